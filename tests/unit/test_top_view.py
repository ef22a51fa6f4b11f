"""pynvmf/cli/top_view.py: what `pynvmf top` computes from two answers of
pynvmf_get_host_stats (literal answers in the shape agreed for that method): rates over
the target's clock, percentiles from the buckets' differences, sorting, the cells."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from pynvmf.cli.top_view import (
    HEADERS,
    NOTHING,
    SORT_COLUMN,
    SORT_KEYS,
    SORT_LETTERS,
    STAGES,
    Histogram,
    Row,
    StatsError,
    cells,
    empty_view,
    latency_text,
    plain_table,
    plain_text,
    quantile,
    rows,
    snapshot,
    sort_rows,
    view,
)

SUB = "nqn.2024-11.dev.pynvmf:a"
HOST_A = "nqn.2014-08.org.nvmexpress:uuid:0000000a"
HOST_B = "nqn.2014-08.org.nvmexpress:uuid:0000000b"
BOUNDS = [1e-05, 2.5e-05, 5e-05, 0.0001, 0.00025, 0.0005, 0.001]
SECOND = 1_000_000_000


def histogram(counts: dict[int, int], total_sum: float = 0.0) -> dict[str, Any]:
    buckets = [0] * (len(BOUNDS) + 1)
    for i, n in counts.items():
        buckets[i] = n
    return {"count": sum(buckets), "sum": total_sum, "buckets": buckets}


def answer(
    ticks: int, namespaces_a: list[dict[str, Any]], namespaces_b: list[dict[str, Any]] = ()
) -> dict[str, Any]:
    hosts = [{"subsystem": SUB, "host": HOST_A, "connected": True, "namespaces": namespaces_a}]
    if namespaces_b:
        hosts.append(
            {"subsystem": SUB, "host": HOST_B, "connected": False, "namespaces": namespaces_b}
        )
    return {
        "tick_rate": SECOND,
        "ticks": ticks,
        "latency_tracking": True,
        "buckets": BOUNDS,
        "hosts": hosts,
    }


def ns(
    nsid: int,
    commands: dict[str, int],
    data: dict[str, int],
    errors: int = 0,
    latency: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "nsid": nsid,
        "commands": commands,
        "bytes": data,
        "errors": errors,
        "latency": latency or {},
    }


# -- percentiles ---------------------------------------------------------------------------


def test_quantile_interpolates_within_the_bucket() -> None:
    # 10 commands in (10us, 25us], 10 in (25us, 50us]: the median is the first bucket's
    # top; the 75th percentile halfway through the second.
    h = Histogram((0, 10, 10, 0, 0, 0, 0, 0))
    assert quantile(0.5, BOUNDS, h) == pytest.approx(25e-6)
    assert quantile(0.75, BOUNDS, h) == pytest.approx(37.5e-6)
    # The first bucket starts at 0.
    assert quantile(0.5, BOUNDS, Histogram((4, 0, 0, 0, 0, 0, 0, 0))) == pytest.approx(5e-6)


def test_quantile_in_the_inf_bucket_is_the_largest_bound_and_none_without_commands() -> None:
    h = Histogram((1, 0, 0, 0, 0, 0, 0, 99))
    assert quantile(0.99, BOUNDS, h) == BOUNDS[-1]
    assert quantile(0.5, BOUNDS, Histogram((0,) * 8)) is None


def test_histogram_difference_is_per_bucket() -> None:
    later = Histogram((5, 7, 1, 0))
    earlier = Histogram((5, 2, 0, 0))
    assert later.minus(earlier).counts == (0, 5, 1, 0)
    assert later.minus(None) is later


# -- rates ------------------------------------------------------------------------------------


def test_rates_are_differences_over_the_targets_clock() -> None:
    first = answer(
        10 * SECOND,
        [
            ns(
                1,
                {"read": 100, "write": 50},
                {"read": 409600, "write": 204800},
                errors=1,
                latency={"read": histogram({1: 100}), "write": histogram({3: 50})},
            )
        ],
    )
    # Two seconds later (the target's clock, whatever the client slept): 2000 more reads
    # of 4 KiB, 1000 more writes, 4 errors; the interval's reads in (25us, 50us], its
    # writes in (50us, 100us].
    second = answer(
        12 * SECOND,
        [
            ns(
                1,
                {"read": 2100, "write": 1050},
                {"read": 2100 * 4096, "write": 1050 * 4096},
                errors=5,
                latency={"read": histogram({1: 100, 2: 2000}), "write": histogram({3: 1050})},
            )
        ],
    )
    (row,) = rows(snapshot(first), snapshot(second))
    assert (row.subsystem, row.host, row.nsid, row.connected) == (SUB, HOST_A, 1, True)
    assert row.iops == pytest.approx(1500)
    assert row.read_mbs == pytest.approx(2000 * 4096 / 2 / 1e6)
    assert row.write_mbs == pytest.approx(1000 * 4096 / 2 / 1e6)
    assert row.errors == pytest.approx(2)
    # 3000 commands: ranks 1500 (p50) and 2970 (p99); 2000 reads in bucket 2 come first.
    assert row.p50 == pytest.approx(25e-6 + 25e-6 * 1500 / 2000)
    assert row.p99 == pytest.approx(50e-6 + 50e-6 * (2970 - 2000) / 1000)


def test_a_namespace_new_since_the_earlier_answer_counts_from_zero() -> None:
    first = answer(SECOND, [ns(1, {"read": 10}, {"read": 40960})])
    second = answer(
        2 * SECOND,
        [ns(1, {"read": 10}, {"read": 40960})],
        [ns(2, {"write": 30}, {"write": 30 * 512}, latency={"write": histogram({0: 30})})],
    )
    by_host = {r.host: r for r in rows(snapshot(first), snapshot(second))}
    assert by_host[HOST_A].iops == 0 and by_host[HOST_A].p50 is None
    new = by_host[HOST_B]
    assert (new.nsid, new.connected, new.iops, new.write_mbs) == (2, False, 30, 30 * 512 / 1e6)
    assert new.p99 == pytest.approx(1e-05 * 0.99)


def test_counts_that_go_down_count_nothing_and_no_time_gives_no_rate() -> None:
    # A target started again: its counts start over, its clock (monotonic) does not.
    first = answer(SECOND, [ns(1, {"read": 500}, {"read": 500 * 4096})])
    second = answer(2 * SECOND, [ns(1, {"read": 3}, {"read": 3 * 4096})])
    (row,) = rows(snapshot(first), snapshot(second))
    assert row.iops == 0 and row.read_mbs == 0
    (same,) = rows(snapshot(first), snapshot(first))
    assert same.iops == 0


def test_without_latency_tracking_latency_is_nothing() -> None:
    first = answer(SECOND, [ns(1, {"read": 1}, {"read": 512})])
    second = answer(2 * SECOND, [ns(1, {"read": 2}, {"read": 1024})])
    for a in (first, second):
        a["latency_tracking"] = False
        del a["buckets"]
        del a["hosts"][0]["namespaces"][0]["latency"]
    (row,) = rows(snapshot(first), snapshot(second))
    assert row.iops == 1 and row.p50 is None and row.p99 is None
    assert cells(row)[HEADERS.index("P50")] == NOTHING
    assert cells(row)[HEADERS.index("P99")] == NOTHING


@pytest.mark.parametrize(
    "damage",
    [
        lambda a: a.pop("ticks"),
        lambda a: a.update(tick_rate=0),
        lambda a: a.update(hosts={}),
        lambda a: a["hosts"][0]["namespaces"][0].update(nsid="1"),
        lambda a: a["hosts"][0]["namespaces"][0]["latency"]["read"]["buckets"].pop(),
        lambda a: a["hosts"][0]["namespaces"][0]["commands"].update(read=True),
    ],
)
def test_an_answer_of_another_shape_is_a_stats_error(damage: Any) -> None:
    good = answer(SECOND, [ns(1, {"read": 1}, {"read": 512}, latency={"read": histogram({0: 1})})])
    snapshot(good)
    bad = copy.deepcopy(good)
    damage(bad)
    with pytest.raises(StatsError):
        snapshot(bad)


# -- sorting and cells ------------------------------------------------------------------------


def _row(host: str, iops: float, p99: float | None, nsid: int = 1) -> Row:
    return Row(SUB, host, nsid, True, iops, iops / 100, 0.0, 0.0, p99, p99)


def test_sorting_puts_the_largest_first_and_rows_without_latency_last() -> None:
    slow = _row("c", 10, 5e-3)
    busy = _row("a", 900, 1e-4)
    idle = _row("b", 0, None)
    assert sort_rows([slow, busy, idle], "iops") == [busy, slow, idle]
    assert sort_rows([idle, busy, slow], "p99") == [slow, busy, idle]
    assert sort_rows([slow, idle, busy], "host") == [busy, idle, slow]
    # Ties keep a fixed order: subsystem, host, namespace.
    assert sort_rows([_row("b", 1, None, 2), _row("b", 1, None, 1)], "iops")[0].nsid == 1
    with pytest.raises(ValueError):
        sort_rows([busy], "colour")


def test_every_sort_key_has_a_column_and_a_letter() -> None:
    assert set(SORT_COLUMN) == set(SORT_KEYS) == set(SORT_LETTERS.values())
    assert sorted(SORT_COLUMN.values()) == list(range(len(HEADERS)))


def test_latency_text_has_a_unit_and_three_figures() -> None:
    assert latency_text(85e-6) == "85.0us"
    assert latency_text(1.25e-3) == "1.25ms"
    assert latency_text(0.125) == "125ms"
    assert latency_text(2.0) == "2.00s"
    assert latency_text(3e-7) == "0.300us"
    assert latency_text(None) == NOTHING


def test_plain_table_aligns_columns_and_names_special_namespaces() -> None:
    table = plain_table(
        [
            _row(HOST_A, 12345.4, 2.5e-4),
            _row(HOST_B, 7, None, nsid=0xFFFFFFFF),
            _row("x", 0, None, 0),
        ]
    )
    header, *lines = table.split("\n")
    assert header.split() == [
        "SUBSYSTEM", "HOST", "NSID", "IOPS", "READ", "MB/s", "WRITE", "MB/s", "P50", "P99", "ERR/s"
    ]  # fmt: skip
    assert lines[0].split()[:4] == [SUB, HOST_A, "1", "12,345"]
    assert lines[0].split()[-3:] == ["250us", "250us", "0.0"]
    assert lines[1].split()[2] == "all"
    assert lines[2].split()[2] == "none"
    # Numbers right-aligned: every line ends at one column for the last number.
    assert len({len(line) for line in [header, *lines]}) == 1


def test_a_hostile_nqn_is_printable_and_bounded_in_the_cells() -> None:
    hostile = "nqn.2014-08.org.evil:[/]\x1b[2J\n\u2028" + "x" * 5000
    subsystem, host = cells(_row(hostile, 1, None))[:2]
    assert subsystem == SUB
    assert host.isprintable() and "\x1b" not in host
    assert host.startswith("nqn.2014-08.org.evil:[/]?[2J??x")
    assert len(host) <= 256


# -- the stages ---------------------------------------------------------------------------------


def _with_stages(ticks: int, per_host: dict[str, dict[str, dict[int, int]]]) -> dict[str, Any]:
    """An answer whose hosts (HOST_A, HOST_B) have stage histograms only."""
    a = answer(ticks, [ns(1, {}, {})], [ns(1, {}, {})])
    for entry in a["hosts"]:
        entry["stages"] = {
            stage: histogram(counts) for stage, counts in per_host.get(entry["host"], {}).items()
        }
    return a


def test_stage_table_shows_each_hosts_p99_by_stage_over_the_interval() -> None:
    first = _with_stages(SECOND, {HOST_A: {"device": {6: 1000}}, HOST_B: {"data": {0: 10}}})
    # In the interval: host A's device stage 100 commands in (50us, 100us], host B's data
    # stage 100 in (250us, 500us] (and a stage pynvmf_get_host_stats may add some day).
    second = _with_stages(
        2 * SECOND,
        {
            HOST_A: {"device": {6: 1000, 3: 100}, "receive": {0: 100}},
            HOST_B: {"data": {0: 10, 5: 100}, "tls": {0: 100}},
        },
    )
    table = view(snapshot(first), snapshot(second), "iops", stages=True)
    assert table.headers == (
        "SUBSYSTEM", "HOST",
        "RECEIVE P99", "DATA P99", "BUDGET P99", "DEVICE P99", "SEND P99", "TLS P99",
    )  # fmt: skip
    # By the slowest stage: host B's data (497.5us) above host A's device (99.5us).
    assert table.lines == (
        (SUB, HOST_B, "-", "498us", "-", "-", "-", "9.90us"),
        (SUB, HOST_A, "9.90us", "-", "-", "99.5us", "-", "-"),
    )
    assert table.connected == (False, True)
    assert (table.sorted_column, table.sorted_by) == (None, "the slowest stage")
    by_host = view(snapshot(first), snapshot(second), "host", stages=True)
    assert [line[1] for line in by_host.lines] == [HOST_A, HOST_B]
    assert (by_host.sorted_column, by_host.sorted_by) == (1, "host")
    assert plain_text(table).split("\n")[1].split()[3] == "498us"


def test_without_latency_tracking_the_stages_are_nothing() -> None:
    first = answer(SECOND, [ns(1, {"read": 1}, {"read": 512})])
    second = answer(2 * SECOND, [ns(1, {"read": 2}, {"read": 1024})])
    for a in (first, second):
        a["latency_tracking"] = False
    table = view(snapshot(first), snapshot(second), "iops", stages=True)
    assert table.lines == ((SUB, HOST_A, "-", "-", "-", "-", "-"),)


def test_the_empty_views_have_the_columns() -> None:
    assert empty_view(stages=False).headers == HEADERS
    assert empty_view(stages=True).headers[2:] == tuple(f"{s.upper()} P99" for s in STAGES)
    assert empty_view(stages=True).lines == ()
