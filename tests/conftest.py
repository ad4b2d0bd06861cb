"""Test configuration: hypothesis profiles (``HYPOTHESIS_PROFILE=long`` for longer runs).

Under CI (``CI`` set) the examples are derandomized, so a run is reproducible
and main cannot turn red on a draw; locally every run draws new examples, and
the long profile is the one that hunts.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

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
