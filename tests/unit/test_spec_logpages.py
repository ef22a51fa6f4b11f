"""Log page structures: round trips and byte offsets pinned to the NVMe specifications."""

import contextlib
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pynvmf.spec.logpages import (
    CHANGED_NS_LOG_SIZE,
    CHANGED_NS_MAX,
    CHANGED_NS_OVERFLOW,
    CMD_EFFECTS_LOG_SIZE,
    DISC_ENTRY_SIZE,
    DISC_HEADER_SIZE,
    ERROR_ENTRY_SIZE,
    FW_SLOT_LOG_SIZE,
    SMART_LOG_SIZE,
    AdrFam,
    ChangedNsList,
    CmdEffects,
    CmdEffectsLog,
    CriticalWarning,
    DiscEflags,
    DiscoveryLogEntry,
    DiscoveryLogHeader,
    DiscoveryLogPage,
    ErrorLog,
    ErrorLogEntry,
    FwSlotLog,
    LogPageId,
    SmartLog,
    SubType,
    TcpSecType,
    Treq,
    TrType,
    discovery_log,
    log_window,
)


def u16(buf: bytes, off: int) -> int:
    return struct.unpack_from("<H", buf, off)[0]


def u32(buf: bytes, off: int) -> int:
    return struct.unpack_from("<I", buf, off)[0]


def u64(buf: bytes, off: int) -> int:
    return struct.unpack_from("<Q", buf, off)[0]


def u128(buf: bytes, off: int) -> int:
    return int.from_bytes(buf[off : off + 16], "little")


def test_log_page_ids() -> None:
    assert LogPageId.ERROR == 0x01
    assert LogPageId.SMART == 0x02
    assert LogPageId.FW_SLOT == 0x03
    assert LogPageId.CHANGED_NS == 0x04
    assert LogPageId.CMD_EFFECTS == 0x05
    assert LogPageId.ANA == 0x0C
    assert LogPageId.DISCOVERY == 0x70


class TestLogWindow:
    def test_slices(self) -> None:
        page = bytes(range(16))
        assert log_window(page, 4, 4) == bytes([4, 5, 6, 7])

    def test_zero_fills_past_end(self) -> None:
        assert log_window(b"\x01\x02", 0, 8) == b"\x01\x02" + bytes(6)
        assert log_window(b"\x01\x02", 2, 4) == bytes(4)

    def test_offset_beyond_page(self) -> None:
        with pytest.raises(ValueError):
            log_window(bytes(8), 12, 4)


def sample_error() -> ErrorLogEntry:
    return ErrorLogEntry(
        error_count=0x0102030405060708,
        sqid=1,
        cid=0x1234,
        status=(0x0B << 1) | 1,
        param_error_location=0x0204,
        lba=0xDEADBEEF00,
        nsid=7,
        vs=0x80,
        trtype=TrType.TCP,
        csi=0,
        opcode=0x02,
        cs=0x1122334455667788,
        trtype_specific=0xABCD,
        log_page_version=1,
    )


class TestErrorLog:
    def test_entry_offsets(self) -> None:
        d = sample_error().pack()
        assert len(d) == ERROR_ENTRY_SIZE
        assert u64(d, 0) == 0x0102030405060708
        assert (u16(d, 8), u16(d, 10), u16(d, 12), u16(d, 14)) == (1, 0x1234, 0x17, 0x0204)
        assert u64(d, 16) == 0xDEADBEEF00
        assert u32(d, 24) == 7
        assert tuple(d[28:32]) == (0x80, 3, 0, 0x02)  # VS, TRTYPE, CSI, opcode
        assert u64(d, 32) == 0x1122334455667788
        assert u16(d, 40) == 0xABCD
        assert d[42:63] == bytes(21)
        assert d[63] == 1

    def test_entry_round_trip(self) -> None:
        entry = sample_error()
        assert ErrorLogEntry.unpack(entry.pack()) == entry

    def test_log_slots_and_round_trip(self) -> None:
        log = ErrorLog([sample_error(), ErrorLogEntry(error_count=1, sqid=2)], slots=4)
        data = log.pack()
        assert len(data) == 4 * ERROR_ENTRY_SIZE
        assert data[2 * ERROR_ENTRY_SIZE :] == bytes(2 * ERROR_ENTRY_SIZE)
        assert ErrorLog.unpack(data) == log

    def test_entry_rejects_out_of_range(self) -> None:
        with pytest.raises(ValueError):
            ErrorLogEntry(sqid=1 << 16).pack()


def sample_smart() -> SmartLog:
    return SmartLog(
        critical_warning=CriticalWarning.TEMPERATURE | CriticalWarning.READ_ONLY,
        composite_temp=273 + 40,
        avail_spare=100,
        spare_thresh=10,
        percent_used=3,
        eg_crit_warning_summary=1,
        data_units_read=(1 << 64) + 1,
        data_units_written=2,
        host_read_cmds=3,
        host_write_cmds=4,
        ctrl_busy_time=5,
        power_cycles=6,
        power_on_hours=7,
        unsafe_shutdowns=8,
        media_errors=9,
        num_err_log_entries=(1 << 127) | 10,
        warning_temp_time=11,
        critical_temp_time=12,
        temp_sensors=[301, 302, 303, 304, 0, 0, 0, 308],
        thm_temp1_trans_count=13,
        thm_temp2_trans_count=14,
        thm_temp1_total_time=15,
        thm_temp2_total_time=16,
    )


class TestSmartLog:
    def test_offsets(self) -> None:
        d = sample_smart().pack()
        assert len(d) == SMART_LOG_SIZE
        assert d[0] == 0b1010
        assert u16(d, 1) == 313  # composite temperature, Kelvin
        assert tuple(d[3:7]) == (100, 10, 3, 1)
        assert d[7:32] == bytes(25)
        assert u128(d, 32) == (1 << 64) + 1  # data units read
        assert u128(d, 48) == 2  # data units written
        assert [u128(d, off) for off in range(64, 176, 16)] == [3, 4, 5, 6, 7, 8, 9]
        assert u128(d, 176) == (1 << 127) | 10  # error log entries
        assert (u32(d, 192), u32(d, 196)) == (11, 12)
        assert [u16(d, off) for off in range(200, 216, 2)] == [301, 302, 303, 304, 0, 0, 0, 308]
        assert [u32(d, off) for off in range(216, 232, 4)] == [13, 14, 15, 16]
        assert d[232:] == bytes(SMART_LOG_SIZE - 232)

    def test_round_trip(self) -> None:
        log = sample_smart()
        assert SmartLog.unpack(log.pack()) == log

    def test_default_is_zero(self) -> None:
        assert SmartLog().pack() == bytes(SMART_LOG_SIZE)

    def test_rejects(self) -> None:
        with pytest.raises(ValueError):
            SmartLog(data_units_read=1 << 128).pack()
        with pytest.raises(ValueError):
            SmartLog(composite_temp=1 << 16).pack()
        with pytest.raises(ValueError):
            SmartLog(temp_sensors=[0] * 7).pack()


class TestFwSlotLog:
    def test_offsets(self) -> None:
        log = FwSlotLog(afi=0x21, frs=["1.0", "", "", "", "", "", "ABCDEFGH"])
        d = log.pack()
        assert len(d) == FW_SLOT_LOG_SIZE
        assert d[0] == 0x21
        assert d[1:8] == bytes(7)
        assert d[8:16] == b"1.0     "
        assert d[16:56] == bytes(40)  # empty slots are zero, not spaces
        assert d[56:64] == b"ABCDEFGH"
        assert d[64:] == bytes(FW_SLOT_LOG_SIZE - 64)
        assert log.active_slot == 1
        assert log.next_slot == 2

    def test_round_trip(self) -> None:
        log = FwSlotLog(afi=1, frs=["6.8.0", "x", "", "", "", "", ""])
        assert FwSlotLog.unpack(log.pack()) == log

    def test_short_list_is_padded(self) -> None:
        assert FwSlotLog.unpack(FwSlotLog(afi=1, frs=["1"]).pack()).frs == ["1"] + [""] * 6

    def test_rejects(self) -> None:
        with pytest.raises(ValueError):
            FwSlotLog(frs=["123456789"]).pack()
        with pytest.raises(ValueError):
            FwSlotLog(frs=[""] * 8).pack()


class TestChangedNsList:
    def test_layout_and_round_trip(self) -> None:
        log = ChangedNsList([1, 5, 9])
        d = log.pack()
        assert len(d) == CHANGED_NS_LOG_SIZE
        assert struct.unpack_from("<4I", d) == (1, 5, 9, 0)
        assert ChangedNsList.unpack(d) == log
        assert not log.overflow

    def test_full_list(self) -> None:
        log = ChangedNsList(list(range(1, CHANGED_NS_MAX + 1)))
        assert not log.overflow
        assert ChangedNsList.unpack(log.pack()) == log

    def test_overflow(self) -> None:
        d = ChangedNsList(list(range(1, CHANGED_NS_MAX + 2))).pack()
        assert u32(d, 0) == CHANGED_NS_OVERFLOW
        assert d[4:] == bytes(CHANGED_NS_LOG_SIZE - 4)
        back = ChangedNsList.unpack(d)
        assert back.overflow
        assert back.nsids == [CHANGED_NS_OVERFLOW]

    def test_empty(self) -> None:
        assert ChangedNsList().pack() == bytes(CHANGED_NS_LOG_SIZE)


class TestCmdEffectsLog:
    def test_offsets(self) -> None:
        log = CmdEffectsLog.from_opcodes(
            {0x02: CmdEffects.CSUPP, 0x06: CmdEffects.CSUPP, 0xFF: 0xFFFFFFFF},
            {0x01: CmdEffects.CSUPP | CmdEffects.LBCC, 0x80: CmdEffects.CSE_SAME_NS},
        )
        d = log.pack()
        assert len(d) == CMD_EFFECTS_LOG_SIZE
        assert u32(d, 4 * 0x02) == 1
        assert u32(d, 4 * 0x06) == 1
        assert u32(d, 4 * 0xFF) == 0xFFFFFFFF
        assert u32(d, 1024 + 4 * 0x01) == 0b11
        assert u32(d, 1024 + 4 * 0x80) == 1 << 16
        assert d[2048:] == bytes(2048)
        assert CmdEffectsLog.unpack(d) == log

    def test_effect_bits(self) -> None:
        assert CmdEffects.CSUPP == 1 << 0
        assert CmdEffects.LBCC == 1 << 1
        assert CmdEffects.NCC == 1 << 2
        assert CmdEffects.NIC == 1 << 3
        assert CmdEffects.CCC == 1 << 4
        assert CmdEffects.CSE_MASK == 0x7 << 16
        assert CmdEffects.USS == 1 << 19

    def test_rejects_wrong_length(self) -> None:
        with pytest.raises(ValueError):
            CmdEffectsLog(acs=[0] * 255).pack()


def tcp_entry(**overrides: object) -> DiscoveryLogEntry:
    values: dict[str, object] = {
        "trtype": TrType.TCP,
        "adrfam": AdrFam.IPV4,
        "subtype": SubType.NVME,
        "treq": Treq.NOT_REQUIRED | Treq.DISABLE_SQFLOW,
        "portid": 1,
        "cntlid": 0xFFFF,
        "asqsz": 32,
        "eflags": DiscEflags.EPCSD,
        "trsvcid": "4420",
        "subnqn": "nqn.2024-01.io.pynvmf:disk0",
        "traddr": "192.168.10.20",
        "tsas": bytes([TcpSecType.NONE]),
    }
    values.update(overrides)
    return DiscoveryLogEntry(**values)  # type: ignore[arg-type]


class TestDiscoveryLog:
    def test_entry_offsets(self) -> None:
        d = tcp_entry(tsas=bytes([TcpSecType.TLS13])).pack()
        assert len(d) == DISC_ENTRY_SIZE
        assert tuple(d[0:4]) == (3, 1, 2, 0b110)  # TRTYPE, ADRFAM, SUBTYPE, TREQ
        assert (u16(d, 4), u16(d, 6), u16(d, 8), u16(d, 10)) == (1, 0xFFFF, 32, 2)
        assert d[12:32] == bytes(20)
        assert d[32:64] == b"4420".ljust(32, b" ")  # TRSVCID, space padded
        assert d[64:256] == bytes(192)
        nqn = b"nqn.2024-01.io.pynvmf:disk0"
        assert d[256 : 256 + len(nqn)] == nqn  # SUBNQN, NUL padded
        assert d[256 + len(nqn) : 512] == bytes(256 - len(nqn))
        assert d[512:768] == b"192.168.10.20".ljust(256, b" ")  # TRADDR
        assert d[768] == TcpSecType.TLS13  # TSAS.SECTYPE
        assert d[769:] == bytes(255)

    def test_entry_round_trip(self) -> None:
        entry = tcp_entry()
        back = DiscoveryLogEntry.unpack(entry.pack())
        assert back == entry
        assert back.tcp_sectype == TcpSecType.NONE

    def test_entry_accepts_nul_padding(self) -> None:
        # The Linux target copies TRADDR/TRSVCID NUL padded.
        raw = bytearray(tcp_entry().pack())
        raw[32:64] = b"4420".ljust(32, b"\x00")
        raw[512:768] = b"10.0.0.1".ljust(256, b"\x00")
        entry = DiscoveryLogEntry.unpack(raw)
        assert entry.trsvcid == "4420"
        assert entry.traddr == "10.0.0.1"

    def test_ipv6_entry(self) -> None:
        entry = tcp_entry(adrfam=AdrFam.IPV6, traddr="fe80::1")
        assert DiscoveryLogEntry.unpack(entry.pack()) == entry

    def test_page_layout(self) -> None:
        entries = [
            tcp_entry(
                subtype=SubType.CURRENT_DISCOVERY, subnqn="nqn.2014-08.org.nvmexpress.discovery"
            ),
            tcp_entry(),
            tcp_entry(portid=2, traddr="192.168.10.21"),
        ]
        d = discovery_log(42, entries)
        assert len(d) == DISC_HEADER_SIZE + 3 * DISC_ENTRY_SIZE
        assert u64(d, 0) == 42  # GENCTR
        assert u64(d, 8) == 3  # NUMREC
        assert u16(d, 16) == 0  # RECFMT
        assert d[18:1024] == bytes(1006)
        assert d[1024:2048] == entries[0].pack()
        assert d[3072:4096] == entries[2].pack()
        page = DiscoveryLogPage.unpack(d)
        assert page == DiscoveryLogPage(42, entries)
        assert page.numrec == 3

    def test_header_only(self) -> None:
        d = discovery_log(7, [tcp_entry(), tcp_entry()])
        assert DiscoveryLogHeader.unpack(d[:DISC_HEADER_SIZE]) == DiscoveryLogHeader(7, 2, 0)
        with pytest.raises(ValueError):
            DiscoveryLogPage.unpack(d[: DISC_HEADER_SIZE + DISC_ENTRY_SIZE])

    def test_empty_page(self) -> None:
        d = discovery_log(1, [])
        assert len(d) == DISC_HEADER_SIZE
        assert DiscoveryLogPage.unpack(d) == DiscoveryLogPage(1, [])

    def test_window_of_page(self) -> None:
        d = discovery_log(5, [tcp_entry()])
        assert log_window(d, 0, 16) == d[:16]
        assert log_window(d, 1024 + 512, 16) == b"192.168.10.20   "

    @pytest.mark.parametrize(
        "overrides",
        [
            {"trsvcid": "x" * 33},
            {"traddr": "x" * 257},
            {"subnqn": "n" * 256},
            {"portid": 1 << 16},
            {"tsas": bytes(257)},
        ],
    )
    def test_entry_rejects(self, overrides: dict[str, object]) -> None:
        with pytest.raises(ValueError):
            tcp_entry(**overrides).pack()

    def test_constants(self) -> None:
        assert TrType.TCP == 3
        assert AdrFam.IPV4 == 1 and AdrFam.IPV6 == 2
        assert SubType.DISCOVERY == 1 and SubType.NVME == 2 and SubType.CURRENT_DISCOVERY == 3
        assert Treq.NOT_SPECIFIED == 0 and Treq.REQUIRED == 1 and Treq.NOT_REQUIRED == 2
        assert Treq.DISABLE_SQFLOW == 4
        assert DiscEflags.DUPRETINFO == 1 and DiscEflags.EPCSD == 2


# Pages are fixed 4096-byte structures; a smaller example would not be a page.
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.large_base_example])
@given(st.binary(min_size=4096, max_size=4096))
def test_arbitrary_pages_parse(data: bytes) -> None:
    # Whatever a controller sends parses, and every parsed field survives a repack.
    for cls in (SmartLog, ErrorLog, ChangedNsList, CmdEffectsLog):
        parsed = cls.unpack(data)
        assert cls.unpack(parsed.pack()) == parsed
    FwSlotLog.unpack(data)
    DiscoveryLogEntry.unpack(data)
    with contextlib.suppress(ValueError):
        DiscoveryLogPage.unpack(data)


def test_a_discovery_entrys_repr_is_short() -> None:
    entry = DiscoveryLogEntry(trsvcid="4420", subnqn="nqn.x:y", traddr="10.0.0.1", tsas=b"\x02")
    text = repr(entry)
    assert "subnqn='nqn.x:y'" in text and "traddr='10.0.0.1'" in text
    assert text.endswith("tsas=bytes.fromhex('02').ljust(256, b'\\x00'))")
    assert len(text) < 400 and "\\x00\\x00" not in text
    assert repr(DiscoveryLogEntry()).endswith("tsas=bytes(256))")
