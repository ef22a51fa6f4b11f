"""Properties of the parsers that read structures a peer controls: Copy descriptors,
Connect data, the discovery log page. Each either parses or raises ValueError/struct.error
(which its caller turns into a status), never anything else, and what it parses packs
back to the same bytes where the format has one canonical encoding."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pynvmf.spec import command as C
from pynvmf.spec import logpages as L


@given(st.sampled_from(sorted(C.COPY_DESCRIPTOR_SIZE)), st.integers(1, 256), st.data())
def test_copy_descriptors_parse_exactly_nr_ranges_from_enough_data(
    desfmt: int, nr: int, data: st.DataObject
) -> None:
    size = C.COPY_DESCRIPTOR_SIZE[desfmt]
    raw = data.draw(st.binary(min_size=nr * size, max_size=nr * size))
    ranges = C.parse_copy_ranges(raw, desfmt, nr)
    assert len(ranges) == nr
    for r in ranges:
        assert 1 <= r.nlb <= 0x10000  # NLB is a 16-bit 0's based count
        assert 0 <= r.slba < 1 << 64
        if desfmt in (0, 1):
            assert (r.snsid, r.sopt) == (0, 0)  # no source namespace in formats 0/1
    # The fields the target uses survive a round trip through the packer.
    assert C.parse_copy_ranges(C.pack_copy_ranges(ranges, desfmt), desfmt, nr) == ranges


@given(st.sampled_from(sorted(C.COPY_DESCRIPTOR_SIZE)), st.binary(min_size=40, max_size=40))
def test_one_descriptor_reads_as_the_range_parser_reads_it(desfmt: int, raw: bytes) -> None:
    # The target reads a single-range Copy with COPY_DESCRIPTOR directly, the host packs
    # one with one_range_copy's packer: both must agree with the general parser and packer.
    raw = raw[: C.COPY_DESCRIPTOR_SIZE[desfmt]]
    (r,) = C.parse_copy_ranges(raw, desfmt, 1)
    snsid, slba, nlb = C.COPY_DESCRIPTOR[desfmt].unpack_from(raw)[:3]
    assert (slba, nlb + 1) == (r.slba, r.nlb)
    if desfmt in (2, 3):
        assert snsid == r.snsid
    cdw12, pack = C.one_range_copy(desfmt, r.snsid)
    assert cdw12 == C.copy_cdw12(1, desfmt)
    packed = pack(r.slba, r.nlb - 1, 0, 0, 0)
    assert packed == C.pack_copy_ranges([C.CopyRange(r.slba, r.nlb, r.snsid)], desfmt)
    assert len(packed) == C.COPY_DESCRIPTOR_SIZE[desfmt]


@given(st.sampled_from(sorted(C.COPY_DESCRIPTOR_SIZE)), st.integers(1, 64), st.data())
def test_copy_descriptors_too_short_raise(desfmt: int, nr: int, data: st.DataObject) -> None:
    # The target refuses a buffer shorter than NR descriptors before it parses (SGL Data
    # Length Invalid); the parser itself needs the fields of the last one at least.
    size = C.COPY_DESCRIPTOR_SIZE[desfmt]
    fields = struct.calcsize("<I4xQHBxHH")
    raw = data.draw(st.binary(max_size=(nr - 1) * size + fields - 1))
    with pytest.raises(struct.error):
        C.parse_copy_ranges(raw, desfmt, nr)


@given(st.binary(min_size=C.CONNECT_DATA_SIZE, max_size=C.CONNECT_DATA_SIZE))
def test_connect_data_always_parses(raw: bytes) -> None:
    cdata = C.ConnectData.unpack(raw)
    assert len(cdata.hostid) == 16 and 0 <= cdata.cntlid <= 0xFFFF
    # NQNs are the bytes up to the first NUL, decoded leniently: never an exception,
    # never longer than their 256-byte fields.
    assert "\0" not in cdata.subnqn and "\0" not in cdata.hostnqn
    assert len(cdata.subnqn.encode("utf-8", "surrogatepass")) <= 4 * 256


@given(st.binary(max_size=4096 + 3 * L.DISC_ENTRY_SIZE))
def test_discovery_log_parses_or_refuses_a_short_page(raw: bytes) -> None:
    try:
        page = L.DiscoveryLogPage.unpack(raw)
    except ValueError:
        return
    assert len(raw) >= L.DISC_HEADER_SIZE + page.numrec * L.DISC_ENTRY_SIZE
    for entry in page.entries:
        assert isinstance(entry.subnqn, str) and isinstance(entry.traddr, str)
