"""The CPU tier as one chunk-major region (``cpu_region``): every chunk's
bytes, over all tensors and workers, are one contiguous row of the region,
laid out as :class:`ChunkMajorLayout` says; the handlers move the right
bytes through strided views of it; the region is shared by name between
processes' mappings. CPU tensors stand in for the GPU (plain and through
the CUDA path's staging, emulated); CUDA runs it too when present."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")

import numpy as np
import torch

from kvoffload.impl.specs import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.impl.worker.cpu_gpu import CpuGpuOffloadingHandlers
from kvoffload.impl.worker.region import ChunkMajorLayout, CpuRegion, SharedRegion, region_name
from kvoffload.impl.worker.spec import CPUOffloadingConfig, CPUOffloadingSpec
from kvoffload.spec.errors import ConfigurationError
from tests.worker.worker_helpers import DEVICES, make_caches, zero_copy_of

ROWS = (24, 40)
FACTOR = 2
CHUNKS = 5
GPU_BLOCKS = 16


def test_layout_pads_a_chunk_to_whole_pages_and_places_each_rank() -> None:
    layout = ChunkMajorLayout(ROWS, block_size_factor=FACTOR, world_size=3, alignment=256)
    assert layout.worker_row_bytes == 64
    # 3 ranks * 64 = 192 bytes a row; 2 rows a chunk must fill 256-byte units
    assert layout.row_stride == 256 and layout.chunk_bytes == 512
    assert layout.column_offsets(0) == (0, 24)
    assert layout.column_offsets(2) == (128, 152)
    assert ChunkMajorLayout((4096,), block_size_factor=16).chunk_bytes == 16 * 4096
    # an odd factor: rows are padded so that factor rows are whole pages
    odd = ChunkMajorLayout((100,), block_size_factor=3, alignment=64)
    assert odd.chunk_bytes % 64 == 0 and odd.row_stride >= 100
    with pytest.raises(ConfigurationError):
        layout.column_offsets(3)
    with pytest.raises(ConfigurationError):
        ChunkMajorLayout(())
    with pytest.raises(ConfigurationError):
        ChunkMajorLayout((24, 0))
    with pytest.raises(ConfigurationError):
        ChunkMajorLayout(ROWS, world_size=True)


def _region_handlers(
    device: str, buffer: object, layout: ChunkMajorLayout, rank: int = 0, seed: int = 0
) -> CpuGpuOffloadingHandlers:
    caches = make_caches(device, GPU_BLOCKS, layout.tensor_row_bytes, seed=seed)
    return CpuGpuOffloadingHandlers(
        caches, layout.block_size_factor, CHUNKS, direct_copy_min_bytes=24,
        emulate_staging=device == "cpu-staged", zero_copy=zero_copy_of(device),
        cpu_region=CpuRegion(buffer, layout, rank),
    )


def _run(handler: object, job_id: int, src: object, dst: object) -> None:
    from kvoffload.impl.worker.base import OffloadingHandler

    assert isinstance(handler, OffloadingHandler)
    assert handler.transfer_async(job_id, (src, dst))  # type: ignore[arg-type]
    handler.wait([job_id])
    assert [r.job_id for r in handler.get_finished() if r.success] == [job_id]


def _expected_chunk(
    handlers: CpuGpuOffloadingHandlers, layout: ChunkMajorLayout, gpu_blocks: list[int],
    rank: int, chunk_row: bytes,
) -> bytes:
    """``chunk_row`` with this rank's columns replaced by the GPU blocks'
    bytes, as the layout places them."""
    row = bytearray(chunk_row)
    for sub, block in enumerate(gpu_blocks):
        base = sub * layout.row_stride
        for offset, item in zip(layout.column_offsets(rank), handlers.kv_caches.tensors):
            data = item.tensor[block].cpu().numpy().tobytes()
            row[base + offset : base + offset + len(data)] = data
    return bytes(row)


@pytest.mark.parametrize("device", DEVICES)
def test_a_chunk_is_one_contiguous_row_of_every_tensor_and_loads_back(device: str) -> None:
    layout = ChunkMajorLayout(ROWS, block_size_factor=FACTOR, alignment=128)
    buffer = bytearray(layout.region_bytes(CHUNKS))
    handlers = _region_handlers(device, buffer, layout)
    view = np.frombuffer(buffer, dtype=np.uint8).reshape(CHUNKS, layout.chunk_bytes)
    # GPU blocks 3,4 -> chunk 2; 9,2 -> chunk 0 (scattered: batched rows)
    _run(handlers.gpu_to_cpu_handler, 1, GPULoadStoreSpec([3, 4, 9, 2], [4], [0]),
         CPULoadStoreSpec([2, 0]))
    for chunk, blocks in ((2, [3, 4]), (0, [9, 2])):
        expected = _expected_chunk(handlers, layout, blocks, 0, bytes(layout.chunk_bytes))
        assert view[chunk].tobytes() == expected
    assert not any(view[1].tobytes())  # untouched
    # a tier overwrites chunk 1 with chunk 2's bytes (as a promotion does)
    view[1] = view[2]
    before = [item.tensor.clone() for item in handlers.kv_caches.tensors]
    _run(handlers.cpu_to_gpu_handler, 2, CPULoadStoreSpec([1, 0]),
         GPULoadStoreSpec([12, 13, 0, 1], [4], [0]))
    for item, old in zip(handlers.kv_caches.tensors, before):
        assert torch.equal(item.tensor[[12, 13, 0, 1]].cpu(), old[[3, 4, 9, 2]].cpu())
        assert torch.equal(item.tensor[5:12].cpu(), old[5:12].cpu())
    assert handlers.cpu_tensors[0].stride() == (layout.row_stride, 1)
    with pytest.raises(ConfigurationError):
        handlers.cpu_block_view(0)
    handlers.release_region()


@pytest.mark.parametrize("device", ["cpu", "cpu-staged"])
def test_two_ranks_share_a_chunk_each_in_its_own_columns(device: str) -> None:
    layout = ChunkMajorLayout(ROWS, block_size_factor=FACTOR, world_size=2, alignment=64)
    buffer = bytearray(layout.region_bytes(CHUNKS))
    ranks = [_region_handlers(device, buffer, layout, rank, seed=rank) for rank in (0, 1)]
    for job, handlers in enumerate(ranks):
        _run(handlers.gpu_to_cpu_handler, job, GPULoadStoreSpec([6, 7], [2], [0]),
             CPULoadStoreSpec([4]))
    view = np.frombuffer(buffer, dtype=np.uint8).reshape(CHUNKS, layout.chunk_bytes)
    expected = bytes(layout.chunk_bytes)
    for rank, handlers in enumerate(ranks):
        expected = _expected_chunk(handlers, layout, [6, 7], rank, expected)
    assert view[4].tobytes() == expected  # both ranks' bytes, neither clobbered
    for handlers in ranks:
        old = [item.tensor[[6, 7]].clone() for item in handlers.kv_caches.tensors]
        _run(handlers.cpu_to_gpu_handler, 9, CPULoadStoreSpec([4]),
             GPULoadStoreSpec([0, 1], [2], [0]))
        for item, rows in zip(handlers.kv_caches.tensors, old):
            assert torch.equal(item.tensor[[0, 1]], rows)


def test_a_region_built_for_other_tensors_or_too_small_is_refused() -> None:
    layout = ChunkMajorLayout(ROWS, block_size_factor=FACTOR, alignment=64)
    caches = make_caches("cpu", GPU_BLOCKS, ROWS)
    with pytest.raises(ConfigurationError, match="need"):
        CpuGpuOffloadingHandlers(caches, FACTOR, CHUNKS, cpu_region=CpuRegion(
            bytearray(layout.region_bytes(CHUNKS) - 1), layout))
    with pytest.raises(ConfigurationError, match="layout"):
        CpuGpuOffloadingHandlers(caches, 1, CHUNKS, cpu_region=CpuRegion(
            bytearray(layout.region_bytes(CHUNKS)), layout))
    with pytest.raises(ConfigurationError, match="layout"):
        CpuGpuOffloadingHandlers(make_caches("cpu", GPU_BLOCKS, (24,)), FACTOR, CHUNKS,
                                 cpu_region=CpuRegion(bytearray(10_000), layout))
    with pytest.raises(ConfigurationError, match="writable"):
        CpuGpuOffloadingHandlers(caches, FACTOR, CHUNKS, cpu_region=CpuRegion(
            object(), layout))
    with pytest.raises(ConfigurationError, match="rank"):
        CpuRegion(bytearray(10), layout, rank=1)


def test_the_plain_layout_is_unchanged_without_a_region() -> None:
    spec = CPUOffloadingSpec(CPUOffloadingConfig(16, offloaded_block_size=32, num_cpu_blocks=3))
    handlers = spec.build_handlers(make_caches("cpu", 8, ROWS))
    assert all(t.is_contiguous() for t in handlers.cpu_tensors)
    assert [tuple(t.shape) for t in handlers.cpu_tensors] == [(6, 24), (6, 40)]
    assert handlers.cpu_region is None


def test_a_shared_region_is_mapped_by_name_and_removed_by_its_creator(tmp_path: Path) -> None:
    name = region_name("engine/0 x")
    assert name == "kvoffload_engine_0_x.mmap"
    size = 4 * mmap.PAGESIZE
    scheduler = SharedRegion(name, size, create=True, directory=tmp_path)
    with pytest.raises(ConfigurationError, match="exists"):
        SharedRegion(name, size, create=True, directory=tmp_path)
    with pytest.raises(ConfigurationError, match="bytes"):
        SharedRegion(name, size * 2, create=False, directory=tmp_path, timeout_s=0.05)
    with pytest.raises(ConfigurationError, match="bytes"):
        SharedRegion(name, size // 2, create=None, directory=tmp_path)
    with pytest.raises(ConfigurationError, match="does not exist"):
        SharedRegion("other.mmap", size, create=False, directory=tmp_path)
    worker = SharedRegion(name, size, create=None, directory=tmp_path)
    assert scheduler.creator and not worker.creator
    # a worker's write is what the scheduler's chunk rows show
    worker.buffer[mmap.PAGESIZE : mmap.PAGESIZE + 3] = b"abc"
    rows = scheduler.chunk_view(mmap.PAGESIZE)
    assert rows.shape == (4, mmap.PAGESIZE) and rows.strides == (mmap.PAGESIZE, 1)
    assert bytes(rows.cast("B")[mmap.PAGESIZE : mmap.PAGESIZE + 3]) == b"abc"
    with pytest.raises(ConfigurationError):
        scheduler.chunk_view(mmap.PAGESIZE * 3)
    rows.release()
    worker.cleanup()
    assert os.path.exists(tmp_path / name)  # a worker never removes it
    scheduler.cleanup()
    scheduler.cleanup()
    assert not os.path.exists(tmp_path / name)
    with pytest.raises(ConfigurationError, match="cleaned up"):
        scheduler.buffer  # noqa: B018
    assert list(tmp_path.iterdir()) == []


def test_handlers_over_a_shared_region_write_what_another_mapping_reads(
    tmp_path: Path,
) -> None:
    layout = ChunkMajorLayout(ROWS, block_size_factor=FACTOR)
    scheduler = SharedRegion("r.mmap", layout.region_bytes(CHUNKS), create=True,
                             directory=tmp_path)
    worker = SharedRegion("r.mmap", layout.region_bytes(CHUNKS), create=False,
                          directory=tmp_path)
    handlers = _region_handlers("cpu", worker.buffer, layout)
    _run(handlers.gpu_to_cpu_handler, 1, GPULoadStoreSpec([0, 1], [2], [0]),
         CPULoadStoreSpec([3]))
    rows = scheduler.chunk_view(layout.chunk_bytes)
    gpu = handlers.kv_caches.tensors[1].tensor
    got = np.asarray(rows).view(np.int8)[3]
    assert np.array_equal(got[24:64], gpu[0].numpy())
    assert np.array_equal(got[layout.row_stride + 24 : layout.row_stride + 64], gpu[1].numpy())
    del got, handlers
    rows.release()
    worker.cleanup()
    scheduler.cleanup()
    assert not (tmp_path / "r.mmap").exists()


def test_whichever_side_comes_first_creates_the_region(tmp_path: Path) -> None:
    # in vLLM the workers build their side before the scheduler exists
    size = mmap.PAGESIZE
    worker = SharedRegion("e.mmap", size, create=None, directory=tmp_path)
    scheduler = SharedRegion("e.mmap", size, create=None, directory=tmp_path)
    assert worker.creator and not scheduler.creator
    scheduler.buffer[:2] = b"hi"
    assert worker.buffer[:2] == b"hi"
    scheduler.cleanup()
    assert (tmp_path / "e.mmap").exists()
    worker.cleanup()
    assert not (tmp_path / "e.mmap").exists()
