"""GPULoadStoreSpec and the canonical KV caches: construction and
validation."""

from __future__ import annotations

import numpy as np
import pytest

from kvoffload.impl.specs import BlockIDsLoadStoreSpec, CPULoadStoreSpec, GPULoadStoreSpec
from kvoffload.spec.errors import OffloadingError, TransferError


def test_gpu_spec_defaults_to_one_aligned_group() -> None:
    spec = GPULoadStoreSpec([4, 5, 6])
    assert spec.medium() == "GPU"
    assert spec.block_ids.dtype == np.int64
    assert spec.group_sizes == (3,)
    assert spec.block_indices == (0,)
    assert isinstance(spec, BlockIDsLoadStoreSpec)


def test_gpu_spec_keeps_groups_and_indices() -> None:
    spec = GPULoadStoreSpec(np.array([1, 2, 3]), group_sizes=[1, 2], block_indices=[3, 0])
    assert spec.group_sizes == (1, 2)
    assert spec.block_indices == (3, 0)
    assert spec == GPULoadStoreSpec([1, 2, 3], (1, 2), (3, 0))
    assert spec != GPULoadStoreSpec([1, 2, 3], (1, 2), (2, 0))
    assert spec != CPULoadStoreSpec([1, 2, 3])
    assert "block_indices=[3, 0]" in repr(spec)


def test_empty_gpu_spec_is_legal() -> None:
    spec = GPULoadStoreSpec([], group_sizes=[0, 0], block_indices=[0, 0])
    assert len(spec) == 0


@pytest.mark.parametrize(
    ("ids", "sizes", "indices", "message"),
    [
        ([1, 2, 3], [1, 1], None, "sum to 2"),
        ([1, 2], [2], [0, 0], "block_indices has 2 entries"),
        ([1, 2], [3, -1], None, "non-negative"),
        ([1, 2], [2], [-1], "non-negative"),
        ([-1, 2], None, None, "non-negative"),
        ([1, 2], [2.0], None, "integers"),
        ([1, 2], [True, 1], None, "integers"),
    ],
)
def test_gpu_spec_rejects_inconsistent_groups(
    ids: list[int], sizes: list[object] | None, indices: list[int] | None, message: str
) -> None:
    with pytest.raises(TransferError, match=message) as info:
        GPULoadStoreSpec(ids, sizes, indices)  # type: ignore[arg-type]
    assert isinstance(info.value, OffloadingError)


def test_cpu_spec_is_unchanged() -> None:
    spec = CPULoadStoreSpec([3, 1])
    assert spec.medium() == "CPU"
    assert spec.block_ids.tolist() == [3, 1]
