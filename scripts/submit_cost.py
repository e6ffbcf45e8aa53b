"""What a file-tier ``submit_store`` that evicts costs on the caller's
thread, and its parts: a full tier (every store evicts as many chunks as it
writes), one job at a time, the pool drained between jobs (outside the
timing). Prints the medians of the call's wall-clock and CPU time
(``time.thread_time``) and of each part, timed by wrapping the tier's
methods on the instance (the wrappers add a little to the total):

- ``_check_job``: the job's validation (keys, slots);
- ``_evict``: choosing victims and freeing their slots and files, of which
  ``policy.evict`` is the replacement policy's own choice;
- ``policy.insert_many``: the new keys entered in the policy;
- ``_enqueue``: the job registered and its items queued.

The rest of the total is the job object, the new blocks, the lock and the
pool thread's wake-up. With small chunks the caches are warm; with large
ones the pool's copies (drained just before) have left them cold, which is
the state a submit meets while the pool runs. ``--evict-between SIZE``
writes SIZE bytes before each timed call, as ``bench tier`` does, for the
parts of a call with cold caches::

    python scripts/submit_cost.py --dir /dev/shm --chunk 4K
    python scripts/submit_cost.py --dir /var/tmp --chunk 4M
    python scripts/submit_cost.py --dir /dev/shm --chunk 4K --evict-between 8M

With ``--fresh N`` it times instead the first ``--jobs`` stores (no
eviction) into each of ``N`` new, empty tiers, one line per call's place
(the first call of a tier, the second, ...), medians over the tiers: the
first call a scheduler makes on a tier meets its code and data cold::

    python scripts/submit_cost.py --dir /dev/shm --chunk 1M --fresh 20 --jobs 4

Run from the repository root (it puts the root first on the import path),
or with the installed package: ``python scripts/submit_cost.py --installed``.
"""

from __future__ import annotations

import argparse
import gc
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

if "--installed" not in sys.argv:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from kvoffload import FileSystemTier  # noqa: E402
from kvoffload.bench.sizes import format_size, parse_size  # noqa: E402
from kvoffload.bench.tier import _scribbler  # noqa: E402
from kvoffload.impl.build import build_name  # noqa: E402
from kvoffload.spec.keys import make_offload_key  # noqa: E402
from kvoffload.spec.tier_contract import TierJob  # noqa: E402

PARTS = (
    ("_check_job", False),
    ("_evict", False),
    ("evict", True),
    ("insert_many", True),
    ("_enqueue", False),
)
"""(method, whether it is the policy's) timed inside the call."""


def _timed(owner: Any, name: str, into: dict[str, list[int]], label: str) -> None:
    """Replace ``owner.name`` by a wrapper adding its nanoseconds to
    ``into[label]``; nothing (and no ``label``) where the object takes no
    such attribute."""
    inner: Callable[..., Any] = getattr(owner, name)
    samples = into.setdefault(label, [])

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter_ns()
        try:
            return inner(*args, **kwargs)
        finally:
            samples.append(time.perf_counter_ns() - started)

    try:
        setattr(owner, name, wrapper)
    except (AttributeError, TypeError):
        del into[label]


def _timed_store(tier: FileSystemTier, job: TierJob) -> tuple[int, int]:
    """``tier.submit_store(job)``'s wall-clock and CPU nanoseconds."""
    cpu_before, before = time.thread_time_ns(), time.perf_counter_ns()
    tier.submit_store(job)
    return time.perf_counter_ns() - before, time.thread_time_ns() - cpu_before


def _drain(tier: FileSystemTier) -> None:
    """Wait for the tier's jobs; raise if any failed."""
    tier.drain_jobs()
    failed = [r.job_id for r in tier.get_finished_jobs() if not r.success]
    if failed:
        raise RuntimeError(f"store jobs {failed} failed")


def measure(
    directory: str, chunk: int, jobs: int, job_chunks: int, seed: int, evict_between: int = 0
) -> None:
    capacity = 32 * job_chunks
    region = mmap.mmap(-1, job_chunks * chunk)
    view = memoryview(region).cast("B", (job_chunks, chunk))
    view_bytes = np.frombuffer(region, np.uint8)
    rng = np.random.default_rng(seed)
    view_bytes[:] = np.frombuffer(rng.bytes(len(view_bytes)), np.uint8)
    root = tempfile.mkdtemp(prefix="kvoffload-submit-cost-", dir=directory)
    tier = FileSystemTier(os.path.join(root, "tier"), capacity, view)
    next_id = 0

    def job() -> TierJob:
        nonlocal next_id
        next_id += 1
        keys = tuple(make_offload_key(rng.bytes(32), 0) for _ in range(job_chunks))
        return TierJob(next_id, keys, tuple(range(job_chunks)), False)

    try:
        for _ in range(capacity // job_chunks):  # fill: every later store evicts
            tier.submit_store(job())
        _drain(tier)
        gc.freeze()
        parts: dict[str, list[int]] = {}
        for name, of_policy in PARTS:
            owner = tier._policy if of_policy else tier
            _timed(owner, name, parts, f"policy.{name}" if of_policy else name)
        walls: list[int] = []
        cpus: list[int] = []
        between = _scribbler(evict_between) if evict_between else None
        for _ in range(jobs):
            next_job = job()
            if between is not None:
                between()
            wall, cpu = _timed_store(tier, next_job)
            walls.append(wall)
            cpus.append(cpu)
            _drain(tier)
    finally:
        tier.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"{format_size(chunk)} chunks, {job_chunks} per job, {jobs} jobs into a full tier "
        f"of {capacity} under {directory} ({tier.file_system}; {tier.num_threads} pool "
        f"threads, checksum {'on' if tier.checksums else 'off'}); {build_name()} build"
        + (f"; {format_size(evict_between)} written before each call" if evict_between else "")
    )
    print(f"submit_store, median: {statistics.median(walls) / 1e3:.1f} µs wall, "
          f"{statistics.median(cpus) / 1e3:.1f} µs CPU")
    for label, samples in parts.items():
        print(f"  {label}: {statistics.median(samples) / 1e3:.1f} µs")


def measure_fresh(
    directory: str, chunk: int, tiers: int, jobs: int, job_chunks: int, seed: int
) -> None:
    region = mmap.mmap(-1, job_chunks * jobs * chunk)
    view = memoryview(region).cast("B", (job_chunks * jobs, chunk))
    rng = np.random.default_rng(seed)
    root = tempfile.mkdtemp(prefix="kvoffload-submit-cost-", dir=directory)
    gc.freeze()
    walls: list[list[int]] = [[] for _ in range(jobs)]
    cpus: list[list[int]] = [[] for _ in range(jobs)]
    checks: list[list[int]] = [[] for _ in range(jobs)]
    try:
        for index in range(tiers):
            tier = FileSystemTier(os.path.join(root, f"tier{index}"), job_chunks * jobs, view)
            parts: dict[str, list[int]] = {}
            _timed(tier, "_check_job", parts, "_check_job")
            try:
                for place in range(jobs):
                    keys = tuple(make_offload_key(rng.bytes(32), 0) for _ in range(job_chunks))
                    slots = tuple(range(place * job_chunks, (place + 1) * job_chunks))
                    wall, cpu = _timed_store(tier, TierJob(place, keys, slots, False))
                    walls[place].append(wall)
                    cpus[place].append(cpu)
                _drain(tier)
            finally:
                tier.shutdown()
            for place, nanoseconds in enumerate(parts["_check_job"]):
                checks[place].append(nanoseconds)
    finally:
        gc.unfreeze()
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"{format_size(chunk)} chunks, {job_chunks} per job, the first {jobs} stores into "
        f"each of {tiers} new tiers under {directory}; {build_name()} build; medians (max)"
    )
    for place in range(jobs):
        print(
            f"call {place + 1}: {statistics.median(walls[place]) / 1e3:.1f} µs wall "
            f"({max(walls[place]) / 1e3:.0f}), {statistics.median(cpus[place]) / 1e3:.1f} "
            f"µs CPU, _check_job {statistics.median(checks[place]) / 1e3:.1f} µs"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the tier lives")
    parser.add_argument("--chunk", default="4K", help="chunk size (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="timed jobs (default: 300; 4 per tier with --fresh)")
    parser.add_argument("--job-chunks", type=int, default=8,
                        help="chunks per job (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--evict-between", default="0", metavar="SIZE",
                        help="bytes written before each timed call of a full tier, as "
                        "bench tier --evict-between (caches cold; default: none)")
    parser.add_argument("--fresh", type=int, default=None, metavar="N",
                        help="time the first --jobs stores into each of N new tiers")
    parser.add_argument("--installed", action="store_true",
                        help="import the installed kvoffload, not this checkout's")
    args = parser.parse_args()
    if args.jobs is None:
        args.jobs = 300 if args.fresh is None else 4
    if args.jobs < 1 or args.job_chunks < 1:
        parser.error("--jobs and --job-chunks must be at least 1")
    if args.fresh is not None:
        if args.fresh < 1:
            parser.error("--fresh must be at least 1")
        if parse_size(args.evict_between):
            parser.error("--evict-between times a full tier's calls, not --fresh ones")
        measure_fresh(args.dir, parse_size(args.chunk), args.fresh, args.jobs,
                      args.job_chunks, args.seed)
    else:
        measure(args.dir, parse_size(args.chunk), args.jobs, args.job_chunks, args.seed,
                parse_size(args.evict_between))


if __name__ == "__main__":
    main()
