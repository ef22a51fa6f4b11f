"""The Ceph tests' fixtures (the cluster itself is tests/conftest.py's `ceph_cluster`),
and what a failed Ceph test's report says about the cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.ceph_cluster import CephCluster


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    cluster = getattr(item, "funcargs", {}).get("ceph_cluster")
    if report.failed and isinstance(cluster, CephCluster):
        # A test that fails because the cluster stopped answering looks like any other
        # failure; the daemons' state and logs tell the two apart.
        report.sections.append(("ceph cluster", cluster.diagnosis()))
