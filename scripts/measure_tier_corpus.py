"""Audit every tier of the blind tier corpus across seeds and print a table.

The blind tier corpus (``tests/blind_tiers``, listed in its ``manifest.py``)
is a set of secondary tiers written from docs/SPEC.md, the tier contract and
vLLM's ``tiering/base.py`` alone, without the kit: a correct tier of each of
9 designs and defective variants, each with one slip. This script audits
each entry as a user would (``audit_tier()`` at the default budget unless
``--examples``, under the profile its design declares: ``Entry.profile()``)
once per seed and prints, per entry: how many seeds caught
the defect (or raised a false alarm, for a correct tier), the invariants
named, the replay's length, the latest run (over the seeds) that failed,
and the wall time per audit.

    python scripts/measure_tier_corpus.py                  # seeds 1-5, default budget
    python scripts/measure_tier_corpus.py --seeds 1 2 --jobs 2
    python scripts/measure_tier_corpus.py --only thread_worker --markdown

Entries the manifest marks ``kit_visible=False`` break only a policy their
design declares, not the tier contract (the kit leaves a tier's victims to
the tier), and those ``tests/stateful/tier_corpus_verdicts.py`` shows the
specification allows: they are expected to pass. Exit status 1 when a defect is missed
by some seed or a correct tier fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from measure_corpus import print_table, run_jobs  # noqa: E402  (this directory)

from kvoffload.stateful import audit_tier  # noqa: E402
from tests.blind_tiers.manifest import BY_NAME, ENTRIES, Entry  # noqa: E402
from tests.stateful.tier_corpus_verdicts import ALLOWED  # noqa: E402

Result = tuple[str, int, bool, str | None, float, int, str, int]
"""(name, seed, passed, invariant label, seconds, calls, driver, runs): ``runs``
is how many runs the audit made, so for a failing audit the 1-based index of
the run that failed (the runs are derandomized per seed and index: the same
run fails at any budget that reaches it)."""


def expected_to_pass(entry: Entry) -> bool:
    """A correct tier, a defect outside the tier contract, or one the
    specification allows (``ALLOWED``)."""
    return entry.correct or not entry.kit_visible or entry.name in ALLOWED


def audit_entry(entry: Entry, seed: int, examples: int | None) -> Result:
    module, _, attr = entry.factory.rpartition(".")
    started = time.perf_counter()
    report = audit_tier(
        entry.load(),
        profile=entry.profile(),
        seed=seed,
        max_examples=examples,
        name=entry.name,
        factory_import=f"{module}:{attr}",
    )
    seconds = time.perf_counter() - started
    label = None if report.invariant is None else report.invariant.label
    return (
        entry.name, seed, report.passed, label, seconds, report.calls,
        report.driver or "", report.examples,
    )


def _job(args: tuple[str, int, int | None]) -> Result:
    name, seed, examples = args
    return audit_entry(BY_NAME[name], seed, examples)


def _progress(result: Result) -> None:
    name, seed, passed, label, seconds, calls, _, runs = result
    verdict = "PASS" if passed else f"{label} ({calls} calls, run {runs})"
    print(f"{name} seed {seed}: {verdict} in {seconds:.1f} s", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--examples", type=int, default=None, help="runs per audit")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=None, help="entry names (prefixes)")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--progress", action="store_true", help="a line per audit, on stderr")
    args = parser.parse_args(argv)

    entries = [
        e for e in ENTRIES
        if args.only is None or any(e.name.startswith(p) for p in args.only)
    ]
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    jobs = [(e.name, s, args.examples) for e in entries for s in args.seeds]
    started = time.perf_counter()
    results = run_jobs(_job, jobs, args.jobs, _progress if args.progress else None)
    total = time.perf_counter() - started

    by_entry: dict[str, list[Result]] = {}
    for result in results:
        by_entry.setdefault(result[0], []).append(result)
    rows, bad = [], 0
    for entry in entries:
        runs = by_entry[entry.name]
        passing = expected_to_pass(entry)
        failed = [r for r in runs if not r[2]]
        hits = len(runs) - len(failed) if passing else len(failed)
        ok = hits == len(runs)
        bad += not ok
        seconds = [r[4] for r in runs]
        calls = [r[5] for r in failed]
        threaded = sum(1 for r in failed if "poll thread" in r[6])
        failing_runs = [r[7] for r in failed]
        if entry.correct:
            verdict = f"false alarm {len(failed)}/{len(runs)}"
        elif not entry.kit_visible:
            verdict = f"outside the contract; flagged {len(failed)}/{len(runs)}"
        elif entry.name in ALLOWED:
            verdict = f"allowed by §10; flagged {len(failed)}/{len(runs)}"
        else:
            verdict = f"caught {len(failed)}/{len(runs)}"
        rows.append((
            entry.name,
            verdict,
            ", ".join(sorted({str(r[3]) for r in failed})) or "-",
            f"{min(calls)}–{max(calls)}" if calls else "-",
            f"{threaded}/{len(failed)}" if failed else "-",
            str(max(failing_runs)) if failing_runs else "-",
            f"{sum(seconds) / len(seconds):.1f}",
            f"{max(seconds):.1f}",
            "" if ok else "  <-- " + ("unexpected" if passing else "missed"),
        ))
    head = (
        "entry", "result", "invariant", "calls", "poll thread", "latest failing run",
        "mean s", "max s", "",
    )
    print_table(head, rows, args.markdown)
    defects = [e for e in entries if not expected_to_pass(e)]
    correct = [e for e in entries if expected_to_pass(e)]
    caught_all = sum(1 for e in defects if all(not r[2] for r in by_entry[e.name]))
    clean = sum(1 for e in correct if all(r[2] for r in by_entry[e.name]))
    passing_times = [r[4] for r in results if r[2]]
    failing_times = [r[4] for r in results if not r[2]]
    latest = max((r[7] for r in results if not r[2]), default=0)
    print(
        f"\n{caught_all}/{len(defects)} defects caught in every seed; "
        f"{clean}/{len(correct)} passing tiers pass in every seed; "
        f"seeds {args.seeds}, budget {args.examples or 'default'}; "
        f"passing audit max {max(passing_times, default=0):.1f} s, "
        f"failing audit max {max(failing_times, default=0):.1f} s; "
        f"latest failing run {latest}; "
        f"total {total:.0f} s with {args.jobs} job(s); "
        f"load average after: {os.getloadavg()[0]:.1f}"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
