"""Design (b): an in-memory tier served by one worker thread.

Submits plan under the lock (skip present keys, evict first-in first-out
among keys no load pins, reserve room) and queue the job; the worker copies
and then publishes the job's effect and result under the same lock. Hook
points (``before_copy``, ``in_commit``, ``before_publish``, ``in_take``) let
a test pause the worker or the caller at a known place.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterable

import attrs

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


@attrs.define
class _Work:
    job_id: int
    keys: list[OffloadKey]
    is_load: bool
    copy: list[tuple[OffloadKey, int]]
    skipped: list[OffloadKey]


class ThreadTier:
    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        self._capacity = capacity_blocks
        self._rows = Rows(primary_kv_view)
        self.hooks = Hooks()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._index: dict[OffloadKey, bytes] = {}
        self._reserved: set[OffloadKey] = set()
        self._pins: Counter[OffloadKey] = Counter()
        self._results: list[TierJobResult] = []
        self._in_flight = 0
        self._work: queue.Queue[_Work | None] = queue.Queue()
        self._worker = threading.Thread(target=self._serve, name="thread-tier", daemon=True)
        self._worker.start()

    # -- caller side ------------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        with self._lock:
            return LookupResult.HIT if key in self._index else LookupResult.MISS

    def _victim_locked(self, protect: Collection[OffloadKey]) -> OffloadKey | None:
        for key in self._index:
            if not self._pins[key] and key not in protect:
                return key
        return None

    def _reserve_locked(self, key: OffloadKey, protect: Collection[OffloadKey]) -> bool:
        while len(self._index) + len(self._reserved) >= self._capacity:
            victim = self._victim_locked(protect)
            if victim is None:
                return False
            del self._index[victim]
        self._reserved.add(key)
        return True

    def _present_locked(self, key: OffloadKey) -> bool:
        return key in self._index or key in self._reserved

    def submit_store(self, job: TierJobLike) -> None:
        pairs = dedup_pairs(job)
        work = _Work(job.job_id, [k for k, _ in pairs], False, [], [])
        with self._lock:
            for key, row in pairs:
                if self._present_locked(key):
                    work.skipped.append(key)
                elif self._reserve_locked(key, work.keys):
                    work.copy.append((key, row))
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
            self.hooks.fire("in_take")
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
        if self._worker.is_alive():
            self._work.put(None)
            self._worker.join(timeout=10.0)

    # -- worker side -----------------------------------------------------------------
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
            except Exception:  # a hook or a copy failed: the job fails whole
                self._fail(work)

    def _fail(self, work: _Work) -> None:
        with self._lock:
            for key, _ in work.copy:
                if work.is_load:
                    self._pins[key] -= 1
                else:
                    self._reserved.discard(key)
            self._publish_locked(TierJobResult(work.job_id, False, None))

    def _do_store(self, work: _Work) -> None:
        self.hooks.fire("before_copy")
        copied = {key: self._rows.read(row) for key, row in work.copy}
        self.hooks.fire("before_publish")
        self._commit_store(work, copied)

    def _commit_store(self, work: _Work, copied: dict[OffloadKey, bytes]) -> None:
        """Make the copied chunks readable and queue the job's result, in one
        critical section: a key never reads HIT before its job is done."""
        with self._lock:
            self.hooks.fire("in_commit")
            self._index.update(copied)
            self._reserved.difference_update(copied)
            self._publish_store_locked(work, copied)

    def _publish_store_locked(self, work: _Work, copied: dict[OffloadKey, bytes]) -> None:
        ok = [k for k in copied if k in self._index]
        ok += [k for k in work.skipped if k in self._index]
        self._publish_locked(job_result(work.job_id, work.keys, ok))

    def _do_load(self, work: _Work) -> None:
        ok: list[OffloadKey] = []
        with self._lock:
            found = {key: self._index.get(key) for key, _ in work.copy}
        self._write_rows(work.copy, found, ok)
        self.hooks.fire("before_publish")
        with self._lock:
            for key, _ in work.copy:
                self._pins[key] -= 1
                if self._pins[key] <= 0:
                    del self._pins[key]
            self._publish_locked(job_result(work.job_id, work.keys, ok))

    def _write_rows(
        self,
        pairs: list[tuple[OffloadKey, int]],
        found: dict[OffloadKey, bytes | None],
        ok: list[OffloadKey],
    ) -> None:
        for key, row in pairs:
            data = found[key]
            if data is not None:
                self._rows.write(row, data)
                ok.append(key)

    def _publish_locked(self, result: TierJobResult) -> None:
        self._results.append(result)
        self._in_flight -= 1
        self._idle.notify_all()


# ---------------------------------------------------------------------------
# Defects.


class CopyOnWriteIndexRace(ThreadTier):
    """The worker rebuilds the index copy-on-write outside the lock ("so
    lookups never wait on it"): a key the caller evicts meanwhile comes back."""

    def _commit_store(self, work: _Work, copied: dict[OffloadKey, bytes]) -> None:
        snapshot = dict(self._index)
        self.hooks.fire("in_commit")
        snapshot.update(copied)
        self._index = snapshot
        with self._lock:
            self._reserved.difference_update(copied)
            self._publish_store_locked(work, copied)


class DrainPollsQueue(ThreadTier):
    """``drain_jobs`` waits for the queue to be empty, not for the worker:
    it returns while the worker still holds the last job."""

    def drain_jobs(self) -> None:
        while not self._work.empty():
            time.sleep(0.001)


class IndexedAtSubmit(ThreadTier):
    """Puts a placeholder in the index at submit ("so a second store of the
    key is skipped") and fills it later: the key reads HIT before its copy."""

    def submit_store(self, job: TierJobLike) -> None:
        super().submit_store(job)
        with self._lock:
            for key in list(self._reserved):
                self._index.setdefault(key, b"")
                self._reserved.discard(key)


class LoadZeroFillsPastEnd(ThreadTier):
    """Zero-fills the destination rows before copying, from the first to one
    past the last row of the job: the row after the job's last row is wiped."""

    def _write_rows(
        self,
        pairs: list[tuple[OffloadKey, int]],
        found: dict[OffloadKey, bytes | None],
        ok: list[OffloadKey],
    ) -> None:
        if pairs:
            first = min(row for _, row in pairs)
            last = max(row for _, row in pairs)
            size = self._rows.chunk_bytes
            self._rows.write_range(first * size, bytes((last - first + 2) * size))
        super()._write_rows(pairs, found, ok)


class TakesResultsUnlocked(ThreadTier):
    """``get_finished_jobs`` copies and then clears the results list without
    the lock: a result the worker publishes in between is lost."""

    def get_finished_jobs(self) -> Iterable[TierJobResult]:
        out = list(self._results)
        self.hooks.fire("in_take")
        self._results.clear()
        return out


class ReportsAtSubmit(ThreadTier):
    """Reports a store finished as soon as it is queued ("optimistic
    completion") and copies later: the caller unpins and reuses the primary
    rows before the worker has read them."""

    def submit_store(self, job: TierJobLike) -> None:
        super().submit_store(job)
        with self._lock:
            self._publish_locked(TierJobResult(job.job_id, True, None))
            self._in_flight += 1  # the worker's own accounting still runs

    def _publish_store_locked(self, work: _Work, copied: dict[OffloadKey, bytes]) -> None:
        self._in_flight -= 1
        self._idle.notify_all()


class DrainEventStartsClear(ThreadTier):
    """Drains by waiting on an "all done" event that is set when the last job
    finishes, but the event starts clear: ``drain_jobs`` on a tier that never
    ran a job blocks until some job finishes."""

    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        self._all_done = threading.Event()
        super().__init__(capacity_blocks, primary_kv_view)

    def submit_store(self, job: TierJobLike) -> None:
        self._all_done.clear()
        super().submit_store(job)

    def submit_load(self, job: TierJobLike) -> None:
        self._all_done.clear()
        super().submit_load(job)

    def _publish_locked(self, result: TierJobResult) -> None:
        super()._publish_locked(result)
        if not self._in_flight:
            self._all_done.set()

    def drain_jobs(self) -> None:
        self._all_done.wait()


class ShutdownWithoutJoin(ThreadTier):
    """``shutdown`` posts the stop sentinel and returns: the worker is still
    running (and still writing primary rows) after the tier said it let go."""

    def shutdown(self) -> None:
        if self._worker.is_alive():
            self._work.put(None)


class LoadReportsBeforeCopy(ThreadTier):
    """Reports a load finished (and unpins its keys) before writing the
    primary rows ("the copy cannot fail now"): the caller reads rows that
    are not written yet."""

    def _do_load(self, work: _Work) -> None:
        with self._lock:
            found = {key: self._index.get(key) for key, _ in work.copy}
            ok = [key for key, _ in work.copy if found[key] is not None]
            for key, _ in work.copy:
                self._pins[key] -= 1
            self._publish_locked(job_result(work.job_id, work.keys, ok))
        self.hooks.fire("before_publish")
        self._write_rows(work.copy, found, [])


def make(capacity_blocks: int, primary_kv_view: memoryview) -> ThreadTier:
    return ThreadTier(capacity_blocks, primary_kv_view)


def make_copy_on_write_index_race(capacity_blocks: int, primary_kv_view: memoryview) -> ThreadTier:
    return CopyOnWriteIndexRace(capacity_blocks, primary_kv_view)


def make_drain_polls_queue(capacity_blocks: int, primary_kv_view: memoryview) -> ThreadTier:
    return DrainPollsQueue(capacity_blocks, primary_kv_view)


def make_indexed_at_submit(capacity_blocks: int, primary_kv_view: memoryview) -> ThreadTier:
    return IndexedAtSubmit(capacity_blocks, primary_kv_view)


def make_load_zero_fills_past_end(capacity_blocks: int, primary_kv_view: memoryview) -> ThreadTier:
    return LoadZeroFillsPastEnd(capacity_blocks, primary_kv_view)


def make_takes_results_unlocked(capacity_blocks: int, primary_kv_view: memoryview) -> ThreadTier:
    return TakesResultsUnlocked(capacity_blocks, primary_kv_view)


def make_reports_at_submit(capacity_blocks: int, primary_kv_view: memoryview) -> ThreadTier:
    return ReportsAtSubmit(capacity_blocks, primary_kv_view)


def make_drain_event_starts_clear(capacity_blocks: int, primary_kv_view: memoryview) -> ThreadTier:
    return DrainEventStartsClear(capacity_blocks, primary_kv_view)


def make_shutdown_without_join(capacity_blocks: int, primary_kv_view: memoryview) -> ThreadTier:
    return ShutdownWithoutJoin(capacity_blocks, primary_kv_view)


def make_load_reports_before_copy(capacity_blocks: int, primary_kv_view: memoryview) -> ThreadTier:
    return LoadReportsBeforeCopy(capacity_blocks, primary_kv_view)
