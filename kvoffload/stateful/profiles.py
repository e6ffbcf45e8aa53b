"""Hypothesis settings profiles for the conformance kit.

- ``ci``: bounded and reproducible (derandomized), prints the reproduction
  blob of a failure; what CI runs.
- ``dev``: the default while developing: random, moderate budget.
- ``deep``: long campaigns (thousands of examples, longer call sequences).

``register_profiles()`` is idempotent; select one with
``settings.load_profile(name)`` or ``HYPOTHESIS_PROFILE=name`` under pytest
(see ``tests/conftest.py``).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

PROFILES = ("ci", "dev", "deep")

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]


def register_profiles() -> None:
    """Register the ``ci``, ``dev`` and ``deep`` profiles with Hypothesis."""
    settings.register_profile(
        "ci",
        max_examples=100,
        stateful_step_count=40,
        derandomize=True,
        print_blob=True,
        deadline=None,
        suppress_health_check=_SLOW_OK,
    )
    settings.register_profile(
        "dev",
        max_examples=150,
        stateful_step_count=50,
        deadline=None,
        suppress_health_check=_SLOW_OK,
    )
    settings.register_profile(
        "deep",
        max_examples=5_000,
        stateful_step_count=120,
        print_blob=True,
        deadline=None,
        suppress_health_check=_SLOW_OK,
    )
