"""How many queued load items a pool thread of the file tier should take at
once: the tier's rule (its share, ``ceil(queued / threads)`` items) against
a cap in bytes per take (``--cap 0``: one item per take), loading the same
cold chunks alternately, pair by pair. Behind docs/DECISIONS.md "h200"
(the share rule was kept: the VM's noise swamped the difference).

    python scripts/load_share_ab.py --size 1M --runs 8
    python scripts/load_share_ab.py --size 256K --runs 8 --cap 1M

Each run: a fresh tier (its defaults, in a temporary directory) stores
``--total`` bytes in jobs of 8 chunks, the files' pages are dropped, and it
loads them back (checked); GB/s of the load, timed from the first
``submit_load`` to the end of ``drain_jobs``. Prints each rule's GB/s per
run, their medians and the paired differences (capped minus share).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from kvoffload.bench import tier as bench  # noqa: E402
from kvoffload.bench.sizes import parse_size  # noqa: E402
from kvoffload.impl import fs_tier  # noqa: E402
from kvoffload.impl.fs_tier import FileSystemTier  # noqa: E402
from kvoffload.spec.keys import make_offload_key  # noqa: E402

JOB_CHUNKS = 8


def capped_take(cap: int) -> object:
    """A ``_take_loads`` that takes the tier's share, at most ``cap`` bytes
    of items (at least one item)."""

    def take(self: FileSystemTier, entry: fs_tier._Job) -> list[fs_tier._Item]:
        share = -(-self._queued_loads // self.num_threads)
        share = max(1, min(share, cap // self.chunk_bytes))
        start = entry.next_item
        end = min(entry.size(), start + share)
        entry.next_item = end
        self._queued_loads -= end - start
        return entry.take(start, end)

    return take


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1M", help="chunk size (default: 1M)")
    parser.add_argument("--total", default="128M", help="bytes per run (default: 128M)")
    parser.add_argument("--runs", type=int, default=8, help="pairs of runs (default: 8)")
    parser.add_argument("--cap", default="0", help="bytes per take, 0: one item (default: 0)")
    args = parser.parse_args(argv)
    size, cap = parse_size(args.size), parse_size(args.cap)
    count = parse_size(args.total) // size
    _, primary = bench._aligned_primary(count, size)
    rng = np.random.default_rng(0)
    primary[:] = np.frombuffer(rng.bytes(count * size), np.uint8).reshape(count, size)
    expected = primary.copy()
    keys = [make_offload_key(rng.bytes(32), 0) for _ in range(count)]
    rules = {"share": FileSystemTier._take_loads, "capped": capped_take(cap)}
    rates: dict[str, list[float]] = {name: [] for name in rules}
    directory = Path(tempfile.mkdtemp(prefix="kvoffload-share-"))
    try:
        for run in range(args.runs):
            order = ("share", "capped") if run % 2 == 0 else ("capped", "share")
            for name in order:
                setattr(FileSystemTier, "_take_loads", rules[name])
                where = directory / name
                tier = FileSystemTier(where, count, primary.data)
                try:
                    bench._run_jobs(
                        tier.submit_store, tier.drain_jobs, tier.get_finished_jobs,
                        bench._jobs(keys, JOB_CHUNKS, promotion=False, first_id=0),
                        sync=directory,
                    )
                    bench._drop_cache(bench._files(where / "chunks"))
                    primary[:] = 0
                    seconds, _ = bench._run_jobs(
                        tier.submit_load, tier.drain_jobs, tier.get_finished_jobs,
                        bench._jobs(keys, JOB_CHUNKS, promotion=True, first_id=count),
                    )
                finally:
                    tier.shutdown()
                    shutil.rmtree(where, ignore_errors=True)
                if not np.array_equal(primary, expected):
                    raise RuntimeError("a load delivered other bytes")
                rates[name].append(count * size / seconds / 1e9)
    finally:
        setattr(FileSystemTier, "_take_loads", rules["share"])
        shutil.rmtree(directory, ignore_errors=True)
    for name, values in rates.items():
        line = " ".join(f"{value:.2f}" for value in values)
        print(f"{args.size} {name}: {line}  median {statistics.median(values):.2f} GB/s")
    deltas = [c - s for c, s in zip(rates["capped"], rates["share"])]
    print(
        f"capped - share per pair: {' '.join(f'{d:+.2f}' for d in deltas)}; "
        f"capped ahead in {sum(d > 0 for d in deltas)} of {len(deltas)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
