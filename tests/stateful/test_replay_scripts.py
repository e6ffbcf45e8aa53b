"""A printed replay script, run as a program, stops at the violating call
with a non-zero exit status and says what the specification expected; the
same script against a correct manager runs to the end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kvoffload.spec.invariants import Invariant
from kvoffload.stateful import audit
from tests.stateful.thirdparty import unprotected_lru

REPO_ROOT = Path(__file__).resolve().parents[2]


def run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-"], input=script, text=True, cwd=REPO_ROOT,
        capture_output=True, timeout=60, check=False,
    )


def test_a_wrong_victim_stops_the_script_at_that_call() -> None:
    report = audit(
        unprotected_lru,
        policy="lru",
        factory_import="tests.stateful.thirdparty:unprotected_lru",
    )
    assert report.invariant is Invariant.EVICTION, report.render()
    assert report.script is not None
    lines = report.script.splitlines()
    violating = next(i for i, line in enumerate(lines) if line.startswith("out = m.prepare_store("))
    check = lines[violating + 2]
    # the specification stores nothing (None) or evicts other keys
    assert check.startswith(("expect(out, None, ", "expect(list(out.evicted_keys), ")), check

    completed = run(report.script)
    assert completed.returncode == 1, completed.stdout + completed.stderr
    last = completed.stderr.strip().splitlines()[-1]
    assert last.startswith(("AssertionError: prepare_store: ", "AssertionError: evicted_keys: "))
    assert "the manager gives " in last and "the specification expects " in last, last
    # the traceback points at the check right after the violating call
    assert f'line {violating + 3}' in completed.stderr, completed.stderr

    # against a correct manager the same calls run to the end
    fixed = report.script.replace(
        "from tests.stateful.thirdparty import unprotected_lru as factory",
        "from tests.stateful.thirdparty import dict_lru as factory",
    )
    assert fixed != report.script
    completed = run(fixed)
    assert completed.returncode == 0, completed.stderr
