"""The host's side of DH-HMAC-CHAP on one queue, sans I/O.

`negotiate()` gives the AUTH_Negotiate to send, `reply(challenge)` the Reply for the
controller's Challenge, `success1(message)` the Success2 to send (bidirectional) or None.
A problem raises `AuthenticationFailed`: with `failure2` set, the AUTH_Failure2 the host
sends the controller before giving up (the controller's message was bad, or its response
R2 did not match); without, the controller refused (AUTH_Failure1).

With `concat` (SC_C NEWTLSPSK or REPLACETLSPSK: secure channel concatenation, admin queue
only) the host offers SHA-256 and SHA-384 alone (the hashes a TLS PSK can have), refuses the
null DH group, sends C2 with S2 0 (as Linux does; S2 set and bidirectional when it also holds
the controller's secret) and, once Success1 (or its Success2) is through, `generated_psk`
holds HMAC(KS, C1 || C2) with the transaction's hash, for pynvmf.tcp.psk.generated_tls_psks.
"""

from __future__ import annotations

import hmac
import secrets

from pynvmf.auth.controller import ALL_HASHES, CONCAT_HASHES, SEQUENCE
from pynvmf.auth.crypto import (
    DhExchange,
    augmented_challenge,
    controller_response,
    generated_psk,
    host_response,
)
from pynvmf.auth.keys import DhchapKey
from pynvmf.spec.auth import (
    Challenge,
    DhGroupId,
    Failure,
    FailureExplanation,
    HashId,
    MalformedMessage,
    MessageId,
    Negotiate,
    Reply,
    SecureConcat,
    Success1,
    Success2,
    explanation_name,
    parse_message,
)

# What the host offers, in the order Linux's host lists them.
HOST_DHGROUPS = (
    DhGroupId.NULL,
    DhGroupId.FFDHE2048,
    DhGroupId.FFDHE3072,
    DhGroupId.FFDHE4096,
    DhGroupId.FFDHE6144,
    DhGroupId.FFDHE8192,
)


class AuthenticationFailed(Exception):
    def __init__(
        self, explanation: int, text: str, *, failure2: bytes | None = None, by_controller: bool
    ) -> None:
        super().__init__(f"{text} ({explanation_name(explanation)})")
        self.explanation = explanation
        self.failure2 = failure2
        self.by_controller = by_controller


class HostAuth:
    def __init__(
        self,
        host_key: DhchapKey,
        hostnqn: str,
        subnqn: str,
        *,
        ctrl_key: DhchapKey | None = None,
        t_id: int | None = None,
        hashes: tuple[HashId, ...] = ALL_HASHES,
        dhgroups: tuple[DhGroupId, ...] = HOST_DHGROUPS,
        concat: SecureConcat = SecureConcat.NONE,
    ) -> None:
        self._host_key = host_key
        self._ctrl_key = ctrl_key
        self.hostnqn = hostnqn
        self.subnqn = subnqn
        self.t_id = secrets.randbits(16) if t_id is None else t_id
        self.concat = concat
        if concat != SecureConcat.NONE:
            hashes = tuple(h for h in hashes if h in CONCAT_HASHES)
            dhgroups = tuple(g for g in dhgroups if g != DhGroupId.NULL)
        self.hashes = hashes
        self.dhgroups = dhgroups
        self.hash_id: HashId | None = None
        self.dhgroup: DhGroupId | None = None
        self._session_key = b""
        self._c1 = b""
        self._c2: bytes | None = None
        self._s2 = 0
        # The PSK this transaction generated (secure channel concatenation), once it succeeded.
        self.generated_psk: bytes | None = None

    def negotiate(self) -> bytes:
        return Negotiate(self.t_id, tuple(self.hashes), tuple(self.dhgroups), self.concat).pack()

    def _failure2(self, explanation: FailureExplanation, text: str) -> AuthenticationFailed:
        msg = Failure(MessageId.FAILURE2, self.t_id, explanation).pack()
        return AuthenticationFailed(explanation, text, failure2=msg, by_controller=False)

    def _parse(self, data: bytes, expected: type) -> object:
        try:
            msg = parse_message(data)
        except MalformedMessage as e:
            raise self._failure2(e.explanation, str(e)) from None
        if isinstance(msg, Failure) and msg.message == MessageId.FAILURE1:
            raise AuthenticationFailed(
                msg.explanation, "the controller refused the authentication", by_controller=True
            )
        if not isinstance(msg, expected):
            raise self._failure2(
                FailureExplanation.INCORRECT_MESSAGE,
                f"{type(msg).__name__} instead of {expected.__name__}",
            )
        if msg.t_id != self.t_id:  # type: ignore[attr-defined]
            raise self._failure2(
                FailureExplanation.INCORRECT_MESSAGE,
                f"transaction {msg.t_id} instead of {self.t_id}",  # type: ignore[attr-defined]
            )
        return msg

    def reply(self, data: bytes) -> bytes:
        msg = self._parse(data, Challenge)
        assert isinstance(msg, Challenge)
        if msg.hash_id not in self.hashes:
            raise self._failure2(FailureExplanation.HASH_UNUSABLE, f"hash {msg.hash_id}")
        hash_id = HashId(msg.hash_id)
        if len(msg.c1) != hash_id.length:
            raise self._failure2(FailureExplanation.HASH_UNUSABLE, f"HL {len(msg.c1)}")
        if msg.dhgroup not in self.dhgroups:
            raise self._failure2(FailureExplanation.DHGROUP_UNUSABLE, f"DH group {msg.dhgroup}")
        group = DhGroupId(msg.dhgroup)
        self.hash_id, self.dhgroup = hash_id, group
        self._c1 = msg.c1
        challenge = msg.c1
        dh_value = b""
        if group == DhGroupId.NULL:
            if msg.dh_value:
                raise self._failure2(FailureExplanation.INCORRECT_PAYLOAD, "DH value, null group")
        else:
            exchange = DhExchange(group)
            try:
                self._session_key = exchange.shared(msg.dh_value)
            except ValueError as e:
                raise self._failure2(FailureExplanation.DHGROUP_UNUSABLE, str(e)) from None
            dh_value = exchange.public
            challenge = augmented_challenge(hash_id, self._session_key, challenge)
        r1 = host_response(
            hash_id,
            self._host_key.transformed(self.hostnqn),
            challenge,
            msg.seqnum,
            self.t_id,
            self.hostnqn,
            self.subnqn,
            self.concat,
        )
        if self._ctrl_key is not None or self.concat != SecureConcat.NONE:
            self._c2 = secrets.token_bytes(hash_id.length)
        if self._ctrl_key is not None:
            self._s2 = SEQUENCE.next()
        return Reply(self.t_id, r1, self._s2, self._c2, dh_value).pack()

    def success1(self, data: bytes) -> bytes | None:
        msg = self._parse(data, Success1)
        assert isinstance(msg, Success1) and self.hash_id is not None
        if msg.hash_length != self.hash_id.length:
            raise self._failure2(FailureExplanation.HASH_UNUSABLE, f"HL {msg.hash_length}")
        if self._ctrl_key is None or self._c2 is None:
            self._generate()
            return None
        if msg.response is None:
            raise self._failure2(FailureExplanation.FAILED, "the controller did not respond")
        challenge = self._c2
        if self._session_key:
            challenge = augmented_challenge(self.hash_id, self._session_key, challenge)
        expected = controller_response(
            self.hash_id,
            self._ctrl_key.transformed(self.subnqn),
            challenge,
            self._s2,
            self.t_id,
            self.hostnqn,
            self.subnqn,
        )
        if not hmac.compare_digest(expected, msg.response):
            raise self._failure2(
                FailureExplanation.FAILED, "the controller's response does not match its key"
            )
        self._generate()
        return Success2(self.t_id).pack()

    def _generate(self) -> None:
        if self.concat == SecureConcat.NONE:
            return
        assert self.hash_id is not None and self._c2 is not None
        self.generated_psk = generated_psk(self.hash_id, self._session_key, self._c1, self._c2)
