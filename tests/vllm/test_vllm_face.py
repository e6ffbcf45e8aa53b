"""Opt-in: kvoffload inside vLLM 0.33 (``kvoffload.vllm``), on a real 0.33
release loaded with its stand-ins (:mod:`kvoffload.vllm_release`).

Set ``KVOFFLOAD_VLLM_DIRS`` as for ``test_vllm_releases.py``; only releases
of the 0.33 generation are used. Without it every test here is skipped.

    KVOFFLOAD_VLLM_DIRS=/tmp/vllm PYTHONPATH=$PWD python -m pytest -q tests/vllm

What runs: vLLM's own ``OffloadingSpecFactory.create_spec`` loading
``spec_module_path="kvoffload.vllm"``; ``isinstance`` against vLLM's ABCs;
a scheduler-shaped sequence through the manager and the worker with the
bytes checked (CPU tensors: no GPU needed); zero capacity side by side with
vLLM's manager; the kit's audit of the face under ``vllm-0.33``, illegal
calls included, in several seeds.
"""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from kvoffload.vllm_release import Generation, load_release, unload_release
from tests.vllm.test_vllm_releases import DIRS, REPO, version_of

FACE_DIRS = [d for d in DIRS if version_of(d) >= (0, 33)]
needs_033 = pytest.mark.skipif(
    not FACE_DIRS, reason="set KVOFFLOAD_VLLM_DIRS to a vLLM 0.33 release to test the face"
)
pytestmark = needs_033

PAGE_BYTES = 64
"""Bytes of one GPU block over all KV tensors (one worker)."""
BLOCKS_PER_CHUNK = 2
NUM_GPU_BLOCKS = 24


@pytest.fixture(scope="module")
def vllm() -> Iterator[Any]:
    """The 0.33 release, loaded for this module; unloaded (with
    ``kvoffload.vllm``, bound to it) afterwards."""
    if not FACE_DIRS:
        pytest.skip("no 0.33 release")
    release = load_release(FACE_DIRS[0])
    assert release.generation is Generation.V0_33
    yield release
    sys.modules.pop("kvoffload.vllm", None)
    unload_release()


def offloading_config(extra_config: dict[str, Any], events: bool = True) -> Any:
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig,
        OffloadingConfig,
        OffloadingGroupConfig,
        OffloadingModelConfig,
        OffloadingParallelConfig,
    )

    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("layer0",), group_id=0),),
        worker_kv_bytes_per_block=PAGE_BYTES,
        enable_kv_cache_events=events,
        extra_config=extra_config,
        engine_id="engine0",
        model=OffloadingModelConfig(name="test-model", dtype="int8", max_model_len=256),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=BLOCKS_PER_CHUNK),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )


def chunk_bytes() -> int:
    """vLLM's chunk size: one worker's blocks of a chunk, rounded up to a page."""
    raw = PAGE_BYTES * BLOCKS_PER_CHUNK
    return -(raw // -mmap.PAGESIZE) * mmap.PAGESIZE


def face_spec(vllm: Any, num_chunks: int, **extra: Any) -> Any:
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    config = offloading_config(
        {
            "spec_name": "KVOffloadingSpec",
            "spec_module_path": "kvoffload.vllm",
            "cpu_bytes_to_use": num_chunks * chunk_bytes() + chunk_bytes() // 2,
            **extra,
        }
    )
    return OffloadingSpecFactory.create_spec(config)


def keys_of(prefix: str, count: int) -> list[bytes]:
    from vllm.v1.kv_offload.base import make_offload_key

    return [make_offload_key(f"{prefix}{i}".encode(), 0) for i in range(count)]


def test_vllm_factory_loads_the_spec_by_module_path(vllm: Any) -> None:
    from vllm.v1.kv_offload.base import OffloadingManager, OffloadingSpec

    from kvoffload.vllm import KVOffloadingManager, KVOffloadingSpec

    spec = face_spec(vllm, 8, eviction_policy="arc", store_threshold=2, max_tracker_size=100)
    assert isinstance(spec, KVOffloadingSpec) and isinstance(spec, OffloadingSpec)
    assert spec.num_chunks == 8
    manager = spec.get_manager()
    assert isinstance(manager, OffloadingManager)
    assert isinstance(manager, KVOffloadingManager)
    assert manager is spec.get_manager()
    assert manager.core.cache_policy == "arc"
    assert manager.filter is not None and manager.filter.max_tracker_size == 100
    (info,) = manager.config_info()
    assert info["cpu_num_chunks"] == 8
    assert set(info) == set(KVOffloadingSpec.config_info_keys({}))
    metrics = KVOffloadingSpec.build_metric_definitions({"store_threshold": 2})
    assert "vllm:kv_offload_stores_skipped" in metrics


def test_the_spec_needs_cpu_bytes_to_use(vllm: Any) -> None:
    from kvoffload.spec.errors import ConfigurationError
    from kvoffload.vllm import KVOffloadingSpec

    with pytest.raises(ConfigurationError):
        KVOffloadingSpec(offloading_config({}))


def test_zero_chunks_refuse_every_store_as_vllm_does(vllm: Any) -> None:
    from vllm.v1.kv_offload.base import ReqContext

    spec = face_spec(vllm, 0)
    assert spec.num_chunks == 0
    ours = spec.get_manager()
    theirs = vllm.new_manager(0, "lru")
    for manager in (ours, theirs):
        ctx = ReqContext(req_id="r")
        manager.on_new_request(ctx)
        assert manager.prepare_store(keys_of("k", 2), ctx) is None
        empty = manager.prepare_store([], ctx)
        assert empty is not None and list(empty.keys_to_store) == []
        assert manager.lookup(keys_of("k", 1)[0], ctx).name == "MISS"
    assert ours.get_stats().gauges["vllm:kv_offload_cpu_cache_usage_perc"] == 0.0


def single_tensor_worker(spec: Any, gpu: Any) -> Any:
    """``spec``'s worker over one canonical KV tensor, ``gpu`` (one row of
    :data:`PAGE_BYTES` per GPU block)."""
    from vllm.v1.kv_offload.base import (
        CanonicalKVCacheRef,
        CanonicalKVCaches,
        CanonicalKVCacheTensor,
    )

    return spec.get_worker(CanonicalKVCaches(
        tensors=[CanonicalKVCacheTensor(tensor=gpu, page_size_bytes=PAGE_BYTES)],
        group_data_refs=[[CanonicalKVCacheRef(tensor_idx=0, page_size_bytes=PAGE_BYTES)]],
    ))


def gpu_spec(first_block: int, chunks: int) -> Any:
    """vLLM's spec of the GPU blocks of ``chunks`` chunks from ``first_block``."""
    from vllm.v1.kv_offload.base import GPULoadStoreSpec

    blocks = list(range(first_block, first_block + chunks * BLOCKS_PER_CHUNK))
    return GPULoadStoreSpec(blocks, group_sizes=[len(blocks)], block_indices=[0])


class Transfers:
    """Runs a worker's transfers one at a time, each with a new job id,
    and checks that each finished and succeeded."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self._next_id = 1

    def run(self, submit: Any, *args: Any) -> None:
        job = self._next_id
        self._next_id += 1
        assert submit(job, *args)
        self.worker.wait({job})
        (result,) = self.worker.get_finished()
        assert result.job_id == job and result.success


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not _cuda(), reason="no GPU"))],
)
def test_a_scheduler_sequence_through_manager_and_worker(vllm: Any, device: str) -> None:
    torch = pytest.importorskip("torch")
    from vllm.v1.kv_offload.base import OffloadingWorker, ReqContext, ScheduleEndContext

    spec = face_spec(vllm, 8)
    manager = spec.get_manager()
    gpu = torch.zeros((NUM_GPU_BLOCKS, PAGE_BYTES), dtype=torch.int8, device=device)
    worker = single_tensor_worker(spec, gpu)
    assert isinstance(worker, OffloadingWorker)
    for block in range(NUM_GPU_BLOCKS):
        gpu[block].fill_(block + 1)  # a pattern per GPU block
    prompt = keys_of("p", 4)
    run = Transfers(worker).run

    # request 1: a miss at once; store the whole prompt (GPU blocks 0..7)
    first = ReqContext(req_id="r1")
    with manager.lock:
        manager.on_new_request(first)
        assert manager.lookup(prompt[0], first).name == "MISS"
        stored = manager.prepare_store(prompt, first)
    assert stored is not None and stored.keys_to_store == prompt
    run(worker.submit_store, gpu_spec(0, 4), stored.store_spec)
    with manager.lock:
        assert manager.lookup(prompt[0], first).name == "HIT_PENDING"
        manager.complete_store(prompt, first)
        manager.on_request_finished(first)
        manager.on_schedule_end(ScheduleEndContext(new_req_ids=("r1",), preempted_req_ids=()))
        events = list(manager.take_events())
    assert [(e.keys, e.removed, e.medium.name) for e in events] == [(prompt, False, "CPU")]

    # request 2: the prompt and two new chunks; lookup to the first miss
    second = ReqContext(req_id="r2")
    longer = prompt + keys_of("q", 2)
    with manager.lock:
        manager.on_new_request(second)
        hits = 0
        while hits < len(longer) and manager.lookup(longer[hits], second).name == "HIT":
            assert manager.get_load_source(longer[hits], second).name == "HOST"
            hits += 1
        assert hits == 4
        load_spec = manager.prepare_load(longer[:hits], second)
    expected = gpu[0:8].clone()
    gpu[8:16].zero_()
    run(worker.submit_load, load_spec, gpu_spec(8, 4), True)
    assert torch.equal(gpu[8:16], expected)  # the bytes came back
    with manager.lock:
        manager.complete_load(longer[:hits], second)
        rest = manager.prepare_store(longer[hits:], second)
    assert rest is not None and rest.keys_to_store == longer[hits:]
    run(worker.submit_store, gpu_spec(16, 2), rest.store_spec)
    with manager.lock:
        manager.complete_store(longer[hits:], second)
        manager.on_request_finished(second)
        manager.on_schedule_end(ScheduleEndContext(new_req_ids=("r2",), preempted_req_ids=()))
        stats = manager.get_stats()
    assert stats.histograms["vllm:kv_offload_cpu_allocation_size"] == [4, 2]
    assert stats.gauges["vllm:kv_offload_cpu_cache_usage_perc"] == 0.0

    # reset: no event (the engine publishes its own), then every key misses
    with manager.lock:
        manager.take_events()
        manager.reset_cache()
        assert list(manager.take_events()) == []
        manager.on_reset_flushed()
        assert all(manager.lookup(k, second).name == "MISS" for k in longer)
        assert not manager.has_pending_work()
    manager.shutdown()
    worker.shutdown()


def test_illegal_calls_raise_typed_errors_and_change_nothing(vllm: Any) -> None:
    """Where vLLM 0.33's manager asserts after pinning (docs/FINDINGS.md F3)."""
    from vllm.v1.kv_offload.base import ReqContext

    from kvoffload.spec.errors import IllegalTransitionError

    manager = face_spec(vllm, 4).get_manager()
    ctx = ReqContext(req_id="r")
    ready, absent = keys_of("k", 2)
    output = manager.prepare_store([ready], ctx)
    manager.complete_store(output.keys_to_store, ctx)
    with pytest.raises(IllegalTransitionError):
        manager.prepare_load([ready, absent], ctx)
    assert manager.stats().loading == 0  # ready was not pinned


def audit(target: str, seed: int, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), KVOFFLOAD_VLLM_DIR=str(FACE_DIRS[0]))
    return subprocess.run(
        [
            sys.executable, "-m", "kvoffload", "audit",
            "--target", f"kvoffload.stateful.vllm_face:{target}",
            "--profile", "vllm-0.33", "--examples", "100", "--seed", str(seed), *extra,
        ],
        capture_output=True, text=True, env=env, cwd=REPO, check=False, timeout=300,
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(
    ("target", "extra"),
    [
        ("lru", ("--policy", "lru")),
        ("arc", ("--policy", "arc")),
        ("filter_lru", ("--policy", "lru", "--reuse-threshold", "2", "--tracker-size", "2")),
    ],
    ids=["lru", "arc", "filter"],
)
def test_the_kit_passes_the_face_with_illegal_calls(
    target: str, extra: tuple[str, ...], seed: int
) -> None:
    done = audit(target, seed, *extra)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS" in done.stdout


def test_the_face_module_is_not_imported_by_kvoffload() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import sys, kvoffload; print('vllm' in sys.modules, "
         "'kvoffload.vllm' in sys.modules)"],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
        cwd=REPO, check=False, timeout=120,
    )
    assert done.stdout.split() == ["False", "False"], done.stderr



def test_threads_sharing_the_face_under_its_lock(vllm: Any) -> None:
    """The scheduler's rule (every call under ``manager.lock``) with three
    threads on one face: afterwards no slot is shared or leaked and nothing
    is left in flight."""
    import random
    import threading

    from vllm.v1.kv_offload.base import ReqContext

    manager = face_spec(vllm, 8, eviction_policy="arc").get_manager()
    every_key = keys_of("s", 16)
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        rng = random.Random(index)
        try:
            for round_ in range(150):
                ctx = ReqContext(req_id=f"t{index}-{round_}")
                start = rng.randrange(0, 10)
                prompt = every_key[start : start + rng.randrange(1, 6)]
                with manager.lock:
                    manager.on_new_request(ctx)
                    hits = 0
                    while hits < len(prompt) and manager.lookup(prompt[hits], ctx).name == "HIT":
                        hits += 1
                    if hits:
                        manager.prepare_load(prompt[:hits], ctx)
                    output = manager.prepare_store(prompt[hits:], ctx)
                with manager.lock:
                    if hits:
                        manager.complete_load(prompt[:hits], ctx)
                    if output is not None:
                        manager.complete_store(output.keys_to_store, ctx)
                    manager.on_request_finished(ctx)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    stats = manager.stats()
    assert (stats.pending, stats.loading) == (0, 0)
    slots = [manager.core.slot_of(k) for k in every_key if manager.core.slot_of(k) is not None]
    assert len(set(slots)) == len(slots) == stats.ready
    assert stats.free + stats.ready == 8
    assert manager.core.open_requests() == 0
