"""End-to-end byte integrity through three tiers: GPU blocks → CPU slots →
a secondary tier → CPU slots → GPU blocks.

The real :class:`TieredOffloadingManager` (over the real CPU manager core)
and the real CPU↔GPU handlers are driven by a Hypothesis state machine,
beside a secondary tier whose jobs run when the machine says so: GPU stores
that fail or die mid-write (garbage in their slots), cascades that fail in
part, promotions that fail in part or die mid-copy (garbage in the primary
slots they were given), evictions in the primary (by stores and by
promotions) and in the tier, promotions racing GPU loads and stores,
resets with jobs in flight, and the tier closed and reopened under a fresh
manager (an engine restart). Over the real file tier: its own threads,
chunk files damaged on disk, and its disk failing writes (full, or torn
with a half-written temp file left behind); a process killed mid-write is
tests/impl/test_tiered_crash.py. After every step: every key the primary
reads as ready holds exactly the bytes last stored under it, every chunk
the tier holds is the bytes of the version cascaded into it, events agree
with both, and a write that failed never became a hit. GPU loads check the
bytes they deliver. CPU tensors stand in for the GPU here; CUDA runs it too
when present.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import tempfile
import threading
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, TypeVar

import pytest

pytest.importorskip("torch")

import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvoffload.impl import fs_tier
from kvoffload.impl.fs_tier import TEMP_SUFFIX, FileSystemTier
from kvoffload.impl.manager import CPUOffloadingManager
from kvoffload.impl.memtier import MemoryTier
from kvoffload.impl.specs import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.impl.tiered import TieredOffloadingManager
from kvoffload.impl.worker.base import TransferResult, TransferSpec
from kvoffload.impl.worker.spec import CPUOffloadingConfig, CPUOffloadingSpec
from kvoffload.impl.worker.worker import OffloadingWorker
from kvoffload.spec.contract import ReqContext
from kvoffload.spec.keys import OffloadKey, make_offload_key
from kvoffload.spec.lifecycle import PhaseKind
from kvoffload.spec.tier_contract import TierJob, TierJobLike, TierJobResult
from tests.fs_faults import per_item_writes
from tests.worker.test_worker_integrity import FAIL_MODES, FlakyHandler
from tests.worker.worker_helpers import HAS_CUDA, make_caches, pattern

CTX = ReqContext("tiered-integrity")
NUM_HASHES = 8
ROW_BYTES = 48
GARBAGE = 0x5A

T = TypeVar("T")

KEYS_OFFERED = st.lists(st.integers(0, NUM_HASHES - 1), min_size=1, max_size=3, unique=True)
"""The keys a GPU store offers (indices into the machine's keys)."""

PICKS = st.lists(st.integers(0, 63), min_size=1, max_size=4)
"""Picks among items the run's state decides (ready keys, a tier's keys,
jobs in flight): indices from a fixed range, taken modulo the number of
items by :func:`pick`. With a threaded tier that state moves with the
pool's timing, and Hypothesis must meet the same draws when it replays a
choice sequence: a draw whose bounds follow that state (``sampled_from``
of the items) raised ``FlakyStrategyDefinition`` in a deep run."""

SEEDS = st.integers(0, 2**16 - 1)
"""A seed for the blocks a GPU job takes (:meth:`TieredIntegrityMachine.take_gpu`)."""


def pick(items: Sequence[T], picks: Sequence[int], most: int) -> list[T]:
    """The distinct items ``picks`` point at, at most ``most`` (none where
    there are no items)."""
    if not items:
        return []
    return list(dict.fromkeys(items[i % len(items)] for i in picks))[:most]


class Model:
    """What the machine knows the tier should hold: key -> version, set by
    the tier itself when it runs a store (from the version the primary
    holds under the pinned key) and read when it runs a load."""

    def __init__(self) -> None:
        self.ready: dict[OffloadKey, int] = {}  # primary: key -> version
        self.tier: dict[OffloadKey, int] = {}  # tier: key -> version
        self.promoted: dict[OffloadKey, int] = {}  # loads the tier carried out


class WitnessedTier(MemoryTier):
    """A :class:`MemoryTier` that tells the model what each job carried,
    and fails jobs on demand (in part, or dying mid-copy)."""

    def __init__(self, capacity: int, view: memoryview, model: Model) -> None:
        super().__init__(capacity, view, medium="TIER", complete_on_submit=False)
        self.model = model

    def _run_store(self, job: TierJob) -> TierJobResult:
        for key in job.keys:
            # the cascade reads a pinned primary slot: the key is ready there
            assert key in self.model.ready, f"cascade of {key!r}, not ready in the primary"
        before = set(self.keys())
        result = super()._run_store(job)
        for key in before.difference(self.keys()):  # the tier's own victims
            del self.model.tier[key]
        for key in job.keys:
            if key in self and key not in before:
                self.model.tier[key] = self.model.ready[key]
        return result

    def _run_load(self, job: TierJob) -> TierJobResult:
        present = [key for key in job.keys if key in self]
        result = super()._run_load(job)
        for key in present:
            self.model.promoted[key] = self.model.tier[key]
        return result

    def die_mid_load(self, job_id: int, keep: list[OffloadKey]) -> None:
        """Fail a queued promotion: ``keep`` made it, the others' primary
        rows hold garbage (a copy that died half-way)."""
        job = next(q.job for q in self._queue if q.job.job_id == job_id)
        assert self._flat is not None
        for key, chunk in zip(job.keys, job.chunk_ids):
            if key not in keep:
                start = chunk * self._chunk_bytes
                self._flat[start:start + self._chunk_bytes] = bytes([GARBAGE]) * self._chunk_bytes
        present = [key for key in keep if key in self]
        self.fail_job(job_id, keep)
        for key in present:
            self.model.promoted[key] = self.model.tier[key]


class TieredIntegrityMachine(RuleBasedStateMachine):
    device: ClassVar[str] = "cpu"
    factor: ClassVar[int] = 2
    cpu_blocks: ClassVar[int] = 4
    tier_blocks: ClassVar[int] = 6
    gpu_blocks: ClassVar[int] = 40
    cascade: ClassVar[str] = "write-through"
    max_promotions: ClassVar[int] = 2

    def __init__(self) -> None:
        super().__init__()
        self.caches = make_caches(self.device, self.gpu_blocks, (ROW_BYTES,))
        spec = CPUOffloadingSpec(CPUOffloadingConfig(
            16, offloaded_block_size=16 * self.factor, num_cpu_blocks=self.cpu_blocks,
            direct_copy_min_bytes=48,
        ))
        self.handlers = spec.build_handlers(self.caches)
        (cpu,) = self.handlers.cpu_tensors
        self.cpu = cpu
        # one row per primary slot, as a tier is handed the primary's memory
        self.view = cpu.view(self.cpu_blocks, -1).numpy().data
        self.store_handler = FlakyHandler(self.handlers.gpu_to_cpu_handler, self.handlers)
        self.load_handler = FlakyHandler(self.handlers.cpu_to_gpu_handler, self.handlers)
        self.worker = OffloadingWorker()
        self.worker.register_handler(GPULoadStoreSpec, CPULoadStoreSpec, self.store_handler)
        self.worker.register_handler(CPULoadStoreSpec, GPULoadStoreSpec, self.load_handler)
        self.keys = [make_offload_key(bytes([h]) * 8, 0) for h in range(NUM_HASHES)]
        self.model = Model()
        self.tier: MemoryTier | FileSystemTier = self.make_tier()
        self.manager = self.new_manager()
        self.free_gpu = list(range(self.gpu_blocks))
        self.next_job = 0
        self.next_version = 0
        self.loading: dict[OffloadKey, int] = {}
        self.jobs: dict[int, tuple[str, list[OffloadKey], list[int], list[int]]] = {}
        self.announced: set[OffloadKey] = set()
        self.tier_announced: set[OffloadKey] = set()
        self.promoting: set[OffloadKey] = set()
        self.loads_checked = 0

    def make_tier(self) -> MemoryTier | FileSystemTier:
        return WitnessedTier(self.tier_blocks, self.view, self.model)

    def memory_tier(self) -> WitnessedTier:
        assert isinstance(self.tier, WitnessedTier)
        return self.tier

    def new_manager(self) -> TieredOffloadingManager:
        primary = CPUOffloadingManager(16 * self.factor, self.cpu_blocks, enable_events=True)
        return TieredOffloadingManager(
            primary, [self.tier], cascade=self.cascade,
            max_promotions_in_flight=self.max_promotions,
        )

    def row(self, key: OffloadKey, version: int, sub: int) -> torch.Tensor:
        return pattern(ROW_BYTES, self.keys.index(key), version, 0, sub)

    def take_gpu(self, count: int, seed: int) -> list[int]:
        # a seed drawn, not st.randoms(): a Hypothesis random draws with
        # bounds from its arguments (how many blocks, of how many free),
        # which a threaded tier's timing moves (see PICKS)
        blocks = random.Random(seed).sample(sorted(self.free_gpu), count)
        for block in blocks:
            self.free_gpu.remove(block)
        return blocks

    # ------------------------------------------------------ primary changes

    def forget_evicted(self, pinned_before: set[OffloadKey]) -> None:
        """Drop from the model the ready keys the primary evicted (a store's
        or a promotion's victims); none may have been pinned."""
        for key in list(self.model.ready):
            if self.manager.phase(key).kind is PhaseKind.ABSENT:
                assert key not in pinned_before, f"{key!r} evicted while pinned"
                del self.model.ready[key]

    def pinned(self) -> set[OffloadKey]:
        return {
            k for k in self.model.ready
            if k in self.loading or self.manager.cascade_pins(k) > 0
        }

    def settle_promotions(self) -> None:
        """Promotions whose results were taken: a hit exactly when the tier
        carried the key out."""
        for key in list(self.promoting):
            if self.manager.is_promoting(key):
                continue
            self.promoting.discard(key)
            carried = self.model.promoted.pop(key, None)
            readable = self.manager.primary.lookup(key, CTX)
            assert readable == (carried is not None), (
                f"promotion of {key!r}: tier carried it {carried is not None}, "
                f"primary readable {readable}"
            )
            if carried is not None:
                self.model.ready[key] = carried

    # --------------------------------------------------------------- rules

    @rule(
        picks=KEYS_OFFERED,
        seed=SEEDS,
        fail=FAIL_MODES,
        collect_now=st.booleans(),
    )
    def gpu_store(self, picks: list[int], seed: int, fail: str,
                  collect_now: bool) -> None:
        offered = [self.keys[h] for h in picks]
        if len(self.free_gpu) < len(offered) * self.factor:
            return
        pinned = self.pinned()
        out = self.manager.prepare_store(offered, CTX)
        if out is None:
            return
        for victim in out.evicted_keys:
            assert victim in self.model.ready and victim not in pinned, victim
        self.forget_evicted(pinned)
        to_store = list(out.keys_to_store)
        if not to_store:
            return
        blocks = self.take_gpu(len(to_store) * self.factor, seed)
        versions = []
        gpu = self.caches.tensors[0].tensor
        for position, key in enumerate(to_store):
            version = self.next_version
            self.next_version += 1
            versions.append(version)
            for sub in range(self.factor):
                gpu[blocks[position * self.factor + sub]].copy_(self.row(key, version, sub))
        spec = GPULoadStoreSpec(blocks)
        self.submit("store", to_store, blocks, versions, (spec, out.store_spec), fail)
        if collect_now:
            self.collect()

    @rule(
        picks=KEYS_OFFERED,
        seed=SEEDS,
    )
    def store_and_end_the_step(self, picks: list[int], seed: int) -> None:
        """A request's blocks stored, their copy collected and the step
        ended with the tier caught up: the path that fills the tier (and,
        written back, cascades the primary's victims). Without it a tier
        held a key in few examples, and few lookups could promote."""
        self.gpu_store(picks, seed, "ok", collect_now=True)
        self.step_end(True)

    @rule(picks=PICKS, seed=SEEDS, fail=FAIL_MODES)
    def gpu_load(self, picks: list[int], seed: int, fail: str) -> None:
        keys = pick(sorted(self.model.ready), picks, 3)
        if not keys or len(self.free_gpu) < len(keys) * self.factor:
            return
        cpu_spec = self.manager.prepare_load(keys, CTX)
        for key in keys:
            self.loading[key] = self.loading.get(key, 0) + 1
        blocks = self.take_gpu(len(keys) * self.factor, seed)
        self.caches.tensors[0].tensor[blocks] = 0x33
        versions = [self.model.ready[key] for key in keys]
        self.submit("load", keys, blocks, versions, (cpu_spec, GPULoadStoreSpec(blocks)), fail)

    def submit(self, kind: str, keys: list[OffloadKey], blocks: list[int],
               versions: list[int], spec: TransferSpec, fail: str) -> None:
        job = self.next_job
        self.next_job += 1
        handler = self.store_handler if kind == "store" else self.load_handler
        handler.fail_next = fail
        assert self.worker.transfer_async(job, spec) == (fail == "ok")
        self.jobs[job] = (kind, keys, blocks, versions)

    @rule()
    def collect(self) -> None:
        for result in self.worker.get_finished():
            self.finish(result)

    @rule(picks=PICKS)
    def wait_for_some(self, picks: list[int]) -> None:
        jobs = pick(sorted(self.jobs), picks, len(picks))
        if jobs:
            self.worker.wait(jobs)
            self.collect()

    def finish(self, result: TransferResult) -> None:
        kind, keys, blocks, versions = self.jobs.pop(result.job_id)
        if kind == "store":
            if result.success:  # known before the call: it may cascade at once
                for key, version in zip(keys, versions):
                    self.model.ready[key] = version
            self.manager.complete_store(keys, CTX, success=result.success)
        else:
            if result.success:
                gpu = self.caches.tensors[0].tensor
                for position, (key, version) in enumerate(zip(keys, versions)):
                    for sub in range(self.factor):
                        got = gpu[blocks[position * self.factor + sub]].cpu()
                        assert torch.equal(got, self.row(key, version, sub)), (
                            f"GPU load of {key!r} v{version} sub-block {sub}: wrong bytes"
                        )
                self.loads_checked += 1
            self.manager.complete_load(keys, CTX)
            for key in keys:
                self.loading[key] -= 1
                if not self.loading[key]:
                    del self.loading[key]
        self.free_gpu += blocks

    @rule(picks=st.lists(st.integers(0, NUM_HASHES - 1), min_size=1, max_size=4))
    def lookup(self, picks: list[int]) -> None:
        """A scheduler's lookup: may start promotions (and evict for them)."""
        chain = list(dict.fromkeys(self.keys[h] for h in picks))
        pinned = self.pinned()
        already = set(self.promoting)
        found = self.manager.lookup_prefix(chain, CTX)
        self.forget_evicted(pinned)
        for key in chain:
            if self.manager.is_promoting(key) and key not in already:
                # a promotion starts only for a key the tier holds (one begun
                # earlier may outlive the tier's copy: it then fails for it)
                self.promoting.add(key)
                assert key in self.model.tier, f"promotion of {key!r}, not in the tier"
        if found is not None:
            assert all(k in self.model.ready for k in chain[:found])
            assert found == len(chain) or chain[found] not in self.model.ready
        assert self.manager.promotions_in_flight <= self.max_promotions

    def tier_only(self) -> list[OffloadKey]:
        return sorted(k for k in self.model.tier if k not in self.model.ready)

    @precondition(lambda self: bool(self.tier_only()))
    @rule(data=st.data())
    def lookup_tier_only_keys(self, data: st.DataObject) -> None:
        """A request whose prefix the tier holds and the primary lost."""
        chain = data.draw(st.lists(st.sampled_from(self.tier_only()), min_size=1,
                                   max_size=4, unique=True))
        self.lookup([self.keys.index(k) for k in chain])

    @precondition(lambda self: any(q.job.is_promotion for q in self.memory_tier()._queue))
    @rule(data=st.data(), die=st.booleans())
    def tier_fails_a_promotion(self, data: st.DataObject, die: bool) -> None:
        job = data.draw(st.sampled_from([q.job for q in self.memory_tier()._queue if q.job.is_promotion]))
        self.fail_tier_job(job, data.draw(st.lists(st.sampled_from(job.keys), unique=True)), die)

    @rule(tier_runs=st.booleans())
    def step_end(self, tier_runs: bool) -> None:
        self.manager.on_schedule_end()
        if tier_runs:  # a fast tier: the step's jobs are done by the next poll
            self.memory_tier().run_jobs()
            self.manager.poll()
        self.settle_promotions()

    @rule(
        picks=st.lists(st.integers(0, NUM_HASHES - 1), min_size=1, max_size=4),
        first_fails=st.sampled_from(["no", "in part", "dying"]),
    )
    def lookup_until_promoted(self, picks: list[int], first_fails: str) -> None:
        """A request asking again each step until its promotions landed;
        the first step's promotions may fail (keeping their first key) or
        die mid-copy."""
        for step in range(3):
            self.lookup(picks)
            if step == 0 and first_fails != "no":
                self.manager.on_schedule_end()
                for queued in [q.job for q in self.memory_tier()._queue if q.job.is_promotion]:
                    self.fail_tier_job(queued, list(queued.keys[:1]), first_fails == "dying")
                self.manager.poll()
                self.settle_promotions()
            else:
                self.step_end(True)

    @rule()
    def poll(self) -> None:
        self.manager.poll()
        self.settle_promotions()

    @precondition(lambda self: self.memory_tier().jobs_queued > 0)
    @rule(count=st.integers(1, 3))
    def tier_runs(self, count: int) -> None:
        self.memory_tier().run_jobs(count)

    @precondition(lambda self: self.memory_tier().jobs_queued > 0)
    @rule(data=st.data(), die=st.booleans())
    def tier_fails(self, data: st.DataObject, die: bool) -> None:
        queued = data.draw(st.sampled_from([q.job for q in self.memory_tier()._queue]))
        self.fail_tier_job(queued, data.draw(st.lists(st.sampled_from(queued.keys), unique=True)),
                           die)

    def fail_tier_job(self, queued: TierJob, keep: list[OffloadKey], die: bool) -> None:
        if queued.is_promotion and die:
            self.memory_tier().die_mid_load(queued.job_id, keep)
        else:
            present = [k for k in keep if k in self.memory_tier()]
            self.memory_tier().fail_job(queued.job_id, keep)
            if queued.is_promotion:
                for key in present:
                    self.model.promoted[key] = self.model.tier[key]

    @rule(picks=st.lists(st.integers(0, NUM_HASHES - 1), min_size=1, max_size=3))
    def tier_evicts(self, picks: list[int]) -> None:
        for key in self.memory_tier().evict([self.keys[h] for h in picks]):
            del self.model.tier[key]

    @rule(picks=st.lists(st.integers(0, NUM_HASHES - 1), max_size=3))
    def touch(self, picks: list[int]) -> None:
        self.manager.touch([self.keys[h] for h in picks], CTX)

    def quiesce(self) -> None:
        self.worker.wait(list(self.jobs))
        self.collect()
        assert not self.jobs

    @rule()
    def reset(self) -> None:
        self.quiesce()
        self.manager.reset_cache()  # drains the tier first
        assert not self.tier.has_pending_work() and self.manager.jobs_in_flight == 0
        self.settle_promotions_after_reset()
        self.model.ready.clear()

    def settle_promotions_after_reset(self) -> None:
        # reset took every result (a carried promotion became ready, then
        # was reset) and dropped promotions never submitted
        self.promoting.clear()
        self.model.promoted.clear()

    @rule()
    def restart(self) -> None:
        """The engine stops and starts again: the tier is closed, reopened
        over the same contents and put under a fresh manager."""
        self.quiesce()
        self.manager.reset_cache()
        self.settle_promotions_after_reset()
        self.manager.take_events()
        self.manager.shutdown()
        assert self.memory_tier().closed
        reopened = WitnessedTier(self.tier_blocks, self.view, self.model)
        reopened._chunks.update(self.memory_tier()._chunks)  # what a file tier finds
        self.tier = reopened
        self.manager = self.new_manager()
        self.model.ready.clear()
        self.announced.clear()
        self.tier_announced = set(self.memory_tier().keys())

    # ----------------------------------------------------------- invariants

    @invariant()
    def the_primary_agrees_with_the_model(self) -> None:
        for key in self.keys:
            assert self.manager.primary.lookup(key, CTX) == (key in self.model.ready), key

    @invariant()
    def every_ready_slot_holds_the_bytes_last_stored(self) -> None:
        for key, version in self.model.ready.items():
            slot = self.manager.slot_of(key)
            assert slot is not None
            for sub in range(self.factor):
                assert torch.equal(
                    self.cpu[slot * self.factor + sub], self.row(key, version, sub)
                ), f"CPU slot {slot} of {key!r} v{version}, sub-block {sub}"

    @invariant()
    def every_tier_chunk_holds_the_bytes_cascaded_into_it(self) -> None:
        assert set(self.memory_tier().keys()) == set(self.model.tier)
        for key, version in self.model.tier.items():
            want = b"".join(
                self.row(key, version, sub).numpy().tobytes() for sub in range(self.factor)
            )
            assert self.memory_tier().chunk(key) == want, f"tier chunk of {key!r} v{version}"

    def apply_events(self) -> None:
        for event in self.manager.take_events():
            target = self.announced if event.medium == "CPU" else self.tier_announced
            if event.removed:
                target -= set(event.keys)
                if target is self.tier_announced:
                    self.tier_dropped(event.keys)
            else:
                target |= set(event.keys)

    def tier_dropped(self, keys: Iterable[OffloadKey]) -> None:
        """The tier announced that it no longer holds ``keys``."""

    @invariant()
    def events_describe_both_tiers(self) -> None:
        self.apply_events()
        assert self.announced == set(self.model.ready)
        assert self.tier_announced == set(self.model.tier)

    def teardown(self) -> None:
        self.worker.shutdown()


SETTINGS = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class WriteThrough(TieredIntegrityMachine):
    pass


class WriteBackOnePromotion(TieredIntegrityMachine):
    cascade = "write-back"
    max_promotions = 1
    tier_blocks = 4


TestTieredIntegrityWriteThrough = WriteThrough.TestCase
TestTieredIntegrityWriteThrough.settings = SETTINGS
TestTieredIntegrityWriteBack = WriteBackOnePromotion.TestCase
TestTieredIntegrityWriteBack.settings = SETTINGS


class CudaWriteThrough(TieredIntegrityMachine):
    device = "cuda"


TestTieredIntegrityCuda = pytest.mark.gpu(
    pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")(CudaWriteThrough.TestCase)
)
TestTieredIntegrityCuda.settings = SETTINGS


# --- the file tier ------------------------------------------------------------


class WitnessedFileTier(FileSystemTier):
    """The real :class:`FileSystemTier`, telling the model which version of
    each key every cascade carried (read from the pinned primary slot's
    owner at submit)."""

    model: Model
    cascaded: dict[OffloadKey, set[int]]

    def submit_store(self, job: TierJobLike) -> None:
        for key in job.keys:
            assert key in self.model.ready, f"cascade of {key!r}, not ready in the primary"
            self.cascaded.setdefault(key, set()).add(self.model.ready[key])
        super().submit_store(job)


class WriteFaults:
    """The file tier's disk failing its next writes (installed in place of
    ``fs_tier._write_chunks`` for one machine's life, item by item):
    ``"full"`` fails a write before it touches a file (a full disk);
    ``"torn"`` leaves half of the chunk in the write's temp file and fails,
    as a write whose clean-up died with it would. The pool threads take the
    faults in turn."""

    def __init__(self) -> None:
        self.real = fs_tier._write_chunks
        self.armed: list[str] = []
        self.lock = threading.Lock()
        self.failed = 0
        fs_tier._write_chunks = per_item_writes(self.fault, self.real)

    def fault(self, temp: str, prefix: str, payload: memoryview,
              recycled: str | None) -> OSError | None:
        with self.lock:
            fault = self.armed.pop(0) if self.armed else None
            if fault is not None:
                self.failed += 1
        if fault is None:
            return None
        if fault == "torn":
            os.makedirs(os.path.dirname(temp), exist_ok=True)
            with open(temp, "wb") as handle:
                handle.write(payload[: len(payload) // 2])
        return OSError(errno.ENOSPC, f"no space left (injected, {fault})", temp)

    def remove(self) -> None:
        fs_tier._write_chunks = self.real


class FileTierIntegrityMachine(TieredIntegrityMachine):
    """The same machine over the real file tier: its copies run on its own
    threads (so promotions truly race GPU loads and stores), chunk files
    are damaged on disk, and the tier is closed and reopened on the same
    directory. A chunk read back must be a version that was cascaded under
    its key; a damaged chunk must never become a hit."""

    tier_blocks = 6

    def __init__(self) -> None:
        # tmpfs when there is one: the tier makes 256 fan-out directories
        # per example, which a disk file system creates and removes slowly
        shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.directory = tempfile.mkdtemp(prefix="kvoffload-tiered-", dir=shm)
        self.cascaded: dict[OffloadKey, set[int]] = {}
        self.damaged: set[OffloadKey] = set()
        # keys whose promotion had read the chunk when it was damaged
        self.read_before_damage: set[OffloadKey] = set()
        super().__init__()
        self.write_faults = WriteFaults()

    def make_tier(self) -> MemoryTier | FileSystemTier:
        tier = WitnessedFileTier(
            self.directory, self.tier_blocks, self.view, num_threads=2,
            enable_events=True, medium="TIER",
            verify_loads="always",  # files are damaged while the tier runs
            checksum=True,  # ... which only the checksum catches, on tmpfs too
        )
        tier.model = self.model
        tier.cascaded = self.cascaded
        return tier

    def file_tier(self) -> FileSystemTier:
        assert isinstance(self.tier, FileSystemTier)
        return self.tier

    def tier_version(self, key: OffloadKey, data: bytes) -> int | None:
        for version in sorted(self.cascaded.get(key, ())):
            if data == self.chunk_bytes(key, version):
                return version
        return None

    def chunk_bytes(self, key: OffloadKey, version: int) -> bytes:
        return b"".join(
            self.row(key, version, sub).numpy().tobytes() for sub in range(self.factor)
        )

    def settle_promotions(self) -> None:
        for key in list(self.promoting):
            if self.manager.is_promoting(key):
                continue
            self.promoting.discard(key)
            read_before_damage = key in self.read_before_damage
            self.read_before_damage.discard(key)
            if not self.manager.primary.lookup(key, CTX):
                continue  # failed (a damaged or evicted chunk): a miss
            assert key not in self.damaged or read_before_damage, (
                f"damaged chunk of {key!r} became a hit"
            )
            slot = self.manager.slot_of(key)
            assert slot is not None
            data = self.cpu[slot * self.factor:(slot + 1) * self.factor].numpy().tobytes()
            version = self.tier_version(key, data)
            assert version is not None, f"promotion of {key!r} delivered bytes never cascaded"
            self.model.ready[key] = version

    def settle_promotions_after_reset(self) -> None:
        super().settle_promotions_after_reset()
        self.read_before_damage.clear()

    def tier_dropped(self, keys: Iterable[OffloadKey]) -> None:
        self.damaged.difference_update(keys)

    # the memory tier's hand-run rules do not apply to a threaded tier
    tier_runs = None  # type: ignore[assignment]
    tier_fails = None  # type: ignore[assignment]
    tier_fails_a_promotion = None  # type: ignore[assignment]
    tier_evicts = None  # type: ignore[assignment]
    lookup_tier_only_keys = None  # type: ignore[assignment]

    def tier_only(self) -> list[OffloadKey]:
        stored = self.file_tier().stored_keys()
        return sorted(k for k in stored if k not in self.model.ready)

    @rule(picks=PICKS)
    def lookup_keys_on_disk(self, picks: list[int]) -> None:
        chain = pick(self.tier_only(), picks, 4)
        if chain:
            self.lookup([self.keys.index(k) for k in chain])

    @rule(tier_runs=st.booleans())
    def step_end(self, tier_runs: bool) -> None:
        self.manager.on_schedule_end()
        if tier_runs:
            self.tier.drain_jobs()
            self.manager.poll()
        self.settle_promotions()

    @rule(
        picks=st.lists(st.integers(0, NUM_HASHES - 1), min_size=1, max_size=4),
        first_fails=st.just("no"),
    )
    def lookup_until_promoted(self, picks: list[int], first_fails: str) -> None:
        for _ in range(3):
            self.lookup(picks)
            self.step_end(True)

    @rule(picks=st.lists(st.integers(0, NUM_HASHES - 1), min_size=1, max_size=4))
    def lookup(self, picks: list[int]) -> None:
        chain = list(dict.fromkeys(self.keys[h] for h in picks))
        pinned = self.pinned()
        found = self.manager.lookup_prefix(chain, CTX)
        self.forget_evicted(pinned)
        for key in chain:
            if self.manager.is_promoting(key):
                self.promoting.add(key)
        if found is not None:
            assert all(k in self.model.ready for k in chain[:found])
        assert self.manager.promotions_in_flight <= self.max_promotions

    @rule(picks=PICKS)
    def damage_a_chunk_file(self, picks: list[int]) -> None:
        """Flip bytes of a stored chunk's file (same length)."""
        self.tier.drain_jobs()  # not under a copy in progress
        # a chunk damaged once only: flipping the same byte again restores it
        stored = sorted(k for k in self.file_tier().stored_keys() if k not in self.damaged)
        for key in pick(stored, picks, 1):
            self.damage(key)

    @rule(picks=PICKS)
    def damage_a_chunk_only_the_tier_holds_and_ask_for_it(self, picks: list[int]) -> None:
        """A chunk the primary lost, damaged, then asked for until its
        promotion ends: its load must fail and the key never be a hit.
        (Left to chance, a damaged chunk's load failed once in 100
        examples.)"""
        self.tier.drain_jobs()
        for key in pick([k for k in self.tier_only() if k not in self.damaged], picks, 1):
            self.damage(key)
            self.lookup_until_promoted([self.keys.index(key)], "no")

    def damage(self, key: OffloadKey) -> None:
        """Flip a byte of ``key``'s chunk file. A promotion of ``key`` in
        flight has already read the file (the tier was drained): it may
        still land, with the intact bytes; only later loads see the damage.
        The key counts as damaged until the tier announces that it dropped
        it (a failed load removes the file): a later store writes it anew."""
        self.apply_events()  # removals announced before the damage
        path = self.file_tier().path_of(key)
        if path is None:
            return
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        path.write_bytes(bytes(raw))
        self.damaged.add(key)
        if key in self.promoting:
            self.read_before_damage.add(key)

    @rule(faults=st.lists(st.sampled_from(["full", "torn"]), min_size=1, max_size=3))
    def the_disk_fails_writes(self, faults: list[str]) -> None:
        """The next cascades' writes fail (see :class:`WriteFaults`): their
        keys stay unreadable in the tier, and a torn temp file never
        becomes a chunk."""
        with self.write_faults.lock:
            self.write_faults.armed = list(faults)

    def temp_files(self) -> list[str]:
        return [
            name
            for _, _, names in os.walk(self.directory)
            for name in names
            if name.endswith(TEMP_SUFFIX)
        ]

    @rule()
    def restart(self) -> None:
        self.quiesce()
        self.manager.reset_cache()
        self.settle_promotions_after_reset()
        self.manager.take_events()
        before = self.file_tier().stored_keys()
        self.manager.shutdown()
        self.tier = self.make_tier()
        assert self.file_tier().stored_keys() == before, "reopened tier lost chunks"
        assert not self.temp_files(), "a reopened tier left a torn write's temp file"
        self.manager = self.new_manager()
        self.model.ready.clear()
        self.announced.clear()
        self.tier_announced = set(before)

    @invariant()
    def every_tier_chunk_holds_the_bytes_cascaded_into_it(self) -> None:
        tier = self.file_tier()
        for key in tier.stored_keys():
            assert key in self.cascaded, f"{key!r} on disk, never cascaded"
            path = tier.path_of(key)
            if path is None or key in self.damaged:
                continue
            try:
                data = path.read_bytes()
            except FileNotFoundError:  # evicted meanwhile by a pool thread
                continue
            assert self.tier_version(key, data) is not None, f"file of {key!r}"

    @invariant()
    def events_describe_both_tiers(self) -> None:
        self.apply_events()
        assert self.announced == set(self.model.ready)
        if not self.tier.has_pending_work():
            self.apply_events()  # nothing runs: the tier's events are all in
            assert self.tier_announced == set(self.file_tier().stored_keys())

    def teardown(self) -> None:
        try:
            self.manager.shutdown()
        finally:
            self.write_faults.remove()
            super().teardown()
            shutil.rmtree(self.directory, ignore_errors=True)


FILE_SETTINGS = settings(SETTINGS, max_examples=25)


class FileTierWriteThrough(FileTierIntegrityMachine):
    pass


class FileTierWriteBack(FileTierIntegrityMachine):
    cascade = "write-back"
    max_promotions = 1


TestTieredIntegrityFileTier = FileTierWriteThrough.TestCase
TestTieredIntegrityFileTier.settings = FILE_SETTINGS
TestTieredIntegrityFileTierWriteBack = FileTierWriteBack.TestCase
TestTieredIntegrityFileTierWriteBack.settings = FILE_SETTINGS


class CudaFileTierWriteThrough(FileTierIntegrityMachine):
    """All three tiers with the GPU's blocks on CUDA: GPU blocks, pinned
    CPU slots, files."""

    device = "cuda"


TestTieredIntegrityFileTierCuda = pytest.mark.gpu(
    pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")(
        CudaFileTierWriteThrough.TestCase
    )
)
TestTieredIntegrityFileTierCuda.settings = FILE_SETTINGS


def test_a_chunk_damaged_after_its_promotion_read_it_lands_intact() -> None:
    """Regression, from the first run on a 16-CPU GPU machine: a promotion
    whose load had already read the chunk (the damage rule drains the tier
    first) landed after the file was damaged. That is right, since it
    delivered the bytes cascaded, and the machine had counted it as a
    damaged chunk becoming a hit. A later promotion of the key must fail."""
    state = FileTierWriteThrough()
    try:
        state.gpu_store(picks=[0], seed=0, fail="ok", collect_now=False)
        state.reset()
        key = state.keys[0]
        state.lookup([0])
        assert key in state.promoting
        state.step_end(tier_runs=False)
        state.tier.drain_jobs()  # the load has read the intact file
        state.damage(key)
        state.poll()
        state.every_ready_slot_holds_the_bytes_last_stored()
        state.events_describe_both_tiers()
        assert key in state.model.ready, "the promotion that read the intact chunk was lost"
        state.reset()
        for _ in range(3):
            state.lookup([0])
            state.step_end(tier_runs=True)
        assert key not in state.model.ready and not state.manager.primary.lookup(key, CTX)
    finally:
        state.teardown()


def test_a_damaged_chunk_dropped_and_stored_again_is_a_hit() -> None:
    """Regression, found while fixing the one above: a damaged chunk fails
    its load and the tier drops it (a removal event); a later cascade
    writes the key anew, and its promotion is a hit with the new bytes."""
    state = FileTierWriteThrough()
    try:
        state.gpu_store(picks=[0, 1], seed=0, fail="ok", collect_now=False)
        state.reset()
        key = state.keys[0]
        state.tier.drain_jobs()
        state.damage(key)
        state.lookup_until_promoted(picks=[0], first_fails="no")
        state.events_describe_both_tiers()
        assert key not in state.model.ready and key not in state.file_tier().stored_keys()
        assert key not in state.damaged, "the tier's removal event did not clear the damage"
        state.gpu_store(picks=[0], seed=1, fail="ok", collect_now=False)
        state.reset()
        state.events_describe_both_tiers()
        state.lookup_until_promoted(picks=[0], first_fails="no")
        state.every_ready_slot_holds_the_bytes_last_stored()
        assert key in state.model.ready, "the chunk stored anew was not promoted"
    finally:
        state.teardown()


@pytest.mark.parametrize("machine", [FileTierWriteThrough, FileTierWriteBack])
def test_the_machine_catches_a_tier_that_reports_a_damaged_load_as_carried(
    machine: type[FileTierIntegrityMachine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The machine's power, on a defect planted in the file tier: a load
    that failed its checksum is reported carried (its bytes, the damaged
    ones, left in the primary slot). Before the rules that fill the tier
    and ask for a damaged chunk, 100 examples missed it written back."""
    real = FileSystemTier._load_done

    def carried_anyway(self: FileSystemTier, entry: Any, item: Any, ok: bool) -> None:
        entry.ok.add(item.key)  # before the real call, which may finish the job
        real(self, entry, item, ok)

    monkeypatch.setattr(FileSystemTier, "_load_done", carried_anyway)
    planted = settings(
        FILE_SETTINGS, max_examples=200, phases=[Phase.generate], database=None,
        derandomize=True,
    )
    with pytest.raises(BaseException) as caught:  # noqa: PT011 - which one is checked below
        run_state_machine_as_test(machine, settings=planted)
    assert "became a hit" in _messages(caught.value), _messages(caught.value)


def _messages(error: BaseException) -> str:
    """An error's message and its causes' and sub-exceptions' (Hypothesis
    may group failures, or wrap one it could not replay)."""
    parts = [str(error)]
    parts += [_messages(sub) for sub in getattr(error, "exceptions", ())]
    for linked in (error.__cause__, error.__context__):
        if linked is not None:
            parts.append(_messages(linked))
    return "\n".join(parts)
