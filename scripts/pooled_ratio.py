"""Pool the run-by-run pairs of several ``bench tier --json`` files and
say, row by row, whether kvoffload's file tier is faster than vLLM's fs
tier, slower, or at parity: no difference the pairs can tell from their
spread (the 95 % interval of the geometric mean of the pairs' ratios holds
1.00). The question issue 16's "at least vLLM's throughput" asks, answered
with every pair the runs made instead of one median per run.

    python scripts/pooled_ratio.py docs/measurements/vm-XXXX-*.json

Rows are grouped by the file system the run's conditions name (tmpfs,
ext4, ...), the chunk size and the operation. Files written before the
JSON kept each run's GB/s (``tier_gbps_runs``) have no pairs and are
named and skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvoffload.bench.sizes import format_size  # noqa: E402
from kvoffload.bench.tier import paired_ratio  # noqa: E402

_FILE_SYSTEM = re.compile(r"file system: ([^)]+)\)")

Row = tuple[str, int, str]


def pool(documents: list[tuple[Path, dict[str, Any]]]) -> tuple[
    dict[Row, tuple[list[float], list[float], set[Path]]], list[Path]
]:
    """The pairs of every row, over all documents, and the documents with
    none."""
    rows: dict[Row, tuple[list[float], list[float], set[Path]]] = defaultdict(
        lambda: ([], [], set())
    )
    skipped: list[Path] = []
    for path, document in documents:
        found = _FILE_SYSTEM.search(document.get("conditions", ""))
        file_system = found.group(1) if found else "unknown"
        paired = False
        for figure in document.get("figures", []):
            ours, theirs = figure.get("tier_gbps_runs", []), figure.get("vllm_gbps_runs", [])
            if not ours or len(ours) != len(theirs):
                continue
            paired = True
            key = (file_system, int(figure["chunk_bytes"]), str(figure["operation"]))
            rows[key][0].extend(float(v) for v in ours)
            rows[key][1].extend(float(v) for v in theirs)
            rows[key][2].add(path)
        if not paired:
            skipped.append(path)
    return dict(rows), skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="bench tier --json outputs")
    args = parser.parse_args(argv)
    documents = []
    for path in args.files:
        try:
            documents.append((path, json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError) as error:
            print(f"pooled_ratio: {path}: {error}", file=sys.stderr)
            return 2
    rows, skipped = pool(documents)
    for path in skipped:
        print(f"pooled_ratio: {path}: no run-by-run pairs (written before they were kept)",
              file=sys.stderr)
    if not rows:
        print("pooled_ratio: no pairs in these files", file=sys.stderr)
        return 1
    print("| file system | chunk | operation | files | pairs | kvoffload / vLLM, "
          "geometric mean (95 % interval) | pairs under 1 | verdict |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | --- |")
    for (file_system, chunk, operation), (ours, theirs, paths) in sorted(rows.items()):
        ratio = paired_ratio(ours, theirs)
        if ratio is None:
            print(f"| {file_system} | {format_size(chunk)} | {operation} | {len(paths)} | "
                  f"{len(ours)} | — | — | one pair: no interval |")
            continue
        print(f"| {file_system} | {format_size(chunk)} | {operation} | {len(paths)} | "
              f"{ratio.pairs} | {ratio.geometric_mean:.3f} ({ratio.low:.3f}-{ratio.high:.3f}) | "
              f"{ratio.below_one} | {ratio.verdict} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
