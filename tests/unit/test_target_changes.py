"""The Target's change methods: each validates the whole change before applying any of
it, and decides what the controllers of connected hosts are told.

The target here is not started (no sockets); controllers are made directly, as
Connect makes them, so that what they are told can be read back.
"""

from __future__ import annotations

import socket
import uuid

import pytest

from pynvmf.block.file import FileDevice
from pynvmf.block.memory import MemoryDevice
from pynvmf.spec.identify import Oaes
from pynvmf.spec.logpages import CHANGED_NS_MAX, LogPageId
from pynvmf.spec.opcodes import DISCOVERY_NQN, NOTICE_DISC_LOG_CHANGED, AsyncEventType
from pynvmf.target.changes import ChangeError
from pynvmf.target.controller import Controller
from pynvmf.target.devices import NamedDevice
from pynvmf.target.port import Port, SecureChannelPolicy
from pynvmf.target.target import Target, TargetState
from pynvmf.tcp.target import TransportConfig

NQN = "nqn.2024-11.dev.pynvmf:changes"
OTHER = "nqn.2024-11.dev.pynvmf:other"
HOST_A = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-4000-8000-00000000000a"
HOST_B = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-4000-8000-00000000000b"
MIB = 1 << 20


def memory(name: str, *, device_uuid: uuid.UUID | None = None) -> NamedDevice:
    return NamedDevice.wrap(name, MemoryDevice(MIB), device_uuid=device_uuid)


def snapshot(target: Target) -> tuple[object, ...]:
    """What a refused change must leave as it was."""
    return (
        target.genctr,
        sorted(target.block_devices),
        {
            nqn: (sorted(s.namespaces), sorted(s.allowed_hosts), s.allow_any_host)
            for nqn, s in target.subsystems.items()
        },
        [(p.address, p.port, p.subsystems, p.discovery_only) for p in target.ports],
    )


def controller(target: Target, nqn: str, hostnqn: str = HOST_A, *, aen: int = 0) -> Controller:
    subsystem = target.discovery if nqn == DISCOVERY_NQN else target.subsystems[nqn]
    cntlid = subsystem.allocate_cntlid()
    assert cntlid is not None
    ctrl = Controller(target, subsystem, cntlid, hostnqn, bytes(16), 0, target.ports[0])
    ctrl.aen_config = aen
    subsystem.controllers[cntlid] = ctrl
    return ctrl


@pytest.fixture
def target() -> Target:
    t = Target(ports=[Port("127.0.0.1", 14000)])  # not started: nothing listens
    t.add_subsystem(NQN)
    return t


# -- subsystems ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nqn", "field"),
    [
        ("", "nqn"),
        ("has space", "nqn"),
        ("x" * 224, "nqn"),
        ("nqn.2014-08.org.nvmexpress:uuid:not-a-uuid", "nqn"),
        (DISCOVERY_NQN, "nqn"),
        (NQN, "nqn"),  # exists
    ],
)
def test_a_subsystem_with_a_bad_nqn_is_refused_and_nothing_changes(
    target: Target, nqn: str, field: str
) -> None:
    before = snapshot(target)
    with pytest.raises(ChangeError) as info:
        target.add_subsystem(nqn)
    assert info.value.field == field
    assert snapshot(target) == before


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"serial": "S" * 21}, "serial"),
        ({"model": "caf\u00e9"}, "model"),
        ({"cntlid_min": 10, "cntlid_max": 9}, "cntlid_min"),
        ({"cntlid_max": 0xFFF0}, "cntlid_min"),
        ({"hosts": ["bad host"]}, "hostnqn"),
        ({"max_io_queues": 0}, "max_io_queues"),
        ({"ieee_oui": 1 << 24}, "ieee_oui"),
    ],
)
def test_subsystem_attributes_are_checked_before_it_is_added(
    target: Target, kwargs: dict[str, object], field: str
) -> None:
    before = snapshot(target)
    with pytest.raises(ChangeError) as info:
        target.add_subsystem(OTHER, **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    assert snapshot(target) == before


def test_controller_ids_come_from_the_subsystems_range(target: Target) -> None:
    subsystem = target.add_subsystem(OTHER, cntlid_min=5, cntlid_max=6)
    assert [subsystem.allocate_cntlid() for _ in range(3)] == [5, 6, 5]
    subsystem.controllers = {5: None, 6: None}  # type: ignore[dict-item]
    assert subsystem.allocate_cntlid() is None


def test_the_maximum_number_of_subsystems_is_enforced(target: Target) -> None:
    target.max_subsystems = 1
    with pytest.raises(ChangeError, match="maximum"):
        target.add_subsystem(OTHER)


async def test_removing_a_subsystem_tears_down_its_controllers_and_listeners(
    target: Target,
) -> None:
    target.add_block_device(memory("kept"))
    target.add_namespace(NQN, "kept")
    owned = NamedDevice.wrap("owned", MemoryDevice(MIB), owned=True)
    target.add_namespace(NQN, owned)
    port = await target.add_listener(NQN, "127.0.0.1", 14420)
    ctrl = controller(target, NQN)
    genctr = target.genctr
    await target.remove_subsystem(NQN)
    assert NQN not in target.subsystems
    assert ctrl.destroyed
    assert not any(p is port for p in target.ports)  # its only subsystem went: it closed
    assert "kept" in target.block_devices and "owned" not in target.block_devices
    assert owned.device.closed  # type: ignore[attr-defined]
    assert target.genctr > genctr


async def test_a_subsystem_that_is_not_there_cannot_be_removed(target: Target) -> None:
    with pytest.raises(ChangeError) as info:
        await target.remove_subsystem(OTHER)
    assert info.value.field == "nqn"


# -- namespaces ---------------------------------------------------------------------------


def test_namespaces_take_the_lowest_free_nsid(target: Target) -> None:
    for name in ("a", "b", "c"):
        target.add_block_device(memory(name))
    assert target.add_namespace(NQN, "a", nsid=2).nsid == 2
    assert target.add_namespace(NQN, "b").nsid == 1
    assert target.add_namespace(NQN, "c").nsid == 3


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"nsid": 1}, "nsid"),  # in use
        ({"nsid": 0}, "nsid"),
        ({"nsid": 0xFFFFFFFF}, "nsid"),
        ({"nguid": bytes(15)}, "nguid"),
        ({"eui64": bytes(9)}, "eui64"),
    ],
)
def test_a_bad_namespace_is_refused_and_nothing_changes(
    target: Target, kwargs: dict[str, object], field: str
) -> None:
    target.add_block_device(memory("a"))
    target.add_block_device(memory("b"))
    target.add_namespace(NQN, "a", nsid=1)
    before = snapshot(target)
    with pytest.raises(ChangeError) as info:
        target.add_namespace(NQN, "b", **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    assert snapshot(target) == before


def test_a_device_serves_one_namespace(target: Target) -> None:
    target.add_subsystem(OTHER)
    target.add_block_device(memory("a"))
    target.add_namespace(NQN, "a")
    with pytest.raises(ChangeError, match="in use") as info:
        target.add_namespace(OTHER, "a")
    assert info.value.field == "device"
    with pytest.raises(ChangeError) as info:
        target.add_namespace(OTHER, "missing")
    assert info.value.field == "device"


def test_a_subsystem_with_a_namespace_limit_reports_it_and_keeps_to_it(target: Target) -> None:
    target.add_subsystem(OTHER, max_namespaces=2)
    for name in ("a", "b", "c"):
        target.add_block_device(memory(name))
    target.add_namespace(OTHER, "a")
    target.add_namespace(OTHER, "b")
    with pytest.raises(ChangeError, match="no free NSID"):
        target.add_namespace(OTHER, "c")
    with pytest.raises(ChangeError):
        target.add_namespace(OTHER, "c", nsid=3)


def test_namespace_identities_default_to_the_devices_and_must_differ(target: Target) -> None:
    dev_uuid = uuid.UUID("91fdba0d-f87b-4c25-b80f-db7be1418b9e")
    target.add_block_device(memory("a", device_uuid=dev_uuid))
    target.add_block_device(memory("b"))
    ns = target.add_namespace(NQN, "a")
    assert ns.uuid == dev_uuid and ns.nguid == dev_uuid.bytes
    with pytest.raises(ChangeError) as info:
        target.add_namespace(NQN, "b", ns_uuid=dev_uuid)
    assert info.value.field == "uuid"
    given = uuid.uuid4()
    other = target.add_namespace(NQN, "b", ns_uuid=given, nguid=bytes(range(16)))
    assert other.uuid == given and other.nguid == bytes(range(16))


def test_derived_identities_do_not_change_across_targets() -> None:
    def build() -> tuple[object, ...]:
        t = Target()
        t.add_subsystem(NQN)
        t.add_block_device(memory("a"))
        ns = t.add_namespace(NQN, "a", nsid=3)
        return ns.uuid, ns.nguid, ns.eui64

    assert build() == build()


async def test_hosts_are_told_of_namespaces_that_come_and_go(target: Target) -> None:
    target.add_block_device(memory("a"))
    enabled = controller(target, NQN, aen=Oaes.NS_ATTR)
    disabled = controller(target, NQN, HOST_B)
    target.add_namespace(NQN, "a", nsid=4)
    assert enabled.changed_nsids == [4] and disabled.changed_nsids == [4]
    # One event (Notice, Namespace Attribute Changed, log page 04h) for the enabled one.
    assert list(enabled.pending_events) == [AsyncEventType.NOTICE | LogPageId.CHANGED_NS << 16]
    assert not disabled.pending_events
    await target.remove_namespace(NQN, 4)
    assert enabled.take_changed_nsids() == [4]
    assert enabled.changed_nsids == []
    # The log page was not read: its event stays masked, no second one.
    assert len(enabled.pending_events) == 1
    assert "a" in target.block_devices  # a named device outlives its namespace


def test_more_changes_than_the_log_holds_overflow_without_growing(target: Target) -> None:
    ctrl = controller(target, NQN)
    for nsid in range(1, 3 * CHANGED_NS_MAX):
        ctrl.namespace_changed(nsid)
    assert len(ctrl.changed_nsids) == CHANGED_NS_MAX + 1  # packs as FFFFFFFFh


async def test_removing_a_device_removes_the_namespace_on_it(target: Target) -> None:
    entry = target.add_block_device(memory("a"))
    target.add_namespace(NQN, "a")
    ctrl = controller(target, NQN)
    await target.remove_block_device("a")
    assert not target.subsystems[NQN].namespaces
    assert ctrl.changed_nsids == [1]
    assert entry.device.closed  # type: ignore[attr-defined]
    assert not ctrl.destroyed


async def test_an_owned_device_goes_with_its_namespace(target: Target, tmp_path) -> None:  # type: ignore[no-untyped-def]
    device = FileDevice(tmp_path / "ns.img", 512, size_bytes=MIB, create=True)
    target.add_namespace(NQN, NamedDevice.wrap("f", device, owned=True), nsid=1)
    assert target.block_devices["f"].path == str((tmp_path / "ns.img").resolve())
    await target.remove_namespace(NQN, 1)
    assert "f" not in target.block_devices and device.closed


# -- hosts ----------------------------------------------------------------------------------


def test_removing_a_host_tears_down_its_controllers_only(target: Target) -> None:
    target.set_allow_any_host(NQN, False)
    target.add_host(NQN, HOST_A)
    target.add_host(NQN, HOST_B)
    a, b = controller(target, NQN, HOST_A), controller(target, NQN, HOST_B)
    target.remove_host(NQN, HOST_A)
    assert a.destroyed and not b.destroyed
    with pytest.raises(ChangeError) as info:
        target.remove_host(NQN, HOST_A)
    assert info.value.field == "hostnqn"
    with pytest.raises(ChangeError, match="already"):
        target.add_host(NQN, HOST_B)


def test_revoking_any_host_tears_down_controllers_of_hosts_not_listed(target: Target) -> None:
    target.add_host(NQN, HOST_B)
    a, b = controller(target, NQN, HOST_A), controller(target, NQN, HOST_B)
    target.set_allow_any_host(NQN, False)
    assert a.destroyed and not b.destroyed


def test_discovery_controllers_that_asked_are_told_of_changes(target: Target) -> None:
    armed = controller(target, DISCOVERY_NQN, aen=Oaes.DISCOVERY_CHANGE)
    quiet = controller(target, DISCOVERY_NQN, HOST_B)
    genctr = target.genctr
    target.add_host(NQN, HOST_B)
    assert target.genctr == genctr + 1
    event = AsyncEventType.NOTICE | NOTICE_DISC_LOG_CHANGED << 8 | LogPageId.DISCOVERY << 16
    assert list(armed.pending_events) == [event]
    assert not quiet.pending_events


# -- ports and listeners -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("port", "field"),
    [
        (Port("localhost", 1), "address"),
        (Port("127.0.0.1", 70000), "port"),
        (Port("127.0.0.1", 1, transport=TransportConfig(inline_data_size=100)), "inline_data_size"),
        (Port("127.0.0.1", 1, transport=TransportConfig(max_h2c_data=1024)), "max_h2c_data"),
    ],
)
async def test_a_bad_port_is_refused(target: Target, port: Port, field: str) -> None:
    before = snapshot(target)
    with pytest.raises(ChangeError) as info:
        await target.add_port(port)
    assert info.value.field == field
    assert snapshot(target) == before


async def test_listeners_open_ports_and_the_last_one_closes_them(target: Target) -> None:
    target.add_subsystem(OTHER)
    port = await target.add_listener(NQN, "127.0.0.1", 14420)
    assert port.subsystems == [NQN] and not port.discovery_only
    assert await target.add_listener(OTHER, "127.0.0.1", 14420) is port
    assert port.subsystems == [NQN, OTHER]
    with pytest.raises(ChangeError) as info:
        await target.add_listener(NQN, "127.0.0.1", 14420)
    assert info.value.field == "address"
    await target.remove_listener(NQN, "127.0.0.1", 14420)
    assert port.subsystems == [OTHER]
    with pytest.raises(ChangeError):
        await target.remove_listener(NQN, "127.0.0.1", 14420)
    await target.remove_listener(OTHER, "127.0.0.1", 14420)
    assert target.find_port("127.0.0.1", 14420) is None


async def test_a_port_with_a_discovery_listener_stays_for_discovery(target: Target) -> None:
    port = await target.add_listener(DISCOVERY_NQN, "::1", 18009)
    assert port.discovery_only
    assert await target.add_listener(NQN, "0:0::1", 18009) is port  # the same address
    assert not port.discovery_only and port.exposes(NQN)
    await target.remove_listener(NQN, "::1", 18009)
    assert port.discovery_only and target.find_port("::1", 18009) is port
    await target.remove_listener(DISCOVERY_NQN, "::1", 18009)
    assert target.find_port("::1", 18009) is None


async def test_a_port_for_every_subsystem_drops_one_by_listing_the_others(target: Target) -> None:
    target.add_subsystem(OTHER)
    port = target.ports[0]
    assert port.subsystems is None
    assert await target.add_listener(NQN, port.address, port.port) is port
    await target.remove_listener(NQN, port.address, port.port)
    assert port.subsystems == [OTHER]


async def test_removing_a_port_tears_down_controllers_through_it(target: Target) -> None:
    ctrl = controller(target, NQN)
    disc = controller(target, DISCOVERY_NQN)

    class FakeQueue:
        port = target.ports[0]
        closed = ""

        def close(self, reason: str) -> None:
            self.closed = reason

    ctrl.queues[0] = disc.queues[0] = FakeQueue()  # type: ignore[assignment]
    await target.remove_port(target.ports[0])
    assert ctrl.destroyed and disc.destroyed
    assert not target.ports


def test_the_transport_for_new_listeners_is_checked(target: Target) -> None:
    with pytest.raises(ChangeError) as info:
        target.set_transport(TransportConfig(inline_data_size=17))
    assert info.value.field == "inline_data_size"
    target.set_transport(TransportConfig(inline_data_size=4096))
    assert target.transport.inline_data_size == 4096


async def test_a_port_takes_its_secure_channel_by_name(target: Target) -> None:
    port = await target.add_port(Port("127.0.0.1", 14421, secure_channel="optional"))  # type: ignore[arg-type]
    assert port.secure_channel is SecureChannelPolicy.OPTIONAL and port.offers_tls
    with pytest.raises(ChangeError) as info:
        await target.add_listener(NQN, "127.0.0.1", 14421, secure_channel="required")
    assert info.value.reason == "127.0.0.1:14421 already listens with secure channel 'optional'"
    with pytest.raises(ChangeError) as info:
        await target.add_port(Port("127.0.0.1", 14422, secure_channel="maybe"))  # type: ignore[arg-type]
    assert info.value.field == "secure_channel"
    assert info.value.reason == "'maybe' is not one of ('none', 'required', 'optional')"


# -- lifecycle ----------------------------------------------------------------------------


async def test_a_target_starts_once_and_stops_once() -> None:
    target = Target(ports=[Port("127.0.0.1", 0)])
    assert target.state is TargetState.NEW
    late = Port("127.0.0.1", 0)
    await target.add_port(late)
    assert late.server is None  # a new target listens once it starts
    await target.start()
    assert target.state is TargetState.RUNNING
    assert all(port.server is not None for port in target.ports)
    await target.add_port(Port("127.0.0.1", 0))
    assert target.ports[-1].server is not None  # a running one at once
    await target.stop()
    await target.stop()
    assert target.state is TargetState.STOPPED
    assert all(port.server is None for port in target.ports)
    with pytest.raises(RuntimeError):
        await target.start()
    assert all(port.server is None for port in target.ports)


async def test_a_start_that_fails_stops_the_target() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        target = Target(ports=[Port("127.0.0.1", 0), Port("127.0.0.1", taken.getsockname()[1])])
        with pytest.raises(ChangeError):
            await target.start()
    assert target.state is TargetState.STOPPED
    assert target.ports[0].server is None
