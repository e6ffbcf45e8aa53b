"""What the disk gives to parallel reads of separate chunk files, with no
tier at all, and the CPU each tier spends per loaded chunk: the two
figures behind docs/PERFORMANCE.md "After fswake" (why the file tier's
loads sit at vLLM's and not above).

    python scripts/parallel_read_ceiling.py                       # 256 KiB, 128 MiB
    python scripts/parallel_read_ceiling.py --size 1M --threads 1 4 16 64
    python scripts/parallel_read_ceiling.py --vllm-path /tmp/vllm/0.33.0 --repeats 5

The reader: ``--total`` bytes as files of ``--size`` each in a temporary
directory, written and synced, their pages dropped (``posix_fadvise``);
then each of ``--threads`` threads takes the next file, opens it
(``O_DIRECT`` where the file system allows), reads it with one ``readv``
into a page-aligned buffer and closes it: GB/s per thread count, two
passes. With ``--vllm-path``, each tier (kvoffload's ``FileSystemTier``
with its defaults, vLLM 0.33's fs tier) stores the same chunks, its pages
are dropped, and it loads them back in jobs of 8; the process's CPU time
(``getrusage``, every thread) over the load, per chunk, and the load's
GB/s, alternated ``--repeats`` times.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from kvoffload.bench import tier as bench  # noqa: E402
from kvoffload.bench.sizes import parse_size  # noqa: E402
from kvoffload.impl.fs_tier import FileSystemTier  # noqa: E402
from kvoffload.spec.keys import make_offload_key  # noqa: E402

JOB_CHUNKS = 8


def read_in_parallel(files: list[Path], buffer: memoryview, size: int, threads: int) -> float:
    """GB/s of ``threads`` threads reading ``files`` (cold) into ``buffer``."""
    bench._drop_cache(iter(files))
    direct = getattr(os, "O_DIRECT", 0)
    lock = threading.Lock()
    queue = iter(range(len(files)))

    def work() -> None:
        while True:
            with lock:
                index = next(queue, None)
            if index is None:
                return
            fd = os.open(files[index], os.O_RDONLY | direct)
            try:
                os.readv(fd, [buffer[index * size : (index + 1) * size]])
            finally:
                os.close(fd)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    started = time.perf_counter()
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return len(files) * size / (time.perf_counter() - started) / 1e9


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def tier_loads(directory: Path, size: int, total: int, release: Path, repeats: int) -> None:
    """CPU µs per loaded chunk and GB/s, kvoffload's tier then vLLM's, alternated."""
    count = total // size
    _, primary = bench._aligned_primary(count, size)
    primary[:] = np.random.default_rng(0).integers(0, 256, primary.shape, dtype=np.uint8)
    keys = [make_offload_key(i.to_bytes(8, "big") * 2, 0) for i in range(count)]
    contender = bench.VllmFsTier(release)
    for run in range(1, repeats + 1):
        tier = FileSystemTier(directory / "kvoffload", count, primary.data)
        try:
            bench._run_jobs(
                tier.submit_store, tier.drain_jobs, tier.get_finished_jobs,
                bench._jobs(keys, JOB_CHUNKS, promotion=False, first_id=0), sync=directory,
            )
            bench._drop_cache(bench._files(directory / "kvoffload" / "chunks"))
            cpu, wall = cpu_seconds(), time.perf_counter()
            bench._run_jobs(
                tier.submit_load, tier.drain_jobs, tier.get_finished_jobs,
                bench._jobs(keys, JOB_CHUNKS, promotion=True, first_id=count),
            )
            ours = (cpu_seconds() - cpu) / count * 1e6, total / (time.perf_counter() - wall) / 1e9
        finally:
            tier.shutdown()
            shutil.rmtree(directory / "kvoffload", ignore_errors=True)
        theirs_tier = contender.new(primary, directory / "vllm", None)
        try:
            bench._run_jobs(
                theirs_tier.submit_store, theirs_tier.drain_jobs, theirs_tier.get_finished_jobs,
                contender.jobs(keys, JOB_CHUNKS, promotion=False), sync=directory,
            )
            bench._drop_cache(bench._files(directory / "vllm"))
            cpu, wall = cpu_seconds(), time.perf_counter()
            bench._run_jobs(
                theirs_tier.submit_load, theirs_tier.drain_jobs, theirs_tier.get_finished_jobs,
                contender.jobs(keys, JOB_CHUNKS, promotion=True),
            )
            theirs = (cpu_seconds() - cpu) / count * 1e6, total / (time.perf_counter() - wall) / 1e9
        finally:
            theirs_tier.shutdown()
            shutil.rmtree(directory / "vllm", ignore_errors=True)
        print(
            f"load run {run}: kvoffload {ours[0]:.0f} µs CPU/chunk, {ours[1]:.2f} GB/s; "
            f"vLLM {theirs[0]:.0f} µs CPU/chunk, {theirs[1]:.2f} GB/s"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="256K", help="chunk size (default: 256K)")
    parser.add_argument("--total", default="128M", help="bytes read per pass (default: 128M)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    parser.add_argument("--dir", default=None, help="directory to write in (default: a temporary one)")
    parser.add_argument("--vllm-path", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    size, total = parse_size(args.size), parse_size(args.total)
    directory = Path(tempfile.mkdtemp(prefix="kvoffload-read-ceiling-", dir=args.dir))
    try:
        count = total // size
        mapping, _ = bench._aligned_primary(count, size)
        buffer = memoryview(mapping)
        files = []
        for index in range(count):
            path = directory / f"{index}"
            path.write_bytes(os.urandom(size))
            files.append(path)
        bench.syncfs(directory)
        for rerun in (1, 2):
            rates = "  ".join(
                f"{threads}: {read_in_parallel(files, buffer, size, threads):.2f}"
                for threads in args.threads
            )
            print(f"plain parallel reads, pass {rerun}, GB/s by threads: {rates}")
        for path in files:
            path.unlink()
        if args.vllm_path is not None:
            tier_loads(directory, size, total, args.vllm_path, args.repeats)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
