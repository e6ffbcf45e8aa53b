"""Design (g): a tier on a lossy backend, where single chunks fail.

The backend drops every third chunk written and every third chunk read (one
counter each, over the tier's life), so a job can succeed for some of its
keys only: it then reports ``success=False`` with ``successful_keys`` naming
the keys that made it. A failed store leaves its key absent; a failed load
leaves its row untouched. Copies run at poll time; room is reserved at
submit, first in first out among unpinned chunks.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Collection, Iterable

import attrs

from tests.blind_tiers._common import (
    LookupResult,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    Rows,
    TierJobLike,
    TierJobResult,
    dedup_pairs,
)

#: The backend loses the n-th chunk written (and read) when n % FAIL_EVERY == 0.
FAIL_EVERY = 3


@attrs.define
class _Queued:
    job_id: int
    keys: list[OffloadKey]
    is_load: bool
    copy: list[tuple[OffloadKey, int]]
    skipped: list[OffloadKey]


class PartialTier:
    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        self._capacity = capacity_blocks
        self._rows = Rows(primary_kv_view)
        self._data: dict[OffloadKey, bytes] = {}
        self._reserved: set[OffloadKey] = set()
        self._pins: Counter[OffloadKey] = Counter()
        self._queue: deque[_Queued] = deque()
        self._results: list[TierJobResult] = []
        self._writes = 0
        self._reads = 0

    # -- the lossy backend ------------------------------------------------------
    def _backend_write(self, key: OffloadKey, data: bytes) -> bool:
        self._writes += 1
        if self._writes % FAIL_EVERY == 0:
            return False
        self._data[key] = data
        return True

    def _backend_read(self, key: OffloadKey) -> bytes | None:
        self._reads += 1
        if self._reads % FAIL_EVERY == 0:
            return None
        return self._data.get(key)

    # -- calls ------------------------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if key in self._data else LookupResult.MISS

    def submit_store(self, job: TierJobLike) -> None:
        pairs = dedup_pairs(job)
        q = _Queued(job.job_id, [k for k, _ in pairs], False, [], [])
        offered = set(q.keys)  # a job never evicts its own keys
        for key, row in pairs:
            if key in self._data or key in self._reserved:
                q.skipped.append(key)
                continue
            while len(self._data) + len(self._reserved) >= self._capacity:
                victim = next(
                    (k for k in self._data if not self._pins[k] and k not in offered), None
                )
                if victim is None:
                    break
                del self._data[victim]
            if len(self._data) + len(self._reserved) < self._capacity:
                self._reserved.add(key)
                q.copy.append((key, row))
        self._queue.append(q)

    def submit_load(self, job: TierJobLike) -> None:
        keys = list(job.keys)
        for key in keys:
            self._pins[key] += 1
        self._queue.append(
            _Queued(job.job_id, keys, True, list(zip(keys, (int(c) for c in job.chunk_ids))), [])
        )

    def _report(self, q: _Queued, ok: list[OffloadKey]) -> TierJobResult:
        wanted = set(q.keys)
        good = frozenset(ok) & wanted
        if good == wanted:
            return TierJobResult(q.job_id, True, None)
        return TierJobResult(q.job_id, False, good if good else None)

    def _store_keys(self, q: _Queued) -> list[OffloadKey]:
        ok: list[OffloadKey] = []
        for key, row in q.copy:
            self._reserved.discard(key)
            if self._backend_write(key, self._rows.read(row)):
                ok.append(key)
        ok.extend(k for k in q.skipped if k in self._data)
        return ok

    def _load_keys(self, q: _Queued) -> list[OffloadKey]:
        ok: list[OffloadKey] = []
        for key, row in q.copy:
            data = self._backend_read(key)
            if data is not None:
                self._rows.write(row, data)
                ok.append(key)
            self._pins[key] -= 1
            if self._pins[key] <= 0:
                del self._pins[key]
        return ok

    def _run(self) -> None:
        while self._queue:
            q = self._queue.popleft()
            ok = self._load_keys(q) if q.is_load else self._store_keys(q)
            self._results.append(self._report(q, ok))

    def get_finished_jobs(self) -> Iterable[TierJobResult]:
        self._run()
        out, self._results = self._results, []
        return out

    def drain_jobs(self) -> None:
        self._run()

    def has_pending_work(self) -> bool:
        return bool(self._queue or self._results)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        return None

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext(req_id=req_context.req_id)

    def on_request_finished(self, req_context: ReqContext) -> None:
        return None

    def take_events(self) -> Iterable[object]:
        return ()

    def shutdown(self) -> None:
        self._run()


# ---------------------------------------------------------------------------
# Defects.


class SuccessSetNotReset(PartialTier):
    """Collects the successful keys in one set kept across jobs (never
    cleared): a job's ``successful_keys`` names keys of earlier jobs."""

    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        super().__init__(capacity_blocks, primary_kv_view)
        self._ok_so_far: set[OffloadKey] = set()

    def _report(self, q: _Queued, ok: list[OffloadKey]) -> TierJobResult:
        self._ok_so_far.update(ok)
        if set(ok) >= set(q.keys):
            return TierJobResult(q.job_id, True, None)
        return TierJobResult(q.job_id, False, frozenset(self._ok_so_far))


class FailedPositionOffByOne(PartialTier):
    """Records the position of a failed chunk after advancing the position
    counter, so the key after the failed one is dropped from the successful
    keys and the failed one is claimed."""

    def _store_keys(self, q: _Queued) -> list[OffloadKey]:
        failed: set[int] = set()
        pos = 0
        for key, row in q.copy:
            self._reserved.discard(key)
            wrote = self._backend_write(key, self._rows.read(row))
            pos += 1
            if not wrote:
                failed.add(pos)
        ok = [key for i, (key, _) in enumerate(q.copy) if i not in failed]
        ok.extend(k for k in q.skipped if k in self._data)
        return ok


class IndexBeforeWrite(PartialTier):
    """Enters the key in the index before asking the backend to write it and
    does not take it out when the write fails: a failed store reads HIT."""

    def _backend_write(self, key: OffloadKey, data: bytes) -> bool:
        self._data[key] = data
        return super()._backend_write(key, data)


class SuccessIfAny(PartialTier):
    """Reports ``success=True`` when any key made it (``bool(ok)``), with the
    partial ``successful_keys`` alongside."""

    def _report(self, q: _Queued, ok: list[OffloadKey]) -> TierJobResult:
        good = frozenset(ok) & set(q.keys)
        return TierJobResult(q.job_id, bool(good), None if good == set(q.keys) else good)


def make(capacity_blocks: int, primary_kv_view: memoryview) -> PartialTier:
    return PartialTier(capacity_blocks, primary_kv_view)


def make_success_set_not_reset(capacity_blocks: int, primary_kv_view: memoryview) -> PartialTier:
    return SuccessSetNotReset(capacity_blocks, primary_kv_view)


def make_failed_position_off_by_one(
    capacity_blocks: int, primary_kv_view: memoryview
) -> PartialTier:
    return FailedPositionOffByOne(capacity_blocks, primary_kv_view)


def make_index_before_write(capacity_blocks: int, primary_kv_view: memoryview) -> PartialTier:
    return IndexBeforeWrite(capacity_blocks, primary_kv_view)


def make_success_if_any(capacity_blocks: int, primary_kv_view: memoryview) -> PartialTier:
    return SuccessIfAny(capacity_blocks, primary_kv_view)
