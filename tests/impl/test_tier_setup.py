"""Secondary tiers from configuration (``kvoffload.impl.tier_setup``), end
to end without vLLM: the keys vLLM 0.33's tiering spec reads, checked
before anything is built; the tiers built over the shared, chunk-major CPU
region; chunks stored from the "GPU" (CPU tensors) into the region by the
worker, cascaded by the tiered manager into the tier, evicted from the CPU
tier, looked up (HIT_PENDING until their promotion lands at a step's end,
then HIT) and loaded back to the GPU with their bytes intact."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

from kvoffload.impl.manager import CPUOffloadingManager
from kvoffload.impl.specs import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.impl.tier_setup import (
    ForeignTier,
    TierSettings,
    build_tiered_manager,
    open_tiers,
    tier_settings,
)
from kvoffload.impl.tiered import TieredOffloadingManager
from kvoffload.impl.worker.region import ChunkMajorLayout, CpuRegion, SharedRegion
from kvoffload.impl.worker.spec import CPUOffloadingConfig, CPUOffloadingSpec
from kvoffload.impl.worker.worker import OffloadingWorker
from kvoffload.spec.contract import LookupResult, ReqContext
from kvoffload.spec.errors import ConfigurationError
from kvoffload.spec.keys import OffloadKey, make_offload_key
from tests.impl import foreign_tier_example
from tests.worker.worker_helpers import make_caches

ROWS = (24, 40)  # bytes per GPU block of each canonical tensor
FACTOR = 2  # GPU blocks per chunk
CPU_CHUNKS = 4
GPU_BLOCKS = 32
LAYOUT = ChunkMajorLayout(ROWS, block_size_factor=FACTOR)
FOREIGN = {"type": "DictTier", "module_path": "tests.impl.foreign_tier_example"}


def test_the_settings_read_vllms_keys_and_kvoffloads_own() -> None:
    assert tier_settings({}) is None
    assert tier_settings({"secondary_tiers": []}) is None
    settings = tier_settings({
        "secondary_tiers": [
            {"type": "fs", "directory": "/x", "capacity_bytes": 1 << 20, "num_threads": 2},
            {"type": "memory", "capacity_blocks": 3},
            {**FOREIGN, "label": "t"},
        ],
        "tier_cascade": "write-back",
        "tier_max_promotions_in_flight": 5,
        "tier_poll_interval_s": 0,
    })
    assert settings is not None
    assert [(t[0], t[1]) for t in settings.tiers] == [
        ("fs", None), ("memory", None), ("DictTier", foreign_tier_example.DictTier)]
    assert settings.tiers[2][2] == {"label": "t"}  # type and module_path are not parameters
    assert (settings.cascade, settings.max_promotions_in_flight) == ("write-back", 5)
    # an engine's registry resolves a name it knows
    resolved = tier_settings({"secondary_tiers": [{"type": "example"}]},
                             resolve={"example": dict}.get)
    assert resolved is not None and resolved.tiers[0][1] is dict


@pytest.mark.parametrize(
    ("extra_config", "message"),
    [
        ({"secondary_tiers": {"type": "fs"}}, "must be a list"),
        ({"secondary_tiers": ["fs"]}, "must be a dict"),
        ({"secondary_tiers": [{"directory": "d"}]}, "needs a 'type'"),
        ({"secondary_tiers": [{"type": "tape"}]}, "unknown tier type 'tape'"),
        ({"secondary_tiers": [{"type": "fs", "capacity_blocks": 4}]}, "needs a 'directory'"),
        ({"secondary_tiers": [{"type": "fs", "directory": "d"}]}, "exactly one of"),
        ({"secondary_tiers": [{"type": "memory", "capacity_blocks": 2, "capacity_bytes": 9}]},
         "exactly one of"),
        ({"secondary_tiers": [{"type": "memory", "capacity_blocks": 2, "colour": 1}]},
         r"unknown parameters \['colour'\]"),
        ({"secondary_tiers": [{"type": "Nope", "module_path": "tests.impl.no_such"}]},
         "cannot load"),
        ({"secondary_tiers": [{"type": "Nope", "module_path": "tests.impl.foreign_tier_example"}]},
         "cannot load"),
        ({"secondary_tiers": [{"type": "memory", "capacity_blocks": 2}], "tier_cascade": "later"},
         "tier_cascade"),
        ({"secondary_tiers": [{"type": "memory", "capacity_blocks": 2}],
          "tier_max_promotions_in_flight": 0}, "tier_max_promotions_in_flight"),
        ({"secondary_tiers": [{"type": "memory", "capacity_blocks": 2}],
          "tier_poll_interval_s": 0.01}, "no tier-poll thread"),
        ({"secondary_tiers": [{"type": "memory", "capacity_blocks": 2, "backpressure": {}}]},
         "back-pressure"),
        ({"tier_cascade": "write-back"}, "lists no tier"),
    ],
)
def test_a_bad_configuration_is_refused_before_anything_is_built(
    extra_config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        tier_settings(extra_config)


def _settings(*tiers: dict[str, Any], **options: Any) -> TierSettings:
    settings = tier_settings({"secondary_tiers": list(tiers), **options})
    assert settings is not None
    return settings


def test_a_tier_that_fails_to_build_releases_the_others_and_the_region(tmp_path: Path) -> None:
    foreign_tier_example.INSTANCES.clear()
    settings = _settings(
        {"type": "memory", "capacity_blocks": 2},
        FOREIGN,
        {"type": "broken_tier", "module_path": "tests.impl.foreign_tier_example"},
    )
    with pytest.raises(ConfigurationError, match="the device is gone"):
        open_tiers(settings, LAYOUT, CPU_CHUNKS, "r.mmap", directory=tmp_path)
    (built,) = foreign_tier_example.INSTANCES
    assert built.closed
    assert list(tmp_path.iterdir()) == []  # the region's file is gone
    # a capacity the chunk size leaves empty fails the same way
    with pytest.raises(ConfigurationError, match="at least one chunk"):
        open_tiers(_settings({"type": "memory", "capacity_bytes": LAYOUT.chunk_bytes - 1}),
                   LAYOUT, CPU_CHUNKS, "r.mmap", directory=tmp_path)
    assert list(tmp_path.iterdir()) == []


class Engine:
    """What the spec builds on both sides, over one shared region: the
    scheduler's tiered manager over the CPU manager core, and a worker
    whose CPU tier is the region (mapped separately, as a worker process
    maps it)."""

    def __init__(self, settings: TierSettings, directory: Path, **tier_options: Any) -> None:
        self.caches = make_caches("cpu", GPU_BLOCKS, ROWS, seed=7)
        self.region, tiers = open_tiers(
            settings, LAYOUT, CPU_CHUNKS, "engine.mmap", directory=directory,
            enable_events=True, **tier_options,
        )
        self.tiers = tiers
        core = CPUOffloadingManager(1, CPU_CHUNKS, "lru", enable_events=True)
        self.manager: TieredOffloadingManager = build_tiered_manager(core, tiers, settings)
        self.worker_region = SharedRegion("engine.mmap", LAYOUT.region_bytes(CPU_CHUNKS),
                                          create=None, directory=directory)
        spec = CPUOffloadingSpec(
            CPUOffloadingConfig(16, offloaded_block_size=16 * FACTOR, num_cpu_blocks=CPU_CHUNKS),
            cpu_region=CpuRegion(self.worker_region.buffer, LAYOUT),
        )
        self.worker: OffloadingWorker = spec.build_worker(self.caches)
        self.jobs = 0

    def gpu(self, block: int) -> list[torch.Tensor]:
        return [item.tensor[block].clone() for item in self.caches.tensors]

    def transfer(self, src: Any, dst: Any) -> None:
        self.jobs += 1
        assert self.worker.transfer_async(self.jobs, (src, dst))
        self.worker.wait([self.jobs])
        assert [(r.job_id, r.success) for r in self.worker.get_finished()] == [(self.jobs, True)]

    def store(self, keys: list[OffloadKey], first_block: int, ctx: ReqContext) -> None:
        with self.manager.lock:
            output = self.manager.prepare_store(keys, ctx)
        assert output is not None and list(output.keys_to_store) == keys
        blocks = list(range(first_block, first_block + FACTOR * len(keys)))
        self.transfer(GPULoadStoreSpec(blocks, [len(blocks)], [0]), output.store_spec)
        with self.manager.lock:
            self.manager.complete_store(keys, ctx)

    def step_until(self, done: Any, what: str) -> None:
        """Steps (``on_schedule_end``: the tier's results come in there,
        as vLLM steps while ``has_pending_work``) until ``done()``."""
        deadline = time.monotonic() + 20
        while True:
            with self.manager.lock:
                self.manager.on_schedule_end()
                if done():
                    return
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.002)

    def close(self) -> None:
        self.manager.shutdown()
        self.worker.shutdown()
        self.worker_region.cleanup()
        self.region.cleanup()


TIER_CONFIGS: dict[str, Callable[[Path], dict[str, Any]]] = {
    "fs": lambda tmp: {"type": "fs", "directory": str(tmp / "tier"), "capacity_blocks": 16,
                       "num_threads": 2},
    "memory": lambda tmp: {"type": "memory", "capacity_bytes": 16 * LAYOUT.chunk_bytes},
    "foreign": lambda tmp: FOREIGN,
}


@pytest.mark.parametrize("tier", sorted(TIER_CONFIGS))
@pytest.mark.parametrize("cascade", ["write-through", "write-back"])
def test_chunks_go_down_to_the_tier_and_come_back_to_the_gpu(
    tmp_path: Path, tier: str, cascade: str
) -> None:
    settings = _settings(TIER_CONFIGS[tier](tmp_path), tier_cascade=cascade,
                         tier_max_promotions_in_flight=CPU_CHUNKS)
    foreign_contexts: list[ReqContext] = []

    def context_of(ours: ReqContext) -> ReqContext:
        foreign_contexts.append(ours)
        return ours

    engine = Engine(settings, tmp_path, medium_of={"fs": "STORAGE", "memory": "STORAGE"},
                    make_job=lambda job: foreign_tier_example.Job(
                        job.job_id, list(job.keys), list(job.chunk_ids), job.is_promotion,
                        getattr(job, "req_context", None)),
                    context_of=context_of)
    try:
        if tier == "foreign":
            assert isinstance(engine.tiers[0], ForeignTier)
        first = [make_offload_key(b"first-%d" % i, 0) for i in range(CPU_CHUNKS)]
        second = [make_offload_key(b"second-%d" % i, 0) for i in range(CPU_CHUNKS)]
        ctx = ReqContext("r1")
        with engine.manager.lock:
            engine.manager.on_new_request(ctx)
        originals = {block: engine.gpu(block) for block in range(GPU_BLOCKS)}
        engine.store(first, 0, ctx)  # GPU blocks 0..7 -> CPU chunks
        with engine.manager.lock:
            assert engine.manager.has_pending_work()
        engine.step_until(lambda: not engine.manager.has_pending_work(), "the cascades")
        assert sum(engine.manager.stats.cascades_done) == CPU_CHUNKS
        # the second request's chunks evict the first ones from the CPU tier
        engine.store(second, 8, ctx)
        engine.step_until(lambda: not engine.manager.has_pending_work(), "the cascades")
        with engine.manager.lock:
            events = engine.manager.take_events()
            assert engine.manager.lookup_result(second[0], ctx) is LookupResult.HIT
            assert engine.manager.primary.phase(first[0]).kind.name == "ABSENT"
            # a key only the tier holds: its promotion starts, HIT_PENDING
            answers = [engine.manager.lookup_result(key, ctx) for key in first[:2]]
        assert answers == [LookupResult.HIT_PENDING] * 2
        stored_in_tier = {k for e in events if e.medium == "STORAGE" and not e.removed
                          for k in e.keys}
        assert set(first) <= stored_in_tier  # the tier's events, in its medium
        assert {k for e in events if e.medium == "CPU" and e.removed for k in e.keys} >= set(first)

        def promoted() -> bool:
            return all(engine.manager.lookup_result(k, ctx) is LookupResult.HIT
                       for k in first[:2])

        engine.step_until(promoted, "the promotions")  # polled at each step's end
        with engine.manager.lock:
            load = engine.manager.prepare_load(first[:2], ctx)
        assert isinstance(load, CPULoadStoreSpec)
        for block in range(16, 20):
            for item in engine.caches.tensors:
                item.tensor[block].zero_()
        engine.transfer(load, GPULoadStoreSpec(list(range(16, 20)), [4], [0]))
        with engine.manager.lock:
            engine.manager.complete_load(first[:2], ctx)
            engine.manager.on_request_finished(ctx)
        for offset in range(4):  # the bytes of GPU blocks 0..3, back in 16..19
            for got, want in zip(engine.gpu(16 + offset), originals[offset]):
                assert torch.equal(got, want)
        if tier == "foreign":
            assert foreign_contexts and all(c.req_id == "r1" for c in foreign_contexts)
    finally:
        engine.close()
    if tier == "foreign":
        assert foreign_tier_example.INSTANCES[-1].closed
    assert not (tmp_path / "engine.mmap").exists()


def test_every_option_of_the_file_tier_can_be_configured() -> None:
    """``secondary_tiers`` takes each option ``FileSystemTier`` has (the
    ones the manager sets itself aside), so a new option cannot be left
    out of the configuration."""
    import inspect

    from kvoffload.impl.fs_tier import FileSystemTier
    from kvoffload.impl.tier_setup import BUILT_IN_TIERS

    set_by_caller = {"capacity_blocks", "primary_kv_view", "enable_events", "block_size"}
    options = set(inspect.signature(FileSystemTier).parameters) - set_by_caller
    assert options == BUILT_IN_TIERS["fs"]
