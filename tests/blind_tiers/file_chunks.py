"""Design (c): one file per chunk under a temporary directory, written to a
temporary name and renamed into place, by a pool of two I/O threads.

The file system is the index: ``lookup`` answers HIT when the chunk's final
file exists. A writer writes ``<name>.tmp`` fully, closes it, and renames it
into place under the lock, the job's chunks together, in the critical section
that queues the job's result: a HIT is never seen before its job is done. Capacity is
counted in memory (files in place plus reserved names); victims are the
oldest chunks no load pins. Hook points: ``before_write`` (may raise, to
inject a write error), ``mid_write`` (half the chunk written), ``before_read``.
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import threading
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable
from typing import BinaryIO

import attrs

from kvoffload.spec.keys import get_offload_block_hash
from tests.blind_tiers._common import (
    Hooks,
    LookupResult,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    Rows,
    TierJobLike,
    TierJobResult,
    dedup_pairs,
    job_result,
)

_WORKERS = 2


@attrs.define
class _Work:
    job_id: int
    keys: list[OffloadKey]
    is_load: bool
    copy: list[tuple[OffloadKey, int]]
    skipped: list[OffloadKey]
    after: set[int] = attrs.Factory(set)  # in-flight stores carrying skipped keys


class FileTier:
    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        self._capacity = capacity_blocks
        self._rows = Rows(primary_kv_view)
        self.root = tempfile.mkdtemp(prefix="blind-file-tier-")
        self.hooks = Hooks()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._order: OrderedDict[OffloadKey, None] = OrderedDict()  # files in place
        self._reserver: dict[OffloadKey, int] = {}  # reserved key -> its store job
        self._running_stores: set[int] = set()
        self._reserved: set[OffloadKey] = set()
        self._pins: Counter[OffloadKey] = Counter()
        self._results: list[TierJobResult] = []
        self._in_flight = 0
        self._work: queue.Queue[_Work | None] = queue.Queue()
        self._threads = [
            threading.Thread(target=self._serve, name=f"file-tier-{i}", daemon=True)
            for i in range(_WORKERS)
        ]
        for thread in self._threads:
            thread.start()

    def _path(self, key: OffloadKey) -> str:
        return os.path.join(self.root, key.hex())

    # -- caller side --------------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        with self._lock:
            return LookupResult.HIT if os.path.exists(self._path(key)) else LookupResult.MISS

    def _victim_locked(self, protect: Collection[OffloadKey]) -> OffloadKey | None:
        for key in self._order:
            if not self._pins[key] and key not in protect:
                return key
        return None

    def _evict_locked(self, key: OffloadKey) -> None:
        del self._order[key]
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass

    def _reserve_locked(self, key: OffloadKey, protect: Collection[OffloadKey]) -> bool:
        while len(self._order) + len(self._reserved) >= self._capacity:
            victim = self._victim_locked(protect)
            if victim is None:
                return False
            self._evict_locked(victim)
        self._reserved.add(key)
        return True

    def submit_store(self, job: TierJobLike) -> None:
        pairs = dedup_pairs(job)
        work = _Work(job.job_id, [k for k, _ in pairs], False, [], [])
        with self._lock:
            for key, row in pairs:
                if key in self._order or key in self._reserved:
                    work.skipped.append(key)
                    if key in self._reserver:
                        work.after.add(self._reserver[key])
                elif self._reserve_locked(key, work.keys):
                    self._reserver[key] = work.job_id
                    work.copy.append((key, row))
            self._running_stores.add(work.job_id)
            self._in_flight += 1
        self._work.put(work)

    def submit_load(self, job: TierJobLike) -> None:
        keys = list(job.keys)
        pairs = list(zip(keys, (int(c) for c in job.chunk_ids)))
        with self._lock:
            for key in keys:
                self._pins[key] += 1
            self._in_flight += 1
        self._work.put(_Work(job.job_id, keys, True, pairs, []))

    def get_finished_jobs(self) -> Iterable[TierJobResult]:
        with self._lock:
            out, self._results = self._results, []
        return out

    def drain_jobs(self) -> None:
        with self._lock:
            while self._in_flight:
                self._idle.wait(timeout=1.0)

    def has_pending_work(self) -> bool:
        with self._lock:
            return bool(self._in_flight or self._results)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        return None

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext(req_id=req_context.req_id)

    def on_request_finished(self, req_context: ReqContext) -> None:
        return None

    def take_events(self) -> Iterable[object]:
        return ()

    def shutdown(self) -> None:
        for _ in self._threads:
            self._work.put(None)
        for thread in self._threads:
            thread.join(timeout=10.0)
        shutil.rmtree(self.root, ignore_errors=True)

    # -- I/O threads ------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            work = self._work.get()
            if work is None:
                return
            try:
                if work.is_load:
                    self._do_load(work)
                else:
                    self._do_store(work)
            except Exception:  # never lose a job to a bug in one copy
                self._fail(work)

    def _fail(self, work: _Work) -> None:
        with self._lock:
            for key, _ in work.copy:
                if work.is_load:
                    self._pins[key] -= 1
                else:
                    self._reserved.discard(key)
            self._publish_locked(TierJobResult(work.job_id, False, None))

    def _write_halves(self, f: BinaryIO, data: bytes) -> None:
        half = len(data) // 2
        self.hooks.fire("before_write")
        f.write(data[:half])
        f.flush()
        self.hooks.fire("mid_write")
        f.write(data[half:])

    def _write_file(self, key: OffloadKey, data: bytes) -> None:
        """Write ``data`` to the temporary name; the caller renames it."""
        with open(self._path(key) + ".tmp", "wb") as f:
            self._write_halves(f, data)

    def _write_tmp(self, key: OffloadKey, row: int) -> bool:
        """Write one chunk to its temporary name; False on an I/O error."""
        tmp = self._path(key) + ".tmp"
        try:
            self._write_file(key, self._rows.read(row))
        except OSError:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            return False
        return True

    def _install_locked(self, key: OffloadKey) -> None:
        """Put a fully written chunk in place (an atomic rename)."""
        os.replace(self._path(key) + ".tmp", self._path(key))
        self._order[key] = None

    def _do_store(self, work: _Work) -> None:
        written = [key for key, row in work.copy if self._write_tmp(key, row)]
        with self._lock:
            # A skipped key still in flight in an earlier job: its fate is
            # that job's, so report after it (the two I/O threads may finish
            # out of order). Earlier jobs never wait on later ones.
            while work.after & self._running_stores:
                self._idle.wait(timeout=1.0)
            # The job's chunks become readable together with its result.
            ok: list[OffloadKey] = []
            for key in written:
                try:
                    self._install_locked(key)
                    ok.append(key)
                except OSError:
                    pass
            self._reserved.difference_update(k for k, _ in work.copy)
            ok += [k for k in work.skipped if k in self._order]
            self._publish_locked(job_result(work.job_id, work.keys, ok))

    def _read_file(self, key: OffloadKey) -> bytes:
        with open(self._path(key), "rb") as f:
            return f.read()

    def _do_load(self, work: _Work) -> None:
        ok: list[OffloadKey] = []
        for key, row in work.copy:
            try:
                self.hooks.fire("before_read")
                self._rows.write(row, self._read_file(key))
                ok.append(key)
            except (OSError, ValueError):
                pass
        with self._lock:
            for key, _ in work.copy:
                self._pins[key] -= 1
                if self._pins[key] <= 0:
                    del self._pins[key]
            self._publish_locked(job_result(work.job_id, work.keys, ok))

    def _publish_locked(self, result: TierJobResult) -> None:
        if result.job_id in self._running_stores:
            self._running_stores.discard(result.job_id)
            for key in [k for k, j in self._reserver.items() if j == result.job_id]:
                del self._reserver[key]
        self._results.append(result)
        self._in_flight -= 1
        self._idle.notify_all()


# ---------------------------------------------------------------------------
# Defects.


class WritesInPlace(FileTier):
    """Writes straight to the final name ("rename is one syscall too many"):
    the chunk is visible, half written, to ``lookup`` and to readers."""

    def _write_tmp(self, key: OffloadKey, row: int) -> bool:
        try:
            with open(self._path(key), "wb") as f:
                self._write_halves(f, self._rows.read(row))
        except OSError:
            try:
                os.unlink(self._path(key))
            except FileNotFoundError:
                pass
            return False
        return True

    def _install_locked(self, key: OffloadKey) -> None:
        self._order[key] = None


class RenamesBeforeWriting(FileTier):
    """Renames the temporary file into place right after opening it and then
    writes through the open descriptor: the final name exists, short, while
    the write goes on."""

    def _write_tmp(self, key: OffloadKey, row: int) -> bool:
        tmp = self._path(key) + ".tmp"
        try:
            with open(tmp, "wb") as f:
                os.replace(tmp, self._path(key))
                self._write_halves(f, self._rows.read(row))
        except OSError:
            try:
                os.unlink(self._path(key))
            except FileNotFoundError:
                pass
            return False
        return True

    def _install_locked(self, key: OffloadKey) -> None:
        self._order[key] = None


class EvictsWhileLoading(FileTier):
    """Picks the oldest chunk as victim whether or not a load is reading it."""

    def _victim_locked(self, protect: Collection[OffloadKey]) -> OffloadKey | None:
        return next((k for k in self._order if k not in protect), None)


class RenamesFailedWrite(FileTier):
    """Renames the temporary file in a ``finally``: a write that failed
    half-way is put in place (and read as a HIT) though the job fails."""

    def _write_tmp(self, key: OffloadKey, row: int) -> bool:
        tmp = self._path(key) + ".tmp"
        ok = False
        try:
            self._write_file(key, self._rows.read(row))
            ok = True
        except OSError:
            pass
        finally:
            if os.path.exists(tmp):
                os.replace(tmp, self._path(key))
        return ok

    def _install_locked(self, key: OffloadKey) -> None:
        self._order[key] = None


class FileNameIgnoresGroup(FileTier):
    """Names a chunk's file after the block hash only, dropping the key's
    KV-group index: the chunks of one block in two KV groups share a file."""

    def _path(self, key: OffloadKey) -> str:
        return os.path.join(self.root, get_offload_block_hash(key).hex())


class ShutdownKeepsDirectory(FileTier):
    """``shutdown`` stops the I/O threads but leaves the chunk files and their
    temporary directory behind."""

    def shutdown(self) -> None:
        for _ in self._threads:
            self._work.put(None)
        for thread in self._threads:
            thread.join(timeout=10.0)


class SkippedKeyReportedEarly(FileTier):
    """A job that skipped a key still in flight in an earlier job reports
    without waiting for it: with two I/O threads it may report the key
    failed, and the key then reads HIT when the earlier job finishes."""

    def _do_store(self, work: _Work) -> None:
        work.after.clear()
        super()._do_store(work)


def make(capacity_blocks: int, primary_kv_view: memoryview) -> FileTier:
    return FileTier(capacity_blocks, primary_kv_view)


def make_writes_in_place(capacity_blocks: int, primary_kv_view: memoryview) -> FileTier:
    return WritesInPlace(capacity_blocks, primary_kv_view)


def make_renames_before_writing(capacity_blocks: int, primary_kv_view: memoryview) -> FileTier:
    return RenamesBeforeWriting(capacity_blocks, primary_kv_view)


def make_evicts_while_loading(capacity_blocks: int, primary_kv_view: memoryview) -> FileTier:
    return EvictsWhileLoading(capacity_blocks, primary_kv_view)


def make_renames_failed_write(capacity_blocks: int, primary_kv_view: memoryview) -> FileTier:
    return RenamesFailedWrite(capacity_blocks, primary_kv_view)


def make_file_name_ignores_group(capacity_blocks: int, primary_kv_view: memoryview) -> FileTier:
    return FileNameIgnoresGroup(capacity_blocks, primary_kv_view)


def make_shutdown_keeps_directory(capacity_blocks: int, primary_kv_view: memoryview) -> FileTier:
    return ShutdownKeepsDirectory(capacity_blocks, primary_kv_view)


def make_skipped_key_reported_early(
    capacity_blocks: int, primary_kv_view: memoryview
) -> FileTier:
    return SkippedKeyReportedEarly(capacity_blocks, primary_kv_view)
