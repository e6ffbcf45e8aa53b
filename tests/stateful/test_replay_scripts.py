"""A replay fails exactly when the manager breaks what the specification
demands: the printed script, run as a program, stops at the violating call
of the defective manager, and runs to its end (``replay passed``) for its
correct twin and for a fixed version that makes other legal choices (free
slot, victim under policy ``any``, ``None`` for a key being stored) — for
every kind of finding: a wrong answer, a recency slip, a crash, an illegal
call, an event."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from kvoffload.spec.invariants import Invariant
from kvoffload.stateful import audit
from kvoffload.stateful.replaying import REPLAY_END

REPO_ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.stateful.replay_twins"


@attrs.frozen
class Case:
    defect: str
    policy: str
    invariants: frozenset[Invariant]
    fixed: tuple[str, ...]  # the correct twin first, then fixed versions


CASES = [
    Case("unprotected", "any", frozenset({Invariant.EVICTION}),
         ("correct", "high_slots", "most_recent_victims")),
    Case("touch_order_slip", "lru", frozenset({Invariant.EVICTION, Invariant.LIVENESS}),
         ("correct", "high_slots")),
    Case("crashes_on_absent_touch", "lru", frozenset({Invariant.CRASH}),
         ("correct", "high_slots")),
    Case("accepts_bad_load", "lru", frozenset({Invariant.ERRORS}), ("correct", "high_slots")),
    Case("pending_hits", "lru", frozenset({Invariant.LOOKUP}),
         ("correct", "high_slots", "retries_pending")),
    Case("announces_failed_stores", "lru", frozenset({Invariant.EVENTS}),
         ("correct", "high_slots")),
]


def run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-"], input=script, text=True, cwd=REPO_ROOT,
        capture_output=True, timeout=60, check=False,
    )


def importing(script: str, defect: str, other: str) -> str:
    line = f"from {MODULE} import {defect} as factory"
    assert line in script.splitlines(), script
    return script.replace(line, f"from {MODULE} import {other} as factory")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.defect)
def test_replay_fails_the_defect_and_passes_legal_managers(case: Case) -> None:
    module = __import__(MODULE, fromlist=[case.defect])
    report = audit(getattr(module, case.defect), policy=case.policy, seed=3,
                   max_examples=200, factory_import=f"{MODULE}:{case.defect}")
    assert not report.passed and report.invariant in case.invariants, report.render()
    script = report.script
    assert script is not None and script.rstrip("\n").splitlines()[-1] == REPLAY_END

    failed = run(script)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "replay passed" not in failed.stdout
    last = failed.stderr.strip().splitlines()[-1]
    if report.invariant is Invariant.CRASH:
        assert last.startswith("KeyError"), failed.stderr
    else:
        assert f"[{report.invariant.label}]" in last, failed.stderr
    # the traceback names the violating call: the last manager call
    calls = [i for i, line in enumerate(script.splitlines(), 1) if line.startswith(("m.", "out = m.", "list(m.", "out = list(m."))]
    assert f"line {calls[-1]}" in failed.stderr, failed.stderr

    for other in case.fixed:
        passed = run(importing(script, case.defect, other))
        assert passed.returncode == 0, f"{other}:\n{script}\n{passed.stderr}"
        assert passed.stdout.startswith("replay passed"), passed.stdout


@pytest.mark.parametrize(
    ("name", "policy"),
    [("high_slots", "lru"), ("most_recent_victims", "any"), ("retries_pending", "lru")],
)
def test_the_fixed_versions_keep_the_specification(name: str, policy: str) -> None:
    module = __import__(MODULE, fromlist=[name])
    report = audit(getattr(module, name), policy=policy, seed=5, max_examples=150)
    assert report.passed, report.render()


def test_a_protocol_finding_replays_with_its_check() -> None:
    """The engine driver's repeated-prompt property shows in no single call:
    its replay ends with a check of the last answer, which fails."""
    from kvoffload.spec.profile import DEFAULT, FilterCounts
    from tests.stateful.test_kit_power import FILTER, lookup_counting_filter

    profile = attrs.evolve(DEFAULT, name="first-miss", filter_counts=FilterCounts.LOOKUPS_TO_FIRST_MISS)
    report = audit(lookup_counting_filter, policy="lru", reuse_filter=FILTER, profile=profile,
                   seed=1, factory_import="tests.stateful.test_kit_power:lookup_counting_filter")
    assert report.invariant is Invariant.REPEATED_PROMPT and report.script is not None
    assert "filter_counts='lookups-to-first-miss'" in report.script
    lines = report.script.splitlines()
    assert lines[-3].startswith("expect(out in (None, ") and lines[-4].startswith("# ^")
    failed = run(report.script)
    assert failed.returncode == 1 and "lookup_prefix reads the repeated prompt back whole" in (
        failed.stderr
    ), failed.stderr
