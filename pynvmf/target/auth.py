"""Authentication Send / Receive (Fabrics command types 05h / 06h) on any queue: the
command fields checked here, the messages handed to the queue's `ControllerAuth`.

Field errors complete the command with a status (nvmet's choices: Invalid Field for
SECP/SPSP/TL/AL, SGL Data Invalid when the transfer length is not TL/AL); a message that
is wrong is the state machine's business and completes successfully, its failure
reported by the next Receive (AUTH_Failure1), after which the queue's connection closes.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

from pynvmf.auth.controller import ControllerAuth
from pynvmf.logs import about
from pynvmf.spec.auth import (
    SECP_DHCHAP,
    SPSP_DHCHAP,
    FailureExplanation,
    auth_cdw10_fields,
    explanation_name,
)
from pynvmf.spec.opcodes import FabricsType
from pynvmf.spec.status import DNR, Status
from pynvmf.target.outcome import Outcome
from pynvmf.tcp.psk import generated_tls_psks

if TYPE_CHECKING:
    from pynvmf.target.queue import TargetQueue
    from pynvmf.target.transport import Request

log = logging.getLogger(__name__)

# The largest Authentication Send accepted (a Reply with SHA-512 and ffdhe8192 is 1168
# bytes) and Receive allocation answered (Linux and SPDK ask for 4096).
MAX_SEND = 8192
MAX_RECEIVE = 65536


async def execute(queue: TargetQueue, req: Request) -> Outcome:
    sqe = req.sqe
    secp, spsp1, spsp0 = auth_cdw10_fields(sqe.cdw10)
    length = sqe.cdw11
    if secp != SECP_DHCHAP or spsp0 != SPSP_DHCHAP or spsp1 != SPSP_DHCHAP:
        return Status.INVALID_FIELD | DNR, 0, None
    auth = queue.auth
    ctrl = queue.controller
    if auth is None and ctrl is not None:
        # A queue connected before its host had a key: once the host has one, the host
        # may authenticate (a key added at runtime, then the host re-authenticating). The
        # queue was usable so far and stays so unless that authentication fails.
        subsystem = ctrl.subsystem
        if ctrl.hostnqn in subsystem.host_auth:
            auth = ControllerAuth(
                functools.partial(subsystem.host_auth.get, ctrl.hostnqn),
                ctrl.hostnqn,
                subsystem.nqn,
                queue.qid,
                ctrl.cntlid,
                authenticated=True,
                tls_offered=queue.port.offers_tls,
                on_tls=queue.tls_psk is not None,
            )
            queue.auth = auth
    if auth is None:
        # This queue was not asked to authenticate (the host has no key here).
        about(log, queue).info(
            "authentication command on a queue that needs none (qid %d)", queue.qid
        )
        return Status.INVALID_FIELD | DNR, 0, None
    send = sqe.fctype == FabricsType.AUTH_SEND
    if length == 0 or length > (MAX_SEND if send else MAX_RECEIVE):
        return Status.INVALID_FIELD | DNR, 0, None
    if req.length != length:
        return Status.SGL_INVALID_DATA | DNR, 0, None
    if send:
        data = req.data if req.data is not None else await queue.fetch_data(req)
        was = auth.in_progress, auth.closing
        auth.send(bytes(data))
        _count_outcome(queue, auth, *was)
        _keep_generated_psk(queue, auth)
        queue.auth_progressed()
        return Status.SUCCESS, 0, None
    await queue.hold(req, length)
    was = auth.in_progress, auth.closing
    message = auth.receive()
    if len(message) > length:
        # The message does not fit what the host allocated: the transaction cannot go on.
        auth.closing = auth.closing or "Authentication Receive allocation too small"
    _count_outcome(queue, auth, *was)
    _keep_generated_psk(queue, auth)
    queue.auth_progressed()
    if len(message) > length:
        return Status.INVALID_FIELD | DNR, 0, None
    # Padded to AL, as nvmet answers (the host's buffer is the allocation).
    return Status.SUCCESS, 0, message.ljust(length, b"\0")


def _count_outcome(
    queue: TargetQueue, auth: ControllerAuth, in_progress: bool, closing: str | None
) -> None:
    """Count a transaction that has just ended (the metrics endpoint shows the counts): a
    success, or a failure by the reason it names (the connection closes)."""
    counters = queue.target.counters
    if auth.closing and not closing:
        reason = explanation_name(auth.failure or FailureExplanation.FAILED)
        failures = counters.auth_failures
        failures[reason] = failures.get(reason, 0) + 1
    elif in_progress and not auth.in_progress and auth.authenticated:
        counters.auth_successes += 1


def _keep_generated_psk(queue: TargetQueue, auth: ControllerAuth) -> None:
    """A transaction with secure channel concatenation succeeded: the target holds the TLS
    PSK it generated, for the TLS connections that will present its identity (NEWTLSPSK), or
    in place of the PSK of this queue's channel (REPLACETLSPSK)."""
    generated = auth.take_generated_psk()
    ctrl = queue.controller
    if generated is None or ctrl is None:
        return
    hash_id, psk = generated
    psks = generated_tls_psks(hash_id, psk, ctrl.hostnqn, ctrl.subsystem.nqn)
    store = queue.target.generated_psks
    if queue.tls_psk is None:
        store.add(psks)
    else:
        store.replace(ctrl.generated_psk, psks, ctrl)
        ctrl.generated_psk = psks[0]
    about(log, queue).info(
        "ctrl %d of %s: TLS PSK generated for %s, identity %s",
        ctrl.cntlid,
        ctrl.subsystem.nqn,
        ctrl.hostnqn,
        psks[0].identity.decode().split(" ")[0],
    )
