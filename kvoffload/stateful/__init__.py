"""The conformance kit: hold any offloading manager to the specification.

- :func:`audit` runs the state machine against ``factory(num_blocks)`` and
  returns an :class:`AuditReport` (with a replay script on failure).
- :func:`conformance_test` turns ``(factory, policy)`` into a pytest test in
  one line; :func:`machine_test_case` gives the raw Hypothesis
  ``TestCase`` (for HypoFuzz campaigns).
- :class:`LegacyManagerAdapter` audits managers written against the older
  block-hash-list API.
- :func:`check_exhaustively` runs every call sequence up to a depth.
- :func:`audit_tier` holds a secondary tier (vLLM 0.33's
  ``SecondaryTierManager`` shape) built by
  ``factory(capacity_blocks, primary_kv_view)`` to the tier model, bytes
  included (:mod:`kvoffload.stateful.tier_audit`).
"""

from __future__ import annotations

import unittest
from collections.abc import Callable

from hypothesis import settings

from kvoffload.spec.contract import OffloadingManager
from kvoffload.spec.profile import DEFAULT, Profile
from kvoffload.stateful.auditing import DEFAULT_EXAMPLES, AuditReport, audit
from kvoffload.stateful.harness import (
    ContextFactory,
    Discrepancy,
    Harness,
    KitConfig,
    ReuseFilterParams,
    default_context,
)
from kvoffload.stateful.legacy import LegacyManagerAdapter, LegacyOffloadingManager
from kvoffload.stateful.machine import ManagerMachine, make_manager_machine
from kvoffload.stateful.profiles import register_profiles
from kvoffload.stateful.tier_audit import audit_tier


def conformance_test(
    factory: Callable[[int], OffloadingManager],
    *,
    policy: str = "any",
    reuse_filter: ReuseFilterParams | None = None,
    profile: Profile = DEFAULT,
    typed_errors: bool | None = None,
    supports_reset: bool | None = None,
    max_examples: int | None = None,
    context_factory: ContextFactory | None = None,
) -> Callable[[], None]:
    """A test function auditing ``factory``: assign it to a ``test_*`` name.

    ``test_my_backend = conformance_test(make_backend, policy="any")``. The
    budget is the audit's default unless ``max_examples`` is given, or the
    active Hypothesis profile asks for more (``deep``). The test fails with
    the audit's report and replay script.
    """

    def test() -> None:
        hypothesis_settings = settings.default
        budget = max_examples
        if (
            budget is None
            and hypothesis_settings is not None
            and hypothesis_settings.max_examples > DEFAULT_EXAMPLES
        ):
            budget = hypothesis_settings.max_examples
        report = audit(
            factory,
            policy=policy,
            reuse_filter=reuse_filter,
            profile=profile,
            typed_errors=typed_errors,
            supports_reset=supports_reset,
            max_examples=budget,
            context_factory=context_factory,
        )
        if not report.passed:
            raise AssertionError(report.render())

    test.__name__ = f"test_conformance_{getattr(factory, '__name__', 'manager')}"
    return test


def machine_test_case(
    factory: Callable[[int], OffloadingManager],
    *,
    policy: str = "any",
    reuse_filter: ReuseFilterParams | None = None,
    profile: Profile = DEFAULT,
    typed_errors: bool | None = None,
    supports_reset: bool | None = None,
    context_factory: ContextFactory | None = None,
) -> type[unittest.TestCase]:
    """The state machine as a ``unittest.TestCase`` (assign it to a
    ``Test*`` name): Hypothesis's own shrinking and database, HypoFuzz-able."""
    config = KitConfig(
        factory,
        policy=policy,
        reuse_filter=reuse_filter,
        profile=profile,
        typed_errors=typed_errors,
        supports_reset=supports_reset,
        context_factory=context_factory or default_context,
    )
    test_case: type[unittest.TestCase] = make_manager_machine(config).TestCase
    return test_case


__all__ = [
    "AuditReport",
    "Discrepancy",
    "Harness",
    "KitConfig",
    "LegacyManagerAdapter",
    "LegacyOffloadingManager",
    "ManagerMachine",
    "ReuseFilterParams",
    "audit",
    "audit_tier",
    "conformance_test",
    "machine_test_case",
    "make_manager_machine",
    "register_profiles",
]
