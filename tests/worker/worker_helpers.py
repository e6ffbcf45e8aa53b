"""Shared builders for the worker-side tests: KV caches on a device, and
byte patterns that tell every (key, version, tensor, sub-block) apart."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from kvoffload.impl.worker.canonical import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
)

HAS_CUDA = torch.cuda.is_available()

def _on_cuda(device: str) -> object:
    return pytest.param(
        device,
        id=device,
        marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")],
    )


DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cpu-staged", id="cpu-staged"),
    _on_cuda("cuda"),
    _on_cuda("cuda-staged"),
]
"""Parametrize a ``device`` argument with these: CPU always (plain, and
through the CUDA path's staging, emulated), CUDA when present (with the
default, zero-copy where the driver maps the CPU tier, and staged)."""


def zero_copy_of(device: str) -> bool | None:
    """The handlers' ``zero_copy`` for a ``DEVICES`` value."""
    return False if device == "cuda-staged" else None


def torch_device(device: str) -> str:
    """The torch device of a ``DEVICES`` value."""
    return device.removesuffix("-staged")


def make_caches(
    device: str,
    num_blocks: int,
    row_bytes: Sequence[int],
    group_tensors: Sequence[Sequence[int]] | None = None,
    seed: int = 0,
) -> CanonicalKVCaches:
    """Random int8 tensors of shape (num_blocks, row) on ``device``; groups
    use the tensors listed in ``group_tensors`` (default: one group, all)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = [
        CanonicalKVCacheTensor(
            torch.randint(-128, 128, (num_blocks, row), dtype=torch.int8,
                          generator=generator).to(torch_device(device)),
            row,
        )
        for row in row_bytes
    ]
    if group_tensors is None:
        group_tensors = [list(range(len(row_bytes)))]
    refs = [
        [CanonicalKVCacheRef(idx, row_bytes[idx]) for idx in indices]
        for indices in group_tensors
    ]
    return CanonicalKVCaches(tensors, refs)


def pattern(row_bytes: int, *labels: int) -> torch.Tensor:
    """A row of ``row_bytes`` bytes determined by ``labels`` (distinct labels
    give different rows with overwhelming probability)."""
    digest = hashlib.blake2b(repr(labels).encode(), digest_size=8).digest()
    rng = np.random.default_rng(int.from_bytes(digest, "little"))
    return torch.from_numpy(rng.integers(-128, 128, row_bytes, dtype=np.int8))


def snapshot(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [tensor.detach().to("cpu", copy=True) for tensor in tensors]


def assert_unchanged(before: Sequence[torch.Tensor], tensors: Sequence[torch.Tensor]) -> None:
    for idx, (old, new) in enumerate(zip(before, tensors)):
        assert torch.equal(old, new.to("cpu")), f"tensor {idx} changed"
