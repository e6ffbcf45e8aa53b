"""CpuGpuOffloadingHandlers: bytes land where the specs say, results come in
submission order, and malformed transfers touch nothing. Runs on the CPU
always and on CUDA when present."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch

from kvoffload.impl.specs import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.impl.worker.base import TransferResult, TransferSpec
from kvoffload.impl.worker.cpu_gpu import CpuGpuOffloadingHandlers
from kvoffload.spec.errors import ConfigurationError, TransferError
from tests.worker.worker_helpers import (
    DEVICES,
    assert_unchanged,
    make_caches,
    snapshot,
    torch_device,
    zero_copy_of,
)

ROWS = (24, 40)

pytestmark = pytest.mark.parametrize("device", DEVICES)


def _handlers(device: str, *, factor: int = 2, cpu_blocks: int = 6, gpu_blocks: int = 16,
              direct: int = 64, groups: list[list[int]] | None = None,
              rows: tuple[int, ...] = ROWS) -> CpuGpuOffloadingHandlers:
    caches = make_caches(device, gpu_blocks, rows, groups)
    return CpuGpuOffloadingHandlers(caches, factor, cpu_blocks, direct_copy_min_bytes=direct,
                                    emulate_staging=device == "cpu-staged",
                                    zero_copy=zero_copy_of(device))


def _run(handler: object, job_id: int, spec: TransferSpec) -> TransferResult:
    from kvoffload.impl.worker.base import OffloadingHandler

    assert isinstance(handler, OffloadingHandler)
    assert handler.transfer_async(job_id, spec)
    handler.wait([job_id])
    results = handler.get_finished()
    assert [r.job_id for r in results] == [job_id]
    return results[0]


def _gpu(handlers: CpuGpuOffloadingHandlers) -> list[torch.Tensor]:
    return [item.tensor for item in handlers.kv_caches.tensors]


@pytest.mark.parametrize("direct", [0, 64, 1 << 30], ids=["all-direct", "mixed", "all-batched"])
def test_store_then_load_round_trips_bytes(device: str, direct: int) -> None:
    handlers = _handlers(device, direct=direct)
    gpu = _gpu(handlers)
    stored = [t[[3, 4, 9, 2, 10, 11]].cpu() for t in gpu]
    result = _run(handlers.gpu_to_cpu_handler, 1,
                  (GPULoadStoreSpec([3, 4, 9, 2, 10, 11]), CPULoadStoreSpec([5, 0, 1])))
    assert result.success and result.transfer_type == ("GPU", "CPU")
    assert result.transfer_size == 6 * sum(ROWS)
    assert result.transfer_time is not None and result.transfer_time >= 0
    for cpu, rows in zip(handlers.cpu_tensors, stored):
        assert torch.equal(cpu[10:12], rows[0:2])  # CPU block 5
        assert torch.equal(cpu[0:4], rows[2:6])    # CPU blocks 0, 1
    for t in gpu:
        t.zero_()
    result = _run(handlers.cpu_to_gpu_handler, 2,
                  (CPULoadStoreSpec([1, 5]), GPULoadStoreSpec([7, 6, 5, 4])))
    assert result.success and result.transfer_type == ("CPU", "GPU")
    for t, rows in zip(gpu, stored):
        assert torch.equal(t[[7, 6, 5, 4]].cpu(), torch.cat([rows[4:6], rows[0:2]]))
        assert not t[:4].any() and not t[8:].any()


def test_a_load_starts_part_way_into_the_first_offloaded_block(device: str) -> None:
    handlers = _handlers(device, factor=3)
    gpu = _gpu(handlers)
    for t in handlers.cpu_tensors:
        t.copy_(torch.arange(t.shape[0]).unsqueeze(1).expand_as(t).to(torch.int8))
    # Block indices 4..7 of a request: offloaded blocks 1 (rows 1, 2 of it)
    # and 2 (rows 0, 1 of it), stored in CPU slots 5 and 2.
    result = _run(handlers.cpu_to_gpu_handler, 1,
                  (CPULoadStoreSpec([5, 2]), GPULoadStoreSpec([0, 1, 2, 3], None, [4])))
    assert result.success
    for t in gpu:
        assert t[0:4, 0].tolist() == [16, 17, 6, 7]


def test_groups_touch_only_their_tensors(device: str) -> None:
    handlers = _handlers(device, factor=1, groups=[[0], [1]])
    gpu = _gpu(handlers)
    cpu_before = snapshot(handlers.cpu_tensors)
    result = _run(handlers.gpu_to_cpu_handler, 1,
                  (GPULoadStoreSpec([1, 2, 3], [2, 1]), CPULoadStoreSpec([0, 1, 4])))
    assert result.transfer_size == 2 * ROWS[0] + 1 * ROWS[1]
    cpu0, cpu1 = handlers.cpu_tensors
    assert torch.equal(cpu0[0:2], gpu[0][1:3].cpu())
    assert torch.equal(cpu1[4], gpu[1][3].cpu())
    # group 0's slots in tensor 1 and group 1's slot in tensor 0 untouched
    assert torch.equal(cpu1[0:2], cpu_before[1][0:2])
    assert torch.equal(cpu0[4], cpu_before[0][4])


def test_results_come_in_submission_order_and_once(device: str) -> None:
    handlers = _handlers(device, factor=1, cpu_blocks=12)
    store = handlers.gpu_to_cpu_handler
    for job in (7, 3, 5):
        assert store.transfer_async(job, (GPULoadStoreSpec([job]), CPULoadStoreSpec([job])))
    store.wait([3])
    finished = store.get_finished()
    store.wait([5, 7, 99])
    finished += store.get_finished()
    assert [r.job_id for r in finished] == [7, 3, 5]
    assert store.get_finished() == []


def test_a_job_id_in_flight_cannot_be_reused(device: str) -> None:
    handlers = _handlers(device, factor=1)
    store = handlers.gpu_to_cpu_handler
    assert store.transfer_async(1, (GPULoadStoreSpec([0]), CPULoadStoreSpec([0])))
    with pytest.raises(TransferError, match="already in flight"):
        store.transfer_async(1, (GPULoadStoreSpec([1]), CPULoadStoreSpec([1])))
    store.wait([1])
    assert [r.job_id for r in store.get_finished()] == [1]
    assert store.transfer_async(1, (GPULoadStoreSpec([1]), CPULoadStoreSpec([1])))


def test_shutdown_waits_then_refuses_submissions(device: str) -> None:
    handlers = _handlers(device, factor=1)
    store = handlers.gpu_to_cpu_handler
    assert store.transfer_async(1, (GPULoadStoreSpec([0]), CPULoadStoreSpec([0])))
    store.shutdown()
    assert [r.job_id for r in store.get_finished()] == [1]
    before = snapshot(handlers.cpu_tensors)
    with pytest.raises(TransferError, match="shut down"):
        store.transfer_async(2, (GPULoadStoreSpec([1]), CPULoadStoreSpec([1])))
    assert_unchanged(before, handlers.cpu_tensors)
    assert store.get_finished() == []


BAD_STORES = [
    pytest.param((CPULoadStoreSpec([0]), CPULoadStoreSpec([1])), "takes", id="wrong-source-medium"),
    pytest.param((CPULoadStoreSpec([0]), GPULoadStoreSpec([0, 1])), "takes", id="reversed"),
    pytest.param((GPULoadStoreSpec([0, 1]), CPULoadStoreSpec([0, 1])), "need 1 CPU", id="count"),
    pytest.param((GPULoadStoreSpec([0, 16]), CPULoadStoreSpec([0])), "GPU block id 16", id="gpu-range"),
    pytest.param((GPULoadStoreSpec([0, 1]), CPULoadStoreSpec([6])), "CPU block id 6", id="cpu-range"),
    pytest.param((GPULoadStoreSpec([0, 1, 2, 3]), CPULoadStoreSpec([2, 2])), "more than once", id="dup-dst"),
    pytest.param((GPULoadStoreSpec([1], None, [1]), CPULoadStoreSpec([0])), "whole offloaded", id="partial"),
    pytest.param((GPULoadStoreSpec([0, 1], [1, 1]), CPULoadStoreSpec([0])), "groups", id="groups"),
]


@pytest.mark.parametrize(("spec", "message"), BAD_STORES)
def test_malformed_stores_raise_and_write_nothing(
    device: str, spec: TransferSpec, message: str
) -> None:
    handlers = _handlers(device)
    before = snapshot(handlers.cpu_tensors + tuple(_gpu(handlers)))
    with pytest.raises(TransferError, match=message):
        handlers.gpu_to_cpu_handler.transfer_async(1, spec)
    assert handlers.gpu_to_cpu_handler.get_finished() == []
    assert_unchanged(before, handlers.cpu_tensors + tuple(_gpu(handlers)))


BAD_LOADS = [
    pytest.param((GPULoadStoreSpec([0]), CPULoadStoreSpec([1])), "takes", id="wrong-direction"),
    pytest.param((CPULoadStoreSpec([0]), GPULoadStoreSpec([0, 1, 2])), "need 2 CPU", id="count"),
    pytest.param((CPULoadStoreSpec([0, 1]), GPULoadStoreSpec([0], None, [1])), "need 1 CPU", id="skip-count"),
    pytest.param((CPULoadStoreSpec([0]), GPULoadStoreSpec([15, 16])), "GPU block id 16", id="gpu-range"),
    pytest.param((CPULoadStoreSpec([0]), GPULoadStoreSpec([3, 3])), "more than once", id="dup-dst"),
]


@pytest.mark.parametrize(("spec", "message"), BAD_LOADS)
def test_malformed_loads_raise_and_write_nothing(
    device: str, spec: TransferSpec, message: str
) -> None:
    handlers = _handlers(device)
    before = snapshot(handlers.cpu_tensors + tuple(_gpu(handlers)))
    with pytest.raises(TransferError, match=message):
        handlers.cpu_to_gpu_handler.transfer_async(1, spec)
    assert_unchanged(before, handlers.cpu_tensors + tuple(_gpu(handlers)))


def test_bad_construction_is_rejected(device: str) -> None:
    caches = make_caches(device, 4, (8,))
    for factor, blocks in ((0, 4), (2, 0), (True, 4)):
        with pytest.raises(ConfigurationError):
            CpuGpuOffloadingHandlers(caches, factor, blocks)
    with pytest.raises(ConfigurationError, match="direct_copy_min_bytes"):
        CpuGpuOffloadingHandlers(caches, 1, 4, direct_copy_min_bytes=-1)
    with pytest.raises(ConfigurationError, match="zero_copy"):
        CpuGpuOffloadingHandlers(caches, 1, 4, zero_copy=1)  # type: ignore[arg-type]
    if torch_device(device) == "cpu":
        with pytest.raises(ConfigurationError, match="zero_copy=True needs KV caches on CUDA"):
            CpuGpuOffloadingHandlers(caches, 1, 4, zero_copy=True)
    else:
        with pytest.raises(ConfigurationError, match="not pinned"):
            CpuGpuOffloadingHandlers(caches, 1, 4, zero_copy=True, pin_memory=False)


def test_cpu_tier_geometry(device: str) -> None:
    handlers = _handlers(device, factor=2, cpu_blocks=6)
    assert [tuple(t.shape) for t in handlers.cpu_tensors] == [(12, 24), (12, 40)]
    assert tuple(handlers.cpu_block_view(1).shape) == (6, 80)
    assert handlers.cpu_bytes == 12 * (24 + 40)
    assert handlers.pinned == (torch_device(device) == "cuda")
    # H100 with torch 2.11 (a lent machine, 2026-11-26) maps pinned memory;
    # a driver that does not would fail here, the handlers falling back.
    assert handlers.zero_copy == (device == "cuda")
    assert all(t.device.type == "cpu" for t in handlers.cpu_tensors)
