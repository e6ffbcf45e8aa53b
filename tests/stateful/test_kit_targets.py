"""The built-in managers pass the conformance kit (a bounded budget for CI).

These audits are also what holds ``kvoffload/impl`` to the specification
under mutation testing (docs/KIT.md): a mutant that changes a victim, a slot,
an event or an error is caught here.
"""

from __future__ import annotations

import pytest

from kvoffload.stateful import audit
from kvoffload.stateful.targets import BUILTIN_TARGETS, BuiltinTarget

PASSING_BUDGET = 60
"""Examples for audits expected to pass (the default budget is 500; the
CI main job and `python -m kvoffload audit` run the built-ins again)."""


@pytest.mark.parametrize("target", BUILTIN_TARGETS, ids=lambda t: t.name)
def test_builtin_target_passes(target: BuiltinTarget) -> None:
    report = audit(
        target.factory,
        policy=target.policy,
        reuse_filter=target.reuse_filter,
        profile=target.audit_profile,
        max_examples=PASSING_BUDGET,
        name=target.name,
        factory_import=target.import_path,
    )
    assert report.passed, report.render()
