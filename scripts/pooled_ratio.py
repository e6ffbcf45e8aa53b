"""Pool the run-by-run pairs of several ``bench tier --json`` files and
say, row by row, whether kvoffload's file tier is faster than vLLM's fs
tier, slower, or at parity: no difference the pairs can tell from their
spread (the 95 % interval of the geometric mean of the pairs' ratios holds
1.00). The question issue 16's "at least vLLM's throughput" asks, answered
with every pair the runs made instead of one median per run.

    python scripts/pooled_ratio.py docs/measurements/vm-4c68454-paired-*.json

Rows are grouped by the file system the run's conditions name (tmpfs,
ext4, ...), the chunk size and the operation
(:func:`kvoffload.bench.tier.pool_runs`). Files written before the JSON
kept each run's GB/s (``tier_gbps_runs``) have no pairs and are named and
skipped. Exit status 1 when no file has pairs, 2 when one cannot be read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvoffload.bench.tier import pool_runs, render_pooled  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="bench tier --json outputs")
    args = parser.parse_args(argv)
    documents: list[tuple[str, dict[str, Any]]] = []
    for path in args.files:
        try:
            documents.append((str(path), json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError) as error:
            print(f"pooled_ratio: {path}: {error}", file=sys.stderr)
            return 2
    rows, skipped = pool_runs(documents)
    for name in skipped:
        print(f"pooled_ratio: {name}: no run-by-run pairs", file=sys.stderr)
    if not rows:
        print("pooled_ratio: no pairs in these files", file=sys.stderr)
        return 1
    print(render_pooled(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
