"""A remote controller as the host sees it: the admin queue, the I/O queues,
keep-alive, and what Identify reported. `connect()` brings one up."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING

from pynvmf.auth.host import HostAuth
from pynvmf.auth.keys import DhchapKey
from pynvmf.host import fabrics
from pynvmf.host.errors import (
    NvmeAuthenticationError,
    NvmeConnectionError,
    NvmeError,
    NvmeStatusError,
    NvmeTimeoutError,
    NvmeTransportUnavailableError,
)
from pynvmf.host.fabrics import HostIdentity
from pynvmf.host.namespace import RemoteNamespace, remote_namespace
from pynvmf.host.queue import HostQueue
from pynvmf.rdma import cm as rdma_cm
from pynvmf.spec import command as C
from pynvmf.spec import identify as I
from pynvmf.spec import reservations as R
from pynvmf.spec.auth import AUTHREQ_ATR, SecureConcat
from pynvmf.spec.logpages import LogPageId
from pynvmf.spec.opcodes import DISCOVERY_NQN, NSID_ALL, AdminOpcode, FeatureId
from pynvmf.tcp.host import Buffer
from pynvmf.tcp.psk import ConfiguredPsk, TlsPsk, generated_tls_psks, tls_psk

if TYPE_CHECKING:
    from pynvmf.rdma.host_queue import RdmaHostQueue

    # A queue of either transport: the same submission interface (submit, execute, wait,
    # submit_fused, close, abort, wait_closed), tcp/host.py's HostCommand for both.
    AnyQueue = HostQueue | RdmaHostQueue

log = logging.getLogger(__name__)

DEFAULT_MAX_TRANSFER = 1024 * 1024
# The admin queue: 32 entries (the Linux host's NVME_AQ_DEPTH), 31 in flight.
ADMIN_QUEUE_DEPTH = 31
SHUTDOWN_TIMEOUT_MIN = 5.0
SHUTDOWN_TIMEOUT_MAX = 60.0
_MPS_BASE = 4096
# The transports a controller's queues may use (nvme-cli's -t): each queue of a controller
# is opened the same way, by `Controller._open`.
TRTYPES = ("tcp", "rdma")
# The most commands in flight on an I/O queue, by transport, beyond CAP.MQES: an NVMe/RDMA
# queue has at most 128 entries (Linux's NVME_RDMA_MAX_QUEUE_SIZE, what nvmet-rdma and
# pynvmf's rdma listener accept; the RDMA CM rejects a deeper one with INVALID_HSQSIZE).
_MAX_QUEUE_DEPTH = {"rdma": rdma_cm.IO_QUEUE_SIZE - 1}
PYVERBS_MISSING = (
    "trtype rdma needs rdma-core's Python bindings (pyverbs: Debian's python3-pyverbs), "
    "which this Python cannot import"
)


def cap_mqes(cap: int) -> int:
    """Maximum Queue Entries Supported, 0's based."""
    return cap & 0xFFFF


def cap_timeout(cap: int) -> float:
    """CAP.TO: the worst case time to CSTS.RDY, in seconds (500 ms units)."""
    return ((cap >> 24) & 0xFF) * 0.5


def cap_mpsmin(cap: int) -> int:
    return (cap >> 48) & 0xF


class Controller:
    """Made by `connect()`. Admin commands go to the admin queue; I/O commands are
    spread round-robin over the I/O queues, each allowing `queue_depth` in flight."""

    def __init__(
        self,
        address: str,
        port: int,
        subnqn: str,
        identity: HostIdentity,
        *,
        kato_ms: int = 5000,
        header_digest: bool = False,
        data_digest: bool = False,
        disable_sqflow: bool = False,
        max_transfer: int = DEFAULT_MAX_TRANSFER,
        timeout: float = 10.0,
        dhchap_secret: DhchapKey | None = None,
        dhchap_ctrl_secret: DhchapKey | None = None,
        tls_psk: TlsPsk | None = None,
        ktls: str = "auto",
        io_identity: HostIdentity | None = None,
        concat: bool = False,
        trtype: str = "tcp",
    ) -> None:
        if trtype not in TRTYPES:
            raise ValueError(f"trtype: {trtype!r} is not one of {', '.join(TRTYPES)}")
        self.trtype = trtype
        self.address = address
        # The TLS PSK every queue's connection uses (with `concat`, the one the admin
        # queue's authentication generated, from then on), or None: plain TCP.
        self.tls_psk = tls_psk
        self.ktls = ktls
        # Secure channel concatenation (nvme-cli's --concat): authenticate the admin queue
        # for a generated PSK, then every queue over TLS with it.
        self.concat = concat
        self.port = port
        self.subnqn = subnqn
        self.identity = identity
        # What the I/O queue Connects carry: the admin queue's identity unless told.
        self.io_identity = identity if io_identity is None else io_identity
        self.kato_ms = kato_ms
        self.header_digest = header_digest
        self.data_digest = data_digest
        self.disable_sqflow = disable_sqflow
        self.timeout = timeout
        self.max_transfer = max_transfer
        # DH-HMAC-CHAP: the host's secret, and the controller's (bidirectional).
        self._dhchap_secret = dhchap_secret
        self._dhchap_ctrl_secret = dhchap_ctrl_secret
        # Queue IDs that authenticated (the last transaction on each succeeded).
        self.authenticated_queues: set[int] = set()
        self.admin: AnyQueue | None = None
        self.io_queues: list[AnyQueue] = []
        self.cntlid = 0
        self.cap = 0
        self.vs = 0
        self.cc = 0
        self.info: I.IdentifyController | None = None
        self.io_inline_limit = 0
        self.queue_depth = 0
        self.keep_alives = 0
        self._namespaces: dict[int, RemoteNamespace] = {}
        self._rr = 0
        self._keep_alive_task: asyncio.Task[None] | None = None
        self._close_task: asyncio.Task[None] | None = None
        self._closed = False
        self._handshakes = asyncio.Lock()
        # Copy descriptor formats 2h/3h enabled in Host Behavior Support (None: not asked).
        self._copy_formats: int | None = None
        self._copy_formats_lock = asyncio.Lock()
        # The NVM command set's Identify Controller (CNS 06h), asked for when first needed.
        self._nvm_info: I.IdentifyControllerNvm | None = None

    def __repr__(self) -> str:
        return (
            f"Controller({self.subnqn!r} at {self.address} port {self.port}, "
            f"cntlid {self.cntlid}, {len(self.io_queues)} I/O queues)"
        )

    @property
    def is_discovery(self) -> bool:
        if self.info is not None:
            return self.info.cntrltype == I.CtrlType.DISCOVERY
        return self.subnqn == DISCOVERY_NQN

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def bytes_sent(self) -> int:
        """Bytes written to the connections of every queue, PDU headers and digests included."""
        return sum(q.bytes_sent for q in self._all_queues())

    @property
    def bytes_received(self) -> int:
        """Bytes read from the connections of every queue."""
        return sum(q.bytes_received for q in self._all_queues())

    # -- bring-up ----------------------------------------------------------------------------

    async def _start(self, queues: int, queue_depth: int) -> None:
        try:
            async with asyncio.timeout(self.timeout) as deadline:
                await self._bring_up(queues, queue_depth, deadline)
        except TimeoutError:
            # No admin queue yet: the port took the connection and never answered the
            # ICReq, as a port of another protocol that waits for its client does.
            what = (
                "no answer to the ICReq (not an NVMe/TCP port?)"
                if self.admin is None
                else "controller bring-up took too long"
            )
            raise NvmeTimeoutError(f"{self.address} port {self.port}: {what}") from None

    async def _connect_admin(self) -> tuple[AnyQueue, int]:
        """Open the admin queue and Connect it (a new controller): it and Connect's DW0."""
        admin = await self._open_queue(0, ADMIN_QUEUE_DEPTH)
        self.admin = admin
        result = await fabrics.connect_queue(
            admin,
            self.identity,
            self.subnqn,
            sqsize=ADMIN_QUEUE_DEPTH,
            kato_ms=self.kato_ms,
            disable_sqflow=self.disable_sqflow,
        )
        self.cntlid = result & 0xFFFF
        return admin, result

    async def _bring_up(self, queues: int, queue_depth: int, deadline: asyncio.Timeout) -> None:
        admin, result = await self._connect_admin()
        if self.concat and self.tls_psk is None:
            admin, result = await self._concatenate(admin, result)
        await self._authenticate_if_asked(admin, result)
        self.cap = await fabrics.property_get(admin, C.PROP_CAP, 8)
        self.vs = await fabrics.property_get(admin, C.PROP_VS)
        # Becoming ready may take CAP.TO on top of everything else.
        when = deadline.when()
        if when is not None:
            deadline.reschedule(when + cap_timeout(self.cap))
        await self._enable()
        info = await self.identify_controller()
        self.info = info
        if info.icdoff:
            # The data would start past the SQE; Linux refuses such controllers too.
            raise NvmeError(f"ICDOFF {info.icdoff} is not supported")
        mps = _MPS_BASE << cap_mpsmin(self.cap)
        if info.mdts:
            self.max_transfer = min(self.max_transfer, mps << info.mdts)
        self.io_inline_limit = max(0, info.ioccsz * 16 - C.SQE_SIZE)
        if self.kato_ms:
            self._keep_alive_task = asyncio.create_task(
                self._keep_alive(), name=f"nvme keep-alive {self.subnqn}"
            )
        if self.is_discovery or queues <= 0:
            return
        queues = await self._negotiate_queue_count(queues)
        depth = min(queue_depth, cap_mqes(self.cap), _MAX_QUEUE_DEPTH.get(self.trtype, queue_depth))
        if info.maxcmd:
            depth = min(depth, info.maxcmd)
        self.queue_depth = max(1, depth)
        results = await asyncio.gather(
            *(self._connect_io_queue(qid) for qid in range(1, queues + 1)),
            return_exceptions=True,
        )
        opened = [r for r in results if not isinstance(r, BaseException)]
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            for queue in opened:
                queue.abort("another I/O queue failed to connect")
            raise failed[0]
        self.io_queues = opened
        await self.refresh_namespaces()

    async def _open_queue(self, qid: int, depth: int) -> AnyQueue:
        if self.tls_psk is None:
            return await self._open(qid, depth)
        # One TLS handshake at a time, as Linux's host opens its queues: tlshd (ktls-utils
        # 1.4) serving nvmet sometimes fails to find the PSK of one of two concurrent
        # handshakes ("failed to search 'psk' key"), and nvmet closes that connection.
        async with self._handshakes:
            return await self._open(qid, depth)

    async def _open(self, qid: int, depth: int) -> AnyQueue:
        if self.trtype == "rdma":
            # pyverbs is there only where rdma-core's Python bindings are: imported when
            # an rdma queue opens.
            from pynvmf.rdma.host_verbs import open_queue

            try:
                return await open_queue(
                    self.address,
                    self.port,
                    qid,
                    depth,
                    cntlid=self.cntlid if qid else 0,
                    max_transfer=self.max_transfer,
                    timeout=self.timeout,
                )
            except ModuleNotFoundError as exc:
                # The adapter imports pyverbs before it opens anything: nothing was sent.
                if (exc.name or "").partition(".")[0] != "pyverbs":
                    raise
                raise NvmeTransportUnavailableError(PYVERBS_MISSING) from exc
        return await HostQueue.open(
            self.address,
            self.port,
            qid,
            depth,
            header_digest=self.header_digest,
            data_digest=self.data_digest,
            max_transfer=self.max_transfer,
            timeout=self.timeout,
            tls_psk=self.tls_psk,
            ktls=self.ktls,
        )

    async def _enable(self) -> None:
        admin = self._admin()
        mpsmin = cap_mpsmin(self.cap)
        self.cc = C.CC_EN | mpsmin << 7 | 6 << C.CC_IOSQES_SHIFT | 4 << C.CC_IOCQES_SHIFT
        await fabrics.property_set(admin, C.PROP_CC, self.cc)
        # Re-read CSTS until ready: every Property Get is a round trip, so this is
        # paced by the controller, and CAP.TO bounds the whole wait.
        limit = max(cap_timeout(self.cap), 0.5)
        deadline = asyncio.get_running_loop().time() + limit
        while True:
            csts = await fabrics.property_get(admin, C.PROP_CSTS)
            if csts & C.CSTS_CFS:
                raise NvmeError(f"controller fatal status while enabling (CSTS {csts:#x})")
            if csts & C.CSTS_RDY:
                return
            if asyncio.get_running_loop().time() > deadline:
                raise NvmeTimeoutError(f"CSTS.RDY not set within CAP.TO ({limit} s)")

    async def _negotiate_queue_count(self, wanted: int) -> int:
        n = wanted - 1
        granted = await self.set_features(FeatureId.NUM_QUEUES, n | n << 16)
        return min(wanted, (granted & 0xFFFF) + 1, (granted >> 16) + 1)

    async def _connect_io_queue(self, qid: int) -> AnyQueue:
        queue = await self._open_queue(qid, self.queue_depth)
        queue.conn.set_inline_limit(self.io_inline_limit)
        try:
            # SQSIZE is 0's based: depth + 1 entries keep `depth` in flight with one free.
            result = await fabrics.connect_queue(
                queue,
                self.io_identity,
                self.subnqn,
                sqsize=self.queue_depth,
                cntlid=self.cntlid,
                disable_sqflow=self.disable_sqflow,
            )
            await self._authenticate_if_asked(queue, result)
        except BaseException:
            queue.abort("I/O queue connect failed")
            raise
        return queue

    # -- authentication ----------------------------------------------------------------------

    def limit_inline_data(self, limit: int) -> int:
        """Send at most `limit` bytes of write data in-capsule on the I/O queues (never more
        than the controller's IOCCSZ allows); returns the limit in effect."""
        effective = min(limit, self.io_inline_limit)
        self.io_inline_limit = effective
        for queue in self.io_queues:
            queue.conn.set_inline_limit(effective)
        return effective

    async def _concatenate(self, admin: AnyQueue, result: int) -> tuple[AnyQueue, int]:
        """Secure channel concatenation, as Linux's host does it: authenticate the plain
        admin queue asking for a new TLS PSK (SC_C NEWTLSPSK), close it, and connect the
        admin queue again over TLS with the generated PSK (which the I/O queues use too).
        That admin queue, and the new controller, are what the rest of bring-up uses."""
        if not result & AUTHREQ_ATR:
            raise NvmeAuthenticationError(
                f"{self.subnqn}: the controller does not ask to authenticate, so no TLS PSK "
                "can be generated for secure channel concatenation"
            )
        await self._authenticate(admin)
        admin.close("reconnecting over TLS with the generated PSK")
        await admin.wait_closed()
        try:
            return await self._connect_admin()
        except NvmeConnectionError as exc:
            if self._dhchap_ctrl_secret is None:
                raise
            # Linux's nvmet (7.2) frees the challenges once Success1 is out, so after a
            # bidirectional transaction it generates no PSK and knows no NVMe1G identity.
            raise NvmeConnectionError(
                f"{exc}: the controller took no TLS connection with the PSK a bidirectional "
                "authentication generated (Linux's nvmet generates none then: connect "
                "without dhchap_ctrl_secret, as Linux's host does with --concat)"
            ) from exc

    async def _authenticate_if_asked(self, queue: AnyQueue, connect_result: int) -> None:
        """Authenticate `queue` when Connect's AUTHREQ asks for it (as Linux's host: a
        secret given to a controller that does not ask is not used)."""
        if not connect_result & AUTHREQ_ATR:
            return
        if self._dhchap_secret is None:
            raise NvmeAuthenticationError(
                f"{self.subnqn} requires DH-HMAC-CHAP authentication and no secret was given"
            )
        await self._authenticate(queue)

    async def _authenticate(self, queue: AnyQueue) -> None:
        assert self._dhchap_secret is not None
        self.authenticated_queues.discard(queue.qid)
        concat = SecureConcat.NONE
        if self.concat and queue.qid == 0:
            # A new PSK on a plain admin queue; over TLS, one that replaces its channel's.
            concat = SecureConcat.NEW_TLS_PSK if queue.tls is None else SecureConcat.REPLACE_TLS_PSK
        auth = HostAuth(
            self._dhchap_secret,
            self.identity.hostnqn,
            self.subnqn,
            ctrl_key=self._dhchap_ctrl_secret,
            concat=concat,
        )
        await fabrics.authenticate(queue, auth)
        if auth.generated_psk is not None:
            assert auth.hash_id is not None
            self.tls_psk = generated_tls_psks(
                auth.hash_id, auth.generated_psk, self.identity.hostnqn, self.subnqn
            )[0]
        self.authenticated_queues.add(queue.qid)

    async def reauthenticate(
        self,
        dhchap_secret: DhchapKey | None = None,
        dhchap_ctrl_secret: DhchapKey | None = None,
    ) -> None:
        """A new DH-HMAC-CHAP transaction on every queue (AUTH_Negotiate on authenticated
        queues), with new secrets if given: what Linux does when its dhchap_secret changes.
        With secure channel concatenation, on the admin queue alone (as Linux), asking for
        a PSK that replaces the current one (REPLACETLSPSK): I/O queues connected from then
        on use it."""
        if dhchap_secret is not None:
            self._dhchap_secret = dhchap_secret
        if dhchap_ctrl_secret is not None:
            self._dhchap_ctrl_secret = dhchap_ctrl_secret
        if self._dhchap_secret is None:
            raise NvmeAuthenticationError("no DH-HMAC-CHAP secret to authenticate with")
        queues = [self._admin()] if self.concat else [self._admin(), *self.io_queues]
        for queue in queues:
            await self._authenticate(queue)

    # -- commands ----------------------------------------------------------------------------

    def _admin(self) -> AnyQueue:
        if self.admin is None or self._closed:
            raise NvmeConnectionError("controller is closed")
        return self.admin

    def next_queue(self) -> AnyQueue:
        """The I/O queue for the next command (round-robin). Compiled, namespace.py's calls
        on it test the queue's type and call TCP's compiled queue natively, an rdma queue
        (RdmaHostQueue, interpreted) as a Python object."""
        queues = self.io_queues
        if not queues:
            raise NvmeConnectionError("controller has no I/O queues")
        i = self._rr
        self._rr = i + 1 if i + 1 < len(queues) else 0
        return queues[i]

    # The NSID and CDW10-CDW15 are HostQueue.execute's, forwarded as they come (as many
    # as the command uses): the submission's fields are spelled out on the queue alone.

    async def admin_command(
        self, opcode: int, *fields: int, data: Buffer | None = None, into: memoryview | None = None
    ) -> int:
        """Any admin command (`fields`: NSID, CDW10, ..., CDW15); returns the completion's
        DW0 | DW1 << 32."""
        return await self._admin().execute(opcode, *fields, data=data, into=into)

    async def io_command(
        self, opcode: int, *fields: int, data: Buffer | None = None, into: memoryview | None = None
    ) -> int:
        """Any I/O command (`fields`: NSID, CDW10, ..., CDW15), with no local checks;
        returns DW0 | DW1 << 32."""
        return await self.next_queue().execute(opcode, *fields, data=data, into=into)

    async def _identify(self, cns: int, nsid: int = 0) -> bytearray:
        buf = bytearray(I.IDENTIFY_DATA_SIZE)
        await self.admin_command(AdminOpcode.IDENTIFY, nsid, cns, into=memoryview(buf))
        return buf

    async def identify_controller(self) -> I.IdentifyController:
        return I.IdentifyController.unpack(await self._identify(I.Cns.CTRL))

    async def identify_namespace(self, nsid: int) -> I.IdentifyNamespace:
        return I.IdentifyNamespace.unpack(await self._identify(I.Cns.NS, nsid))

    async def nvm_limits(self) -> I.IdentifyControllerNvm:
        """The NVM command set's limits (Identify CNS 06h, CSI 0: VSL, WZSL, ...), asked
        once; a controller from before NVMe 2.0 that does not know the structure has no
        limits beyond each command's own fields (all zero)."""
        if self._nvm_info is None:
            try:
                self._nvm_info = I.IdentifyControllerNvm.unpack(await self._identify(I.Cns.CS_CTRL))
            except NvmeStatusError as exc:
                log.info("%s: no NVM command set Identify Controller: %s", self, exc)
                self._nvm_info = I.IdentifyControllerNvm()
        return self._nvm_info

    def size_limit_bytes(self, limit: int) -> int:
        """A size limit of Identify CNS 06h (log2 of minimum memory pages) in bytes; 0 if none."""
        return (1 << limit) * (_MPS_BASE << cap_mpsmin(self.cap)) if limit else 0

    async def active_namespaces(self) -> list[int]:
        nsids: list[int] = []
        start = 0
        while True:
            page = I.NsIdList.unpack(await self._identify(I.Cns.NS_ACTIVE_LIST, start)).nsids
            nsids.extend(page)
            if len(page) < I.NSID_LIST_MAX or page[-1] >= 0xFFFFFFFD:
                return nsids
            start = page[-1]

    async def get_features(
        self,
        fid: int,
        cdw11: int = 0,
        *,
        sel: int = 0,
        into: memoryview | None = None,
        nsid: int = 0,
    ) -> int:
        """The feature's value (completion DW0); a feature with a data structure (e.g. Host
        Behavior Support) is read `into` a buffer of its size. A namespace specific
        feature (e.g. Reservation Notification Mask) is read for namespace `nsid`."""
        result = await self.admin_command(
            AdminOpcode.GET_FEATURES, nsid, fid | sel << 8, cdw11, into=into
        )
        return result & 0xFFFFFFFF

    async def set_features(
        self,
        fid: int,
        value: int = 0,
        *,
        save: bool = False,
        data: Buffer | None = None,
        nsid: int = 0,
    ) -> int:
        """Completion DW0 (some features, e.g. Number of Queues, report what was granted);
        a feature with a data structure is given it as `data`; a namespace specific one
        applies to namespace `nsid` (NSID_ALL: every namespace)."""
        result = await self.admin_command(
            AdminOpcode.SET_FEATURES, nsid, fid | (1 << 31 if save else 0), value, data=data
        )
        return result & 0xFFFFFFFF

    async def host_identifier(self) -> bytes:
        """The 128-bit Host Identifier the controller knows this host by (Feature 81h)."""
        buf = bytearray(16)
        await self.get_features(FeatureId.HOST_ID, R.FEATURE_EXHID, into=memoryview(buf))
        return bytes(buf)

    async def reservation_notification(self, *, rae: bool = False) -> R.ReservationNotification:
        """The oldest Reservation Notification log page, which reading removes (its
        `available` says how many more there are); an empty page (count 0) if none."""
        page = await self.get_log_page(
            LogPageId.RESERVATION, R.RESERVATION_LOG_SIZE, nsid=NSID_ALL, rae=rae
        )
        return R.ReservationNotification.unpack(page)

    # -- copy descriptor formats (TP 4130) ---------------------------------------------------

    @property
    def copy_formats_enabled(self) -> int | None:
        """The Copy descriptor formats 2h/3h this association may use (bit N: format N),
        as `enable_copy_formats()` found them; None until it has run."""
        return self._copy_formats

    async def enable_copy_formats(self) -> int:
        """Enable, once per controller, the descriptor formats 2h/3h (a source NSID per
        range) that OCFS advertises: Host Behavior Support's CDFE, every other byte of it
        kept. Returns the formats enabled; 0 if the controller refused the feature, in
        which case no Copy in those formats may be sent to it."""
        if self._copy_formats is not None:
            return self._copy_formats
        # Concurrent copies wait for the first one's answer instead of asking again.
        async with self._copy_formats_lock:
            if self._copy_formats is None:
                self._copy_formats = await self._set_cdfe()
            return self._copy_formats

    async def _set_cdfe(self) -> int:
        info = self.info
        assert info is not None
        wanted = info.ocfs & C.COPY_CDFE_FORMATS
        if not wanted:
            return 0
        data = bytearray(C.HOST_BEHAVIOR_SIZE)
        try:
            await self.get_features(FeatureId.HOST_BEHAVIOR, into=memoryview(data))
            cdfe = C.host_behavior_cdfe(data)
            if cdfe & wanted != wanted:
                C.set_host_behavior_cdfe(data, cdfe | wanted)
                await self.set_features(FeatureId.HOST_BEHAVIOR, data=data)
        except NvmeStatusError as exc:
            log.info("%s: Host Behavior Support refused, Copy formats 2h/3h unused: %s", self, exc)
            return 0
        return wanted

    async def get_log_page(
        self,
        lid: int,
        length: int,
        offset: int = 0,
        nsid: int = NSID_ALL,
        *,
        lsp: int = 0,
        rae: bool = False,
    ) -> bytes:
        """`length` bytes of log page `lid` from byte `offset`, in as many commands as
        the transfer limit needs."""
        if offset % 4 or offset < 0 or length < 0:
            raise ValueError("log page offset must be a non-negative multiple of 4")
        padded = -(-length // 4) * 4
        buf = bytearray(padded)
        view = memoryview(buf)
        step = max(4, self.max_transfer // 4 * 4)
        for pos in range(0, padded, step):
            n = min(step, padded - pos)
            numd = n // 4 - 1
            lpo = offset + pos
            await self.admin_command(
                AdminOpcode.GET_LOG_PAGE,
                nsid,
                lid | (lsp & 0xF) << 8 | (1 << 15 if rae else 0) | (numd & 0xFFFF) << 16,
                numd >> 16,
                lpo & 0xFFFFFFFF,
                lpo >> 32,
                into=view[pos : pos + n],
            )
        return bytes(buf[:length])

    # -- namespaces ----------------------------------------------------------------------------

    @property
    def namespaces(self) -> Mapping[int, RemoteNamespace]:
        return self._namespaces

    def namespace(self, nsid: int) -> RemoteNamespace:
        try:
            return self._namespaces[nsid]
        except KeyError:
            raise KeyError(f"namespace {nsid} is not active on {self.subnqn}") from None

    async def refresh_namespaces(self) -> None:
        """Re-read the active namespace list and Identify each namespace."""
        found: dict[int, RemoteNamespace] = {}
        for nsid in await self.active_namespaces():
            ident = await self.identify_namespace(nsid)
            if ident.nsze:  # an all-zero answer means inactive after all
                found[nsid] = remote_namespace(self, nsid, ident)
        self._namespaces = found

    # -- keep alive --------------------------------------------------------------------------

    async def _keep_alive(self) -> None:
        admin = self.admin
        assert admin is not None
        interval = self.kato_ms / 2000
        while True:
            await asyncio.sleep(interval)
            try:
                async with asyncio.timeout(self.kato_ms / 1000):
                    await admin.execute(AdminOpcode.KEEP_ALIVE)
            except NvmeConnectionError:
                return  # the queue already failed its commands
            except (TimeoutError, NvmeError) as exc:
                # The controller will tear the association down (or has): fail
                # everything now rather than let commands wait on a dead peer.
                log.error("%s: keep alive failed (%r), dropping the connection", self, exc)
                self._abort_queues(f"keep alive failed: {exc!r}")
                return
            self.keep_alives += 1

    # -- teardown ----------------------------------------------------------------------------

    def _abort_queues(self, reason: str) -> None:
        for queue in self._all_queues():
            queue.abort(reason)

    def _all_queues(self) -> list[AnyQueue]:
        return [*self.io_queues, *([self.admin] if self.admin is not None else [])]

    async def close(self) -> None:
        """Normal shutdown (CC.SHN = 01b, bounded wait for CSTS.SHST), then close
        every queue. Commands still in flight fail with NvmeConnectionError."""
        if self._close_task is None:
            self._close_task = asyncio.create_task(self._close())
        # Concurrent callers share one shutdown; cancelling a caller does not stop it.
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        if self._closed:
            return
        task = self._keep_alive_task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        admin = self.admin
        if admin is not None and not admin.closed and self.cc & C.CC_EN:
            try:
                await self._shutdown(admin)
            except (NvmeError, TimeoutError) as exc:
                log.warning("%s: shutdown incomplete: %r", self, exc)
        self._closed = True
        queues = self._all_queues()
        for queue in queues:
            queue.close()
        await asyncio.gather(*(queue.wait_closed() for queue in queues))

    async def _shutdown(self, admin: AnyQueue) -> None:
        limit = SHUTDOWN_TIMEOUT_MIN
        if self.info is not None and self.info.rtd3e:
            limit = min(max(limit, self.info.rtd3e / 1e6), SHUTDOWN_TIMEOUT_MAX)
        async with asyncio.timeout(limit):
            self.cc = (self.cc & ~C.CC_SHN_MASK) | 1 << C.CC_SHN_SHIFT
            await fabrics.property_set(admin, C.PROP_CC, self.cc)
            while True:
                csts = await fabrics.property_get(admin, C.PROP_CSTS)
                if csts & C.CSTS_SHST_MASK == C.CSTS_SHST_COMPLETE:
                    return

    async def __aenter__(self) -> Controller:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


async def connect(
    address: str,
    port: int,
    subnqn: str,
    *,
    hostnqn: str | None = None,
    hostid: bytes | None = None,
    queues: int = 1,
    queue_depth: int = 128,
    kato_ms: int = 5000,
    header_digest: bool = False,
    data_digest: bool = False,
    disable_sqflow: bool = False,
    max_transfer: int = DEFAULT_MAX_TRANSFER,
    timeout: float = 10.0,
    dhchap_secret: str | DhchapKey | None = None,
    dhchap_ctrl_secret: str | DhchapKey | None = None,
    tls_psk: str | ConfiguredPsk | TlsPsk | None = None,
    tls_identity: int = 0,
    tls_compat: bool = False,
    ktls: str = "auto",
    io_hostid: bytes | None = None,
    concat: bool = False,
    trtype: str = "tcp",
) -> Controller:
    """Create a controller on the subsystem `subnqn` at address:port and bring it up:
    admin queue, enable, Identify, `queues` I/O queues, namespaces.

    `disable_sqflow` asks for SQ flow control off (Connect CATTR), which lets a
    controller complete a read with its last C2HData PDU instead of a CapsuleResp.

    `dhchap_secret` (a DHHC-1 string as `nvme gen-dhchap-key` writes, or a DhchapKey)
    authenticates every queue with DH-HMAC-CHAP when the controller asks;
    `dhchap_ctrl_secret` also has the controller prove it holds its own secret
    (bidirectional). A failure raises NvmeAuthenticationError; a malformed secret,
    KeyFormatError (a ValueError) before anything is sent.

    `io_hostid`: a Host Identifier for the I/O queue Connects other than the admin
    queue's (`hostid`), as some hosts send and Linux nvmet and SPDK accept; for testing
    targets. By default every Connect carries `hostid`, as Linux's host does.

    `concat` (nvme-cli's ``--concat``): secure channel concatenation. The admin queue
    authenticates over plain TCP asking for a TLS PSK, then every queue connects over TLS
    1.3 with the PSK that authentication generated (identity ``NVMe1G0x <hostnqn>
    <subnqn> <digest>``). It needs `dhchap_secret` and no `tls_psk`, as Linux's host; the
    listener must take both plain and TLS connections (nvmet's TREQ "not required").

    `trtype` "rdma": every queue over NVMe/RDMA (pynvmf.rdma.host_verbs, through rdma-core's
    pyverbs, which must be installed), to an RDMA CM address and port; no TLS or digests
    there (they are NVMe/TCP's).
    """
    if trtype not in TRTYPES:
        raise ValueError(f"trtype: {trtype!r} is not one of {', '.join(TRTYPES)}")
    if trtype == "rdma" and (tls_psk is not None or concat or header_digest or data_digest):
        raise ValueError("trtype rdma: TLS, secure channel concatenation and digests are TCP's")
    if queue_depth < 1:
        raise ValueError("queue_depth must be at least 1")
    host_key = DhchapKey.parse(dhchap_secret) if isinstance(dhchap_secret, str) else dhchap_secret
    ctrl_key = (
        DhchapKey.parse(dhchap_ctrl_secret)
        if isinstance(dhchap_ctrl_secret, str)
        else dhchap_ctrl_secret
    )
    if ctrl_key is not None and host_key is None:
        raise ValueError("a controller secret needs a host secret too")
    if concat and host_key is None:
        raise ValueError("secure channel concatenation needs a DH-HMAC-CHAP secret")
    if concat and tls_psk is not None:
        raise ValueError("secure channel concatenation generates its TLS PSK: give none")
    identity = HostIdentity.resolve(hostnqn, hostid)
    io_identity = None if io_hostid is None else HostIdentity.resolve(identity.hostnqn, io_hostid)
    psk = _tls_psk(tls_psk, identity.hostnqn, subnqn, tls_identity, tls_compat)
    ctrl = Controller(
        address,
        port,
        subnqn,
        identity,
        kato_ms=kato_ms,
        header_digest=header_digest,
        data_digest=data_digest,
        disable_sqflow=disable_sqflow,
        max_transfer=max_transfer,
        timeout=timeout,
        dhchap_secret=host_key,
        dhchap_ctrl_secret=ctrl_key,
        tls_psk=psk,
        ktls=ktls,
        io_identity=io_identity,
        concat=concat,
        trtype=trtype,
    )
    try:
        await ctrl._start(queues, queue_depth)
    except BaseException:
        ctrl._closed = True
        if ctrl._keep_alive_task is not None:
            ctrl._keep_alive_task.cancel()
        ctrl._abort_queues("connect failed")
        raise
    return ctrl


def _tls_psk(
    psk: str | ConfiguredPsk | TlsPsk | None,
    hostnqn: str,
    subnqn: str,
    version: int,
    compat: bool = False,
) -> TlsPsk | None:
    """The TLS PSK every queue's handshake uses: the interchange format (what ``nvme
    gen-tls-key`` prints) or a configured PSK, derived for this host and subsystem with
    identity version `version` (0: ``NVMe0R0x <hostnqn> <subnqn>``, what Linux 6.12 offers;
    1: the ``NVMe1R0x`` digest form) and, with `compat`, the way libnvme < 1.14 (nvme-cli
    2.13) derived the keys it put in a target's keyring; or a TLS PSK as it is."""
    if psk is None or isinstance(psk, TlsPsk):
        return psk
    if isinstance(psk, str):
        psk = ConfiguredPsk.parse(psk)
    if version not in (0, 1):
        raise ValueError("tls_identity is 0 or 1")
    return tls_psk(psk, hostnqn, subnqn, version, compat=compat)
