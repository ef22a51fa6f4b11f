"""What a change of the target may be refused for: ChangeError, and the checks of a
change's arguments that need nothing but the arguments (the target checks the rest
against its state).

Every check raises ChangeError naming the argument at fault, before anything changed.
"""

from __future__ import annotations

from collections.abc import Callable

from pynvmf.spec.logpages import AnaState
from pynvmf.spec.nqn import nqn_problem
from pynvmf.spec.opcodes import DISCOVERY_NQN
from pynvmf.target import ana
from pynvmf.tcp.target import TransportConfig

NSID_MAX = 0xFFFFFFFE  # FFFFFFFFh means every namespace
SERIAL_MAX = 20  # Identify Controller SN, MN and FR: ASCII, space padded
MODEL_MAX = 40
FIRMWARE_MAX = 8
INLINE_DATA_MAX = 1 << 20
MIN_H2C_DATA = 4096  # NVMe/TCP: MAXH2CDATA is at least 4 KiB

# Told the NQN of a subsystem whose configuration changed (Target.add_change_listener).
ChangeListener = Callable[[str], None]


class ChangeError(ValueError):
    """A change the target refused; nothing changed. `field` names the argument at fault
    (nqn, hostnqn, nsid, device, address, ...), so that a caller can name its own."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def check_hostnqn(hostnqn: str) -> None:
    problem = nqn_problem(hostnqn)
    if problem:
        raise ChangeError("hostnqn", f"{hostnqn!r} is not a valid NQN: {problem}")
    if hostnqn == DISCOVERY_NQN:
        raise ChangeError("hostnqn", "the discovery NQN is not a host's")


def check_grpid(grpid: object) -> None:
    if not isinstance(grpid, int) or isinstance(grpid, bool) or not 1 <= grpid <= ana.ANAGRPMAX:
        raise ChangeError("anagrpid", f"{grpid!r} is not an ANA group ID (1..{ana.ANAGRPMAX})")


def check_state(state: object) -> AnaState:
    parsed = ana.parse_state(state)
    if parsed is None:
        raise ChangeError(
            "ana_state", f"{state!r} is not an ANA state ({', '.join(ana.STATE_NAMES)})"
        )
    return parsed


def check_text(field: str, text: str, limit: int) -> None:
    if not isinstance(text, str) or len(text) > limit or not all(" " <= c <= "~" for c in text):
        raise ChangeError(field, f"{text!r} is not printable ASCII of at most {limit} characters")


def check_transport(config: TransportConfig) -> None:
    inline = config.inline_data_size
    if not isinstance(inline, int) or inline % 16 or not 0 <= inline <= INLINE_DATA_MAX:
        raise ChangeError(
            "inline_data_size", f"{inline!r} is not a multiple of 16 between 0 and 1 MiB"
        )
    h2c = config.max_h2c_data
    if not isinstance(h2c, int) or h2c < MIN_H2C_DATA or h2c % 4:
        raise ChangeError("max_h2c_data", f"{h2c!r} is not a multiple of 4 of at least 4096")
