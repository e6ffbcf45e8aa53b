"""Design (d): one slab file of ``capacity_blocks`` slots and a slot
allocator (a free list), with positional reads and writes done at poll time.

A store reserves a slot at submit (evicting the oldest stored chunk that no
load pins) and writes it when the caller polls or drains; a load pins its
keys at submit and reads at poll. The slab lives in a temporary directory
the factory creates and ``shutdown`` removes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
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
    copy: list[tuple[OffloadKey, int, int]]  # (key, primary row, slab slot)
    skipped: list[OffloadKey]


class SlabTier:
    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        self._capacity = capacity_blocks
        self._rows = Rows(primary_kv_view)
        self._size = self._rows.chunk_bytes
        self.root = tempfile.mkdtemp(prefix="blind-slab-tier-")
        self._fd = os.open(os.path.join(self.root, "slab.bin"), os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(self._fd, self._slots() * self._size)
        self._free: list[int] = list(range(self._slots()))[::-1]  # pop() hands out 0 first
        self._slot_of: dict[OffloadKey, int] = {}  # stored chunks, oldest first
        self._pending: dict[OffloadKey, int] = {}  # reserved slots, store queued
        self._pins: Counter[OffloadKey] = Counter()
        self._queue: deque[_Queued] = deque()
        self._results: list[TierJobResult] = []

    def _slots(self) -> int:
        return self._capacity

    # -- allocator ------------------------------------------------------------------
    def _full(self) -> bool:
        return len(self._slot_of) + len(self._pending) >= self._capacity

    def _alloc(self) -> int:
        return self._free.pop()

    def _release(self, slot: int) -> None:
        self._free.append(slot)

    def _evict_one(self, protect: Collection[OffloadKey]) -> bool:
        for key in self._slot_of:
            if not self._pins[key] and key not in protect:
                self._release(self._slot_of.pop(key))
                return True
        return False

    # -- calls ------------------------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if key in self._slot_of else LookupResult.MISS

    def _is_present(self, key: OffloadKey) -> bool:
        return key in self._slot_of or key in self._pending

    def _plan_store(self, pairs: list[tuple[OffloadKey, int]], q: _Queued) -> None:
        offered = set(q.keys)  # a job never evicts its own keys
        for key, row in pairs:
            if self._is_present(key):
                q.skipped.append(key)
                continue
            while self._full():
                if not self._evict_one(offered):
                    break
            if self._full():
                continue  # no room: this key fails
            slot = self._alloc()
            self._pending[key] = slot
            q.copy.append((key, row, slot))

    def submit_store(self, job: TierJobLike) -> None:
        pairs = dedup_pairs(job)
        q = _Queued(job.job_id, [k for k, _ in pairs], False, [], [])
        self._plan_store(pairs, q)
        self._queue.append(q)

    def submit_load(self, job: TierJobLike) -> None:
        keys = list(job.keys)
        q = _Queued(job.job_id, keys, True, [], [])
        for key, row in zip(keys, (int(c) for c in job.chunk_ids)):
            self._pins[key] += 1
            q.copy.append((key, row, -1))
        self._queue.append(q)

    def _write_slot(self, slot: int, data: bytes) -> None:
        os.pwrite(self._fd, data, slot * self._size)

    def _finish_store(self, q: _Queued) -> TierJobResult:
        ok: list[OffloadKey] = []
        for key, row, slot in q.copy:
            self._pending.pop(key, None)
            try:
                self._write_slot(slot, self._rows.read(row))
            except (OSError, IndexError):
                self._release(slot)
                continue
            self._slot_of[key] = slot
            ok.append(key)
        ok.extend(k for k in q.skipped if k in self._slot_of)
        return job_result(q.job_id, q.keys, ok)

    def _finish_load(self, q: _Queued) -> TierJobResult:
        ok: list[OffloadKey] = []
        for key, row, _ in q.copy:
            slot = self._slot_of.get(key)
            if slot is not None:
                data = os.pread(self._fd, self._size, slot * self._size)
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
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        shutil.rmtree(self.root, ignore_errors=True)


# ---------------------------------------------------------------------------
# Defects.


class BumpAllocator(SlabTier):
    """Hands out slot ``number of chunks held`` ("slots are dense"): after an
    eviction that slot still belongs to another chunk, which is overwritten."""

    def _alloc(self) -> int:
        return len(self._slot_of) + len(self._pending)

    def _release(self, slot: int) -> None:
        return None


class RefreshesPresentKey(SlabTier):
    """A store of a key already held rewrites its slot from the new row
    ("refresh") instead of skipping it."""

    def _plan_store(self, pairs: list[tuple[OffloadKey, int]], q: _Queued) -> None:
        fresh: list[tuple[OffloadKey, int]] = []
        for key, row in pairs:
            slot = self._slot_of.get(key)
            if slot is not None:
                q.copy.append((key, row, slot))
            else:
                fresh.append((key, row))
        super()._plan_store(fresh, q)


class OneSlotTooMany(SlabTier):
    """Sizes the slab ``capacity_blocks + 1`` slots and only evicts when over
    (``>`` where ``>=`` was meant): it holds one chunk more than its capacity."""

    def _slots(self) -> int:
        return self._capacity + 1

    def _full(self) -> bool:
        return len(self._slot_of) + len(self._pending) > self._capacity


class SkipMisalignsRows(SlabTier):
    """Drops the keys already held from the job's keys but not their chunk
    ids, so every later key of that job is copied from the wrong row."""

    def submit_store(self, job: TierJobLike) -> None:
        keys = [k for k in dict.fromkeys(job.keys) if not self._is_present(k)]
        rows = [int(c) for c in job.chunk_ids]
        q = _Queued(job.job_id, list(dict.fromkeys(job.keys)), False, [], [])
        q.skipped.extend(k for k in q.keys if k not in keys)
        self._plan_store(list(zip(keys, rows)), q)
        self._queue.append(q)


class SortedReadsPermuteRows(SlabTier):
    """Reads a load's chunks in slab order ("sequential I/O") but hands out
    the destination rows in the job's order: keys land in each other's rows
    whenever the two orders differ."""

    def _finish_load(self, q: _Queued) -> TierJobResult:
        rows = [row for _, row, _ in q.copy]
        by_slot = sorted(q.copy, key=lambda e: self._slot_of.get(e[0], -1))
        q.copy = [(key, row, slot) for (key, _, slot), row in zip(by_slot, rows)]
        return super()._finish_load(q)


def make(capacity_blocks: int, primary_kv_view: memoryview) -> SlabTier:
    return SlabTier(capacity_blocks, primary_kv_view)


def make_bump_allocator(capacity_blocks: int, primary_kv_view: memoryview) -> SlabTier:
    return BumpAllocator(capacity_blocks, primary_kv_view)


def make_refreshes_present_key(capacity_blocks: int, primary_kv_view: memoryview) -> SlabTier:
    return RefreshesPresentKey(capacity_blocks, primary_kv_view)


def make_one_slot_too_many(capacity_blocks: int, primary_kv_view: memoryview) -> SlabTier:
    return OneSlotTooMany(capacity_blocks, primary_kv_view)


def make_skip_misaligns_rows(capacity_blocks: int, primary_kv_view: memoryview) -> SlabTier:
    return SkipMisalignsRows(capacity_blocks, primary_kv_view)


def make_sorted_reads_permute_rows(capacity_blocks: int, primary_kv_view: memoryview) -> SlabTier:
    return SortedReadsPermuteRows(capacity_blocks, primary_kv_view)
