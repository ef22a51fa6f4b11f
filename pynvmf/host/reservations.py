"""Reservations from the host side: the commands and features of one namespace.

`RemoteNamespace` has these methods (it derives from `NamespaceReservations`); a
controller's Reservation Notification log page and Host Identifier are
`Controller.reservation_notification()` and `Controller.host_identifier()`. A command the
controller fails raises NvmeStatusError, e.g. with `status == Status.RESERVATION_CONFLICT`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pynvmf.spec import reservations as R
from pynvmf.spec.opcodes import FeatureId, IoOpcode
from pynvmf.spec.reservations import (
    AcquireAction,
    Cptpl,
    RegisterAction,
    ReleaseAction,
    ReservationStatus,
)

if TYPE_CHECKING:
    from pynvmf.host.controller import Controller

# A report's first read: the header and 63 registrants; a larger answer is read again.
_REPORT_FIRST_READ = 4096


class NamespaceReservations:
    """The reservation commands of namespace `nsid` of `controller`."""

    controller: Controller
    nsid: int

    async def reservation_register(
        self,
        *,
        nrkey: int = 0,
        crkey: int = 0,
        action: RegisterAction = RegisterAction.REGISTER,
        iekey: bool = False,
        cptpl: int = Cptpl.NO_CHANGE,
    ) -> None:
        """Register `nrkey`, unregister (`crkey`), or replace `crkey` by `nrkey`."""
        await self.controller.next_queue().execute(
            IoOpcode.RESERVATION_REGISTER,
            self.nsid,
            R.register_cdw10(action, iekey=iekey, cptpl=cptpl),
            data=R.REGISTER_DATA.pack(crkey, nrkey),
        )

    async def reservation_acquire(
        self,
        rtype: int,
        *,
        crkey: int,
        prkey: int = 0,
        action: AcquireAction = AcquireAction.ACQUIRE,
        iekey: bool = False,
    ) -> None:
        """Acquire a reservation of type `rtype`, or preempt the registrants (and the
        reservation) of key `prkey`, with Preempt and Abort their commands too."""
        await self.controller.next_queue().execute(
            IoOpcode.RESERVATION_ACQUIRE,
            self.nsid,
            R.acquire_cdw10(action, rtype, iekey=iekey),
            data=R.ACQUIRE_DATA.pack(crkey, prkey),
        )

    async def reservation_release(
        self,
        rtype: int,
        *,
        crkey: int,
        action: ReleaseAction = ReleaseAction.RELEASE,
        iekey: bool = False,
    ) -> None:
        """Release the reservation (of type `rtype`), or clear every registration."""
        await self.controller.next_queue().execute(
            IoOpcode.RESERVATION_RELEASE,
            self.nsid,
            R.release_cdw10(action, rtype, iekey=iekey),
            data=R.RELEASE_DATA.pack(crkey),
        )

    async def reservation_report(
        self, *, extended: bool = True, length: int | None = None
    ) -> ReservationStatus:
        """The Reservation Status: every registrant unless `length` (bytes) is given and
        too small for them (then `count` still says how many there are)."""
        size = length or _REPORT_FIRST_READ
        status = await self._report(size, extended)
        if length is None and len(status.registrants) < status.count:
            entry = R.REGCTL_EXT_SIZE if extended else R.REGCTL_SIZE
            head = R.STATUS_HEADER_EXTENDED_SIZE if extended else R.STATUS_HEADER_SIZE
            status = await self._report(head + entry * status.count, extended)
        return status

    async def _report(self, length: int, extended: bool) -> ReservationStatus:
        buf = bytearray(length)
        await self.controller.next_queue().execute(
            IoOpcode.RESERVATION_REPORT,
            self.nsid,
            R.report_numd(length),
            R.REPORT_EDS if extended else 0,
            into=memoryview(buf),
        )
        return ReservationStatus.unpack(buf, extended=extended)

    # -- features -------------------------------------------------------------------

    async def reservation_notification_mask(self) -> int:
        """This controller's Reservation Notification Mask for the namespace (Feature 82h)."""
        return await self.controller.get_features(FeatureId.RESERVATION_MASK, nsid=self.nsid)

    async def set_reservation_notification_mask(self, mask: int) -> None:
        await self.controller.set_features(FeatureId.RESERVATION_MASK, mask, nsid=self.nsid)

    async def reservation_persistence(self) -> bool:
        """Whether the namespace's reservations persist through power loss (Feature 83h)."""
        value = await self.controller.get_features(
            FeatureId.RESERVATION_PERSISTENCE, nsid=self.nsid
        )
        return bool(value & R.FEATURE_PTPL)

    async def set_reservation_persistence(self, ptpl: bool) -> None:
        await self.controller.set_features(
            FeatureId.RESERVATION_PERSISTENCE, R.FEATURE_PTPL if ptpl else 0, nsid=self.nsid
        )
