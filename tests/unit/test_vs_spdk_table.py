"""benchmarks/vs_spdk.py's table: the ratio of the medians, and beside it the range of the
repeats' own ratios (a run measured moments after SPDK's), which is what shows how far
the machine's noise reaches."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "vs_spdk.py"


@pytest.fixture(scope="module")
def vs_spdk() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vs_spdk_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_ratio_cells_carry_the_range_of_the_paired_ratios(vs_spdk: ModuleType) -> None:
    m = vs_spdk.Measurement
    read = vs_spdk.ROWS[0].name  # an IOPS row
    qd1 = next(r.name for r in vs_spdk.ROWS if r.metric == "lat")
    results = [
        # Repeat 0 on a quiet machine, repeat 1 on a loaded one, repeat 2 between.
        m("SPDK", read, 0, 400_000, 0, 0),
        m("pynvmf", read, 0, 200_000, 0, 0),
        m("SPDK", read, 1, 100_000, 0, 0),
        m("pynvmf", read, 1, 90_000, 0, 0),
        m("SPDK", read, 2, 300_000, 0, 0),
        m("pynvmf", read, 2, 180_000, 0, 0),
        m("SPDK", qd1, 0, 0, 0, 10.0),
        m("pynvmf", qd1, 0, 0, 0, 25.0),
        m("SPDK", qd1, 1, 0, 0, 20.0),
        m("pynvmf", qd1, 1, 0, 0, 30.0),
    ]
    headers, rows, medians = vs_spdk.table(results)
    assert headers == ["workload", "SPDK", "pynvmf", "pynvmf / SPDK"]
    by_name = {r[0]: r for r in rows}
    # Medians 300K and 180K: 0.60; the repeats' ratios are 0.50, 0.90 and 0.60.
    assert by_name[read][-1] == "0.60 (0.50-0.90)"
    # Latency: medians 15 and 27.5 µs; the repeats 2.5x and 1.5x.
    assert by_name[qd1][-1] == "1.83x slower (1.50-2.50)"
    assert medians[read] == {"SPDK": 300_000, "pynvmf": 180_000}


def test_one_repeat_has_no_range(vs_spdk: ModuleType) -> None:
    m = vs_spdk.Measurement
    read = vs_spdk.ROWS[0].name
    _, rows, _ = vs_spdk.table([m("SPDK", read, 0, 400_000, 0, 0), m("x", read, 0, 100_000, 0, 0)])
    assert rows[0][-1] == "0.25"
