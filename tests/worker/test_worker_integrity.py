"""End-to-end byte integrity: a real manager and the real handlers, driven
together by a Hypothesis state machine.

GPU blocks are filled with a pattern unique to (key, version, tensor,
sub-block) before each store. Stores (some failing, some leaving garbage in
their slots), evictions, loads part-way into an offloaded block, waits and
resets interleave; after every step each ready key's CPU slot must hold
exactly the bytes last stored under that key, and every successful load must
deliver them. Runs on the CPU always, on CUDA when present.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from typing import ClassVar

import pytest

pytest.importorskip("torch")

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from kvoffload.impl.manager import OffloadingManagerCore
from kvoffload.impl.reuse import FilterReusedOffloadingManager
from kvoffload.impl.specs import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.impl.worker.base import OffloadingHandler, TransferResult, TransferSpec
from kvoffload.impl.worker.cpu_gpu import CpuGpuOffloadingHandlers
from kvoffload.impl.worker.spec import CPUOffloadingConfig, CPUOffloadingSpec
from kvoffload.impl.worker.worker import OffloadingWorker
from kvoffload.spec.contract import ReqContext
from kvoffload.spec.keys import OffloadKey, get_offload_group_idx, make_offload_key
from tests.worker.worker_helpers import HAS_CUDA, make_caches, pattern

CTX = ReqContext("integrity")
NUM_HASHES = 7
FAIL_MODES = st.sampled_from(["ok", "ok", "ok", "raise", "garbage"])


class FlakyHandler(OffloadingHandler):
    """Passes jobs through, except the one it is told to fail: ``raise``
    fails before anything is written; ``garbage`` scribbles over the
    destination CPU slots first, like a transfer that died half-way."""

    def __init__(self, inner: OffloadingHandler, handlers: CpuGpuOffloadingHandlers) -> None:
        self.inner = inner
        self.handlers = handlers
        self.fail_next = "ok"

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        mode, self.fail_next = self.fail_next, "ok"
        if mode == "raise":
            raise RuntimeError("injected transfer failure")
        if mode == "garbage":
            dst = spec[1]
            if isinstance(dst, CPULoadStoreSpec):
                factor = self.handlers.block_size_factor
                for cpu in self.handlers.cpu_tensors:
                    for block in dst.block_ids.tolist():
                        cpu[block * factor:(block + 1) * factor].fill_(0x5A)
            elif isinstance(dst, GPULoadStoreSpec):
                for item in self.handlers.kv_caches.tensors:
                    item.tensor[dst.block_ids.tolist()] = 0x5A
            return False
        return self.inner.transfer_async(job_id, spec)

    def get_finished(self) -> list[TransferResult]:
        return self.inner.get_finished()

    def wait(self, job_ids: Collection[int]) -> None:
        self.inner.wait(job_ids)


class IntegrityMachine(RuleBasedStateMachine):
    device: ClassVar[str] = "cpu"
    factor: ClassVar[int] = 2
    num_groups: ClassVar[int] = 1
    cpu_blocks: ClassVar[int] = 5
    gpu_blocks: ClassVar[int] = 40
    policy: ClassVar[str] = "lru"
    store_threshold: ClassVar[int] = 1
    direct_copy_min_bytes: ClassVar[int] = 48
    emulate_staging: ClassVar[bool] = False
    zero_copy: ClassVar[bool | None] = None

    def __init__(self) -> None:
        super().__init__()
        rows = (24, 40, 16) if self.num_groups == 2 else (24, 40)
        groups = [[0, 2], [1, 2]] if self.num_groups == 2 else None
        self.caches = make_caches(self.device, self.gpu_blocks, rows, groups)
        self.rows = rows
        self.group_tensors = [
            self.caches.tensors_of_group(g) for g in range(self.num_groups)
        ]
        spec = CPUOffloadingSpec(CPUOffloadingConfig(
            16, offloaded_block_size=16 * self.factor, num_cpu_blocks=self.cpu_blocks,
            cache_policy=self.policy, store_threshold=self.store_threshold,
            enable_events=True, direct_copy_min_bytes=self.direct_copy_min_bytes,
            zero_copy=self.zero_copy,
        ))
        self.manager = spec.get_manager()
        core = self.manager.backing if isinstance(
            self.manager, FilterReusedOffloadingManager) else self.manager
        assert isinstance(core, OffloadingManagerCore)
        self.core = core
        if self.emulate_staging:
            self.handlers = CpuGpuOffloadingHandlers(
                self.caches, self.factor, self.cpu_blocks,
                direct_copy_min_bytes=self.direct_copy_min_bytes, emulate_staging=True)
        else:
            self.handlers = spec.build_handlers(self.caches)
        store, load = self.handlers.gpu_to_cpu_handler, self.handlers.cpu_to_gpu_handler
        self.store_handler = FlakyHandler(store, self.handlers)
        self.load_handler = FlakyHandler(load, self.handlers)
        self.worker = OffloadingWorker()
        self.worker.register_handler(GPULoadStoreSpec, CPULoadStoreSpec, self.store_handler)
        self.worker.register_handler(CPULoadStoreSpec, GPULoadStoreSpec, self.load_handler)
        self.keys = [
            make_offload_key(bytes([h]) * 8, g)
            for g in range(self.num_groups) for h in range(NUM_HASHES)
        ]
        self.free_gpu = list(range(self.gpu_blocks))
        self.next_job = 0
        self.next_version = 0
        self.ready: dict[OffloadKey, int] = {}       # key -> version stored
        self.loading: dict[OffloadKey, int] = {}     # key -> loads in flight
        self.pending_store: dict[OffloadKey, int] = {}
        self.jobs: dict[int, tuple[str, list[OffloadKey], list[int], object]] = {}
        self.announced: set[OffloadKey] = set()
        self.loads_checked = 0

    # ------------------------------------------------------------ patterns

    def expected_row(self, key: OffloadKey, version: int, tensor: int, sub: int) -> torch.Tensor:
        return pattern(self.rows[tensor], self.keys.index(key), version, tensor, sub)

    def take_gpu(self, count: int, rnd: random.Random, contiguous: bool) -> list[int]:
        self.free_gpu.sort()
        if contiguous:
            for start in range(len(self.free_gpu) - count + 1):
                window = self.free_gpu[start:start + count]
                if window[-1] - window[0] == count - 1:
                    break
            else:
                window = rnd.sample(self.free_gpu, count)
        else:
            window = rnd.sample(self.free_gpu, count)
        for block in window:
            self.free_gpu.remove(block)
        return window

    def gpu_spec(self, blocks: list[int], keys: list[OffloadKey], per_key: list[int],
                 starts: list[int]) -> GPULoadStoreSpec:
        sizes = [0] * self.num_groups
        for key, count in zip(keys, per_key):
            sizes[get_offload_group_idx(key)] += count
        indices = [0] * self.num_groups
        for group, start in enumerate(starts):
            indices[group] = start
        return GPULoadStoreSpec(blocks, sizes, indices)

    # --------------------------------------------------------------- rules

    @initialize()
    def start(self) -> None:
        assert self.handlers.pinned == (self.device == "cuda")

    @rule(
        picks=st.lists(st.integers(0, NUM_HASHES - 1), min_size=1, max_size=4, unique=True),
        group_mask=st.integers(1, 3),
        rnd=st.randoms(use_true_random=False),
        contiguous=st.booleans(),
        fail=FAIL_MODES,
        collect_now=st.booleans(),
    )
    def store(self, picks: list[int], group_mask: int, rnd: random.Random,
              contiguous: bool, fail: str, collect_now: bool = True) -> None:
        groups = [g for g in range(self.num_groups) if group_mask >> g & 1] or [0]
        offered = [make_offload_key(bytes([h]) * 8, g) for g in groups for h in picks]
        if len(self.free_gpu) < len(offered) * self.factor:
            return
        if self.store_threshold > 1:
            self.manager.lookup_prefix(offered, CTX)
        out = self.manager.prepare_store(offered, CTX)
        if out is None:
            return
        for victim in out.evicted_keys:
            assert victim in self.ready and victim not in self.loading, victim
            del self.ready[victim]
        to_store = list(out.keys_to_store)
        assert set(to_store) <= set(offered)
        if not to_store:
            return
        blocks = self.take_gpu(len(to_store) * self.factor, rnd, contiguous)
        versions = []
        for position, key in enumerate(to_store):
            version = self.next_version
            self.next_version += 1
            versions.append(version)
            for tensor in self.group_tensors[get_offload_group_idx(key)]:
                gpu = self.caches.tensors[tensor].tensor
                for sub in range(self.factor):
                    block = blocks[position * self.factor + sub]
                    gpu[block].copy_(self.expected_row(key, version, tensor, sub))
            self.pending_store[key] = version
        spec = self.gpu_spec(blocks, to_store, [self.factor] * len(to_store), [])
        self.submit("store", to_store, blocks, versions, (spec, out.store_spec), fail)
        if collect_now:
            self.collect()

    @precondition(lambda self: bool(self.ready))
    @rule(
        data=st.data(),
        rnd=st.randoms(use_true_random=False),
        contiguous=st.booleans(),
        fail=FAIL_MODES,
    )
    def load(self, data: st.DataObject, rnd: random.Random, contiguous: bool,
             fail: str) -> None:
        candidates = sorted(self.ready, key=lambda k: (get_offload_group_idx(k), k))
        chosen = data.draw(st.lists(st.sampled_from(candidates), min_size=1,
                                    max_size=3, unique=True))
        keys = sorted(chosen, key=lambda k: (get_offload_group_idx(k), chosen.index(k)))
        # Per group: skip some sub-blocks of its first key and trim some of
        # its last, as a load of block indices not aligned to offloaded ones.
        per_key = [self.factor] * len(keys)
        starts: list[int] = [0] * self.num_groups
        rows: list[tuple[OffloadKey, int, int]] = []  # (key, version, sub)
        for group in range(self.num_groups):
            members = [i for i, k in enumerate(keys) if get_offload_group_idx(k) == group]
            if not members:
                continue
            total = len(members) * self.factor
            skip = data.draw(st.integers(0, self.factor - 1))
            trim = data.draw(st.integers(0, min(self.factor - 1, total - skip - 1)))
            starts[group] = data.draw(st.integers(0, 5)) * self.factor + skip
            per_key[members[0]] -= skip
            per_key[members[-1]] -= trim
            for n, i in enumerate(members):
                first = skip if n == 0 else 0
                last = self.factor - trim if n == len(members) - 1 else self.factor
                rows += [(keys[i], self.ready[keys[i]], sub) for sub in range(first, last)]
        if len(self.free_gpu) < len(rows):
            return
        cpu_spec = self.manager.prepare_load(keys, CTX)
        assert isinstance(cpu_spec, CPULoadStoreSpec)
        for key in keys:
            self.loading[key] = self.loading.get(key, 0) + 1
        blocks = self.take_gpu(len(rows), rnd, contiguous)
        for item in self.caches.tensors:
            item.tensor[blocks] = 0x33
        spec = self.gpu_spec(blocks, keys, per_key, starts)
        self.submit("load", keys, blocks, rows, (cpu_spec, spec), fail)

    @precondition(lambda self: bool(self.ready))
    @rule(
        data=st.data(),
        rnd=st.randoms(use_true_random=False),
        contiguous=st.booleans(),
    )
    def load_and_collect(self, data: st.DataObject, rnd: random.Random,
                         contiguous: bool) -> None:
        self.load(data, rnd, contiguous, "ok")
        self.collect()

    def submit(self, kind: str, keys: list[OffloadKey], blocks: list[int],
               payload: object, spec: TransferSpec, fail: str) -> None:
        job = self.next_job
        self.next_job += 1
        handler = self.store_handler if kind == "store" else self.load_handler
        handler.fail_next = fail
        accepted = self.worker.transfer_async(job, spec)
        assert accepted == (fail == "ok")
        self.jobs[job] = (kind, keys, blocks, payload)

    @rule()
    def collect(self) -> None:
        for result in self.worker.get_finished():
            self.finish(result)

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data())
    def wait_for_some(self, data: st.DataObject) -> None:
        jobs = data.draw(st.lists(st.sampled_from(sorted(self.jobs)), min_size=1))
        self.worker.wait(jobs)
        self.collect()

    def finish(self, result: TransferResult) -> None:
        kind, keys, blocks, payload = self.jobs.pop(result.job_id)
        if kind == "store":
            assert isinstance(payload, list)
            self.manager.complete_store(keys, CTX, success=result.success)
            for key, version in zip(keys, payload):
                del self.pending_store[key]
                if result.success:
                    self.ready[key] = version
        else:
            assert isinstance(payload, list)
            if result.success:
                for position, (key, version, sub) in enumerate(payload):
                    for tensor in self.group_tensors[get_offload_group_idx(key)]:
                        got = self.caches.tensors[tensor].tensor[blocks[position]].cpu()
                        want = self.expected_row(key, version, tensor, sub)
                        assert torch.equal(got, want), (
                            f"load of {key!r} v{version} sub-block {sub}, tensor "
                            f"{tensor}: wrong bytes in GPU block {blocks[position]}"
                        )
                self.loads_checked += 1
            self.manager.complete_load(keys, CTX)
            for key in keys:
                self.loading[key] -= 1
                if not self.loading[key]:
                    del self.loading[key]
        if result.success:
            assert result.transfer_size is not None and result.transfer_size > 0
        self.free_gpu += blocks

    @rule(keys=st.lists(st.integers(0, NUM_HASHES - 1), max_size=3))
    def touch(self, keys: list[int]) -> None:
        self.manager.touch([make_offload_key(bytes([h]) * 8, 0) for h in keys], CTX)

    @rule()
    def reset(self) -> None:
        self.worker.wait(list(self.jobs))
        self.collect()
        assert not self.jobs
        self.manager.reset_cache()
        self.ready.clear()

    # ----------------------------------------------------------- invariants

    @invariant()
    def manager_agrees_with_the_model(self) -> None:
        for key in self.keys:
            assert self.core.lookup(key, CTX) == (key in self.ready), key

    @invariant()
    def every_ready_slot_holds_the_bytes_stored_under_its_key(self) -> None:
        factor = self.factor
        for key, version in self.ready.items():
            slot = self.core.slot_of(key)
            assert slot is not None
            for tensor in self.group_tensors[get_offload_group_idx(key)]:
                cpu = self.handlers.cpu_tensors[tensor]
                for sub in range(factor):
                    assert torch.equal(
                        cpu[slot * factor + sub], self.expected_row(key, version, tensor, sub)
                    ), f"CPU slot {slot} of {key!r} v{version}, tensor {tensor}, sub {sub}"

    @invariant()
    def events_describe_the_ready_set(self) -> None:
        for event in self.manager.take_events():
            if event.removed:
                self.announced -= set(event.keys)
            else:
                self.announced |= set(event.keys)
        assert self.announced == set(self.ready)

    def teardown(self) -> None:
        self.worker.shutdown()


SETTINGS = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class SingleGroupLRU(IntegrityMachine):
    pass


class TwoGroupsARCReuseFilter(IntegrityMachine):
    factor = 3
    num_groups = 2
    cpu_blocks = 6
    policy = "arc"
    store_threshold = 2
    direct_copy_min_bytes = 0  # every run is one direct copy


class UnitBlocksAllBatched(IntegrityMachine):
    factor = 1
    cpu_blocks = 4
    direct_copy_min_bytes = 1 << 30  # every row goes through gather/scatter


class TwoGroupsStagedAsOnCuda(TwoGroupsARCReuseFilter):
    """The CUDA path's staging and deferred scatters, run on the host."""

    emulate_staging = True
    direct_copy_min_bytes = 48
    store_threshold = 1


TestIntegrityTwoGroupsStagedAsOnCuda = TwoGroupsStagedAsOnCuda.TestCase
TestIntegrityTwoGroupsStagedAsOnCuda.settings = SETTINGS
TestIntegritySingleGroupLRU = SingleGroupLRU.TestCase
TestIntegritySingleGroupLRU.settings = SETTINGS
TestIntegrityTwoGroupsARCReuseFilter = TwoGroupsARCReuseFilter.TestCase
TestIntegrityTwoGroupsARCReuseFilter.settings = SETTINGS
TestIntegrityUnitBlocksAllBatched = UnitBlocksAllBatched.TestCase
TestIntegrityUnitBlocksAllBatched.settings = SETTINGS


class CudaSingleGroup(IntegrityMachine):
    device = "cuda"


class CudaTwoGroups(TwoGroupsARCReuseFilter):
    device = "cuda"
    direct_copy_min_bytes = 48


class CudaTwoGroupsStaged(TwoGroupsARCReuseFilter):
    """Batched rows through pinned staging buffers, not zero-copy."""

    device = "cuda"
    direct_copy_min_bytes = 48
    zero_copy = False


_gpu = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]
TestIntegrityCudaSingleGroup = pytest.mark.gpu(
    pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")(CudaSingleGroup.TestCase)
)
TestIntegrityCudaSingleGroup.settings = SETTINGS
TestIntegrityCudaTwoGroups = pytest.mark.gpu(
    pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")(CudaTwoGroups.TestCase)
)
TestIntegrityCudaTwoGroups.settings = SETTINGS
TestIntegrityCudaTwoGroupsStaged = pytest.mark.gpu(
    pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")(CudaTwoGroupsStaged.TestCase)
)
TestIntegrityCudaTwoGroupsStaged.settings = SETTINGS


def test_a_scripted_round_trip_through_manager_and_worker() -> None:
    """The machine's loop spelled out once: store two keys, reload one
    part-way into its offloaded block, evict for a third whose transfer
    fails, reset."""
    caches = make_caches("cpu", 16, (8,))
    spec = CPUOffloadingSpec(CPUOffloadingConfig(
        16, offloaded_block_size=32, num_cpu_blocks=2, direct_copy_min_bytes=0))
    manager, worker = spec.get_manager(), spec.build_worker(caches)
    gpu = caches.tensors[0].tensor
    a, b, c = (make_offload_key(bytes([h]) * 4, 0) for h in b"abc")

    out = manager.prepare_store([a, b], CTX)
    assert out is not None and out.keys_to_store == (a, b)
    gpu[0:4] = torch.arange(4, dtype=torch.int8).unsqueeze(1)  # a: 0, 1; b: 2, 3
    assert worker.transfer_async(1, (GPULoadStoreSpec([0, 1, 2, 3]), out.store_spec))
    [stored] = worker.get_finished()
    manager.complete_store([a, b], CTX, success=stored.success)

    # No room for c while a and b are offered with it: they are protected.
    assert manager.prepare_store([c, a, b], CTX) is None

    # Load b's second half, then all of a, into fresh GPU blocks.
    load_spec = manager.prepare_load([b, a], CTX)
    gpu[8:11] = -1
    assert worker.transfer_async(2, (load_spec, GPULoadStoreSpec([8, 9, 10], None, [3])))
    [loaded] = worker.get_finished()
    manager.complete_load([b, a], CTX)
    assert loaded.success and gpu[8:11, 0].tolist() == [3, 0, 1]

    # c evicts one of a, b; a transfer that cannot run (no CPU -> CPU handler)
    # fails, and the failed store leaves c untracked.
    out = manager.prepare_store([c], CTX)
    assert out is not None and len(out.evicted_keys) == 1
    assert not worker.transfer_async(3, (CPULoadStoreSpec([0]), out.store_spec))
    [failed] = worker.get_finished()
    manager.complete_store([c], CTX, success=failed.success)
    assert not failed.success and not manager.lookup(c, CTX)

    manager.reset_cache()
    assert not manager.lookup(a, CTX) and not manager.lookup(b, CTX)
