"""Design (e): an LRU-bounded in-memory tier.

Recency: a stored chunk joins the most-recent end when its store completes;
``touch`` moves the touched chunks that are held to the most-recent end,
walking the keys in reverse so the first key ends most recent (the order the
manager's own ``touch`` uses). Room is reserved at submit: in-flight stores
count against the capacity, and the least-recent chunk that no queued load
pins is evicted. Copies run at poll time.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
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
    job_result,
)


@attrs.define
class _Queued:
    job_id: int
    keys: list[OffloadKey]
    is_load: bool
    copy: list[tuple[OffloadKey, int]]
    skipped: list[OffloadKey]


class LRUTier:
    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        self._capacity = capacity_blocks
        self._rows = Rows(primary_kv_view)
        self._lru: OrderedDict[OffloadKey, bytes] = OrderedDict()  # least recent first
        self._reserved: set[OffloadKey] = set()
        self._pins: Counter[OffloadKey] = Counter()
        self._queue: deque[_Queued] = deque()
        self._results: list[TierJobResult] = []

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if key in self._lru else LookupResult.MISS

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in reversed(list(keys)):
            if key in self._lru:
                self._lru.move_to_end(key)

    def _held(self) -> int:
        return len(self._lru) + len(self._reserved)

    def _is_present(self, key: OffloadKey) -> bool:
        return key in self._lru or key in self._reserved

    def _evict_lru(self, protect: Collection[OffloadKey]) -> bool:
        for key in self._lru:
            if not self._pins[key] and key not in protect:
                del self._lru[key]
                return True
        return False

    def submit_store(self, job: TierJobLike) -> None:
        pairs = dedup_pairs(job)
        q = _Queued(job.job_id, [k for k, _ in pairs], False, [], [])
        offered = set(q.keys)  # a job never evicts its own keys
        for key, row in pairs:
            if self._is_present(key):
                q.skipped.append(key)
                continue
            while self._held() >= self._capacity and self._evict_lru(offered):
                pass
            if self._held() < self._capacity:
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

    def _finish_store(self, q: _Queued) -> TierJobResult:
        ok: list[OffloadKey] = []
        for key, row in q.copy:
            self._reserved.discard(key)
            try:
                self._lru[key] = self._rows.read(row)
            except IndexError:
                continue
            ok.append(key)
        ok.extend(k for k in q.skipped if k in self._lru)
        return job_result(q.job_id, q.keys, ok)

    def _finish_load(self, q: _Queued) -> TierJobResult:
        ok: list[OffloadKey] = []
        for key, row in q.copy:
            data = self._lru.get(key)
            if data is not None:
                try:
                    self._rows.write(row, data)
                    ok.append(key)
                except (IndexError, ValueError):
                    pass
            self._pins[key] -= 1
            if self._pins[key] <= 0:
                del self._pins[key]
        return job_result(q.job_id, q.keys, ok)

    def _run(self) -> None:
        while self._queue:
            q = self._queue.popleft()
            self._results.append(self._finish_load(q) if q.is_load else self._finish_store(q))

    def get_finished_jobs(self) -> Iterable[TierJobResult]:
        self._run()
        out, self._results = self._results, []
        return out

    def drain_jobs(self) -> None:
        self._run()

    def has_pending_work(self) -> bool:
        return bool(self._queue or self._results)

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


class TouchAddsAbsent(LRUTier):
    """``touch`` inserts keys it does not hold (``setdefault`` before
    ``move_to_end``): a key never stored reads HIT with empty bytes."""

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in reversed(list(keys)):
            self._lru.setdefault(key, b"")
            self._lru.move_to_end(key)


class TouchDemotes(LRUTier):
    """``touch`` moves the touched keys to the least-recent end
    (``move_to_end(key, last=False)``): touched chunks are evicted first.
    Breaks the tier's declared LRU policy, not the tier contract itself."""

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in keys:
            if key in self._lru:
                self._lru.move_to_end(key, last=False)


class IgnoresInFlight(LRUTier):
    """Counts only completed chunks against the capacity: stores submitted
    together before a poll all get room, and the tier ends over capacity."""

    def _held(self) -> int:
        return len(self._lru)


class StaleBytesCache(LRUTier):
    """Evicts from the recency order but keeps the bytes ("freed lazily"),
    and asks the bytes map whether a key is present: a key stored again
    after its eviction is skipped, reported stored, and reads MISS."""

    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        super().__init__(capacity_blocks, primary_kv_view)
        self._bytes: dict[OffloadKey, bytes] = {}

    def _is_present(self, key: OffloadKey) -> bool:
        return key in self._bytes or key in self._reserved

    def _finish_store(self, q: _Queued) -> TierJobResult:
        super()._finish_store(q)
        for key, _ in q.copy:
            if key in self._lru:
                self._bytes[key] = self._lru[key]
        ok = [k for k in q.keys if k in self._lru or k in q.skipped]
        return job_result(q.job_id, q.keys, ok)


def make(capacity_blocks: int, primary_kv_view: memoryview) -> LRUTier:
    return LRUTier(capacity_blocks, primary_kv_view)


def make_touch_adds_absent(capacity_blocks: int, primary_kv_view: memoryview) -> LRUTier:
    return TouchAddsAbsent(capacity_blocks, primary_kv_view)


def make_touch_demotes(capacity_blocks: int, primary_kv_view: memoryview) -> LRUTier:
    return TouchDemotes(capacity_blocks, primary_kv_view)


def make_ignores_in_flight(capacity_blocks: int, primary_kv_view: memoryview) -> LRUTier:
    return IgnoresInFlight(capacity_blocks, primary_kv_view)


def make_stale_bytes_cache(capacity_blocks: int, primary_kv_view: memoryview) -> LRUTier:
    return StaleBytesCache(capacity_blocks, primary_kv_view)
