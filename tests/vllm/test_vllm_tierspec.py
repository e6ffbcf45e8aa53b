"""Opt-in: kvoffload's spec with secondary tiers inside vLLM 0.33
(``secondary_tiers``, as vLLM's ``TieringOffloadingSpec`` reads them), on a
real 0.33 release loaded with its stand-ins.

    KVOFFLOAD_VLLM_DIRS=/tmp/vllm PYTHONPATH=$PWD python -m pytest -q tests/vllm/test_vllm_tierspec.py

What runs: vLLM's own ``OffloadingSpecFactory.create_spec`` building
``KVOffloadingSpec`` with a tier (kvoffload's file tier, and vLLM's own file
tier named by ``type`` and ``module_path``); a scheduler-shaped sequence
through the manager and a worker over the shared region on CPU tensors:
chunks stored, cascaded to the tier, evicted from the CPU tier, looked up
(``HIT_PENDING`` until their promotion lands at a step's end, then ``HIT``),
loaded back with the bytes checked; bad tier configurations refused with
nothing left in the region's directory.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.vllm.test_vllm_face import (
    BLOCKS_PER_CHUNK,
    NUM_GPU_BLOCKS,
    PAGE_BYTES,
    Transfers,
    gpu_spec,
    keys_of,
    needs_033,
    offloading_config,
    single_tensor_worker,
    vllm,
)

pytestmark = needs_033
__all__ = ["vllm"]  # the module-scoped fixture, shared

CHUNKS = 4


def tiered_spec(tmp_path: Path, tier: dict[str, Any], **extra: Any) -> Any:
    """vLLM's factory building kvoffload's spec with ``tier`` behind a CPU
    tier of :data:`CHUNKS` chunks, its shared region under ``tmp_path``."""
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    from kvoffload.impl.worker.region import ChunkMajorLayout

    chunk = ChunkMajorLayout((PAGE_BYTES,), block_size_factor=BLOCKS_PER_CHUNK).chunk_bytes
    config = offloading_config({
        "spec_name": "KVOffloadingSpec",
        "spec_module_path": "kvoffload.vllm",
        "cpu_bytes_to_use": CHUNKS * chunk + chunk // 2,
        "shared_region_dir": str(tmp_path / "shm"),
        "secondary_tiers": [tier],
        **extra,
    })
    (tmp_path / "shm").mkdir(exist_ok=True)
    return OffloadingSpecFactory.create_spec(config)


TIERS = {
    "kvoffload-fs": lambda tmp: {"type": "fs", "directory": str(tmp / "tier"),
                                 "capacity_blocks": 16, "num_threads": 2},
    "vllm-fs": lambda tmp: {"type": "FileSystemTierManager",
                            "module_path": "vllm.v1.kv_offload.tiering.fs.manager",
                            "root_dir": str(tmp / "vtier"), "n_read_threads": 2,
                            "n_write_threads": 2},
}


@pytest.mark.parametrize("tier", sorted(TIERS))
def test_chunks_cascade_to_the_tier_and_load_back_through_the_face(
    vllm: Any, tmp_path: Path, tier: str
) -> None:
    torch = pytest.importorskip("torch")
    from vllm.v1.kv_offload.base import ReqContext, ScheduleEndContext

    from kvoffload.impl.tiered import TieredOffloadingManager
    from kvoffload.vllm import KVOffloadingManager, KVOffloadingSpec

    # the default bound (a quarter of the CPU tier) would promote one at a time
    spec = tiered_spec(tmp_path, TIERS[tier](tmp_path), tier_max_promotions_in_flight=CHUNKS)
    assert isinstance(spec, KVOffloadingSpec) and spec.num_chunks == CHUNKS
    manager = spec.get_manager()
    assert type(manager) is KVOffloadingManager  # the same face, the tiers behind it
    assert isinstance(manager.tiered, TieredOffloadingManager)
    assert manager.lock is manager.tiered.lock  # a real lock, not the core's
    gpu = torch.arange(NUM_GPU_BLOCKS * PAGE_BYTES, dtype=torch.int32).remainder(251)
    gpu = gpu.to(torch.int8).reshape(NUM_GPU_BLOCKS, PAGE_BYTES)
    worker = single_tensor_worker(spec, gpu)
    original = gpu.clone()
    run = Transfers(worker).run
    step = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())

    def store(keys: list[bytes], first_block: int, ctx: Any) -> None:
        with manager.lock:
            output = manager.prepare_store(keys, ctx)
        assert output is not None and output.keys_to_store == keys
        run(worker.submit_store, gpu_spec(first_block, len(keys)), output.store_spec)
        with manager.lock:
            manager.complete_store(keys, ctx)

    def step_until(done: Any) -> None:
        deadline = time.monotonic() + 30
        while True:
            with manager.lock:
                manager.on_schedule_end(step)
                if done():
                    return
            assert time.monotonic() < deadline
            time.sleep(0.002)

    first, second = keys_of("a", CHUNKS), keys_of("b", CHUNKS)
    ctx = ReqContext(req_id="r1")
    with manager.lock:
        manager.on_new_request(ctx)
    store(first, 0, ctx)
    with manager.lock:
        assert manager.has_pending_work()  # the cascades are in flight
    step_until(lambda: not manager.has_pending_work())
    store(second, CHUNKS * BLOCKS_PER_CHUNK, ctx)  # evicts the first chunks
    step_until(lambda: not manager.has_pending_work())
    with manager.lock:
        events = list(manager.take_events())
    media = {(e.medium.name, e.removed) for e in events}
    assert ("CPU", True) in media and ("CPU", False) in media
    if tier == "kvoffload-fs":
        assert ("STORAGE", False) in media  # the tier's own events
    # keys only the tier holds: RETRY while the tier looks (vLLM's fs tier
    # looks asynchronously), HIT_PENDING once their promotion starts, HIT
    # once a step's end took it
    answers: list[list[str]] = []

    def promoted() -> bool:
        answers.append([manager.lookup(k, ctx).name for k in first[:2]])
        return answers[-1] == ["HIT", "HIT"]

    step_until(promoted)
    assert ["HIT_PENDING", "HIT_PENDING"] in answers
    assert all(set(seen) <= {"RETRY", "HIT_PENDING", "HIT"} for seen in answers), answers
    with manager.lock:
        load = manager.prepare_load(first[:2], ctx)
    gpu[16:20].zero_()
    run(worker.submit_load, load, gpu_spec(16, 2), False)
    assert torch.equal(gpu[16:20], original[0:4])  # the bytes came back from the tier
    with manager.lock:
        manager.complete_load(first[:2], ctx)
        manager.on_request_finished(ctx)
    manager.shutdown()
    worker.shutdown()
    assert list((tmp_path / "shm").iterdir()) == []  # the region is gone


@pytest.mark.parametrize(
    ("tier", "extra", "message"),
    [
        ({"type": "memory", "capacity_blocks": 2}, {"store_threshold": 2}, "store_threshold"),
        ({"type": "fs", "capacity_blocks": 2}, {}, "directory"),
        ({"type": "memory", "capacity_blocks": 2, "medium": "MEMORY"}, {}, "medium"),
        ({"type": "nope"}, {}, "unknown tier type"),
        ({"type": "memory", "capacity_blocks": 2}, {"tier_poll_interval_s": 0.1}, "poll"),
    ],
)
def test_bad_tier_configurations_are_refused_and_leave_nothing(
    vllm: Any, tmp_path: Path, tier: dict[str, Any], extra: dict[str, Any], message: str
) -> None:
    from kvoffload.spec.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=message):
        tiered_spec(tmp_path, tier, **extra).get_manager()
    assert list((tmp_path / "shm").iterdir()) == []


def test_vllms_registered_tier_names_resolve_and_peer_tiers_are_refused(
    vllm: Any, tmp_path: Path
) -> None:
    from kvoffload.impl.tier_setup import ForeignTier
    from kvoffload.spec.errors import ConfigurationError

    spec = tiered_spec(tmp_path, {"type": "example"})
    manager = spec.get_manager()
    assert manager.tiered is not None
    (tier,) = manager.tiered.tiers
    assert isinstance(tier, ForeignTier) and type(tier.tier).__name__ == (
        "ExampleSecondaryTierManager")
    manager.shutdown()
    with pytest.raises(ConfigurationError, match="serves external requests"):
        tiered_spec(tmp_path, {"type": "PeerTier", "module_path": "tests.vllm.peer_tier_example"})
    assert list((tmp_path / "shm").iterdir()) == []
