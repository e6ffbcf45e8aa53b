"""Canonical, block-level view of the GPU KV caches (as vLLM's ``kv_offload`` defines it).

The worker side never looks at attention layouts. It sees a list of unique
byte tensors, each with shape ``(num_blocks, page_size_bytes)`` and dtype
``int8`` (row ``i`` holds GPU block ``i``), and, per KV-cache group, which of
those tensors the group's layers use.

torch is imported only for type checking here, so this module loads without
it; :meth:`CanonicalKVCaches.validate` is the one place that inspects tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import attrs

from kvoffload.spec.errors import ConfigurationError

if TYPE_CHECKING:
    import torch


@attrs.frozen(eq=False)
class CanonicalKVCacheTensor:
    """One KV-cache tensor whose first dimension is the GPU block id.

    ``tensor`` has shape ``(num_blocks, page_size_bytes)`` and dtype int8;
    ``page_size_bytes`` is the (possibly padded) size of one block's row.
    """

    tensor: torch.Tensor
    page_size_bytes: int


@attrs.frozen
class CanonicalKVCacheRef:
    """A layer (or layers) of a KV-cache group: which tensor
    (``tensor_idx`` into :attr:`CanonicalKVCaches.tensors`) and the
    un-padded page size that layer uses."""

    tensor_idx: int
    page_size_bytes: int


def _tensor_tuple(
    tensors: Iterable[CanonicalKVCacheTensor],
) -> tuple[CanonicalKVCacheTensor, ...]:
    return tuple(tensors)


def _refs_tuple(
    groups: Iterable[Iterable[CanonicalKVCacheRef]],
) -> tuple[tuple[CanonicalKVCacheRef, ...], ...]:
    return tuple(tuple(refs) for refs in groups)


@attrs.frozen(eq=False)
class CanonicalKVCaches:
    """The unique KV tensors and, per KV-cache group, the references of the
    group's layers into them."""

    tensors: tuple[CanonicalKVCacheTensor, ...] = attrs.field(converter=_tensor_tuple)
    group_data_refs: tuple[tuple[CanonicalKVCacheRef, ...], ...] = attrs.field(
        converter=_refs_tuple
    )

    @classmethod
    def single_group(cls, tensors: Sequence[torch.Tensor]) -> CanonicalKVCaches:
        """Caches with one KV-cache group that uses every tensor in full;
        each tensor's page size is its row length."""
        canonical = [
            CanonicalKVCacheTensor(tensor, int(tensor.shape[-1])) for tensor in tensors
        ]
        refs = [
            CanonicalKVCacheRef(idx, item.page_size_bytes)
            for idx, item in enumerate(canonical)
        ]
        return cls(canonical, [refs])

    @property
    def num_groups(self) -> int:
        return len(self.group_data_refs)

    def tensors_of_group(self, group: int) -> tuple[int, ...]:
        """Indices of the tensors group ``group`` reads and writes, ascending."""
        return tuple(sorted({ref.tensor_idx for ref in self.group_data_refs[group]}))

    def validate(self) -> int:
        """Check the shapes and references; return the number of GPU blocks.

        Raises :class:`~kvoffload.spec.errors.ConfigurationError` if there is
        no tensor or no group, a tensor is not a 2-D int8 tensor of shape
        ``(num_blocks, page_size_bytes)``, tensors disagree on ``num_blocks``
        or device, a reference names a missing tensor or a page larger than
        the tensor's row, or a tensor is used by no group.
        """
        import torch

        if not self.tensors:
            raise ConfigurationError("CanonicalKVCaches has no tensors")
        if not self.group_data_refs:
            raise ConfigurationError("CanonicalKVCaches has no KV-cache groups")
        num_blocks: int | None = None
        device: torch.device | None = None
        for idx, item in enumerate(self.tensors):
            tensor = item.tensor
            if not isinstance(tensor, torch.Tensor):
                raise ConfigurationError(
                    f"tensor {idx} is a {type(tensor).__name__}, not a torch.Tensor"
                )
            if tensor.dtype != torch.int8:
                raise ConfigurationError(
                    f"tensor {idx} has dtype {tensor.dtype}; canonical KV tensors "
                    "are int8 byte views"
                )
            if tensor.dim() != 2 or int(tensor.shape[1]) != item.page_size_bytes:
                raise ConfigurationError(
                    f"tensor {idx} has shape {tuple(tensor.shape)}; expected "
                    f"(num_blocks, {item.page_size_bytes})"
                )
            if item.page_size_bytes <= 0:
                raise ConfigurationError(
                    f"tensor {idx} has page_size_bytes {item.page_size_bytes}"
                )
            if num_blocks is None:
                num_blocks, device = int(tensor.shape[0]), tensor.device
            elif int(tensor.shape[0]) != num_blocks:
                raise ConfigurationError(
                    f"tensor {idx} has {int(tensor.shape[0])} blocks; tensor 0 "
                    f"has {num_blocks}"
                )
            elif tensor.device != device:
                raise ConfigurationError(
                    f"tensor {idx} is on {tensor.device}; tensor 0 is on {device}"
                )
        used: set[int] = set()
        for group, refs in enumerate(self.group_data_refs):
            if not refs:
                raise ConfigurationError(f"KV-cache group {group} has no layers")
            for ref in refs:
                if not 0 <= ref.tensor_idx < len(self.tensors):
                    raise ConfigurationError(
                        f"group {group} refers to tensor {ref.tensor_idx}; there "
                        f"are {len(self.tensors)} tensors"
                    )
                row = self.tensors[ref.tensor_idx].page_size_bytes
                if not 0 < ref.page_size_bytes <= row:
                    raise ConfigurationError(
                        f"group {group} uses {ref.page_size_bytes} bytes per block "
                        f"of tensor {ref.tensor_idx}, whose rows are {row} bytes"
                    )
                used.add(ref.tensor_idx)
        unused = sorted(set(range(len(self.tensors))) - used)
        if unused:
            raise ConfigurationError(f"tensors {unused} are used by no KV-cache group")
        if num_blocks is None or num_blocks <= 0:
            raise ConfigurationError("the KV tensors hold no blocks")
        return num_blocks
