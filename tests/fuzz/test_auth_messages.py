"""DH-HMAC-CHAP against arbitrary input: the message parser either returns a message or
raises MalformedMessage, and the controller's state machine, fed any sequence of
Authentication Send payloads and Receives, never raises, never authenticates a host that
did not answer its challenge, and always has an answer (a message) for a Receive."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pynvmf.auth import ControllerAuth, DhchapKey, HostAuth, HostAuthConfig
from pynvmf.spec import auth as A
from pynvmf.spec.auth import DhGroupId, HashId

NQN = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-1111-2222-3333-444455556666"
SUBNQN = "nqn.2024-11.dev.pynvmf:fuzz"
KEY = DhchapKey.generate(32)
CONFIG = HostAuthConfig(KEY, DhchapKey.generate(32), (HashId.SHA256,), (DhGroupId.NULL,))

# Payloads near the real ones: valid headers with random bodies, real messages cut short.
_real = [
    HostAuth(KEY, NQN, SUBNQN, t_id=1).negotiate(),
    A.Reply(1, bytes(32), 5, bytes(32)).pack(),
    A.Success2(1).pack(),
    A.Failure(A.MessageId.FAILURE2, 1, 1).pack(),
]
payloads = st.one_of(
    st.binary(max_size=200),
    st.builds(
        lambda t, i, body: bytes([t, i, 0, 0, 1, 0]) + body,
        st.sampled_from([0, 1, 2]),
        st.sampled_from([0, 1, 2, 3, 4, 0xF0, 0xF1, 0x55]),
        st.binary(max_size=120),
    ),
    st.builds(lambda m, n: m[:n], st.sampled_from(_real), st.integers(0, 80)),
)


@given(payloads)
def test_parse_message_returns_or_raises_malformed(data: bytes) -> None:
    try:
        msg = A.parse_message(data)
    except A.MalformedMessage as e:
        assert e.explanation in set(A.FailureExplanation)
    else:
        assert isinstance(
            msg, (A.Negotiate, A.Challenge, A.Reply, A.Success1, A.Success2, A.Failure)
        )


@given(st.lists(st.one_of(payloads, st.none()), max_size=8))
def test_controller_never_raises_nor_authenticates_a_stranger(steps: list[bytes | None]) -> None:
    ctrl = ControllerAuth(lambda: CONFIG, NQN, SUBNQN, 0)
    for step in steps:
        if step is None:
            answer = ctrl.receive()
            A.parse_message(answer)  # always a well formed message
        else:
            ctrl.send(step)
        # Without the key no response can match: never authenticated.
        assert not ctrl.authenticated
        if ctrl.closing:
            break
