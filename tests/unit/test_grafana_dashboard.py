"""contrib/grafana/pynvmf.json: a Grafana dashboard whose queries name only the metrics
docs/metrics.md lists (so the dashboard cannot drift from the docs and the endpoint), and
whose PromQL Prometheus's own promtool parses."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "contrib" / "grafana" / "pynvmf.json"
METRICS_DOC = ROOT / "docs" / "metrics.md"
# The histograms of command latency and its stages (their table rows come with them).
HISTOGRAMS = ("pynvmf_command_latency_seconds", "pynvmf_command_stage_seconds")
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
# What Grafana puts in place of its variables before a query goes to Prometheus.
VARIABLES = {"$__rate_interval": "1m", "$subsystem": ".*", "$host": ".*"}


def _dashboard() -> dict[str, Any]:
    value = json.loads(DASHBOARD.read_text())
    assert isinstance(value, dict)
    return value


def _documented() -> set[str]:
    """The names in docs/metrics.md's "Every metric" table."""
    text = METRICS_DOC.read_text()
    table = text[text.index("## Every metric") :]
    table = table[: table.index("\n## ", 1)] if "\n## " in table[1:] else table
    names = set(re.findall(r"^\| `(pynvmf_[a-z0-9_]+)` \|", table, re.MULTILINE))
    assert len(names) > 20, names
    return names


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))  # a collapsed row holds its panels
    return found


def _expressions(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _panels(dashboard) for t in p.get("targets", [])]


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    dashboard = _dashboard()
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["title"] and dashboard["uid"]
    panels = _panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    graphs = [p for p in panels if p["type"] != "row"]
    assert len(graphs) >= 12
    for panel in graphs:
        assert panel["title"]
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip()
            assert target["datasource"]["uid"] == "${datasource}"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "subsystem", "host"} <= variables


def test_every_metric_the_dashboard_queries_is_documented() -> None:
    documented = _documented()
    allowed = documented | {h + s for h in HISTOGRAMS for s in HISTOGRAM_SERIES}
    used: set[str] = set()
    for expr in _expressions(_dashboard()):
        used |= set(re.findall(r"\bpynvmf_[a-z0-9_]+", expr))
    assert used, "no metric in the dashboard"
    assert used <= allowed, f"not in docs/metrics.md's table: {sorted(used - allowed)}"
    # The dashboard shows what operators look for first.
    for name in (
        "pynvmf_commands_total",
        "pynvmf_command_bytes_total",
        "pynvmf_command_errors_total",
        "pynvmf_connections",
        "pynvmf_ana_state",
        "pynvmf_tls_handshake_failures_total",
        "pynvmf_auth_failures_total",
        "pynvmf_data_digest_errors_total",
        "pynvmf_budget_waits_total",
        "pynvmf_command_latency_seconds_bucket",
        "pynvmf_command_stage_seconds_bucket",
    ):
        assert name in used, name


def test_the_latency_panels_take_quantiles_of_the_histograms() -> None:
    expressions = _expressions(_dashboard())
    assert (
        "histogram_quantile(0.99, sum by (le, subsystem, opcode) "
        '(rate(pynvmf_command_latency_seconds_bucket{subsystem=~"$subsystem"}[1m])))'
    ) in expressions
    assert any(
        e.startswith("histogram_quantile(0.99, sum by (le, stage)")
        and "pynvmf_command_stage_seconds_bucket" in e
        for e in expressions
    )


def test_promtool_parses_every_query(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "Debian's prometheus (promtool) is missing: make system-deps"
    rules = []
    for i, expr in enumerate(_expressions(_dashboard())):
        for name, value in VARIABLES.items():
            expr = expr.replace(name, value)
        rules.append({"record": f"pynvmf:dashboard_query_{i}", "expr": expr})
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(
        [promtool, "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout
