"""CanonicalKVCaches.validate: malformed caches are rejected up front."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import torch

from kvoffload.impl.worker.canonical import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
)
from kvoffload.spec.errors import ConfigurationError


def _tensor(blocks: int, row: int, dtype: torch.dtype = torch.int8) -> CanonicalKVCacheTensor:
    return CanonicalKVCacheTensor(torch.zeros((blocks, row), dtype=dtype), row)


def test_single_group_uses_every_tensor() -> None:
    caches = CanonicalKVCaches.single_group(
        [torch.zeros((4, 8), dtype=torch.int8), torch.zeros((4, 16), dtype=torch.int8)]
    )
    assert caches.num_groups == 1
    assert caches.tensors_of_group(0) == (0, 1)
    assert caches.validate() == 4


def test_tensors_of_group_deduplicates() -> None:
    caches = CanonicalKVCaches(
        [_tensor(4, 8), _tensor(4, 8)],
        [[CanonicalKVCacheRef(1, 8), CanonicalKVCacheRef(1, 6)], [CanonicalKVCacheRef(0, 8)]],
    )
    assert caches.tensors_of_group(0) == (1,)
    assert caches.tensors_of_group(1) == (0,)
    assert caches.validate() == 4


@pytest.mark.parametrize(
    ("tensors", "groups", "message"),
    [
        ([], [[]], "no tensors"),
        ([_tensor(4, 8)], [], "no KV-cache groups"),
        ([_tensor(4, 8, torch.float16)], [[CanonicalKVCacheRef(0, 8)]], "dtype"),
        (
            [CanonicalKVCacheTensor(torch.zeros((4, 8), dtype=torch.int8), 16)],
            [[CanonicalKVCacheRef(0, 16)]],
            "shape",
        ),
        (
            [CanonicalKVCacheTensor(torch.zeros((4, 2, 4), dtype=torch.int8), 8)],
            [[CanonicalKVCacheRef(0, 8)]],
            "shape",
        ),
        ([_tensor(4, 8), _tensor(5, 8)], [[CanonicalKVCacheRef(0, 8), CanonicalKVCacheRef(1, 8)]], "5 blocks"),
        ([_tensor(4, 8)], [[CanonicalKVCacheRef(1, 8)]], "refers to tensor 1"),
        ([_tensor(4, 8)], [[CanonicalKVCacheRef(0, 9)]], "9 bytes"),
        ([_tensor(4, 8)], [[]], "no layers"),
        ([_tensor(4, 8), _tensor(4, 8)], [[CanonicalKVCacheRef(0, 8)]], r"tensors \[1\]"),
        ([_tensor(0, 8)], [[CanonicalKVCacheRef(0, 8)]], "no blocks"),
    ],
)
def test_validate_rejects(
    tensors: list[CanonicalKVCacheTensor],
    groups: list[list[CanonicalKVCacheRef]],
    message: str,
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        CanonicalKVCaches(tensors, groups).validate()
