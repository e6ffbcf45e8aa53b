"""Slot pools and spec builders (``Backend``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from mypy_extensions import mypyc_attr

from kvoffload.impl.block import BlockStatus
from kvoffload.impl.build import IntArg
from kvoffload.impl.specs import CPULoadStoreSpec
from kvoffload.spec.contract import LoadStoreSpec
from kvoffload.spec.errors import ConfigurationError, OffloadingError
from kvoffload.spec.keys import OffloadKey


def require_positive_int(name: str, value: object) -> int:
    """``value`` if it is an int > 0, else :class:`ConfigurationError`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ConfigurationError(f"{name} must be > 0, got {value}")
    return value


@mypyc_attr(allow_interpreted_subclasses=True)
class Backend(ABC):
    """A pool of block slots in one medium, and how to describe them."""

    def __init__(self, block_size: IntArg, medium: str) -> None:
        self.block_size: int = require_positive_int("block_size", block_size)
        self.medium: str = medium

    @abstractmethod
    def get_num_free_blocks(self) -> int:
        """Slots that :meth:`allocate_blocks` can hand out now."""

    @abstractmethod
    def allocate_blocks(self, keys: Sequence[OffloadKey]) -> list[BlockStatus]:
        """One new PENDING :class:`BlockStatus` per key, on distinct free slots.

        Called only with ``len(keys) <= get_num_free_blocks()``.
        """

    @abstractmethod
    def free(self, block: BlockStatus) -> None:
        """Return ``block``'s slot to the pool."""

    @abstractmethod
    def get_load_store_spec(
        self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]
    ) -> LoadStoreSpec:
        """A spec naming ``blocks``' slots, in order."""

    def reset(self, blocks: Sequence[BlockStatus]) -> None:
        """Take back every allocated block at once (``reset_cache``).

        ``blocks`` are all blocks the manager tracks; the default frees them
        in descending slot order.
        """
        for block in sorted(blocks, key=lambda b: b.block_id, reverse=True):
            self.free(block)


@mypyc_attr(allow_interpreted_subclasses=True)
class CPUBackend(Backend):
    """``num_blocks`` CPU slots. Never-used slots are handed out in ascending
    order first, then freed slots, last freed first.

    A freed :class:`BlockStatus` is kept with its slot and handed out again
    (PENDING) with it, so a store that replaces evicted blocks allocates no
    new objects: a block object belongs to the backend, and a caller must not
    hold on to one after freeing it.
    """

    def __init__(
        self, block_size: IntArg, num_blocks: IntArg, allow_empty: bool = False
    ) -> None:
        super().__init__(block_size, CPULoadStoreSpec.medium())
        if allow_empty and num_blocks == 0 and type(num_blocks) is int:
            self.num_blocks: int = 0  # a pool with no slot (``allow_empty``)
        else:
            self.num_blocks = require_positive_int("num_blocks", num_blocks)
        self._num_allocated = 0
        # freed blocks, last freed at the end (their slots are free)
        self._free_blocks: list[BlockStatus] = []

    def get_num_free_blocks(self) -> int:
        return len(self._free_blocks) + self.num_blocks - self._num_allocated

    def allocate_blocks(self, keys: Sequence[OffloadKey]) -> list[BlockStatus]:
        count = len(keys)
        if count > self.get_num_free_blocks():
            raise OffloadingError(
                f"asked for {count} slots with {self.get_num_free_blocks()} free"
            )
        fresh = min(count, self.num_blocks - self._num_allocated)
        start = self._num_allocated
        blocks = [BlockStatus(slot) for slot in range(start, start + fresh)]
        self._num_allocated += fresh
        reused = count - fresh
        if reused > 0:
            free_blocks = self._free_blocks
            taken = free_blocks[-reused:]
            del free_blocks[-reused:]
            taken.reverse()  # last freed first
            for block in taken:
                block.ref_cnt = -1
            blocks.extend(taken)
        return blocks

    def free(self, block: BlockStatus) -> None:
        self._free_blocks.append(block)

    def reset(self, blocks: Sequence[BlockStatus]) -> None:
        """Every slot free, handed out in ascending order again."""
        self._num_allocated = 0
        self._free_blocks.clear()

    def get_load_store_spec(
        self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]
    ) -> CPULoadStoreSpec:
        # slots this backend handed out: ints in range, no check needed
        return CPULoadStoreSpec([block.block_id for block in blocks], checked=False)
