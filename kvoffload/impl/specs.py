"""Load/store specs that name blocks by slot (block id)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from mypy_extensions import mypyc_attr

from kvoffload.spec.contract import LoadStoreSpec
from kvoffload.spec.errors import TransferError

_MAX_BLOCK_ID = (1 << 63) - 1
_INT_ONLY = frozenset({int})


def block_id_array(block_ids: object) -> npt.NDArray[np.int64]:
    """``block_ids`` as a one-dimensional int64 array.

    Raises :class:`TransferError` unless ``block_ids`` is a flat iterable of
    ``int`` (numpy integers included; never ``bool``, ``float``, ``str`` or a
    nested sequence) or an integer numpy array of one dimension, each id in
    ``[0, 2**63 - 1]``. Nothing is coerced: a spec names exactly the blocks
    it was given.
    """
    if isinstance(block_ids, np.ndarray):
        if block_ids.ndim != 1 or block_ids.dtype.kind not in ("i", "u"):
            raise TransferError(
                f"block ids must be a 1-D integer array, got {block_ids.ndim}-D "
                f"{block_ids.dtype}"
            )
        if block_ids.size and (
            int(block_ids.min()) < 0 or int(block_ids.max()) > _MAX_BLOCK_ID
        ):
            raise TransferError(
                f"block ids must be non-negative and below 2**63, got {block_ids.tolist()!r}"
            )
        return block_ids.astype(np.int64, copy=False)
    if isinstance(block_ids, (str, bytes)):
        raise TransferError(f"block ids must be ints, got {block_ids!r}")
    try:
        listed: list[Any] = list(cast(Iterable[Any], block_ids))
    except TypeError:
        raise TransferError(f"block ids must be an iterable of ints, got {block_ids!r}") from None
    if listed:
        if not set(map(type, listed)) <= _INT_ONLY:
            for value in listed:
                if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                    raise TransferError(f"block ids must be ints, got {value!r}")
            listed = [int(value) for value in listed]
        if min(listed) < 0 or max(listed) > _MAX_BLOCK_ID:
            raise TransferError(f"block ids must be non-negative and below 2**63, got {listed!r}")
    return np.array(listed, dtype=np.int64)


@mypyc_attr(allow_interpreted_subclasses=True)
class BlockIDsLoadStoreSpec(LoadStoreSpec):
    """Blocks given by their ids (slots) in a medium, as an int64 array.

    Raises :class:`TransferError` for malformed ids (:func:`block_id_array`).
    ``checked=False`` skips that check, for ids a backend made itself (a
    ``list`` of slot numbers, each an ``int`` in ``[0, 2**63 - 1]``, handed
    over: the spec keeps it): the spec of every ``prepare_load`` and
    ``prepare_store``, where the check cost more than building the array.
    Such a spec builds its array on the first read of :attr:`block_ids`, so
    a caller that only wants the ids as a list (:meth:`id_list`, e.g. a face
    building another library's spec from them) never pays for one.
    """

    __slots__ = ("_array", "_ids")

    def __init__(
        self, block_ids: Iterable[int] | npt.NDArray[Any], *, checked: bool = True
    ) -> None:
        self._ids: list[int] | None = None
        self._array: npt.NDArray[np.int64] | None = None
        if checked:
            self._array = block_id_array(block_ids)
        else:
            self._ids = cast(list[int], block_ids)

    @property
    def block_ids(self) -> npt.NDArray[np.int64]:
        """The ids, a one-dimensional int64 array (built once, when first read)."""
        array = self._array
        if array is None:
            array = self._array = np.array(self._ids, dtype=np.int64)
        return array

    def id_list(self) -> list[int]:
        """The ids as a new list of ``int``."""
        ids = self._ids
        if ids is not None:
            return list(ids)
        return cast(list[int], self.block_ids.tolist())

    @staticmethod
    def medium() -> str:
        return "BLOCK_IDS"

    def __len__(self) -> int:
        ids = self._ids
        return len(ids) if ids is not None else int(self.block_ids.shape[0])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockIDsLoadStoreSpec):
            return NotImplemented
        return self.medium() == other.medium() and bool(
            np.array_equal(self.block_ids, other.block_ids)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.block_ids.tolist()!r})"


@mypyc_attr(allow_interpreted_subclasses=True)
class CPULoadStoreSpec(BlockIDsLoadStoreSpec):
    """Slots of the CPU block pool."""

    __slots__ = ()

    @staticmethod
    def medium() -> str:
        return "CPU"


@mypyc_attr(allow_interpreted_subclasses=True)
class GPULoadStoreSpec(BlockIDsLoadStoreSpec):
    """Blocks of the GPU KV cache, grouped by KV-cache group.

    ``block_ids`` are ordered by group: the first ``group_sizes[0]`` ids
    belong to group 0, the next ``group_sizes[1]`` to group 1, and so on, so
    ``sum(group_sizes) == len(block_ids)``. ``group_sizes=None`` means one
    group holding every id.

    ``block_indices[g]`` is the logical index (within its request) of the
    first block of group ``g``; a worker uses it to start part-way into the
    first offloaded block when an offloaded block spans several GPU blocks.
    ``block_indices=None`` means every group starts on an offloaded-block
    boundary (all zeros). ``len(block_indices) == len(group_sizes)``.

    Raises :class:`~kvoffload.spec.errors.TransferError` if a block id is
    malformed (see :func:`block_id_array`), a group size or block index is negative, the group sizes do not
    sum to the number of ids, or the two per-group sequences differ in length.
    """

    __slots__ = ("block_indices", "group_sizes")

    def __init__(
        self,
        block_ids: Iterable[int] | npt.NDArray[Any],
        group_sizes: Sequence[int] | None = None,
        block_indices: Sequence[int] | None = None,
    ) -> None:
        super().__init__(block_ids)
        num_ids = len(self)
        sizes = (num_ids,) if group_sizes is None else _as_int_tuple(group_sizes, "group_sizes")
        if any(size < 0 for size in sizes):
            raise TransferError(f"group_sizes must be non-negative, got {list(sizes)}")
        if sum(sizes) != num_ids:
            raise TransferError(
                f"group_sizes {list(sizes)} sum to {sum(sizes)} but there are "
                f"{num_ids} block ids"
            )
        if block_indices is None:
            indices = (0,) * len(sizes)
        else:
            indices = _as_int_tuple(block_indices, "block_indices")
        if len(indices) != len(sizes):
            raise TransferError(
                f"block_indices has {len(indices)} entries but there are "
                f"{len(sizes)} groups"
            )
        if any(index < 0 for index in indices):
            raise TransferError(f"block_indices must be non-negative, got {list(indices)}")
        self.group_sizes: tuple[int, ...] = sizes
        self.block_indices: tuple[int, ...] = indices

    @staticmethod
    def medium() -> str:
        return "GPU"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GPULoadStoreSpec):
            return NotImplemented
        return (
            bool(np.array_equal(self.block_ids, other.block_ids))
            and self.group_sizes == other.group_sizes
            and self.block_indices == other.block_indices
        )

    __hash__ = None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.block_ids.tolist()!r}, "
            f"group_sizes={list(self.group_sizes)!r}, "
            f"block_indices={list(self.block_indices)!r})"
        )


def _as_int_tuple(values: Iterable[object], name: str) -> tuple[int, ...]:
    result: list[int] = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TransferError(f"{name} must hold integers, got {value!r}")
        result.append(int(value))
    return tuple(result)
