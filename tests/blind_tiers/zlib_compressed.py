"""Design (h): a compressed in-memory tier.

Each chunk is kept zlib-compressed, or raw when compression does not shrink
it (a flag says which). Capacity is counted in chunks, as the contract says
(``capacity_blocks``), whatever their compressed size; room is reserved at
submit, first in first out among unpinned chunks. Copies run at poll time:
a store compresses the pinned primary row then, before its result is
reported.
"""

from __future__ import annotations

import zlib
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
    job_result,
)


@attrs.define
class _Queued:
    job_id: int
    keys: list[OffloadKey]
    is_load: bool
    copy: list[tuple[OffloadKey, int]]
    skipped: list[OffloadKey]


@attrs.define
class _Blob:
    compressed: bool
    payload: bytes | memoryview


class ZlibTier:
    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        self._capacity = capacity_blocks
        self._rows = Rows(primary_kv_view)
        self._blobs: dict[OffloadKey, _Blob] = {}
        self._reserved: set[OffloadKey] = set()
        self._pins: Counter[OffloadKey] = Counter()
        self._queue: deque[_Queued] = deque()
        self._results: list[TierJobResult] = []

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if key in self._blobs else LookupResult.MISS

    def _has_room(self) -> bool:
        return len(self._blobs) + len(self._reserved) < self._capacity

    def _evict_one(self, protect: Collection[OffloadKey]) -> bool:
        victim = next((k for k in self._blobs if not self._pins[k] and k not in protect), None)
        if victim is None:
            return False
        del self._blobs[victim]
        return True

    def submit_store(self, job: TierJobLike) -> None:
        pairs = dedup_pairs(job)
        q = _Queued(job.job_id, [k for k, _ in pairs], False, [], [])
        offered = set(q.keys)  # a job never evicts its own keys
        for key, row in pairs:
            if key in self._blobs or key in self._reserved:
                q.skipped.append(key)
                continue
            while not self._has_room() and self._evict_one(offered):
                pass
            if self._has_room():
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

    def _pack(self, row: int) -> _Blob:
        raw = self._rows.read(row)
        packed = zlib.compress(raw, 1)
        return _Blob(True, packed) if len(packed) < len(raw) else _Blob(False, raw)

    def _unpack(self, blob: _Blob) -> bytes:
        return zlib.decompress(blob.payload) if blob.compressed else bytes(blob.payload)

    def _put(self, key: OffloadKey, blob: _Blob) -> None:
        self._blobs[key] = blob

    def _finish_store(self, q: _Queued) -> TierJobResult:
        ok: list[OffloadKey] = []
        for key, row in q.copy:
            self._reserved.discard(key)
            self._put(key, self._pack(row))
            ok.append(key)
        ok.extend(k for k in q.skipped if k in self._blobs)
        return job_result(q.job_id, q.keys, ok)

    def _finish_load(self, q: _Queued) -> TierJobResult:
        ok: list[OffloadKey] = []
        for key, row in q.copy:
            blob = self._blobs.get(key)
            if blob is not None:
                try:
                    self._rows.write(row, self._unpack(blob))
                    ok.append(key)
                except (zlib.error, ValueError, IndexError):
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


class RawFlagLost(ZlibTier):
    """Falls back to raw bytes for incompressible chunks but always
    decompresses on load: an incompressible chunk reads HIT and never loads."""

    def _unpack(self, blob: _Blob) -> bytes:
        return zlib.decompress(blob.payload)


class BudgetInBytes(ZlibTier):
    """Turns ``capacity_blocks`` into a byte budget and charges each chunk
    its compressed size: with compressible data it holds more chunks than
    its capacity."""

    def _has_room(self) -> bool:
        return True

    def _put(self, key: OffloadKey, blob: _Blob) -> None:
        budget = self._capacity * self._rows.chunk_bytes
        used = sum(len(b.payload) for b in self._blobs.values())
        while used + len(blob.payload) > budget and self._blobs:
            victim = next((k for k in self._blobs if not self._pins[k]), None)
            if victim is None:
                break
            used -= len(self._blobs.pop(victim).payload)
        self._blobs[key] = blob


class LazyCompression(ZlibTier):
    """"Compresses lazily": a store keeps a view of the primary row and only
    compresses it on first load, so once the row is reused for another
    block the chunk reads back the new bytes."""

    def _finish_store(self, q: _Queued) -> TierJobResult:
        ok: list[OffloadKey] = []
        size = self._rows.chunk_bytes
        flat = self._rows._flat
        for key, row in q.copy:
            self._reserved.discard(key)
            self._blobs[key] = _Blob(False, flat[row * size : (row + 1) * size])
            ok.append(key)
        ok.extend(k for k in q.skipped if k in self._blobs)
        return job_result(q.job_id, q.keys, ok)


def make(capacity_blocks: int, primary_kv_view: memoryview) -> ZlibTier:
    return ZlibTier(capacity_blocks, primary_kv_view)


def make_raw_flag_lost(capacity_blocks: int, primary_kv_view: memoryview) -> ZlibTier:
    return RawFlagLost(capacity_blocks, primary_kv_view)


def make_budget_in_bytes(capacity_blocks: int, primary_kv_view: memoryview) -> ZlibTier:
    return BudgetInBytes(capacity_blocks, primary_kv_view)


def make_lazy_compression(capacity_blocks: int, primary_kv_view: memoryview) -> ZlibTier:
    return LazyCompression(capacity_blocks, primary_kv_view)
