"""The kit against the blind corpus: every defect caught, no false alarm.

The corpus (``tests/blind_corpus``) was written from README.md and
docs/SPEC.md alone by someone who had not seen the kit. Each entry is
audited once here, as a user would audit it (its policy, its reuse
threshold and table size), with a fixed seed: defective managers at the
default budget (a finding usually takes well under a second), correct ones
(and "defects" the specification allows, ``corpus_verdicts.py``) at a
smaller budget. ``scripts/measure_corpus.py`` measures the same across
seeds at the default budget; docs/KIT.md has its table.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from kvoffload.stateful import AuditReport, ReuseFilterParams, audit
from tests.blind_corpus.manifest import MANIFEST
from tests.stateful.corpus_verdicts import expected_to_pass

PASSING_BUDGET = 80
SEED = 20261121


def _audit(entry: Any, max_examples: int | None) -> AuditReport:
    module, _, name = entry.factory.partition(":")
    factory = getattr(importlib.import_module(module), name)
    reuse = None
    if entry.reuse_threshold is not None:
        tracker = getattr(entry, "tracker_size", None)
        reuse = ReuseFilterParams(entry.reuse_threshold, tracker or 64_000)
    return audit(
        factory,
        policy=entry.policy,
        reuse_filter=reuse,
        seed=SEED,
        max_examples=max_examples,
        name=entry.name,
        factory_import=entry.factory,
    )


@pytest.mark.parametrize("entry", MANIFEST, ids=lambda e: e.name)
def test_corpus_entry(entry: Any) -> None:
    passing = expected_to_pass(entry)
    report = _audit(entry, PASSING_BUDGET if passing else None)
    assert report.passed is passing, report.render()
