"""Hypothesis budgets for the fuzz properties.

`make test` runs the "ci" profile (a bounded number of examples per property, no
deadline: the machines are shared and slow); `PYNVMF_FUZZ_PROFILE=long` gives each
property far more examples for a local run.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "long",
    max_examples=20000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("PYNVMF_FUZZ_PROFILE", "ci"))
