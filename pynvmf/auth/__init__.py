"""NVMe in-band authentication (DH-HMAC-CHAP) as sans-I/O state machines for both roles:
`ControllerAuth` (the target's side of one queue) and `HostAuth` (the host's), the
DHHC-1 secrets they use (`DhchapKey`) and the computations between them (crypto.py)."""

from pynvmf.auth.controller import ControllerAuth, HostAuthConfig
from pynvmf.auth.host import AuthenticationFailed, HostAuth
from pynvmf.auth.keys import DhchapKey, KeyFormatError

__all__ = [
    "AuthenticationFailed",
    "ControllerAuth",
    "DhchapKey",
    "HostAuth",
    "HostAuthConfig",
    "KeyFormatError",
]
