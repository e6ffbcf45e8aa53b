"""Secondary tiers for the tier kit's own tests: correct ones and planted
defects, each a factory ``(capacity_blocks, primary_kv_view) -> tier``.

:class:`DictTier` is a correct, bounded, in-memory tier whose jobs run
lazily (at most one per ``get_finished_jobs``, all of them at
``drain_jobs``), so jobs stay in flight across calls; :class:`ThreadTier`
runs them on a worker thread under a lock. Each ``*Tier`` below them plants
one defect, named in its docstring; ``PLANTED`` lists them with the
invariant the kit must report.
"""

from __future__ import annotations

import queue
import threading
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable
from typing import Any

from kvoffload import ReqContext
from kvoffload.spec.contract import LookupResult, RequestOffloadingContext
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.tier_contract import TierJobLike, TierJobResult
from kvoffload.spec.violations import Invariant


class DictTier:
    """A correct bounded in-memory tier (LRU; keys being loaded are never
    evicted; a key without room fails its store)."""

    JOBS_PER_POLL = 1

    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        self.capacity = capacity_blocks
        self.view = primary_kv_view.cast("B")  # flat bytes, as vLLM's tiers read it
        strides = primary_kv_view.strides
        self.chunk_bytes = strides[0] if strides else primary_kv_view.itemsize
        self.chunks: OrderedDict[OffloadKey, bytes] = OrderedDict()
        self.loading: Counter[OffloadKey] = Counter()
        self.queued: list[TierJobLike] = []
        self.finished: list[TierJobResult] = []

    # --- primary memory ---
    def read_slot(self, slot: int) -> bytes:
        start = slot * self.chunk_bytes
        return bytes(self.view[start : start + self.chunk_bytes])

    def write_slot(self, slot: int, data: bytes) -> None:
        start = slot * self.chunk_bytes
        self.view[start : start + self.chunk_bytes] = data

    # --- the contract ---
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if key in self.chunks else LookupResult.MISS

    def submit_store(self, job: TierJobLike) -> None:
        self.queued.append(job)

    def submit_load(self, job: TierJobLike) -> None:
        for key in job.keys:
            if key in self.chunks:
                self.loading[key] += 1
        self.queued.append(job)

    def evictable(self, key: OffloadKey) -> bool:
        return self.loading[key] == 0

    def make_room(self, protected: Collection[OffloadKey]) -> bool:
        if len(self.chunks) < self.capacity:
            return True
        for victim in self.chunks:
            if self.evictable(victim) and victim not in protected:
                del self.chunks[victim]
                return True
        return False

    def run_store(self, job: TierJobLike) -> TierJobResult:
        made: list[OffloadKey] = []
        for key, slot in zip(job.keys, job.chunk_ids):
            if key in self.chunks:
                self.chunks.move_to_end(key)
                made.append(key)
            elif self.make_room(job.keys):
                self.chunks[key] = self.read_slot(int(slot))
                made.append(key)
        return self.result(job, made)

    def run_load(self, job: TierJobLike) -> TierJobResult:
        made: list[OffloadKey] = []
        for key, slot in zip(job.keys, job.chunk_ids):
            if key in self.chunks and self.loading[key] > 0:
                self.write_slot(int(slot), self.chunks[key])
                self.loading[key] -= 1
                made.append(key)
        return self.result(job, made)

    @staticmethod
    def result(job: TierJobLike, made: list[OffloadKey]) -> TierJobResult:
        if len(made) == len(job.keys):
            return TierJobResult(job.job_id, True)
        return TierJobResult(job.job_id, False, frozenset(made))

    def run(self, job: TierJobLike) -> None:
        self.finished.append(self.run_load(job) if job.is_promotion else self.run_store(job))

    def get_finished_jobs(self) -> Iterable[TierJobResult]:
        for job in self.queued[: self.JOBS_PER_POLL]:
            self.run(job)
        del self.queued[: self.JOBS_PER_POLL]
        done, self.finished = self.finished, []
        return done

    def drain_jobs(self) -> None:
        while self.queued:
            self.run(self.queued.pop(0))

    def has_pending_work(self) -> bool:
        return bool(self.queued or self.finished)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in keys:
            if key in self.chunks:
                self.chunks.move_to_end(key)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext(req_context.req_id)

    def on_request_finished(self, req_context: ReqContext) -> None:
        return None

    def take_events(self) -> Iterable[Any]:
        return ()

    def shutdown(self) -> None:
        return None


class ThreadTier(DictTier):
    """A correct tier whose jobs run on a worker thread; its index and
    results are guarded by one lock."""

    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        super().__init__(capacity_blocks, primary_kv_view)
        self.lock = threading.Lock()
        self.jobs: queue.Queue[TierJobLike | None] = queue.Queue()
        self.worker = threading.Thread(target=self.serve, daemon=True)
        self.worker.start()

    def serve(self) -> None:
        while (job := self.jobs.get()) is not None:
            self.execute(job)
            self.jobs.task_done()
        self.jobs.task_done()

    def execute(self, job: TierJobLike) -> None:
        with self.lock:
            self.run(job)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        with self.lock:
            return super().lookup(key, req_context)

    def submit_store(self, job: TierJobLike) -> None:
        self.jobs.put(job)

    def submit_load(self, job: TierJobLike) -> None:
        with self.lock:
            for key in job.keys:
                if key in self.chunks:
                    self.loading[key] += 1
        self.jobs.put(job)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        # under the lock: the worker iterates the chunks when it evicts (the
        # kit's noise found this tier's first version touching them unlocked)
        with self.lock:
            super().touch(keys, req_context)

    def get_finished_jobs(self) -> Iterable[TierJobResult]:
        with self.lock:
            done, self.finished = self.finished, []
        return done

    def drain_jobs(self) -> None:
        self.jobs.join()

    def has_pending_work(self) -> bool:
        with self.lock:
            return bool(self.jobs.unfinished_tasks or self.finished)

    def shutdown(self) -> None:
        self.jobs.put(None)
        self.worker.join(timeout=5)


# --- planted defects ------------------------------------------------------


class TornReadTier(DictTier):
    """A promotion copies only the first half of each chunk."""

    def write_slot(self, slot: int, data: bytes) -> None:
        half = len(data) // 2
        start = slot * self.chunk_bytes
        self.view[start : start + half] = data[:half]


class LostJobTier(DictTier):
    """A cascade whose keys were all present already is never reported."""

    def run_store(self, job: TierJobLike) -> TierJobResult:
        skipped = all(key in self.chunks for key in job.keys)
        result = super().run_store(job)
        if skipped:
            self.finished.append(result)
            self.finished.pop()
        return result

    def run(self, job: TierJobLike) -> None:
        if not job.is_promotion and all(key in self.chunks for key in job.keys):
            self.run_store(job)
            return
        super().run(job)


class DoubleReportTier(DictTier):
    """A promotion that fails for some key is reported twice."""

    def run(self, job: TierJobLike) -> None:
        super().run(job)
        if not self.finished[-1].success and job.is_promotion:
            self.finished.append(self.finished[-1])


class WrongSlotTier(DictTier):
    """A promotion of several keys writes them into its slots in reverse."""

    def run_load(self, job: TierJobLike) -> TierJobResult:
        reversed_job = _Job(job.job_id, tuple(job.keys), tuple(job.chunk_ids)[::-1], True)
        return super().run_load(reversed_job)


class UnpinnedReadTier(DictTier):
    """A cascade reports its job first and reads its slots at the next
    ``get_finished_jobs``/``drain_jobs``: after the primary released them."""

    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        super().__init__(capacity_blocks, primary_kv_view)
        self.unread: list[tuple[OffloadKey, int]] = []

    def run_store(self, job: TierJobLike) -> TierJobResult:
        before = set(self.chunks)
        result = super().run_store(job)
        self.unread += [
            (k, int(s)) for k, s in zip(job.keys, job.chunk_ids) if k in self.chunks and k not in before
        ]
        return result

    def read_late(self) -> None:
        for key, slot in self.unread:
            if key in self.chunks:
                self.chunks[key] = self.read_slot(slot)
        self.unread = []

    def get_finished_jobs(self) -> Iterable[TierJobResult]:
        self.read_late()
        return super().get_finished_jobs()

    def drain_jobs(self) -> None:
        self.read_late()
        super().drain_jobs()


class OverflowTier(DictTier):
    """Never evicts: holds more keys than its capacity."""

    def make_room(self, protected: Collection[OffloadKey]) -> bool:
        return True


class EvictLoadingTier(DictTier):
    """Evicts keys whose promotion is still in flight."""

    def evictable(self, key: OffloadKey) -> bool:
        return True


class StaleTier(DictTier):
    """Keeps the chunk of a key after evicting it from its index, and serves
    the old bytes when the key is stored again but finds room only later."""

    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        super().__init__(capacity_blocks, primary_kv_view)
        self.graveyard: dict[OffloadKey, bytes] = {}

    def make_room(self, protected: Collection[OffloadKey]) -> bool:
        before = dict(self.chunks)
        ok = super().make_room(protected)
        for key in set(before) - set(self.chunks):
            self.graveyard[key] = before[key]
        return ok

    def run_store(self, job: TierJobLike) -> TierJobResult:
        result = super().run_store(job)
        for key in job.keys:
            if key in self.chunks and key in self.graveyard:
                self.chunks[key] = self.graveyard.pop(key)
        return result


class _Job:
    def __init__(
        self, job_id: int, keys: tuple[OffloadKey, ...], chunk_ids: tuple[int, ...], promo: bool
    ) -> None:
        self.job_id = job_id
        self.keys = keys
        self.chunk_ids = chunk_ids
        self.is_promotion = promo


class RacyThreadTier(ThreadTier):
    """Promotions run on a second worker thread (a read pool, as vLLM's fs
    tier has), and the store worker publishes a key in the index before its
    bytes, without the lock: a promotion racing the cascade reads the
    empty placeholder."""

    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        super().__init__(capacity_blocks, primary_kv_view)
        self.loads: queue.Queue[TierJobLike | None] = queue.Queue()
        self.reader = threading.Thread(target=self.serve_loads, daemon=True)
        self.reader.start()

    def serve_loads(self) -> None:
        while (job := self.loads.get()) is not None:
            with self.lock:
                self.run(job)
            self.loads.task_done()
        self.loads.task_done()

    def submit_load(self, job: TierJobLike) -> None:
        with self.lock:
            for key in job.keys:
                if key in self.chunks:
                    self.loading[key] += 1
        self.loads.put(job)

    def write_slot(self, slot: int, data: bytes) -> None:
        start = slot * self.chunk_bytes
        self.view[start : start + len(data)] = data  # the placeholder writes nothing

    def execute(self, job: TierJobLike) -> None:
        made: list[OffloadKey] = []
        for key, slot in zip(job.keys, job.chunk_ids):
            if key in self.chunks:
                made.append(key)
                continue
            with self.lock:
                if not self.make_room(job.keys):
                    continue
            self.chunks[key] = b""  # published before its bytes, outside the lock
            threading.Event().wait(0.002)
            self.chunks[key] = self.read_slot(int(slot))
            made.append(key)
        with self.lock:
            self.finished.append(self.result(job, made))

    def drain_jobs(self) -> None:
        self.jobs.join()
        self.loads.join()

    def has_pending_work(self) -> bool:
        with self.lock:
            busy = self.jobs.unfinished_tasks or self.loads.unfinished_tasks
            return bool(busy or self.finished)

    def shutdown(self) -> None:
        self.loads.put(None)
        self.reader.join(timeout=5)
        super().shutdown()


class QueuedHitTier(DictTier):
    """Answers HIT for a key whose store is only queued (its copy runs at a
    later poll): a HIT for a copy not made, so the copy reads the slot after
    the HIT."""

    def queued_store(self, key: OffloadKey) -> bool:
        return any(key in job.keys for job in self.queued if not job.is_promotion)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self.queued_store(key):
            return LookupResult.HIT
        return super().lookup(key, req_context)

    def submit_load(self, job: TierJobLike) -> None:
        for key in job.keys:  # its jobs run in order: a queued store lands first
            if key in self.chunks or self.queued_store(key):
                self.loading[key] += 1
        self.queued.append(job)


def _factory(cls: type[DictTier]) -> Any:
    def build(capacity_blocks: int, primary_kv_view: memoryview) -> DictTier:
        return cls(capacity_blocks, primary_kv_view)

    build.__qualname__ = build.__name__ = cls.__name__.lower()
    return build


dict_tier = _factory(DictTier)
thread_tier = _factory(ThreadTier)
torn_read = _factory(TornReadTier)
lost_job = _factory(LostJobTier)
double_report = _factory(DoubleReportTier)
wrong_slot = _factory(WrongSlotTier)
unpinned_read = _factory(UnpinnedReadTier)
overflow = _factory(OverflowTier)
evict_loading = _factory(EvictLoadingTier)
stale = _factory(StaleTier)
racy_thread = _factory(RacyThreadTier)
queued_hit = _factory(QueuedHitTier)

def not_a_tier(capacity_blocks: int, primary_kv_view: memoryview) -> object:
    """A factory whose product has none of a tier's methods (a usage error)."""
    return object()


CORRECT = {"dict_tier": dict_tier, "thread_tier": thread_tier}

PLANTED: dict[str, tuple[Any, frozenset[Invariant]]] = {
    "torn_read": (torn_read, frozenset({Invariant.TIER_READABLE})),
    # a tier that forgets a job also says it has no pending work (T6)
    "lost_job": (lost_job, frozenset({Invariant.TIER_JOBS, Invariant.TIER_DRAIN})),
    "double_report": (double_report, frozenset({Invariant.TIER_JOBS})),
    "wrong_slot": (wrong_slot, frozenset({Invariant.TIER_PROMOTION_SLOTS})),
    # the late read stores the kit's filler (T3); when the kit has reused the
    # slot for a promotion of the same key into it, the tier loads back the
    # very bytes the slot held, which the bytes cannot tell from a promotion
    # that wrote nothing (T1: CI at 30dbad7, seed 11; test_tier_kit)
    "unpinned_read": (
        unpinned_read,
        frozenset({Invariant.TIER_CASCADE_PINS, Invariant.TIER_READABLE}),
    ),
    "overflow": (overflow, frozenset({Invariant.TIER_CAPACITY})),
    "evict_loading": (evict_loading, frozenset({Invariant.TIER_LIFECYCLE})),
    "stale": (stale, frozenset({Invariant.TIER_READABLE})),
    # a HIT before the copy: the placeholder loads (T1), or the copy reads the
    # slot the kit released at that HIT (T3)
    "racy_thread": (
        racy_thread, frozenset({Invariant.TIER_READABLE, Invariant.TIER_CASCADE_PINS})
    ),
    "queued_hit": (queued_hit, frozenset({Invariant.TIER_CASCADE_PINS})),
}
"""Each planted defect, its factory and the invariants that name it."""
