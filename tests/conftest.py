"""Test configuration: hypothesis profiles (``HYPOTHESIS_PROFILE=long`` for longer runs).

Under CI (``CI`` set) the examples are derandomized, so a run is reproducible
and main cannot turn red on a draw; locally every run draws new examples, and
the long profile is the one that hunts.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from passes.fold import runner

settings.register_profile(
    "default",
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "long", max_examples=2000, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def no_idle_child() -> None:
    """No idle onnxruntime child an earlier in-process run of fold kept (:mod:`passes.fold.runner`),
    for the tests that count the children of this process."""
    runner.close_idle()
