"""``python -m kvoffload bench tier``: throughput of the file tier
(:class:`~kvoffload.FileSystemTier`) beside the disk's own ceiling and, with
``--vllm-path DIR``, beside vLLM 0.33's ``fs`` tier on the same jobs, run
as a vLLM install runs it: with its C I/O module ``vllm.fs_io_C`` where the
release directory has it (:mod:`kvoffload.bench.vllm_fs_io`;
``--vllm-python-io`` runs its Python fallback instead).

For each chunk size the same bytes (random, ``--total`` of them, in a
page-aligned primary buffer) move these ways; every figure is the median of
``--repeats`` runs, in GB/s (10**9 bytes per second). With vLLM's tier the
two take turns at going first (kvoffload's in the first, third, ... run),
so that neither always meets the disk and the page cache the other left:

- ``store``: the ceiling writes the bytes to one file sequentially and
  ``fsync`` s it. Each tier, with its default options, runs store jobs of
  ``--job-chunks`` chunks, timed from the first ``submit_store`` to the end
  of ``drain_jobs`` plus a ``syncfs`` of the directory's file system, so the
  clock stops when the bytes are on the disk for every contender.
- ``load``: the files' pages are dropped from the page cache first
  (``posix_fadvise(DONTNEED)`` once they are on the disk); the ceiling reads
  its file sequentially, each tier runs load jobs into the primary buffer.
- ``store, Python I/O`` and ``load, Python I/O`` (only where the build has
  the tier's C I/O): as ``store`` and ``load``, kvoffload's tier with
  ``compiled_io=False``, the Python path in the same run.
- ``load, every chunk verified``: as ``load``, kvoffload's tier with
  ``verify_loads="always"`` (each load checks the chunk's CRC-32; by
  default only chunks found when the directory was opened are checked).
- ``store, fsync per chunk``: kvoffload's tier with ``fsync="chunk"``
  (each chunk on the disk before it becomes readable); no ``syncfs``.
- ``load, page cache``: the reads again with the pages cached, kvoffload's
  tier with ``direct_io=False`` (by default it bypasses the page cache).
- ``store, full tier``: kvoffload's tier is first filled (untimed) with as
  many other chunks as it holds, so every timed store evicts one: the state
  a disk tier spends its life in. The evicted chunk's file is rewritten
  (``recycle_files``, the default). ``store, full tier, no recycling``: the
  same with ``recycle_files=False`` (evicted files removed, new ones
  created). Timed as ``store``; vLLM's tier has no capacity, so no figure.

Both tiers use ``O_DIRECT`` by default where the file system allows it.
vLLM's tier has no fsync option and no buffered mode where ``O_DIRECT``
works, so it has no figure in the last two rows then. Each load is checked
against the stored bytes (outside the timing). ``submit µs`` is the time a
``submit_store``/``submit_load`` call takes on the caller's thread: median
and maximum over the jobs of the row's operation in every run of its chunk
size (so vLLM's figures and ours count the same jobs; a maximum over more
calls is a larger one), how many of those calls took over
:data:`SUBMIT_BOUND_US` (the issue's bound on a submit), and the CPU time
those calls ran on the caller's thread (``time.thread_time``). The objects alive
when the bench starts (vLLM's release and the torch it imports among
them) are frozen out of the garbage collector for the run, as an engine
freezes its start-up heap (:func:`freeze_startup_heap`; ``--no-gc-freeze``
leaves them); ``--no-gc`` turns the collector off for the run, so that
the calls left over the bound are the tiers' own. ``--evict-between
SIZE`` writes SIZE bytes on the caller's thread before each timed submit
(untimed; both tiers), as a scheduler's
own work between two submits leaves the tier's code and data out of the
caches; the submit figures are then those of a cold call, and the
throughput figures include the writes.

With vLLM's tier and two or more runs, each row also gives the ratio run
by run: each run of one tier and the same run of the other went back to
back, so their two figures are a pair measured under the same
conditions, and the row reports the pairs' geometric mean with a 95 %
interval (:class:`PairedRatio`; the JSON keeps every run's GB/s, and
``scripts/pooled_ratio.py`` pools the pairs of several files).
``--compared-only`` measures only the rows both tiers run (``store`` and
``load``), so that many pairs fit in the time of a few full runs.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import mmap
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypedDict

import attrs
import numpy as np
import numpy.typing as npt

from kvoffload.bench.sizes import format_size, parse_size
from kvoffload.impl.fs_tier import (
    COMPILED_IO,
    CRC32_CHOICES,
    FileSystemTier,
    choose_crc32,
)
from kvoffload.spec.errors import ConfigurationError
from kvoffload.spec.keys import OffloadKey, make_offload_key
from kvoffload.spec.tier_contract import TierJob

DEFAULT_SIZES = ("64K", "256K", "1M", "4M")
CHECKSUM_CHOICES: dict[str, bool | str] = {"auto": "auto", "on": True, "off": False}
"""``--checksum``: the tier's ``checksum`` option each value gives."""
STORE = "store"
LOAD = "load"
STORE_FSYNC = "store, fsync per chunk"
LOAD_CACHED = "load, page cache"
LOAD_VERIFIED = "load, every chunk verified"
STORE_FULL = "store, full tier"
STORE_FULL_UNLINK = "store, full tier, no recycling"
STORE_PYTHON_IO = "store, Python I/O"
LOAD_PYTHON_IO = "load, Python I/O"
OPERATIONS = (
    STORE, LOAD, STORE_PYTHON_IO, LOAD_PYTHON_IO, LOAD_VERIFIED, STORE_FSYNC, LOAD_CACHED,
    STORE_FULL, STORE_FULL_UNLINK,
)
MEASURED = tuple(
    op for op in OPERATIONS if COMPILED_IO or op not in (STORE_PYTHON_IO, LOAD_PYTHON_IO)
)
"""The operations this build measures (the Python-I/O rows only where the
tier's I/O runs in C by default: elsewhere they are the first two rows)."""
COMPARED = (STORE, LOAD)
"""The operations both tiers run with their default options, the pairs
``--compared-only`` measures (many repeats in the time of a few)."""


@attrs.frozen
class TierFigure:
    """One chunk size and operation; throughputs in GB/s, times in µs."""

    chunk_bytes: int
    operation: str
    num_chunks: int
    ceiling_gbps: float
    tier_gbps: float
    vllm_gbps: float | None
    submit_us_median: float | None
    submit_us_max: float | None
    vllm_submit_us_median: float | None
    vllm_submit_us_max: float | None = None
    submit_cpu_us_median: float | None = None
    submit_cpu_us_max: float | None = None
    submit_calls: int | None = None
    submit_over_bound: int | None = None
    vllm_submit_over_bound: int | None = None
    tier_gbps_runs: tuple[float, ...] = ()
    vllm_gbps_runs: tuple[float, ...] = ()
    """Each run's GB/s, in run order: run ``i`` of one tier and of the
    other went back to back, so ``(tier_gbps_runs[i], vllm_gbps_runs[i])``
    is a pair measured under the same conditions."""

    @property
    def of_ceiling(self) -> float:
        return self.tier_gbps / self.ceiling_gbps

    @property
    def over_vllm(self) -> float | None:
        return None if not self.vllm_gbps else self.tier_gbps / self.vllm_gbps

    @property
    def paired(self) -> PairedRatio | None:
        """kvoffload's GB/s over vLLM's, run by run (None: no vLLM figure
        on this row, as on the rows only kvoffload's tier runs, or fewer
        than two runs)."""
        if not self.vllm_gbps_runs:
            return None
        return paired_ratio(self.tier_gbps_runs, self.vllm_gbps_runs)


_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)
"""Student's t, 97.5th percentile, for 1 to 30 degrees of freedom."""


def t975(degrees: int) -> float:
    """Student's t at the 97.5th percentile (a two-sided 95 % interval):
    the table up to 30 degrees of freedom, then the Cornish-Fisher
    expansion around the normal's 1.95996 (within 0.001 of the exact value
    from 31 on)."""
    if degrees < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {degrees}")
    if degrees <= len(_T975):
        return _T975[degrees - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * degrees) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * degrees**2)


@attrs.frozen
class PairedRatio:
    """The ratio of two contenders' throughputs over pairs of runs made
    back to back: the geometric mean of the pairs' ratios and its 95 %
    interval (Student's t on the ratios' logarithms), with how many pairs
    there were and in how many the first contender was the slower."""

    pairs: int
    geometric_mean: float
    low: float
    high: float
    below_one: int

    @property
    def verdict(self) -> str:
        """``faster`` (the whole interval above 1), ``slower`` (below 1),
        or ``parity`` (the interval holds 1: no difference these pairs can
        tell from their spread)."""
        if self.low > 1.0:
            return "faster"
        if self.high < 1.0:
            return "slower"
        return "parity"

    def describe(self) -> str:
        return (
            f"{self.geometric_mean:.3f} ({self.low:.3f}-{self.high:.3f}), "
            f"{self.below_one} of {self.pairs} under 1"
        )


def paired_ratio(ours: Sequence[float], theirs: Sequence[float]) -> PairedRatio | None:
    """:class:`PairedRatio` of ``ours[i] / theirs[i]``; None with fewer
    than two pairs. Raises ``ValueError`` on lists of unequal length or a
    throughput that is not positive."""
    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} runs against {len(theirs)}: not pairs")
    if len(ours) < 2:
        return None
    if min(ours) <= 0 or min(theirs) <= 0:
        raise ValueError("a throughput that is not positive has no ratio")
    logs = [math.log(a / b) for a, b in zip(ours, theirs, strict=True)]
    mean = statistics.fmean(logs)
    half = t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return PairedRatio(
        pairs=len(logs),
        geometric_mean=math.exp(mean),
        low=math.exp(mean - half),
        high=math.exp(mean + half),
        below_one=sum(1 for value in logs if value < 0),
    )


_FILE_SYSTEM = re.compile(r"file system: ([^)]+)\)")

PooledRow = tuple[str, int, str]
"""File system, chunk bytes, operation."""


def pool_runs(
    documents: Sequence[tuple[str, dict[str, Any]]],
) -> tuple[dict[PooledRow, tuple[list[float], list[float], set[str]]], list[str]]:
    """The run-by-run pairs of several ``--json`` documents, ``(name,
    document)``, per row (the file system named in a document's conditions,
    the chunk size, the operation: kvoffload's GB/s, vLLM's, the names that
    gave pairs), and the names of the documents with none (written before
    the runs were kept, or without vLLM's tier)."""
    rows: dict[PooledRow, tuple[list[float], list[float], set[str]]] = {}
    skipped: list[str] = []
    for name, document in documents:
        found = _FILE_SYSTEM.search(str(document.get("conditions", "")))
        file_system = found.group(1) if found else "unknown"
        paired = False
        for figure in document.get("figures", []):
            ours, theirs = figure.get("tier_gbps_runs", []), figure.get("vllm_gbps_runs", [])
            if not ours or len(ours) != len(theirs):
                continue
            paired = True
            key = (file_system, int(figure["chunk_bytes"]), str(figure["operation"]))
            row = rows.setdefault(key, ([], [], set()))
            row[0].extend(float(v) for v in ours)
            row[1].extend(float(v) for v in theirs)
            row[2].add(name)
        if not paired:
            skipped.append(name)
    return rows, skipped


def render_pooled(rows: dict[PooledRow, tuple[list[float], list[float], set[str]]]) -> str:
    """A Markdown table of :func:`pool_runs`' rows: each row's
    :class:`PairedRatio` over all its pairs, and its verdict."""
    lines = [
        "| file system | chunk | operation | files | pairs | kvoffload / vLLM, "
        "geometric mean (95 % interval) | pairs under 1 | verdict |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for (file_system, chunk, operation), (ours, theirs, names) in sorted(rows.items()):
        head = f"| {file_system} | {format_size(chunk)} | {operation} | {len(names)} | "
        ratio = paired_ratio(ours, theirs)
        if ratio is None:
            lines.append(head + f"{len(ours)} | — | — | one pair: no interval |")
        else:
            lines.append(
                head + f"{ratio.pairs} | {ratio.geometric_mean:.3f} "
                f"({ratio.low:.3f}-{ratio.high:.3f}) | {ratio.below_one} | {ratio.verdict} |"
            )
    return "\n".join(lines)


Primary = npt.NDArray[np.uint8]


SUBMIT_BOUND_US = 50.0
"""The time a ``submit_*`` call may take on the caller's thread (µs): the
bench counts the calls over it, beside the median and the maximum."""


def _over_bound(walls: Sequence[float]) -> int:
    return sum(1 for wall in walls if wall * 1e6 > SUBMIT_BOUND_US)


class _SubmitFields(TypedDict):
    submit_us_median: float
    submit_us_max: float
    submit_cpu_us_median: float
    submit_cpu_us_max: float
    vllm_submit_us_median: float | None
    vllm_submit_us_max: float | None
    submit_calls: int
    submit_over_bound: int
    vllm_submit_over_bound: int | None


def _submit_figures(
    ours: Sequence[tuple[float, float]], theirs: Sequence[tuple[float, float]]
) -> _SubmitFields:
    """The submit fields of a :class:`TierFigure` from (wall, CPU) seconds."""
    walls, cpus = [w for w, _ in ours], [c for _, c in ours]
    vllm = [w for w, _ in theirs]
    return {
        "submit_us_median": statistics.median(walls) * 1e6,
        "submit_us_max": max(walls) * 1e6,
        "submit_cpu_us_median": statistics.median(cpus) * 1e6,
        "submit_cpu_us_max": max(cpus) * 1e6,
        "vllm_submit_us_median": statistics.median(vllm) * 1e6 if vllm else None,
        "vllm_submit_us_max": max(vllm) * 1e6 if vllm else None,
        "submit_calls": len(walls),
        "submit_over_bound": _over_bound(walls),
        "vllm_submit_over_bound": _over_bound(vllm) if vllm else None,
    }


def _aligned_primary(num_chunks: int, chunk_bytes: int) -> tuple[mmap.mmap, Primary]:
    """A page-aligned (``O_DIRECT``-able) zeroed buffer of ``num_chunks`` rows."""
    region = mmap.mmap(-1, num_chunks * chunk_bytes)
    array: Primary = np.frombuffer(region, dtype=np.uint8).reshape(num_chunks, chunk_bytes)
    return region, array


def _drop_cache(paths: Iterator[Path], flush: bool = False) -> None:
    """Ask the kernel to forget the cached pages of ``paths`` (``flush``:
    write them out first, so they are clean and can be dropped)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            if flush:
                os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _files(directory: Path) -> Iterator[Path]:
    return (path for path in directory.rglob("*") if path.is_file())


def syncfs(directory: Path) -> None:
    """Flush the file system holding ``directory`` (``syncfs(2)``; ``sync``
    where the C library has no ``syncfs``)."""
    function = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
    if function is None:
        os.sync()
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        if function(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


# --- the ceiling ----------------------------------------------------------------


def _ceiling(primary: Primary, directory: Path) -> dict[str, float]:
    """Seconds for each operation on one plain file of the same bytes."""
    path = directory / "ceiling.bin"
    rows = [memoryview(row) for row in primary]
    expected = primary.copy()
    syncfs(directory)
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for row in rows:
            os.write(fd, row)
        os.fsync(fd)
    finally:
        os.close(fd)
    written = time.perf_counter() - start
    _drop_cache(iter([path]))
    primary[:] = 0

    def read() -> float:
        start = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        try:
            for row in rows:
                os.readv(fd, [row])
        finally:
            os.close(fd)
        return time.perf_counter() - start

    seconds = {
        STORE: written,
        STORE_FSYNC: written,
        STORE_FULL: written,
        STORE_FULL_UNLINK: written,
        STORE_PYTHON_IO: written,
        LOAD: read(),
        LOAD_CACHED: read(),
    }
    seconds[LOAD_VERIFIED] = seconds[LOAD_PYTHON_IO] = seconds[LOAD]  # the same cold read
    if not np.array_equal(primary, expected):
        raise RuntimeError("the ceiling read back other bytes")
    path.unlink()
    return seconds


# --- kvoffload's tier ------------------------------------------------------------


def _jobs(
    keys: Sequence[OffloadKey], job_chunks: int, promotion: bool, first_id: int
) -> list[TierJob]:
    jobs = []
    for index, start in enumerate(range(0, len(keys), job_chunks)):
        ids = tuple(range(start, min(start + job_chunks, len(keys))))
        jobs.append(TierJob(first_id + index, tuple(keys[i] for i in ids), ids, promotion))
    return jobs


def _run_jobs(
    submit: Callable[[Any], None],
    drain: Callable[[], None],
    finished: Callable[[], Sequence[Any]],
    jobs: Sequence[Any],
    sync: Path | None = None,
    between: Callable[[], None] | None = None,
) -> tuple[float, list[tuple[float, float]]]:
    """Seconds from the first submit to the end of the drain (and of a
    ``syncfs`` of ``sync``), and each submit's seconds, wall-clock and CPU
    of the caller's thread (``time.thread_time``: what the call itself ran,
    not what it waited for); raises if a job failed. ``between`` runs
    before each submit, outside the submit's timing (inside the
    operation's)."""
    submit_seconds = []
    if sync is not None:
        syncfs(sync)
    start = time.perf_counter()
    for job in jobs:
        if between is not None:
            between()
        before, cpu_before = time.perf_counter(), time.thread_time()
        submit(job)
        cpu = time.thread_time() - cpu_before
        submit_seconds.append((time.perf_counter() - before, cpu))
    drain()
    if sync is not None:
        syncfs(sync)
    elapsed = time.perf_counter() - start
    results = list(finished())
    failed = [r.job_id for r in results if not r.success]
    if len(results) != len(jobs) or failed:
        raise RuntimeError(f"{len(failed)} of {len(jobs)} jobs failed ({len(results)} reported)")
    return elapsed, submit_seconds


def _scribbler(size: int) -> Callable[[], None]:
    """A call that writes ``size`` bytes of its own buffer on the caller's
    thread: run before each timed submit (``--evict-between``), it stands
    for the scheduler's own work between two submits, which leaves the
    caches cold for the tier's code and data, on both tiers alike."""
    buffer = np.zeros(size, dtype=np.uint8)
    value = 0

    def scribble() -> None:
        nonlocal value
        value = (value + 1) & 0xFF
        buffer.fill(value)

    return scribble


def _kvoffload(
    primary: Primary,
    directory: Path,
    keys: Sequence[OffloadKey],
    job_chunks: int,
    threads: int | None,
    checksum: bool | str = "auto",
    crc32: str = "auto",
    between: Callable[[], None] | None = None,
    compared_only: bool = False,
) -> tuple[dict[str, float], dict[str, list[tuple[float, float]]], TierSetup]:
    """Seconds per operation, each operation's submit seconds, and what the
    tier with the default options did (``threads``: None, the tier's
    own count); ``between`` runs before each timed submit;
    ``compared_only``: only the default options' store and load."""
    view = primary.data
    expected = primary.copy()
    seconds: dict[str, float] = {}
    submits: dict[str, list[tuple[float, float]]] = {}
    setup = TierSetup(False, False, 0, None)
    python_io: dict[str, Any] = {"compiled_io": False}
    cases: tuple[tuple[str, str, dict[str, Any]], ...] = (
        (STORE, LOAD, {}),
        *(((STORE_PYTHON_IO, LOAD_PYTHON_IO, python_io),) if COMPILED_IO else ()),
        ("", LOAD_VERIFIED, {"verify_loads": "always"}),
        (STORE_FSYNC, "", {"fsync": "chunk"}),
        ("", LOAD_CACHED, {"direct_io": False}),
        (STORE_FULL, "", {"recycle_files": True}),
        (STORE_FULL_UNLINK, "", {"recycle_files": False}),
    )
    if compared_only:  # the default options' store and load, the rows vLLM's tier runs too
        cases = tuple(case for case in cases if case[0] in COMPARED)
    for store_operation, load_operation, options in cases:
        where = directory / "kvoffload"
        tier = FileSystemTier(
            where, len(keys), view, num_threads=threads, checksum=checksum, crc32=crc32,
            **options,
        )
        try:
            if not options:
                setup = TierSetup(
                    tier.direct_io, tier.checksums, tier.num_threads, tier.file_system
                )
            full = "recycle_files" in options
            if full:  # fill the tier first (untimed): every timed store evicts
                _run_jobs(
                    tier.submit_store, tier.drain_jobs, tier.get_finished_jobs,
                    _jobs(_filler(keys), job_chunks, promotion=False, first_id=len(keys)),
                    sync=directory,
                )
            store_jobs = _jobs(keys, job_chunks, promotion=False, first_id=0)
            elapsed, times = _run_jobs(
                tier.submit_store, tier.drain_jobs, tier.get_finished_jobs, store_jobs,
                sync=directory if full or options in ({}, python_io) else None,
                between=between,
            )
            if store_operation:
                seconds[store_operation], submits[store_operation] = elapsed, times
            if load_operation:
                if load_operation in (LOAD, LOAD_PYTHON_IO, LOAD_VERIFIED):
                    syncfs(directory)
                    _drop_cache(_files(where / "chunks"))
                else:  # read once to cache the pages
                    _run_jobs(
                        tier.submit_load, tier.drain_jobs, tier.get_finished_jobs,
                        _jobs(keys, job_chunks, promotion=True, first_id=len(keys)),
                    )
                primary[:] = 0
                load_jobs = _jobs(keys, job_chunks, promotion=True, first_id=len(keys))
                seconds[load_operation], submits[load_operation] = _run_jobs(
                    tier.submit_load, tier.drain_jobs, tier.get_finished_jobs, load_jobs,
                    between=between,
                )
                if not np.array_equal(primary, expected):
                    raise RuntimeError("kvoffload's tier loaded other bytes")
        finally:
            tier.shutdown()
            shutil.rmtree(where, ignore_errors=True)
    return seconds, submits, setup


def _filler(keys: Sequence[OffloadKey]) -> list[OffloadKey]:
    """Other keys, as many: what fills a tier before the timed stores."""
    return [make_offload_key(bytes(key) + b"filler", 0) for key in keys]


# --- vLLM's tier -------------------------------------------------------------------


def _vllm_spec() -> Any:
    """The fields of an ``OffloadingSpec`` vLLM's file tier reads (its path
    mapper's run config), as a plain namespace."""
    ns = types.SimpleNamespace
    config = ns(
        groups=[],
        model=ns(name="kvoffload-bench", dtype="uint8"),
        cache=ns(tokens_per_hash=16),
        parallel=ns(
            tp_size=1, pp_size=1, pcp_size=1, dcp_size=1, rank=0,
            is_parallelism_agnostic=True,
        ),
        canonical_layout=False,
        replicated_layout=False,
        kv_cache_layout=None,
    )
    return ns(
        config=config,
        blocks_per_chunk=1,
        kv_events_config=ns(enable_kv_cache_events=False),
    )


class VllmFsTier:
    """vLLM 0.33's ``FileSystemTierManager`` from a loaded release."""

    def __init__(self, release_dir: Path, python_io: bool = False) -> None:
        import importlib

        from kvoffload.bench.vllm_fs_io import load_fs_io
        from kvoffload.vllm_release import load_release

        self.release = load_release(release_dir)
        fresh = "vllm.v1.kv_offload.tiering.fs.io" not in sys.modules
        io = load_fs_io(self.release.root, python_io) if fresh else ""
        self.manager_module = importlib.import_module("vllm.v1.kv_offload.tiering.fs.manager")
        self.base = importlib.import_module("vllm.v1.kv_offload.tiering.base")
        # what the tier's io module found when it was imported
        self.compiled_io = bool(sys.modules["vllm.v1.kv_offload.tiering.fs.io"]._HAS_FSIO_C)
        if self.compiled_io != io.startswith("C"):
            io = ("C" if self.compiled_io else "Python") + " I/O (as first imported here)"
        self.io = io

    def describe(self) -> str:
        return f"vLLM {self.release.version} fs tier (FileSystemTierManager, {self.io})"

    def new(self, primary: Primary, directory: Path, threads: int | None) -> Any:
        kwargs: dict[str, Any] = {}
        if threads is not None:
            kwargs = {"n_read_threads": threads, "n_write_threads": threads}
        return self.manager_module.FileSystemTierManager(
            _vllm_spec(), primary.data, "fs", root_dir=str(directory), **kwargs
        )

    def jobs(self, keys: Sequence[OffloadKey], job_chunks: int, promotion: bool) -> list[Any]:
        context = self.release.base.ReqContext(req_id="bench")
        return [
            self.base.TransferJob(
                job_id=job.job_id,
                keys=list(job.keys),
                chunk_ids=np.array(job.chunk_ids, dtype=np.int64),
                is_promotion=promotion,
                req_context=context,
            )
            for job in _jobs(keys, job_chunks, promotion, first_id=0)
        ]


def _vllm(
    contender: VllmFsTier,
    primary: Primary,
    directory: Path,
    keys: Sequence[OffloadKey],
    job_chunks: int,
    threads: int | None,
    between: Callable[[], None] | None = None,
    compared_only: bool = False,
) -> tuple[dict[str, float], dict[str, list[tuple[float, float]]], bool]:
    expected = primary.copy()
    where = directory / "vllm"
    tier = contender.new(primary, where, threads)
    direct = bool(tier._use_o_direct)
    seconds: dict[str, float] = {}
    try:
        submits: dict[str, list[tuple[float, float]]] = {}
        seconds[STORE], submits[STORE] = _run_jobs(
            tier.submit_store, tier.drain_jobs, tier.get_finished_jobs,
            contender.jobs(keys, job_chunks, promotion=False), sync=directory,
            between=between,
        )
        if not direct:
            _drop_cache(p for p in _files(where) if p.suffix == ".bin")
        reads = (LOAD,) if direct or compared_only else (LOAD, LOAD_CACHED)
        for operation in reads:
            primary[:] = 0
            seconds[operation], submits[operation] = _run_jobs(
                tier.submit_load, tier.drain_jobs, tier.get_finished_jobs,
                contender.jobs(keys, job_chunks, promotion=True), between=between,
            )
            if not np.array_equal(primary, expected):
                raise RuntimeError("vLLM's tier loaded other bytes")
    finally:
        tier.shutdown()
        shutil.rmtree(where, ignore_errors=True)
    return seconds, submits, direct


# --- the run ------------------------------------------------------------------------


@attrs.frozen
class TierSetup:
    """What kvoffload's tier with the default options did in a run."""

    direct: bool  # O_DIRECT
    checksums: bool  # a CRC-32 recorded per chunk
    threads: int  # pool threads
    file_system: str | None  # its directory's (None: unknown)


@attrs.frozen
class Run:
    """Figures of one run and how the tiers did their I/O."""

    figures: list[TierFigure]
    kvoffload: TierSetup
    vllm_direct: bool | None


def measure(
    chunk_sizes: Sequence[int],
    *,
    total_bytes: int,
    directory: Path,
    repeats: int = 3,
    job_chunks: int = 8,
    threads: int | None = None,
    vllm: VllmFsTier | None = None,
    vllm_threads: int | None = None,
    seed: int = 0,
    checksum: bool | str = "auto",
    crc32: str = "auto",
    evict_between: int = 0,
    compared_only: bool = False,
) -> Run:
    """Every chunk size and operation (``evict_between``: see
    :func:`_scribbler`; ``compared_only``: only :data:`COMPARED`)."""
    rng = np.random.default_rng(seed)
    between = _scribbler(evict_between) if evict_between else None
    figures: list[TierFigure] = []
    vllm_direct: bool | None = None
    setup = TierSetup(False, False, 0, None)
    for chunk_bytes in chunk_sizes:
        count = max(16, total_bytes // chunk_bytes)
        region, primary = _aligned_primary(count, chunk_bytes)
        try:
            ceiling: dict[str, list[float]] = {op: [] for op in OPERATIONS}
            ours: dict[str, list[float]] = {op: [] for op in OPERATIONS}
            theirs: dict[str, list[float]] = {op: [] for op in OPERATIONS}
            our_submits: dict[str, list[tuple[float, float]]] = {op: [] for op in OPERATIONS}
            their_submits: dict[str, list[tuple[float, float]]] = {op: [] for op in OPERATIONS}
            for repeat in range(repeats):
                primary[:] = np.frombuffer(rng.bytes(count * chunk_bytes), np.uint8).reshape(
                    count, chunk_bytes
                )
                keys = [make_offload_key(rng.bytes(32), 0) for _ in range(count)]
                for op, value in _ceiling(primary, directory).items():
                    ceiling[op].append(value)
                # the tiers take turns at going first (None: kvoffload's), so
                # that neither always meets the disk and the page cache the
                # other left
                turns: list[VllmFsTier | None] = [None]
                if vllm is not None:
                    turns = [None, vllm] if repeat % 2 == 0 else [vllm, None]
                for contender in turns:
                    if contender is None:
                        seconds, submits, setup = _kvoffload(
                            primary, directory, keys, job_chunks, threads, checksum, crc32,
                            between=between, compared_only=compared_only,
                        )
                        times_of, submits_of = ours, our_submits
                    else:
                        seconds, submits, vllm_direct = _vllm(
                            contender, primary, directory, keys, job_chunks, vllm_threads,
                            between=between, compared_only=compared_only,
                        )
                        times_of, submits_of = theirs, their_submits
                    for op, value in seconds.items():
                        times_of[op].append(value)
                    for op, times in submits.items():
                        submits_of[op] += times
            moved = count * chunk_bytes
            for op in COMPARED if compared_only else MEASURED:
                figures.append(
                    TierFigure(
                        chunk_bytes=chunk_bytes,
                        operation=op,
                        num_chunks=count,
                        ceiling_gbps=moved / statistics.median(ceiling[op]) / 1e9,
                        tier_gbps=moved / statistics.median(ours[op]) / 1e9,
                        vllm_gbps=(
                            moved / statistics.median(theirs[op]) / 1e9 if theirs[op] else None
                        ),
                        **_submit_figures(our_submits[op], their_submits[op]),
                        tier_gbps_runs=tuple(moved / value / 1e9 for value in ours[op]),
                        vllm_gbps_runs=tuple(moved / value / 1e9 for value in theirs[op]),
                    )
                )
        finally:
            del primary, region  # unmapped once the tiers' views are gone
    return Run(figures, setup, vllm_direct)


def render(figures: Sequence[TierFigure], conditions: str) -> str:
    with_vllm = any(fig.vllm_gbps is not None for fig in figures)
    header = "| chunk | operation | chunks | disk ceiling GB/s | kvoffload GB/s | % of ceiling |"
    rule = "| --- | --- | ---: | ---: | ---: | ---: |"
    pairs = [fig.paired if with_vllm else None for fig in figures]
    paired = any(pair is not None for pair in pairs)
    if with_vllm:
        header += " vLLM fs GB/s | kvoffload / vLLM |"
        rule += " ---: | ---: |"
    if paired:
        header += " run by run: geometric mean (95 % interval), runs under 1 |"
        rule += " ---: |"
    header += f" submit µs, median / max | calls over {SUBMIT_BOUND_US:.0f} µs |"
    header += " its CPU µs, median / max |"
    rule += " ---: | ---: | ---: |"
    if with_vllm:
        header += f" vLLM submit µs, median / max | vLLM calls over {SUBMIT_BOUND_US:.0f} µs |"
        rule += " ---: | ---: |"
    lines = [conditions, "", header, rule]
    for fig, pair in zip(figures, pairs, strict=True):
        line = (
            f"| {format_size(fig.chunk_bytes)} | {fig.operation} | {fig.num_chunks} | "
            f"{fig.ceiling_gbps:.2f} | {fig.tier_gbps:.2f} | {100 * fig.of_ceiling:.0f}% |"
        )
        if with_vllm:
            ratio = fig.over_vllm
            line += (
                f" {fig.vllm_gbps:.2f} | {ratio:.2f} |"
                if fig.vllm_gbps is not None and ratio is not None
                else " — | — |"
            )
        if paired:
            line += " — |" if pair is None else f" {pair.describe()} |"
        line += f" {fig.submit_us_median:.1f} / {fig.submit_us_max:.0f} |"
        line += f" {fig.submit_over_bound} of {fig.submit_calls} |"
        line += f" {fig.submit_cpu_us_median:.1f} / {fig.submit_cpu_us_max:.0f} |"
        if with_vllm:
            median, most = fig.vllm_submit_us_median, fig.vllm_submit_us_max
            line += " — |" if median is None or most is None else f" {median:.1f} / {most:.0f} |"
            over = fig.vllm_submit_over_bound
            line += " — |" if over is None else f" {over} of {fig.submit_calls} |"
        lines.append(line)
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sizes", default=",".join(DEFAULT_SIZES),
        help="comma-separated chunk sizes (default: %(default)s)",
    )
    parser.add_argument("--total", default="128M",
                        help="bytes moved per case (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs per case; the median is kept (default: %(default)s)")
    parser.add_argument("--job-chunks", type=int, default=8,
                        help="chunks per store/load job (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None,
                        help="kvoffload tier's pool threads (default: the tier's own)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="directory to write in (default: a new temporary directory, "
                        "removed afterwards)")
    parser.add_argument("--vllm-path", type=Path, default=None, metavar="DIR",
                        help="a vLLM 0.33 release (scripts/fetch_vllm.py): also run its fs tier")
    parser.add_argument("--vllm-python-io", action="store_true",
                        help="run vLLM's tier with its Python I/O fallback instead of "
                        "its C module (vllm.fs_io_C), which a vLLM install uses")
    parser.add_argument("--vllm-threads", type=int, default=None,
                        help="vLLM tier's read and write threads each (default: vLLM's, 16)")
    parser.add_argument("--checksum", default="auto", choices=tuple(CHECKSUM_CHOICES),
                        help="kvoffload tier's checksum option (default: %(default)s, "
                        "on except on a file system kept in memory, such as tmpfs)")
    parser.add_argument("--crc32", default="auto",
                        choices=CRC32_CHOICES,
                        help="what computes kvoffload's CRC-32 (FileSystemTier's crc32 "
                             "option; default: the fastest here)")
    parser.add_argument("--no-gc-freeze", action="store_true",
                        help="leave the heap loaded at start-up under the cyclic garbage "
                        "collector (by default it is frozen, as vLLM's engine does once "
                        "it has started)")
    parser.add_argument("--no-gc", action="store_true",
                        help="turn the cyclic garbage collector off for the run (both "
                        "tiers): what is left over 50 µs is the tiers' own; an engine "
                        "runs with it on, so the default figures keep it")
    parser.add_argument("--evict-between", default="0", metavar="SIZE",
                        help="bytes written on the caller's thread before each timed "
                        "submit, outside its timing, for both tiers: the scheduler's own "
                        "work between two submits, leaving the caches cold (e.g. 32M; "
                        "throughput figures then include that work; default: none)")
    parser.add_argument("--compared-only", action="store_true",
                        help="measure only the rows both tiers run (store, load), so that "
                        "many --repeats (pairs of runs, one of each tier back to back) fit "
                        "in the time of a few")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the figures as JSON to PATH")


def freeze_startup_heap() -> None:
    """Move every object alive now out of the cyclic garbage collector's
    reach (``gc.freeze``), after one full collection, as vLLM's engine does
    once it has started (``vllm/utils/gc_utils.py``: ``freeze_gc_heap``).
    Unfrozen, a full collection walks the whole start-up heap; with torch
    imported (vLLM's fs tier imports it) one took 87-95 ms, and landing in
    a ``submit_*`` it was that call's maximum."""
    gc.collect()
    gc.freeze()


def _positive(name: str, value: int) -> int:
    if value <= 0:
        raise SystemExit(f"bench tier: {name} must be > 0, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    sizes = [parse_size(item) for item in args.sizes.split(",") if item.strip()]
    for size in sizes:
        _positive("--sizes", size)
    total = _positive("--total", parse_size(args.total))
    try:
        evict_between = parse_size(args.evict_between)
    except ValueError as error:
        raise SystemExit(f"bench tier: --evict-between: {error}") from None
    if evict_between < 0:
        raise SystemExit(f"bench tier: --evict-between must be >= 0, got {evict_between}")
    repeats = _positive("--repeats", args.repeats)
    job_chunks = _positive("--job-chunks", args.job_chunks)
    threads = None if args.threads is None else _positive("--threads", args.threads)
    vllm = None
    if args.vllm_path is not None:
        from kvoffload.vllm_release import VllmReleaseError

        try:
            vllm = VllmFsTier(args.vllm_path, python_io=args.vllm_python_io)
        except (VllmReleaseError, ImportError) as error:
            print(f"bench tier: cannot load vLLM's fs tier: {error}", file=sys.stderr)
            return 2
    try:
        crc32 = choose_crc32(args.crc32)
    except ConfigurationError as error:
        print(f"bench tier: --crc32: {error}", file=sys.stderr)
        return 2
    owned = args.dir is None
    directory = Path(tempfile.mkdtemp(prefix="kvoffload-bench-tier-")) if owned else args.dir
    directory.mkdir(parents=True, exist_ok=True)
    if not args.no_gc_freeze:
        freeze_startup_heap()
    collecting = gc.isenabled()
    if args.no_gc:
        gc.disable()
    try:
        result = measure(
            sizes, total_bytes=total, directory=directory, repeats=repeats,
            job_chunks=job_chunks, threads=threads, vllm=vllm,
            vllm_threads=args.vllm_threads, seed=args.seed,
            checksum=CHECKSUM_CHOICES[args.checksum], crc32=crc32,
            evict_between=evict_between, compared_only=args.compared_only,
        )
    finally:
        if args.no_gc and collecting:
            gc.enable()
        if not args.no_gc_freeze:
            gc.unfreeze()  # a caller in the same process gets its heap back
        if owned:
            shutil.rmtree(directory, ignore_errors=True)
    figures = result.figures
    load = os.getloadavg()
    conditions = (
        f"directory: {directory} ({'temporary' if owned else 'given'}); "
        f"{os.cpu_count()} CPUs, load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}; "
        f"{format_size(total)} per case, median of {repeats}; {job_chunks} chunks per job; "
        + ("store and load only (--compared-only); " if args.compared_only else "")
        + ("start-up heap not frozen; " if args.no_gc_freeze else "start-up heap frozen; ")
        + ("garbage collector off (--no-gc); " if args.no_gc else "")
        + (
            f"{format_size(evict_between)} written before each submit, untimed "
            "(caches cold; throughput includes it); "
            if evict_between
            else ""
        )
        + f"kvoffload: {result.kvoffload.threads} threads"
        + (" (--threads), " if threads is not None else " (the tier's default here), ")
        + ("O_DIRECT" if result.kvoffload.direct else "buffered (no O_DIRECT here)")
        + (", I/O in C (_chunkio)" if COMPILED_IO else ", I/O in Python (pure build)")
        + (
            f", CRC-32 ({crc32}) recorded, checked on a reopened chunk's first load"
            if result.kvoffload.checksums
            else ", no checksum"
        )
        + f" (checksum={args.checksum!r}; file system: {result.kvoffload.file_system})"
    )
    if vllm is not None:
        conditions += (
            f"; {vllm.describe()}: {args.vllm_threads or 16}+{args.vllm_threads or 16} threads, "
            + ("O_DIRECT" if result.vllm_direct else "buffered (no O_DIRECT here)")
            + "; the two tiers first in turn"
        )
    print(render(figures, conditions))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(
                {"conditions": conditions, "figures": [attrs.asdict(f) for f in figures]},
                handle, indent=2,
            )
    return 0
