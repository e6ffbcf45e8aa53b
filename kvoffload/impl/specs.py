"""Load/store specs that name blocks by slot (block id)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from kvoffload.spec.contract import LoadStoreSpec


class BlockIDsLoadStoreSpec(LoadStoreSpec):
    """Blocks given by their ids (slots) in a medium, as an int64 array."""

    __slots__ = ("block_ids",)

    def __init__(self, block_ids: Iterable[int] | npt.NDArray[Any]) -> None:
        self.block_ids: npt.NDArray[np.int64] = np.asarray(
            block_ids if isinstance(block_ids, np.ndarray) else list(block_ids),
            dtype=np.int64,
        ).reshape(-1)

    @staticmethod
    def medium() -> str:
        return "BLOCK_IDS"

    def __len__(self) -> int:
        return int(self.block_ids.shape[0])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockIDsLoadStoreSpec):
            return NotImplemented
        return self.medium() == other.medium() and bool(
            np.array_equal(self.block_ids, other.block_ids)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.block_ids.tolist()!r})"


class CPULoadStoreSpec(BlockIDsLoadStoreSpec):
    """Slots of the CPU block pool."""

    __slots__ = ()

    @staticmethod
    def medium() -> str:
        return "CPU"
