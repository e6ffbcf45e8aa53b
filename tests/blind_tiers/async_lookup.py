"""Design (f): lookups answered asynchronously, as a tier whose index lives
behind a slow metadata service would.

The first ``lookup`` of a key by a request queues an index query on the
lookup thread and answers RETRY; later lookups answer RETRY until the query
is resolved, then answer once from it (re-checked against the index at that
moment, so a key evicted since reads MISS) and forget it, so the next lookup
asks afresh. ``on_request_finished`` drops a request's queries. Stores and
loads are copied at poll time, as in the dict tier. Hook point:
``before_resolve`` (lookup thread, before it answers a query).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter, deque
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

_Tag = tuple[str, OffloadKey]


@attrs.define
class _Queued:
    job_id: int
    keys: list[OffloadKey]
    is_load: bool
    copy: list[tuple[OffloadKey, int]]
    skipped: list[OffloadKey]


class AsyncLookupTier:
    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        self._capacity = capacity_blocks
        self._rows = Rows(primary_kv_view)
        self.hooks = Hooks()
        self._lock = threading.Lock()
        self._data: dict[OffloadKey, bytes] = {}
        self._reserved: set[OffloadKey] = set()
        self._pins: Counter[OffloadKey] = Counter()
        self._queue: deque[_Queued] = deque()
        self._results: list[TierJobResult] = []
        self._answers: dict[_Tag, bool | None] = {}  # None: query in flight
        self._queries: queue.Queue[_Tag | None] = queue.Queue()
        self._thread = threading.Thread(target=self._resolve_queries, name="lookup", daemon=True)
        self._thread.start()

    # -- lookups ----------------------------------------------------------------
    def _present_locked(self, key: OffloadKey) -> bool:
        return key in self._data

    def _ask_locked(self, tag: _Tag) -> None:
        self._answers[tag] = None
        self._queries.put(tag)

    def _answer_locked(self, tag: _Tag, found: bool) -> LookupResult:
        del self._answers[tag]
        return LookupResult.HIT if found and self._present_locked(tag[1]) else LookupResult.MISS

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        tag = (req_context.req_id, key)
        with self._lock:
            if tag not in self._answers:
                self._ask_locked(tag)
                found = None
            else:
                found = self._answers[tag]
            if found is not None:
                return self._answer_locked(tag, found)
        # Not answered yet: give the lookup thread the interpreter for a
        # moment (never waits), so a caller asking again soon finds it done.
        time.sleep(0)
        return LookupResult.RETRY

    def _resolve_queries(self) -> None:
        while True:
            tag = self._queries.get()
            if tag is None:
                return
            self.hooks.fire("before_resolve")
            with self._lock:
                self._resolve_locked(tag)

    def _resolve_locked(self, tag: _Tag) -> None:
        if tag in self._answers:  # the request may have finished meanwhile
            self._answers[tag] = self._present_locked(tag[1])

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext(req_id=req_context.req_id)

    def on_request_finished(self, req_context: ReqContext) -> None:
        with self._lock:
            for tag in [t for t in self._answers if t[0] == req_context.req_id]:
                del self._answers[tag]

    # -- jobs ----------------------------------------------------------------------
    def submit_store(self, job: TierJobLike) -> None:
        pairs = dedup_pairs(job)
        q = _Queued(job.job_id, [k for k, _ in pairs], False, [], [])
        offered = set(q.keys)  # a job never evicts its own keys
        with self._lock:
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
        with self._lock:
            for key in keys:
                self._pins[key] += 1
        self._queue.append(
            _Queued(job.job_id, keys, True, list(zip(keys, (int(c) for c in job.chunk_ids))), [])
        )

    def _finish_locked(self, q: _Queued) -> TierJobResult:
        ok: list[OffloadKey] = []
        if not q.is_load:
            for key, row in q.copy:
                self._reserved.discard(key)
                self._data[key] = self._rows.read(row)
                ok.append(key)
            ok.extend(k for k in q.skipped if k in self._data)
            return job_result(q.job_id, q.keys, ok)
        for key, row in q.copy:
            data = self._data.get(key)
            if data is not None:
                self._rows.write(row, data)
                ok.append(key)
            self._pins[key] -= 1
            if self._pins[key] <= 0:
                del self._pins[key]
        return job_result(q.job_id, q.keys, ok)

    def _run(self) -> None:
        with self._lock:
            while self._queue:
                self._results.append(self._finish_locked(self._queue.popleft()))

    def get_finished_jobs(self) -> Iterable[TierJobResult]:
        self._run()
        out, self._results = self._results, []
        return out

    def drain_jobs(self) -> None:
        self._run()

    def has_pending_work(self) -> bool:
        # Jobs only, as the contract defines it; lookup queries are not work.
        return bool(self._queue or self._results)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        return None

    def take_events(self) -> Iterable[object]:
        return ()

    def shutdown(self) -> None:
        self._run()
        if self._thread.is_alive():
            self._queries.put(None)
            self._thread.join(timeout=10.0)


# ---------------------------------------------------------------------------
# Defects.


class CoalescedQueryStarves(AsyncLookupTier):
    """Coalesces queries for the same key ("one index round trip per key"),
    but the lookup thread answers only the request that sent the query: a
    second request asking while it was in flight gets RETRY forever."""

    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        super().__init__(capacity_blocks, primary_kv_view)
        self._asked: set[OffloadKey] = set()

    def _ask_locked(self, tag: _Tag) -> None:
        self._answers[tag] = None
        if tag[1] not in self._asked:
            self._asked.add(tag[1])
            self._queries.put(tag)

    def _resolve_locked(self, tag: _Tag) -> None:
        super()._resolve_locked(tag)
        self._asked.discard(tag[1])


class CachesAnswerForRequest(AsyncLookupTier):
    """Keeps a resolved answer for the rest of the request and returns it as
    is: a key evicted after it was answered still reads HIT."""

    def _answer_locked(self, tag: _Tag, found: bool) -> LookupResult:
        return LookupResult.HIT if found else LookupResult.MISS


class CountsReservedAsPresent(AsyncLookupTier):
    """Asks "is the key ours?" rather than "is it stored?": a key whose store
    is only queued reads HIT."""

    def _present_locked(self, key: OffloadKey) -> bool:
        return key in self._data or key in self._reserved


def make(capacity_blocks: int, primary_kv_view: memoryview) -> AsyncLookupTier:
    return AsyncLookupTier(capacity_blocks, primary_kv_view)


def make_coalesced_query_starves(
    capacity_blocks: int, primary_kv_view: memoryview
) -> AsyncLookupTier:
    return CoalescedQueryStarves(capacity_blocks, primary_kv_view)


def make_caches_answer_for_request(
    capacity_blocks: int, primary_kv_view: memoryview
) -> AsyncLookupTier:
    return CachesAnswerForRequest(capacity_blocks, primary_kv_view)


def make_counts_reserved_as_present(
    capacity_blocks: int, primary_kv_view: memoryview
) -> AsyncLookupTier:
    return CountsReservedAsPresent(capacity_blocks, primary_kv_view)
