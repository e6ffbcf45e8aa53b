"""Audit every manager of the blind corpus across seeds and print a table.

The blind corpus (``tests/blind_corpus``, listed in its ``manifest.py``) is
a set of managers written from README.md and docs/SPEC.md alone, without
the kit: correct ones of several designs, and defective ones, each with one
slip. This script audits each entry as a user would (``audit()`` with the
entry's policy and reuse threshold, the default budget unless
``--examples``) once per seed, and prints, per entry: how many seeds caught
the defect (or raised a false alarm, for a correct manager), the invariants
and drivers named, and the wall time per audit.

    python scripts/measure_corpus.py                  # seeds 1-5, default budget
    python scripts/measure_corpus.py --seeds 1 2 --examples 100 --jobs 2
    python scripts/measure_corpus.py --only arc4 --markdown

Entries whose "defect" the specification allows (see ``NOT_DEFECTS`` in
``tests/stateful/corpus_verdicts.py``) are expected to pass. Exit status 1 when a defect is missed by some seed or a correct
manager fails.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvoffload.stateful import ReuseFilterParams, audit  # noqa: E402
from tests.blind_corpus.manifest import MANIFEST, Entry  # noqa: E402
from tests.stateful.corpus_verdicts import NOT_DEFECTS, expected_to_pass  # noqa: E402

Result = tuple[str, int, bool, str | None, str | None, float, int]
T = TypeVar("T")
R = TypeVar("R")


def audit_entry(entry: Entry, seed: int, examples: int | None) -> Result:
    """(name, seed, passed, invariant, driver, seconds, calls)."""
    module, _, name = entry.factory.partition(":")
    factory = getattr(importlib.import_module(module), name)
    reuse = None
    if entry.reuse_threshold is not None:
        tracker = getattr(entry, "tracker_size", None)
        reuse = ReuseFilterParams(
            store_threshold=entry.reuse_threshold,
            max_tracker_size=tracker if tracker is not None else 64_000,
        )
    started = time.perf_counter()
    report = audit(
        factory,
        policy=entry.policy,
        reuse_filter=reuse,
        seed=seed,
        max_examples=examples,
        name=entry.name,
        factory_import=entry.factory,
    )
    seconds = time.perf_counter() - started
    invariant = None if report.invariant is None else str(report.invariant)
    return (entry.name, seed, report.passed, invariant, report.driver, seconds, report.calls)


def _job(args: tuple[str, int, int | None]) -> Result:
    name, seed, examples = args
    entry = next(e for e in MANIFEST if e.name == name)
    return audit_entry(entry, seed, examples)


def print_table(
    head: Sequence[str], rows: Sequence[Sequence[str]], markdown: bool
) -> None:
    """Print ``rows`` under ``head``; the last column is a marker shown
    after the row (no header), e.g. ``<-- missed``."""
    if markdown:
        print("| " + " | ".join(head[:-1]) + " |")
        print("|" + " --- |" * (len(head) - 1))
        for row in rows:
            print("| " + " | ".join(row[:-1]) + " |" + row[-1])
    else:
        widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
        for row in [head, *rows]:
            print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())


def run_jobs(
    job: Callable[[T], R],
    jobs: Sequence[T],
    workers: int,
    progress: Callable[[R], None] | None = None,
) -> list[R]:
    """``job`` over ``jobs``, in ``workers`` processes when more than one;
    ``progress`` sees each result as it comes (in order)."""
    results: list[R] = []
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            for result in pool.map(job, jobs):
                results.append(result)
                if progress is not None:
                    progress(result)
        return results
    for one in jobs:
        results.append(job(one))
        if progress is not None:
            progress(results[-1])
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--examples", type=int, default=None, help="runs per audit")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=None, help="entry names (prefixes)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)

    entries = [
        e for e in MANIFEST
        if args.only is None or any(e.name.startswith(p) for p in args.only)
    ]
    jobs = [(e.name, s, args.examples) for e in entries for s in args.seeds]
    started = time.perf_counter()
    results = run_jobs(_job, jobs, args.jobs)
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
        invariants = sorted({str(r[3]) for r in failed})
        drivers = sorted({str(r[4]) for r in failed})
        seconds = [r[5] for r in runs]
        calls = [r[6] for r in failed]
        if entry.correct:
            verdict = f"false alarm {len(failed)}/{len(runs)}"
        elif entry.name in NOT_DEFECTS:
            verdict = f"allowed; flagged {len(failed)}/{len(runs)}"
        else:
            verdict = f"caught {len(failed)}/{len(runs)}"
        rows.append((
            entry.name,
            entry.policy + ("+filter" if entry.reuse_threshold else ""),
            verdict,
            ", ".join(invariants) or "-",
            ", ".join(drivers) or "-",
            f"{max(calls)}" if calls else "-",
            f"{sum(seconds) / len(seconds):.1f}",
            f"{max(seconds):.1f}",
            "" if ok else "  <-- " + ("missed" if not passing else "unexpected"),
        ))
    head = ("entry", "policy", "result", "invariant", "driver", "calls", "mean s", "max s", "")
    print_table(head, rows, args.markdown)
    defects = [e for e in entries if not expected_to_pass(e)]
    correct = [e for e in entries if expected_to_pass(e)]
    caught_all = sum(
        1 for e in defects if all(not r[2] for r in by_entry[e.name])
    )
    clean = sum(1 for e in correct if all(r[2] for r in by_entry[e.name]))
    every = [r[5] for r in results]
    print(
        f"\n{caught_all}/{len(defects)} defects caught in every seed; "
        f"{clean}/{len(correct)} passing managers pass in every seed; "
        f"seeds {args.seeds}, budget {args.examples or 'default'}; "
        f"audit wall time mean {sum(every) / len(every):.1f} s, max {max(every):.1f} s; "
        f"total {total:.0f} s with {args.jobs} job(s)"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
