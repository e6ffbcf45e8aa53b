"""How often the tier kit prints a directed replay for a race, and whether
each printed script repeats it: the figures behind docs/KIT.md ("Races
replay deterministically") and docs/DECISIONS.md "tierquiet".

    python scripts/measure_race_replay.py                     # the index race, seeds 1-12
    python scripts/measure_race_replay.py --entry thread_worker.takes_results_unlocked --seeds 1 2 3 4 5 6
    python scripts/measure_race_replay.py --scripts 5         # run each printed script 5 times

For each seed, the blind-corpus entry is audited as a user would
(``audit_tier`` at the default budget, under the entry's profile); the
line says whether the audit caught the race, at which run, whether the
report carries a ``Schedule`` (a directed replay), and how long the audit
took. With ``--scripts N`` each printed script with a schedule is run N
times in a fresh interpreter, counting the runs that raise the audit's
violation.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from kvoffload.stateful import audit_tier  # noqa: E402
from tests.blind_tiers.manifest import BY_NAME  # noqa: E402


def run_script(script: str, label: str, times: int) -> int:
    """How many of ``times`` runs of ``script`` raised the violation ``label``."""
    with tempfile.TemporaryDirectory(prefix="kvoffload-race-script-") as directory:
        path = os.path.join(directory, "replay.py")
        with open(path, "w", encoding="utf-8") as out:
            out.write(script)
        env = {**os.environ, "PYTHONPATH": ROOT}
        failed = 0
        for _ in range(times):
            done = subprocess.run(
                [sys.executable, path], capture_output=True, text=True, cwd=ROOT,
                env=env, timeout=300,
            )
            failed += done.returncode != 0 and label in done.stderr
        return failed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entry", default="thread_worker.copy_on_write_index_race")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(1, 13)))
    parser.add_argument("--scripts", type=int, default=0, help="runs of each printed script")
    args = parser.parse_args(argv)
    entry = BY_NAME.get(args.entry)
    if entry is None:
        parser.error(f"no corpus entry {args.entry!r}")
    caught = scheduled = script_runs = script_failures = 0
    for seed in args.seeds:
        started = time.perf_counter()
        module, _, attr = entry.factory.rpartition(".")
        report = audit_tier(
            entry.load(), profile=entry.profile(), seed=seed, factory_import=f"{module}:{attr}",
        )
        seconds = time.perf_counter() - started
        has = bool(report.script and "Schedule([" in report.script)
        caught += not report.passed
        scheduled += has
        line = (
            f"seed {seed}: {'PASS' if report.passed else 'caught'} at run {report.examples}, "
            f"{'a schedule' if has else 'no schedule'}, {seconds:.1f} s"
        )
        if has and args.scripts and report.script and report.invariant is not None:
            failed = run_script(report.script, report.invariant.label, args.scripts)
            script_runs += args.scripts
            script_failures += failed
            line += f"; script failed {failed} of {args.scripts} runs"
        print(line, flush=True)
    summary = f"{args.entry}: caught in {caught} of {len(args.seeds)} seeds, a schedule in {scheduled}"
    if args.scripts:
        summary += f"; printed scripts failed {script_failures} of {script_runs} runs"
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
