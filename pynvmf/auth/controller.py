"""The controller's side of DH-HMAC-CHAP on one queue, sans I/O.

The glue hands every Authentication Send payload to `send()` and answers every
Authentication Receive with `receive()`; the state machine decides what the host may send
next. A transaction (NVMe Base 2.0 §8.13.5):

    host  AUTH_Negotiate  ->  (hashes and DH groups it offers, T_ID)
          <-  DH-HMAC-CHAP_Challenge   (hash, group, S1, C1, the controller's DH value)
    host  DH-HMAC-CHAP_Reply  ->      (R1, optionally C2 and S2, the host's DH value)
          <-  DH-HMAC-CHAP_Success1    (R2 when the host sent C2)
    host  DH-HMAC-CHAP_Success2  ->   (only after R2)

Anything wrong puts the machine in the failure state: the next Receive returns
AUTH_Failure1 with the reason explanation the specification names, after which the
connection is to be closed (`closing`), as nvmet does; an AUTH_Failure2 from the host ends
it the same way. A Negotiate on an authenticated queue starts a re-authentication: the
queue stays authenticated while it runs, and a failed one closes it.

Secure channel concatenation (NVMe Base 2.1 §8.3.4.3): a Negotiate with SC_C NEWTLSPSK (an
admin queue without TLS, on a listener that offers TLS) or REPLACETLSPSK (an admin queue over
TLS) asks the transaction to generate a PSK for TLS. The host then sends C2 with S2 0 (no
controller authentication: Success1 carries no R2) or with S2 set (bidirectional, the PSK
comes with Success2). Once it succeeded, `take_generated_psk()` hands the generated PSK,
HMAC(KS, C1 || C2), to the glue, which derives the TLS PSK and its identity. SC_C is part of
R1 and of R2 (Linux 7.2's nvmet puts it in R2 too; its host never asks for R2 with it).

Secrets stay in the configuration objects; nothing here logs or returns them.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, auto

from pynvmf.auth.crypto import (
    DhExchange,
    augmented_challenge,
    controller_response,
    generated_psk,
    host_response,
)
from pynvmf.auth.keys import DhchapKey
from pynvmf.logs import about
from pynvmf.spec.auth import (
    AUTH_ID_DHCHAP,
    FAILURE_SIZE,
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

log = logging.getLogger(__name__)

ALL_HASHES = (HashId.SHA256, HashId.SHA384, HashId.SHA512)
# The controller's preference when the configuration names none: a DH exchange first
# (the session key binds the responses to this connection), the null group last.
ALL_DHGROUPS = (
    DhGroupId.FFDHE2048,
    DhGroupId.FFDHE3072,
    DhGroupId.FFDHE4096,
    DhGroupId.FFDHE6144,
    DhGroupId.FFDHE8192,
    DhGroupId.NULL,
)
# The hashes a generated PSK can be for: a TLS PSK's (NVMe/TCP allows SHA-256 and SHA-384
# cipher suites only; Linux refuses to derive one from SHA-512).
CONCAT_HASHES = (HashId.SHA256, HashId.SHA384)


@dataclass(frozen=True)
class HostAuthConfig:
    """What a subsystem requires of one host: its secret, optionally the controller's
    secret (bidirectional authentication), and the hashes and DH groups allowed, in the
    controller's order of preference."""

    host_key: DhchapKey
    ctrl_key: DhchapKey | None = None
    hashes: tuple[HashId, ...] = ALL_HASHES
    dhgroups: tuple[DhGroupId, ...] = ALL_DHGROUPS
    # The keyring names the keys came from (what outputs show instead of the keys).
    host_key_name: str = ""
    ctrl_key_name: str = ""


class _SeqNum:
    """Sequence numbers S1: one counter per process from a random start, never 0 (as Linux)."""

    def __init__(self) -> None:
        self._value = secrets.randbits(32)
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            self._value = (self._value + 1) & 0xFFFFFFFF or 1
            return self._value


SEQUENCE = _SeqNum()


class State(Enum):
    IDLE = auto()  # waiting for AUTH_Negotiate
    CHALLENGE = auto()  # the next Receive returns the Challenge
    REPLY = auto()  # waiting for the Reply
    SUCCESS1 = auto()  # the next Receive returns Success1
    SUCCESS2 = auto()  # waiting for Success2
    FAILURE1 = auto()  # the next Receive returns Failure1
    CLOSED = auto()  # the transaction failed for good


@dataclass
class ControllerAuth:
    """One queue's authentication. `config` is looked up at every Negotiate, so a key
    changed at runtime applies to the next (re-)authentication."""

    lookup: Callable[[], HostAuthConfig | None]
    hostnqn: str
    subnqn: str
    qid: int
    cntlid: int = 0
    state: State = State.IDLE
    authenticated: bool = False
    # Secure channel concatenation: whether the queue's listener offers TLS (NEWTLSPSK is
    # possible), and whether this queue's connection is TLS (REPLACETLSPSK is).
    tls_offered: bool = False
    on_tls: bool = False
    # Set when the connection must be closed once the current command has completed.
    closing: str | None = None
    failure: FailureExplanation | None = None
    transactions: int = 0
    _t_id: int = 0
    _hash: HashId = HashId.SHA256
    _group: DhGroupId = DhGroupId.NULL
    _config: HostAuthConfig | None = field(default=None, repr=False)
    _s1: int = 0
    _c1: bytes = field(default=b"", repr=False)
    _dh: DhExchange | None = field(default=None, repr=False)
    _session_key: bytes = field(default=b"", repr=False)
    _c2: bytes | None = field(default=None, repr=False)
    _s2: int = 0
    _sc_c: int = SecureConcat.NONE
    _generated: tuple[HashId, bytes] | None = field(default=None, repr=False)

    @property
    def in_progress(self) -> bool:
        return self.state not in (State.IDLE, State.CLOSED)

    def describe(self) -> dict[str, str]:
        """This queue's authentication as SPDK's nvmf_subsystem_get_qpairs shows it:
        its state (SPDK's names) and the hash and group negotiated."""
        if self.authenticated and not self.in_progress:
            state = "completed"
        elif self.state is State.IDLE:
            state = "negotiate"
        elif self.state is State.CLOSED:
            state = "error"
        else:
            state = self.state.name.lower()
        return {"state": state, "digest": self._hash.hashlib_name, "dhgroup": self._group.text}

    def _where(self) -> str:
        return f"ctrl {self.cntlid} qid {self.qid} host {self.hostnqn}"

    def log_context(self) -> dict[str, object]:
        """What each log record of this authentication says of it (pynvmf/logs.py)."""
        return {
            "host": self.hostnqn,
            "subsystem": self.subnqn,
            "qid": self.qid,
            "cntlid": self.cntlid,
        }

    def _fail(self, explanation: FailureExplanation, why: str) -> None:
        about(log, self).warning(
            "%s: authentication failed (%s): %s", self._where(), explanation_name(explanation), why
        )
        self.failure = explanation
        self.authenticated = False
        self.state = State.FAILURE1
        self._forget()

    def _forget(self) -> None:
        self._sc_c = SecureConcat.NONE
        self._c1 = b""
        self._dh = None
        self._session_key = b""
        self._c2 = None
        self._config = None

    # -- Authentication Send ---------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """An Authentication Send payload. Never raises for bad input: a failure is
        answered by the next Receive."""
        if self.state in (State.CLOSED, State.FAILURE1):
            return  # the failure stands; Failure1 is what the next Receive returns
        try:
            msg = parse_message(data)
        except MalformedMessage as e:
            self._fail(e.explanation, str(e))
            return
        if isinstance(msg, Negotiate):
            self._negotiate(msg)
        elif isinstance(msg, Failure):
            if msg.message != MessageId.FAILURE2:
                self._fail(FailureExplanation.INCORRECT_MESSAGE, "AUTH_Failure1 from the host")
                return
            about(log, self).warning(
                "%s: the host failed the authentication (%s)",
                self._where(),
                explanation_name(msg.explanation),
            )
            known = msg.explanation in FailureExplanation.__members__.values()
            self.failure = (
                FailureExplanation(msg.explanation) if known else FailureExplanation.FAILED
            )
            self.authenticated = False
            self.state = State.CLOSED
            self.closing = "the host failed the authentication (AUTH_Failure2)"
            self._forget()
        elif isinstance(msg, Reply) and self.state == State.REPLY:
            self._reply(msg)
        elif isinstance(msg, Success2) and self.state == State.SUCCESS2:
            if msg.t_id != self._t_id:
                self._fail(FailureExplanation.INCORRECT_PAYLOAD, f"Success2 T_ID {msg.t_id}")
                return
            self._succeed()
        else:
            self._fail(
                FailureExplanation.INCORRECT_MESSAGE,
                f"{type(msg).__name__} when {self.state.name} was expected",
            )

    def _negotiate(self, msg: Negotiate) -> None:
        config = self.lookup()
        self._t_id = msg.t_id
        if config is None:
            self._fail(FailureExplanation.FAILED, "no DH-HMAC-CHAP key for this host")
            return
        concat = msg.sc_c != SecureConcat.NONE
        if concat:
            refusal = self._concat_refusal(msg.sc_c)
            if refusal:
                self._fail(FailureExplanation.CONCAT_MISMATCH, refusal)
                return
        if AUTH_ID_DHCHAP not in msg.auth_ids:
            self._fail(FailureExplanation.NOT_USABLE, f"protocols {msg.auth_ids} offered")
            return
        usable = [h for h in config.hashes if not concat or h in CONCAT_HASHES]
        hash_id = next((h for h in usable if h in msg.hashes), None)
        if hash_id is None:
            self._fail(FailureExplanation.HASH_UNUSABLE, f"hashes {list(msg.hashes)} offered")
            return
        group = next((g for g in config.dhgroups if g in msg.dhgroups), None)
        if concat:
            # The generated PSK is keyed with the DH session key: no null group (nvmet
            # answers the same).
            group = next(
                (g for g in config.dhgroups if g in msg.dhgroups and g != DhGroupId.NULL), None
            )
            if group is None:
                self._fail(
                    FailureExplanation.CONCAT_MISMATCH,
                    f"secure channel concatenation needs a DH group; {list(msg.dhgroups)} offered",
                )
                return
        if group is None:
            self._fail(
                FailureExplanation.DHGROUP_UNUSABLE, f"DH groups {list(msg.dhgroups)} offered"
            )
            return
        self._forget()
        self._sc_c = msg.sc_c
        self._config = config
        self._hash = hash_id
        self._group = group
        self.transactions += 1
        self.state = State.CHALLENGE

    def _concat_refusal(self, sc_c: int) -> str:
        """Why this queue cannot do the secure channel concatenation SC_C asks for, or ""."""
        if self.qid != 0:
            return f"SC_C {sc_c:#04x} on I/O queue {self.qid} (the admin queue's alone)"
        if sc_c == SecureConcat.NEW_TLS_PSK:
            if self.on_tls:
                return "NEWTLSPSK on a queue that already runs over TLS"
            if not self.tls_offered:
                return "NEWTLSPSK on a listener without TLS"
            return ""
        if sc_c == SecureConcat.REPLACE_TLS_PSK:
            return "" if self.on_tls else "REPLACETLSPSK on a queue without TLS"
        return f"SC_C {sc_c:#04x}"

    def _reply(self, msg: Reply) -> None:
        config = self._config
        assert config is not None
        hl = self._hash.length
        if msg.t_id != self._t_id:
            self._fail(FailureExplanation.INCORRECT_PAYLOAD, f"Reply T_ID {msg.t_id}")
            return
        if len(msg.response) != hl:
            self._fail(FailureExplanation.INCORRECT_PAYLOAD, f"Reply HL {len(msg.response)}")
            return
        concat = self._sc_c != SecureConcat.NONE
        if concat and msg.c2 is None:
            # The generated PSK needs C2 (nvmet answers the same).
            self._fail(FailureExplanation.FAILED, "secure channel concatenation without C2")
            return
        if not concat and msg.c2 is not None and msg.seqnum == 0:
            # S2 0 with a C2 asks for a PSK, which a Negotiate without SC_C did not.
            self._fail(FailureExplanation.INCORRECT_PAYLOAD, "Reply with C2 and S2 0")
            return
        challenge = self._c1
        if self._dh is None:
            if msg.dh_value:
                self._fail(FailureExplanation.INCORRECT_PAYLOAD, "DH value with the null group")
                return
        else:
            try:
                self._session_key = self._dh.shared(msg.dh_value)
            except ValueError as e:
                self._fail(FailureExplanation.DHGROUP_UNUSABLE, str(e))
                return
            challenge = augmented_challenge(self._hash, self._session_key, self._c1)
        expected = host_response(
            self._hash,
            config.host_key.transformed(self.hostnqn),
            challenge,
            self._s1,
            self._t_id,
            self.hostnqn,
            self.subnqn,
            self._sc_c,
        )
        if not hmac.compare_digest(expected, msg.response):
            self._fail(FailureExplanation.FAILED, "the host's response does not match")
            return
        if msg.c2 is not None and msg.seqnum and config.ctrl_key is None:
            self._fail(FailureExplanation.FAILED, "C2 sent, and no controller key is set")
            return
        self._c2 = msg.c2
        self._s2 = msg.seqnum
        self.state = State.SUCCESS1

    def _succeed(self) -> None:
        self.authenticated = True
        self.failure = None
        self.state = State.IDLE
        concat = self._sc_c != SecureConcat.NONE
        if concat:
            assert self._c2 is not None
            self._generated = (
                self._hash,
                generated_psk(self._hash, self._session_key, self._c1, self._c2),
            )
        about(log, self).info(
            "%s: authenticated (%s, %s%s%s)",
            self._where(),
            self._hash.hashlib_name,
            self._group.text,
            ", bidirectional" if self._c2 is not None and self._s2 else "",
            f", {SecureConcat(self._sc_c).name} for secure channel concatenation" if concat else "",
        )
        self._forget()

    def take_generated_psk(self) -> tuple[HashId, bytes] | None:
        """The PSK the last transaction generated for secure channel concatenation (its
        hash and the generated PSK), once: None if it generated none."""
        generated, self._generated = self._generated, None
        return generated

    # -- Authentication Receive ------------------------------------------------------------

    def receive(self) -> bytes:
        """The message an Authentication Receive returns now."""
        state = self.state
        if state == State.CHALLENGE:
            return self._challenge()
        if state == State.SUCCESS1:
            return self._success1()
        if state not in (State.FAILURE1, State.CLOSED):
            self._fail(FailureExplanation.INCORRECT_MESSAGE, f"a Receive in state {state.name}")
        explanation = self.failure or FailureExplanation.FAILED
        self.state = State.CLOSED
        self.closing = f"authentication failed ({explanation_name(explanation)})"
        return Failure(MessageId.FAILURE1, self._t_id, explanation).pack()

    def _challenge(self) -> bytes:
        hl = self._hash.length
        self._s1 = SEQUENCE.next()
        self._c1 = secrets.token_bytes(hl)
        dh_value = b""
        if self._group != DhGroupId.NULL:
            self._dh = DhExchange(self._group)
            dh_value = self._dh.public
        self.state = State.REPLY
        return Challenge(self._t_id, self._hash, self._group, self._s1, self._c1, dh_value).pack()

    def _success1(self) -> bytes:
        config = self._config
        assert config is not None
        hl = self._hash.length
        if self._c2 is None or not self._s2:
            # Unidirectional, or C2 for a generated PSK alone (S2 0): no R2.
            msg = Success1(self._t_id, hl).pack()
            self._succeed()
            return msg
        assert config.ctrl_key is not None
        challenge = self._c2
        if self._session_key:
            challenge = augmented_challenge(self._hash, self._session_key, challenge)
        r2 = controller_response(
            self._hash,
            config.ctrl_key.transformed(self.subnqn),
            challenge,
            self._s2,
            self._t_id,
            self.hostnqn,
            self.subnqn,
            self._sc_c,
        )
        self.state = State.SUCCESS2
        return Success1(self._t_id, hl, r2).pack()


MIN_RECEIVE = FAILURE_SIZE  # the smallest Authentication Receive allocation that holds a message
