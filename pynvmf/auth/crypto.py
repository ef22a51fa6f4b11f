"""The computations of DH-HMAC-CHAP (NVMe Base 2.0 §8.13.5): the FFDHE groups of RFC 7919,
the Diffie-Hellman exchange (through `cryptography`), the augmented challenge and the two
responses. Pure functions and small objects; no state machine, no I/O."""

from __future__ import annotations

import functools
import hashlib
import hmac
import struct
import warnings

from pynvmf.spec.auth import DhGroupId, HashId

with warnings.catch_warnings():
    # cryptography 46+ marks finite-field DH deprecated; NVMe's DH-HMAC-CHAP requires it.
    warnings.simplefilter("ignore")
    from cryptography.hazmat.primitives.asymmetric import dh

_X = {  # RFC 7919 §A: the smallest X making each p a safe prime
    2048: 560316,
    3072: 2625351,
    4096: 5736041,
    6144: 15705020,
    8192: 10965728,
}
GENERATOR = 2


def _e_scaled(bits: int) -> int:
    """floor(e * 2^bits), from the series sum 1/k! in integer arithmetic (64 guard bits)."""
    scale = 1 << (bits + 64)
    total, term, k = 0, scale, 0
    while term:
        total += term
        k += 1
        term //= k
    return total >> 64


@functools.cache
def ffdhe_prime(bits: int) -> int:
    """RFC 7919's p = 2^b - 2^{b-64} + {[2^{b-130} e] + X} * 2^64 - 1."""
    return 2**bits - 2 ** (bits - 64) + (_e_scaled(bits - 130) + _X[bits]) * 2**64 - 1


@functools.cache
def _parameters(group: DhGroupId) -> dh.DHParameters:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return dh.DHParameterNumbers(ffdhe_prime(group.prime_bits), GENERATOR).parameters()


class DhExchange:
    """One side's ephemeral key pair in a group: `public` to send, `shared(peer)` for the
    session key. Raises ValueError for a peer value outside 2..p-2."""

    def __init__(self, group: DhGroupId) -> None:
        if group == DhGroupId.NULL:
            raise ValueError("the null group has no exchange")
        self.group = group
        self._length = group.value_length
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._private = _parameters(group).generate_private_key()
        y = self._private.public_key().public_numbers().y
        self.public = y.to_bytes(self._length, "big")

    def shared(self, peer_value: bytes) -> bytes:
        """g^xy mod p as the specification's session key: big endian, the prime's length."""
        if not peer_value or len(peer_value) > self._length:
            raise ValueError(f"a {self.group.text} value is {self._length} bytes")
        p = ffdhe_prime(self.group.prime_bits)
        y = int.from_bytes(peer_value, "big")
        if not 1 < y < p - 1:
            raise ValueError("the peer's DH value is outside 2..p-2")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            peer = dh.DHPublicNumbers(y, _parameters(self.group).parameter_numbers()).public_key()
            key = self._private.exchange(peer)
        return key.rjust(self._length, b"\0")


def augmented_challenge(hash_id: HashId, session_key: bytes, challenge: bytes) -> bytes:
    """Ca = HMAC(H(g^xy mod p), C) (§8.13.5.3): binds the challenge to the exchange."""
    name = hash_id.hashlib_name
    return hmac.new(hashlib.new(name, session_key).digest(), challenge, name).digest()


_LE32 = struct.Struct("<I")
_LE16 = struct.Struct("<H")


def _response(
    hash_id: HashId,
    key: bytes,
    challenge: bytes,
    seqnum: int,
    t_id: int,
    sc_c: int,
    label: bytes,
    first_nqn: str,
    second_nqn: str,
) -> bytes:
    mac = hmac.new(key, challenge, hash_id.hashlib_name)
    mac.update(_LE32.pack(seqnum))
    mac.update(_LE16.pack(t_id))
    mac.update(bytes((sc_c,)))
    mac.update(label)
    mac.update(first_nqn.encode())
    mac.update(b"\0")
    mac.update(second_nqn.encode())
    return mac.digest()


def host_response(
    hash_id: HashId,
    key: bytes,
    challenge: bytes,
    seqnum: int,
    t_id: int,
    hostnqn: str,
    subnqn: str,
    sc_c: int = 0,
) -> bytes:
    """R1 = HMAC(Kh', C1 || S1 || T_ID || SC_C || "HostHost" || NQNh || 00h || NQNc); `key` is
    the host secret transformed with the host NQN, `challenge` C1 (augmented with DH)."""
    return _response(hash_id, key, challenge, seqnum, t_id, sc_c, b"HostHost", hostnqn, subnqn)


def controller_response(
    hash_id: HashId,
    key: bytes,
    challenge: bytes,
    seqnum: int,
    t_id: int,
    hostnqn: str,
    subnqn: str,
    sc_c: int = 0,
) -> bytes:
    """R2 = HMAC(Kc', C2 || S2 || T_ID || SC_C || "Controller" || NQNc || 00h || NQNh); `key`
    is the controller secret transformed with the subsystem NQN."""
    return _response(hash_id, key, challenge, seqnum, t_id, sc_c, b"Controller", subnqn, hostnqn)


def generated_psk(hash_id: HashId, session_key: bytes, c1: bytes, c2: bytes) -> bytes:
    """The PSK a transaction with secure channel concatenation generates for TLS (NVMe Base
    2.1 §8.3.4.3): HMAC(KS, C1 || C2) with the transaction's hash, KS the DH session key
    (g^xy mod p, the prime's length) and C1, C2 the two challenges as sent (not augmented)."""
    name = hash_id.hashlib_name
    return hmac.new(session_key, c1 + c2, name).digest()
