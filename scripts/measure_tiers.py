"""Audit the sample tiers of tests/stateful/tier_samples.py (correct ones and
planted defects) at the default budget over several seeds; print a Markdown
table of verdicts and times (docs/KIT.md, "Auditing a secondary tier").

    PYTHONPATH=. python scripts/measure_tiers.py --seeds 1 2 3 4 5
"""

from __future__ import annotations

import argparse
import os
import time

from kvoffload.stateful import audit_tier
from tests.stateful import tier_samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    print()
    print("| tier | expected | verdicts (one per seed) | max seconds | replay calls |")
    print("| --- | --- | --- | --- | --- |")
    rows = [(n, f, "PASS") for n, f in tier_samples.CORRECT.items()]
    rows += [(n, f, "/".join(sorted(i.label for i in inv)))
             for n, (f, inv) in tier_samples.PLANTED.items()]
    for name, factory, expected in rows:
        verdicts, seconds, calls = [], [], []
        for seed in args.seeds:
            started = time.perf_counter()
            report = audit_tier(factory, seed=seed)
            seconds.append(time.perf_counter() - started)
            verdicts.append("PASS" if report.passed else str(report.invariant).split()[0])
            calls.append(report.calls)
        shown = " ".join(verdicts)
        print(f"| `{name}` | {expected} | {shown} | {max(seconds):.1f} | "
              f"{min(calls)}–{max(calls)} |")
    print()
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
