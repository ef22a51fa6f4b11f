"""Identify data structures: round trips and byte offsets pinned to the NVMe Base spec."""

import contextlib
import struct
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pynvmf.spec.fields import U16, Layout
from pynvmf.spec.identify import (
    CQES_NVM,
    IDENTIFY_DATA_SIZE,
    NSID_LIST_MAX,
    SQES_NVM,
    Cns,
    Csi,
    CtrlType,
    IdentifyController,
    IdentifyNamespace,
    LbaFormat,
    Nidt,
    NsIdDescriptor,
    NsIdDescriptorList,
    NsIdList,
    Oncs,
    PowerStateDescriptor,
    Sgls,
    flbas_for_index,
    frmw_slots,
)


def u8(buf: bytes, off: int) -> int:
    return buf[off]


def u16(buf: bytes, off: int) -> int:
    return struct.unpack_from("<H", buf, off)[0]


def u32(buf: bytes, off: int) -> int:
    return struct.unpack_from("<I", buf, off)[0]


def u64(buf: bytes, off: int) -> int:
    return struct.unpack_from("<Q", buf, off)[0]


def u128(buf: bytes, off: int) -> int:
    return int.from_bytes(buf[off : off + 16], "little")


def linux_like_ctrl() -> IdentifyController:
    """Roughly what the Linux nvmet TCP target reports, with every field touched."""
    return IdentifyController(
        vid=0x1B36,
        ssvid=0x1AF4,
        sn="8d1a5ea3c19e2b07",
        mn="Linux",
        fr="6.8.0",
        rab=6,
        ieee=0x123456,
        cmic=0b1011,
        mdts=5,
        cntlid=0x0102,
        ver=0x00020000,
        rtd3r=1_000_000,
        rtd3e=2_000_000,
        oaes=0x8000_0900,
        ctratt=0x41,
        rrls=0x0003,
        cntrltype=CtrlType.IO,
        fguid=bytes(range(0xA0, 0xB0)),
        crdt1=10,
        crdt2=20,
        crdt3=30,
        nvmsr=1,
        vwci=0x85,
        mec=2,
        oacs=0x0108,
        acl=3,
        aerl=3,
        frmw=0b11,
        lpa=0b111,
        elpe=127,
        avscc=1,
        apsta=1,
        wctemp=343,
        cctemp=373,
        mtfa=7,
        hmpre=0x1111,
        hmmin=0x2222,
        tnvmcap=(1 << 100) + 5,
        unvmcap=12345,
        rpmbs=0x01020304,
        edstt=15,
        dsto=1,
        fwug=0xFF,
        kas=100,
        hctma=1,
        mntmt=300,
        mxtmt=360,
        sanicap=0x7,
        hmminds=0x3333,
        hmmaxd=0x44,
        nsetidmax=8,
        endgidmax=9,
        anatt=10,
        anacap=0x1F,
        anagrpmax=128,
        nanagrpid=128,
        pels=0x5555,
        domainid=0x66,
        megcap=(1 << 64) | 7,
        sqes=SQES_NVM,
        cqes=CQES_NVM,
        maxcmd=128,
        nn=1024,
        oncs=Oncs.DSM | Oncs.WRITE_ZEROES | Oncs.COPY,
        fuses=1,
        fna=0b101,
        vwc=1,
        awun=0x10,
        awupf=0x20,
        icsvscc=1,
        nwpc=1,
        acwu=0x30,
        ocfs=0x000F,
        sgls=Sgls.SUPPORTED | Sgls.KEYED | Sgls.OFFSET,
        mnan=1024,
        maxdna=99,
        maxcna=77,
        subnqn="nqn.2014-08.org.nvmexpress:uuid:" + str(uuid.UUID(int=1)),
        ioccsz=(64 + 8192) // 16,
        iorcsz=1,
        icdoff=0,
        fcatt=0,
        msdbd=1,
        ofcs=1,
        dctype=0,
        psd=[
            PowerStateDescriptor(max_power=0x9C4, entry_lat=0x10, exit_lat=0x4),
            PowerStateDescriptor(
                max_power=100,
                flags=0b10,
                entry_lat=1,
                exit_lat=2,
                read_tput=1,
                read_lat=2,
                write_tput=3,
                write_lat=4,
                idle_power=5,
                idle_scale=0x40,
                active_power=6,
                active_work_scale=0x42,
            ),
        ],
    )


class TestIdentifyController:
    def test_size(self) -> None:
        assert len(IdentifyController().pack()) == IDENTIFY_DATA_SIZE

    def test_default_sets_nothing(self) -> None:
        # Nothing is claimed unless the target sets it: an empty SN packs as spaces only.
        data = IdentifyController().pack()
        assert data[4:72] == b" " * 68
        assert data[:4] == bytes(4)
        assert data[72:] == bytes(IDENTIFY_DATA_SIZE - 72)

    def test_round_trip(self) -> None:
        ctrl = linux_like_ctrl()
        assert IdentifyController.unpack(ctrl.pack()) == ctrl

    def test_round_trip_memoryview(self) -> None:
        ctrl = linux_like_ctrl()
        assert IdentifyController.unpack(memoryview(ctrl.pack())) == ctrl

    def test_offsets(self) -> None:
        ctrl = linux_like_ctrl()
        d = ctrl.pack()
        assert u16(d, 0) == 0x1B36
        assert u16(d, 2) == 0x1AF4
        assert d[4:24] == b"8d1a5ea3c19e2b07    "
        assert d[24:64] == b"Linux".ljust(40, b" ")
        assert d[64:72] == b"6.8.0   "
        assert u8(d, 72) == 6
        assert d[73:76] == bytes([0x56, 0x34, 0x12])  # OUI, least significant byte first
        assert u8(d, 76) == 0b1011
        assert u8(d, 77) == 5  # MDTS
        assert u16(d, 78) == 0x0102  # CNTLID
        assert u32(d, 80) == 0x00020000  # VER
        assert u32(d, 84) == 1_000_000
        assert u32(d, 88) == 2_000_000
        assert u32(d, 92) == 0x8000_0900  # OAES
        assert u32(d, 96) == 0x41  # CTRATT
        assert u16(d, 100) == 3  # RRLS
        assert u8(d, 111) == 1  # CNTRLTYPE
        assert d[112:128] == bytes(range(0xA0, 0xB0))  # FGUID
        assert (u16(d, 128), u16(d, 130), u16(d, 132)) == (10, 20, 30)
        assert (u8(d, 253), u8(d, 254), u8(d, 255)) == (1, 0x85, 2)
        assert u16(d, 256) == 0x0108  # OACS
        assert (u8(d, 258), u8(d, 259), u8(d, 260), u8(d, 261)) == (3, 3, 0b11, 0b111)
        assert u8(d, 262) == 127  # ELPE
        assert u8(d, 263) == 1  # NPSS: two descriptors
        assert (u8(d, 264), u8(d, 265)) == (1, 1)
        assert (u16(d, 266), u16(d, 268), u16(d, 270)) == (343, 373, 7)
        assert (u32(d, 272), u32(d, 276)) == (0x1111, 0x2222)
        assert u128(d, 280) == (1 << 100) + 5  # TNVMCAP
        assert u128(d, 296) == 12345  # UNVMCAP
        assert u32(d, 312) == 0x01020304
        assert (u16(d, 316), u8(d, 318), u8(d, 319)) == (15, 1, 0xFF)
        assert u16(d, 320) == 100  # KAS
        assert (u16(d, 322), u16(d, 324), u16(d, 326)) == (1, 300, 360)
        assert (u32(d, 328), u32(d, 332), u16(d, 336)) == (7, 0x3333, 0x44)
        assert (u16(d, 338), u16(d, 340)) == (8, 9)
        assert (u8(d, 342), u8(d, 343)) == (10, 0x1F)  # ANATT, ANACAP
        assert (u32(d, 344), u32(d, 348)) == (128, 128)  # ANAGRPMAX, NANAGRPID
        assert u32(d, 352) == 0x5555  # PELS
        assert u16(d, 356) == 0x66  # DOMAINID
        assert u128(d, 368) == (1 << 64) | 7  # MEGCAP
        assert (u8(d, 512), u8(d, 513)) == (0x66, 0x44)  # SQES, CQES
        assert u16(d, 514) == 128  # MAXCMD
        assert u32(d, 516) == 1024  # NN
        assert u16(d, 520) == 0x10C  # ONCS
        assert u16(d, 522) == 1  # FUSES
        assert (u8(d, 524), u8(d, 525)) == (0b101, 1)  # FNA, VWC
        assert (u16(d, 526), u16(d, 528)) == (0x10, 0x20)  # AWUN, AWUPF
        assert (u8(d, 530), u8(d, 531)) == (1, 1)  # NVSCC, NWPC
        assert u16(d, 532) == 0x30  # ACWU
        assert u16(d, 534) == 0x000F  # OCFS
        assert u32(d, 536) == (1 | 1 << 2 | 1 << 20)  # SGLS
        assert u32(d, 540) == 1024  # MNAN
        assert u128(d, 544) == 99  # MAXDNA
        assert u32(d, 560) == 77  # MAXCNA
        nqn = ctrl.subnqn.encode()
        assert d[768 : 768 + len(nqn)] == nqn
        assert d[768 + len(nqn) : 1024] == bytes(256 - len(nqn))
        assert u32(d, 1792) == (64 + 8192) // 16  # IOCCSZ
        assert u32(d, 1796) == 1  # IORCSZ
        assert u16(d, 1800) == 0  # ICDOFF
        assert (u8(d, 1802), u8(d, 1803)) == (0, 1)  # FCATT, MSDBD
        assert u16(d, 1804) == 1  # OFCS
        assert u16(d, 2048) == 0x9C4  # PSD0 max power
        assert (u32(d, 2052), u32(d, 2056)) == (0x10, 0x4)  # PSD0 ENLAT, EXLAT
        psd1 = d[2080:2112]
        assert u16(psd1, 0) == 100
        assert psd1[3] == 0b10  # flags: non-operational
        assert (u32(psd1, 4), u32(psd1, 8)) == (1, 2)
        assert tuple(psd1[12:16]) == (1, 2, 3, 4)
        assert (u16(psd1, 16), psd1[18], u16(psd1, 20), psd1[22]) == (5, 0x40, 6, 0x42)
        assert d[2112:] == bytes(IDENTIFY_DATA_SIZE - 2112)

    def test_reserved_bytes_stay_zero(self) -> None:
        d = linux_like_ctrl().pack()
        for start, end in (
            (102, 111),
            (134, 253),
            (358, 368),
            (384, 512),
            (564, 768),
            (1024, 1792),
            (1807, 2048),
        ):
            assert d[start:end] == bytes(end - start), (start, end)

    def test_unpack_known_bytes(self) -> None:
        # Built by hand from the spec offsets, independent of the packer.
        raw = bytearray(IDENTIFY_DATA_SIZE)
        raw[4:24] = b"SERIAL".ljust(20, b" ")
        raw[24:64] = b"MODEL".ljust(40, b"\x00")  # NUL padding seen in the wild
        raw[77] = 3
        struct.pack_into("<H", raw, 78, 7)
        struct.pack_into("<I", raw, 80, 0x00010400)
        raw[111] = CtrlType.DISCOVERY
        struct.pack_into("<H", raw, 320, 10)
        struct.pack_into("<I", raw, 516, 32)
        struct.pack_into("<H", raw, 520, 0x0C)
        struct.pack_into("<H", raw, 534, 1)
        struct.pack_into("<I", raw, 536, 0x100005)
        raw[768 : 768 + 36] = b"nqn.2014-08.org.nvmexpress.discovery"
        struct.pack_into("<I", raw, 1792, 260)
        struct.pack_into("<I", raw, 1796, 1)
        struct.pack_into("<H", raw, 2048, 2500)
        ctrl = IdentifyController.unpack(bytes(raw))
        assert ctrl.sn == "SERIAL"
        assert ctrl.mn == "MODEL"
        assert ctrl.mdts == 3
        assert ctrl.cntlid == 7
        assert ctrl.ver == 0x00010400
        assert ctrl.cntrltype == CtrlType.DISCOVERY
        assert ctrl.kas == 10
        assert ctrl.nn == 32
        assert ctrl.oncs == 0x0C
        assert ctrl.ocfs == 1
        assert ctrl.sgls == 0x100005
        assert ctrl.subnqn == "nqn.2014-08.org.nvmexpress.discovery"
        assert ctrl.ioccsz == 260
        assert ctrl.iorcsz == 1
        assert ctrl.npss == 0
        assert ctrl.psd == [PowerStateDescriptor(max_power=2500)]

    def test_layout_fields_do_not_overlap(self) -> None:
        # A Layout refuses overlapping fields when it is built: the controller's table,
        # NPSS and the power state descriptors included, was accepted at import.
        layout = IdentifyController.LAYOUT
        assert {"npss", "psd"} <= {name for name, _, _ in layout.fields}
        with pytest.raises(ValueError, match="overlaps"):
            Layout("wider", IDENTIFY_DATA_SIZE, (*layout.fields, ("extra", 2047, U16)))
        with pytest.raises(ValueError, match="outside"):
            Layout("shorter", 3071, layout.fields)  # the descriptors end at 3072

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("sn", "x" * 21),
            ("mn", "x" * 41),
            ("fr", "x" * 9),
            ("sn", "caf\u00e9"),
            ("subnqn", "n" * 256),
            ("fguid", bytes(15)),
            ("mdts", 256),
            ("cntlid", -1),
            ("ieee", 1 << 24),
            ("tnvmcap", 1 << 128),
        ],
    )
    def test_invalid_values_raise(self, field: str, value: object) -> None:
        ctrl = IdentifyController(**{field: value})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=field):
            ctrl.pack()

    def test_psd_count_bounds(self) -> None:
        with pytest.raises(ValueError):
            IdentifyController(psd=[]).pack()
        with pytest.raises(ValueError):
            IdentifyController(psd=[PowerStateDescriptor()] * 33).pack()
        ctrl = IdentifyController(psd=[PowerStateDescriptor(max_power=i) for i in range(32)])
        assert ctrl.npss == 31
        assert IdentifyController.unpack(ctrl.pack()) == ctrl

    def test_subnqn_max_length(self) -> None:
        ctrl = IdentifyController(subnqn="n" * 255)
        data = ctrl.pack()
        assert data[1023] == 0
        assert IdentifyController.unpack(data).subnqn == "n" * 255

    def test_short_buffer(self) -> None:
        with pytest.raises(ValueError):
            IdentifyController.unpack(bytes(4095))

    def test_helpers(self) -> None:
        assert SQES_NVM == 0x66
        assert CQES_NVM == 0x44
        assert frmw_slots(1) == 0b10
        with pytest.raises(ValueError):
            frmw_slots(8)


def sample_ns() -> IdentifyNamespace:
    return IdentifyNamespace(
        nsze=0x1_0000_0000,
        ncap=0x0_FFFF_0000,
        nuse=0x0_8000_0000,
        nsfeat=0b10011,
        flbas=flbas_for_index(1),
        mc=1,
        dpc=0x1F,
        dps=1,
        nmic=1,
        rescap=0xFF,
        fpi=0x80,
        dlfeat=0b01001,
        nawun=1,
        nawupf=2,
        nacwu=3,
        nabsn=4,
        nabo=5,
        nabspf=6,
        noiob=7,
        nvmcap=(1 << 70) + 1,
        npwg=8,
        npwa=9,
        npdg=10,
        npda=11,
        nows=12,
        mssrl=0x1234,
        mcl=0x12345678,
        msrc=0x7F,
        nulbaf=0,
        anagrpid=1,
        nsattr=1,
        nvmsetid=2,
        endgid=3,
        nguid=bytes(range(16)),
        eui64=bytes(range(0x10, 0x18)),
        lbaf=[LbaFormat(ms=0, lbads=9, rp=2), LbaFormat(ms=8, lbads=12, rp=0)],
    )


class TestIdentifyNamespace:
    def test_round_trip(self) -> None:
        ns = sample_ns()
        assert IdentifyNamespace.unpack(ns.pack()) == ns

    def test_offsets(self) -> None:
        d = sample_ns().pack()
        assert len(d) == IDENTIFY_DATA_SIZE
        assert u64(d, 0) == 0x1_0000_0000  # NSZE
        assert u64(d, 8) == 0x0_FFFF_0000  # NCAP
        assert u64(d, 16) == 0x0_8000_0000  # NUSE
        assert u8(d, 24) == 0b10011  # NSFEAT
        assert u8(d, 25) == 1  # NLBAF: two formats, 0's based
        assert u8(d, 26) == 1  # FLBAS
        assert tuple(d[27:34]) == (1, 0x1F, 1, 1, 0xFF, 0x80, 0b01001)  # MC .. DLFEAT
        assert [u16(d, off) for off in range(34, 48, 2)] == [1, 2, 3, 4, 5, 6, 7]
        assert u128(d, 48) == (1 << 70) + 1  # NVMCAP
        assert [u16(d, off) for off in range(64, 74, 2)] == [8, 9, 10, 11, 12]
        assert u16(d, 74) == 0x1234  # MSSRL
        assert u32(d, 76) == 0x12345678  # MCL
        assert u8(d, 80) == 0x7F  # MSRC
        assert u32(d, 92) == 1  # ANAGRPID
        assert u8(d, 99) == 1  # NSATTR
        assert (u16(d, 100), u16(d, 102)) == (2, 3)  # NVMSETID, ENDGID
        assert d[104:120] == bytes(range(16))  # NGUID
        assert d[120:128] == bytes(range(0x10, 0x18))  # EUI64
        assert d[128:132] == bytes([0, 0, 9, 2])  # LBAF0: MS, LBADS, RP
        assert d[132:136] == bytes([8, 0, 12, 0])  # LBAF1
        assert d[136:] == bytes(IDENTIFY_DATA_SIZE - 136)

    def test_unpack_known_bytes(self) -> None:
        # A 1 GiB, 4 KiB-block namespace the way the Linux target reports it.
        raw = bytearray(IDENTIFY_DATA_SIZE)
        struct.pack_into("<QQQ", raw, 0, 262144, 262144, 262144)
        raw[30] = 1  # NMIC
        struct.pack_into("<I", raw, 92, 1)
        raw[104:120] = bytes.fromhex("00112233445566778899aabbccddeeff")
        raw[130] = 12  # LBAF0.LBADS
        ns = IdentifyNamespace.unpack(raw)
        assert ns.nsze == ns.ncap == ns.nuse == 262144
        assert ns.nlbaf == 0
        assert ns.lbaf == [LbaFormat(ms=0, lbads=12, rp=0)]
        assert ns.block_size == 4096
        assert ns.metadata_size == 0
        assert ns.nmic == 1
        assert ns.anagrpid == 1
        assert ns.nguid.hex() == "00112233445566778899aabbccddeeff"
        assert ns.eui64 == bytes(8)

    def test_block_size_follows_flbas(self) -> None:
        ns = sample_ns()
        assert ns.lbaf_index == 1
        assert ns.block_size == 4096
        assert ns.metadata_size == 8
        ns.flbas = flbas_for_index(0, extended_metadata=True)
        assert ns.flbas == 0x10
        assert ns.block_size == 512

    def test_flbas_high_bits(self) -> None:
        # Formats 16..63 put the upper two index bits in FLBAS bits 6:5.
        assert flbas_for_index(17) == 0b0100001
        formats = [LbaFormat(lbads=9)] * 17 + [LbaFormat(lbads=13)]
        ns = IdentifyNamespace(flbas=flbas_for_index(17), lbaf=formats)
        assert ns.lbaf_index == 17
        assert ns.block_size == 8192
        assert IdentifyNamespace.unpack(ns.pack()) == ns

    def test_flbas_out_of_range(self) -> None:
        ns = IdentifyNamespace(flbas=3)
        with pytest.raises(ValueError):
            _ = ns.block_size
        with pytest.raises(ValueError):
            flbas_for_index(64)

    def test_lbaf_bounds(self) -> None:
        with pytest.raises(ValueError):
            IdentifyNamespace(lbaf=[]).pack()
        with pytest.raises(ValueError):
            IdentifyNamespace(lbaf=[LbaFormat()] * 65).pack()
        full = IdentifyNamespace(lbaf=[LbaFormat(lbads=9 + i % 4) for i in range(64)])
        assert full.nlbaf == 63
        assert IdentifyNamespace.unpack(full.pack()) == full

    @pytest.mark.parametrize(
        ("field", "value"), [("nguid", bytes(8)), ("eui64", bytes(16)), ("nsze", -1)]
    )
    def test_invalid_values_raise(self, field: str, value: object) -> None:
        with pytest.raises(ValueError, match=field):
            IdentifyNamespace(**{field: value}).pack()  # type: ignore[arg-type]


class TestNsIdDescriptors:
    def test_pack_layout(self) -> None:
        nguid = bytes(range(16))
        eui = bytes(range(8))
        uid = uuid.UUID("12345678-9abc-def0-1234-56789abcdef0")
        page = NsIdDescriptorList(
            [
                NsIdDescriptor.eui64(eui),
                NsIdDescriptor.nguid(nguid),
                NsIdDescriptor.uuid(uid.bytes),
                NsIdDescriptor.csi(Csi.NVM),
            ]
        ).pack()
        assert len(page) == IDENTIFY_DATA_SIZE
        assert page[0:4] == bytes([1, 8, 0, 0])
        assert page[4:12] == eui
        assert page[12:16] == bytes([2, 16, 0, 0])
        assert page[16:32] == nguid
        assert page[32:36] == bytes([3, 16, 0, 0])
        assert page[36:52] == uid.bytes
        assert page[52:56] == bytes([4, 1, 0, 0])
        assert page[56] == 0
        assert page[57:] == bytes(IDENTIFY_DATA_SIZE - 57)

    def test_round_trip(self) -> None:
        descs = NsIdDescriptorList(
            [NsIdDescriptor(Nidt.NGUID, bytes(range(16))), NsIdDescriptor(Nidt.CSI, b"\x02")]
        )
        back = NsIdDescriptorList.unpack(descs.pack())
        assert back == descs
        assert back.get(Nidt.CSI) == b"\x02"
        assert back.get(Nidt.UUID) is None

    def test_empty(self) -> None:
        page = NsIdDescriptorList().pack()
        assert page == bytes(IDENTIFY_DATA_SIZE)
        assert NsIdDescriptorList.unpack(page).descriptors == []

    def test_wrong_length_for_type(self) -> None:
        with pytest.raises(ValueError):
            NsIdDescriptorList([NsIdDescriptor(Nidt.EUI64, bytes(16))]).pack()
        with pytest.raises(ValueError):
            NsIdDescriptorList([NsIdDescriptor(0x80, b"")]).pack()

    def test_overflow(self) -> None:
        many = [NsIdDescriptor(0x80, bytes(252))] * 17  # 17 * 256 > 4096
        with pytest.raises(ValueError):
            NsIdDescriptorList(many).pack()

    def test_truncated_descriptor(self) -> None:
        # Fifteen 256-byte vendor descriptors reach offset 3840; the next claims 255
        # bytes of identifier where only 252 remain.
        raw = bytearray(IDENTIFY_DATA_SIZE)
        for pos in range(0, 3840, 256):
            raw[pos : pos + 2] = bytes([0x80, 252])
        raw[3840:3842] = bytes([0x80, 255])
        with pytest.raises(ValueError):
            NsIdDescriptorList.unpack(raw)


class TestNsIdList:
    def test_active_filters_and_sorts(self) -> None:
        lst = NsIdList.active([7, 1, 3, 3, 10, 2], start_nsid=2)
        assert lst.nsids == [3, 7, 10]

    def test_layout_and_round_trip(self) -> None:
        lst = NsIdList.active([1, 2, 5])
        data = lst.pack()
        assert len(data) == IDENTIFY_DATA_SIZE
        assert struct.unpack_from("<4I", data) == (1, 2, 5, 0)
        assert data[12:] == bytes(IDENTIFY_DATA_SIZE - 12)
        assert NsIdList.unpack(data) == lst

    def test_truncates_to_1024(self) -> None:
        lst = NsIdList.active(range(1, 3000), start_nsid=100)
        assert len(lst.nsids) == NSID_LIST_MAX
        assert lst.nsids[0] == 101
        assert lst.nsids[-1] == 100 + NSID_LIST_MAX
        assert NsIdList.unpack(lst.pack()) == lst

    def test_pack_rejects(self) -> None:
        with pytest.raises(ValueError):
            NsIdList(list(range(1, NSID_LIST_MAX + 2))).pack()
        with pytest.raises(ValueError):
            NsIdList([0]).pack()
        with pytest.raises(ValueError):
            NsIdList([1 << 32]).pack()


def test_cns_values() -> None:
    assert Cns.NS == 0x00
    assert Cns.CTRL == 0x01
    assert Cns.NS_ACTIVE_LIST == 0x02
    assert Cns.NS_DESC_LIST == 0x03
    assert Cns.CS_NS == 0x05
    assert Cns.CS_CTRL == 0x06
    assert Cns.NS_ALLOCATED_LIST == 0x10
    assert Nidt.EUI64 == 1 and Nidt.NGUID == 2 and Nidt.UUID == 3 and Nidt.CSI == 4


# Pages are fixed 4096-byte structures; a smaller example would not be a page.
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.large_base_example])
@given(st.binary(min_size=IDENTIFY_DATA_SIZE, max_size=IDENTIFY_DATA_SIZE))
def test_arbitrary_pages_parse(data: bytes) -> None:
    # A host must survive whatever a controller sends: only ValueError is acceptable.
    IdentifyController.unpack(data)
    NsIdList.unpack(data)
    with contextlib.suppress(ValueError):
        NsIdDescriptorList.unpack(data)
    ns = IdentifyNamespace.unpack(data)
    # Reserved bytes are dropped, but every parsed field survives a repack.
    assert IdentifyNamespace.unpack(ns.pack()) == ns
