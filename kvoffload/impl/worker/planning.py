"""Index arithmetic of CPU<->GPU transfers: pure numpy, no torch.

A GPU block is one row of a canonical tensor. An offloaded (CPU) block is
``block_size_factor`` consecutive GPU-sized rows of the matching CPU tensor:
CPU block ``b`` covers CPU rows ``b * factor .. b * factor + factor - 1``.
:func:`map_block_rows` turns a (GPU spec, CPU spec) pair into matching row
arrays, validating it; :func:`plan_row_copies` splits the rows into
contiguous runs (one copy each) and a batch of scattered rows (one gather
and one scatter for all of them).
"""

from __future__ import annotations

import attrs
import numpy as np
import numpy.typing as npt

from kvoffload.impl.specs import CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.spec.errors import TransferError

IntArray = npt.NDArray[np.int64]

_EMPTY: IntArray = np.zeros(0, dtype=np.int64)

DEFAULT_DIRECT_COPY_MIN_BYTES = 128 * 1024
"""On CUDA, runs of at least this many bytes are copied directly (one DMA
each); shorter ones are batched. Below about this size a copy's launch
overhead outweighs its transfer time over PCIe."""

ZERO_COPY_DIRECT_COPY_MIN_BYTES = 1024 * 1024
"""On CUDA with zero-copy (the CPU tier mapped into the GPU): runs of at
least this many bytes are one DMA each; shorter ones go to the gather and
scatter kernels. Measured on an H100 (PCIe, torch 2.11, 256 MiB per
transfer): scattered 256 KiB rows moved at 43 GB/s by kernels against
31 GB/s as one DMA per row; 2 MiB rows at 45-50 GB/s as DMAs against
43-48 by kernels (docs/PERFORMANCE.md)."""

HOST_DIRECT_COPY_MIN_BYTES = 32 * 1024
"""The same threshold when both sides are host memory: a batched row costs a
second memcpy, a direct one a few microseconds of call overhead."""


@attrs.frozen(eq=False)
class BlockRows:
    """Matching rows of one transfer: GPU row ``gpu_rows[i]`` pairs with CPU
    row ``cpu_rows[i]``; ``group_of_row[i]`` is its KV-cache group."""

    gpu_rows: IntArray
    cpu_rows: IntArray
    group_of_row: IntArray

    def __len__(self) -> int:
        return int(self.gpu_rows.shape[0])


def map_block_rows(
    gpu_spec: GPULoadStoreSpec,
    cpu_spec: CPULoadStoreSpec,
    *,
    block_size_factor: int,
    num_groups: int,
    num_gpu_blocks: int,
    num_cpu_blocks: int,
    to_cpu: bool,
) -> BlockRows:
    """Pair every GPU block of ``gpu_spec`` with its CPU row.

    Group ``g``'s GPU blocks start ``block_indices[g] % block_size_factor``
    rows into its first CPU block, so it needs
    ``ceil((skip + group_sizes[g]) / block_size_factor)`` CPU blocks (none for
    an empty group); the CPU ids are those counts laid end to end in group
    order. A store (``to_cpu``) must cover whole offloaded blocks: no skip and
    no partial last block, since a partly written slot would hold stale
    bytes.

    Raises :class:`TransferError` if the group count differs from
    ``num_groups``, an id is out of range, the CPU id count is wrong, a store
    is not block-aligned, or two blocks would be written to the same row.
    """
    factor = block_size_factor
    sizes = np.asarray(gpu_spec.group_sizes, dtype=np.int64)
    if sizes.shape[0] != num_groups:
        raise TransferError(
            f"GPU spec has {sizes.shape[0]} KV-cache groups; the KV caches have "
            f"{num_groups}"
        )
    gpu_ids = gpu_spec.block_ids
    cpu_ids = cpu_spec.block_ids
    _check_range(gpu_ids, num_gpu_blocks, "GPU")
    _check_range(cpu_ids, num_cpu_blocks, "CPU")
    skips = np.asarray(gpu_spec.block_indices, dtype=np.int64) % factor
    cpu_counts = np.where(sizes > 0, (skips + sizes + factor - 1) // factor, 0)
    expected = int(cpu_counts.sum())
    if expected != cpu_ids.shape[0]:
        raise TransferError(
            f"{gpu_ids.shape[0]} GPU blocks (groups {sizes.tolist()}, starting "
            f"{skips.tolist()} blocks into an offloaded block of {factor}) need "
            f"{expected} CPU blocks; the CPU spec names {cpu_ids.shape[0]}"
        )
    if to_cpu:
        ragged = (skips != 0) | ((sizes % factor) != 0)
        if bool(ragged.any()):
            group = int(np.flatnonzero(ragged)[0])
            raise TransferError(
                f"a store must fill whole offloaded blocks of {factor} GPU "
                f"blocks, but group {group} has {int(sizes[group])} blocks "
                f"starting at block index {gpu_spec.block_indices[group]}"
            )
    num_groups_arr = np.arange(sizes.shape[0], dtype=np.int64)
    group_of_row = np.repeat(num_groups_arr, sizes)
    gpu_starts = np.cumsum(sizes) - sizes
    cpu_starts = np.cumsum(cpu_counts) - cpu_counts
    within_group = np.arange(gpu_ids.shape[0], dtype=np.int64) - gpu_starts[group_of_row]
    sub_block = skips[group_of_row] + within_group
    cpu_blocks = cpu_ids[cpu_starts[group_of_row] + sub_block // factor]
    cpu_rows = cpu_blocks * factor + sub_block % factor
    gpu_rows = gpu_ids.astype(np.int64, copy=True)
    destination = cpu_rows if to_cpu else gpu_rows
    limit = num_cpu_blocks * factor if to_cpu else num_gpu_blocks
    if _has_repeats(destination, limit):
        raise TransferError(
            f"the {'CPU' if to_cpu else 'GPU'} destination names a block more "
            "than once"
        )
    return BlockRows(gpu_rows, cpu_rows, group_of_row)


def _has_repeats(rows: IntArray, limit: int) -> bool:
    """Whether ``rows`` (each in ``[0, limit)``) names a row twice. A mask
    over the range where it is small next to the rows (``np.unique`` hashes
    or sorts: 4 ms for 16 K rows, most of a large transfer's planning),
    a sort otherwise."""
    count = int(rows.shape[0])
    if count < 2:
        return False
    if limit <= 64 * count:
        seen = np.zeros(limit, dtype=np.bool_)
        seen[rows] = True
        return int(np.count_nonzero(seen)) != count
    ordered = np.sort(rows)
    return bool((ordered[1:] == ordered[:-1]).any())


def _check_range(ids: IntArray, num_blocks: int, medium: str) -> None:
    if ids.shape[0] == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= num_blocks:
        bad = low if low < 0 else high
        raise TransferError(
            f"{medium} block id {bad} is outside [0, {num_blocks})"
        )


@attrs.frozen(eq=False)
class RowCopyPlan:
    """How to copy ``src`` rows to ``dst`` rows: each direct run ``i`` copies
    ``run_lengths[i]`` rows from ``run_src[i]`` to ``run_dst[i]`` in one
    copy; the scattered rows ``gather_src[j] -> gather_dst[j]`` go in one
    batched gather/scatter."""

    run_src: IntArray
    run_dst: IntArray
    run_lengths: IntArray
    gather_src: IntArray
    gather_dst: IntArray

    @property
    def num_rows(self) -> int:
        return int(self.run_lengths.sum()) + int(self.gather_src.shape[0])


def plan_row_copies(
    src_rows: IntArray, dst_rows: IntArray, *, row_bytes: int, direct_min_bytes: int
) -> RowCopyPlan:
    """Split ``src_rows[i] -> dst_rows[i]`` into maximal runs where both sides
    advance by one row. A run of at least ``direct_min_bytes`` bytes becomes
    one direct copy; the rows of shorter runs are batched (in their order)."""
    count = int(src_rows.shape[0])
    if count == 0:
        return RowCopyPlan(_EMPTY, _EMPTY, _EMPTY, _EMPTY, _EMPTY)
    breaks = np.flatnonzero((np.diff(src_rows) != 1) | (np.diff(dst_rows) != 1)) + 1
    starts = np.concatenate(([0], breaks)).astype(np.int64)
    lengths = np.diff(np.concatenate((starts, [count]))).astype(np.int64)
    direct = lengths * row_bytes >= direct_min_bytes
    batched = np.repeat(~direct, lengths)
    return RowCopyPlan(
        run_src=src_rows[starts[direct]],
        run_dst=dst_rows[starts[direct]],
        run_lengths=lengths[direct],
        gather_src=src_rows[batched],
        gather_dst=dst_rows[batched],
    )
