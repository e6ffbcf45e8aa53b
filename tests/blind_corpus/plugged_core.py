"""Designs G and J: my own parts plugged into the library's manager core.

G: a FIFO ``CachePolicy`` (insertion order, touch ignored) in
``OffloadingManagerCore`` over the library's ``CPUBackend`` — audited "any".
J: a ``Backend`` of my own (fresh counter + LIFO stack) under
``LRUOffloadingManager`` (audited "lru") and under the core with the
library's ``ARCCachePolicy`` (audited "arc").
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from kvoffload import (
    ARCCachePolicy,
    Backend,
    BlockStatus,
    CachePolicy,
    CPUBackend,
    CPULoadStoreSpec,
    LRUOffloadingManager,
    OffloadingManager,
    OffloadingManagerCore,
    OffloadKey,
)

from ._common import BLOCK_SIZE, check_size

Victims = list[tuple[OffloadKey, BlockStatus]]


class FifoPolicy(CachePolicy):
    """First in, first out: touch changes nothing.

    The order is the insertion order of the base class's ``blocks`` dict,
    which the library's core reads to find tracked blocks (an undocumented
    requirement found by trial: overriding ``get``/``items`` is not enough).
    """

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.blocks[key] = block

    def remove(self, key: OffloadKey) -> None:
        del self.blocks[key]

    def clear(self) -> None:
        self.blocks.clear()

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        """FIFO ignores reuse."""

    def _candidate(
        self, key: OffloadKey, block: BlockStatus, protected: Collection[OffloadKey]
    ) -> bool:
        return block.ref_cnt == 0 and key not in protected

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        chosen: Victims = []
        for key, block in self.blocks.items():
            if len(chosen) == n:
                break
            if self._candidate(key, block, protected):
                chosen.append((key, block))
        if len(chosen) < n:
            return None
        for key, _ in chosen:
            del self.blocks[key]
        return chosen


class StackBackend(Backend):
    """CPU slots: never-used ascending, then freed LIFO."""

    def __init__(self, block_size: int, num_blocks: int) -> None:
        super().__init__(block_size, "CPU")
        self.num_blocks = check_size(num_blocks)
        self.next_fresh = 0
        self.stack: list[int] = []

    def get_num_free_blocks(self) -> int:
        return self.num_blocks - self.next_fresh + len(self.stack)

    def _one(self) -> int:
        if self.next_fresh < self.num_blocks:
            self.next_fresh += 1
            return self.next_fresh - 1
        return self.stack.pop()

    def allocate_blocks(self, keys: Sequence[OffloadKey]) -> list[BlockStatus]:
        return [BlockStatus(self._one()) for _ in keys]

    def free(self, block: BlockStatus) -> None:
        self.stack.append(block.block_id)

    def get_load_store_spec(
        self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]
    ) -> CPULoadStoreSpec:
        return CPULoadStoreSpec([b.block_id for b in blocks])

    def reset(self, blocks: Sequence[BlockStatus]) -> None:
        self.next_fresh = 0
        self.stack = []


def make_fifo(num_blocks: int) -> OffloadingManager:
    return OffloadingManagerCore(
        CPUBackend(BLOCK_SIZE, num_blocks), FifoPolicy(num_blocks), enable_events=True
    )


def make_stack_lru(num_blocks: int) -> OffloadingManager:
    return LRUOffloadingManager(
        StackBackend(BLOCK_SIZE, num_blocks), enable_events=True
    )


def make_stack_arc(num_blocks: int) -> OffloadingManager:
    return OffloadingManagerCore(
        StackBackend(BLOCK_SIZE, num_blocks),
        ARCCachePolicy(num_blocks),
        enable_events=True,
    )


# -- defective twins -------------------------------------------------------


class FifoIgnoresProtected(FifoPolicy):
    def _candidate(
        self, key: OffloadKey, block: BlockStatus, protected: Collection[OffloadKey]
    ) -> bool:
        return block.ref_cnt == 0  # slip: the offered keys are fair game


class FifoEvictsReaders(FifoPolicy):
    def _candidate(
        self, key: OffloadKey, block: BlockStatus, protected: Collection[OffloadKey]
    ) -> bool:
        return (
            block.ref_cnt >= 0 and key not in protected
        )  # slip: LOADING counted as stored


class FifoPartialEvict(FifoPolicy):
    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        chosen: Victims = []
        for key in list(
            self.blocks
        ):  # slip: removes as it goes, even if it then gives up
            if len(chosen) == n:
                break
            block = self.blocks[key]
            if self._candidate(key, block, protected):
                del self.blocks[key]
                chosen.append((key, block))
        return chosen if len(chosen) == n else None


class FifoStackBackend(StackBackend):
    def _one(self) -> int:
        if self.next_fresh < self.num_blocks:
            self.next_fresh += 1
            return self.next_fresh - 1
        return self.stack.pop(0)  # slip: oldest freed slot first


class SortedSpecBackend(StackBackend):
    def get_load_store_spec(
        self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]
    ) -> CPULoadStoreSpec:
        # slip: the slots are sorted, as if the worker wanted them ascending
        return CPULoadStoreSpec(sorted(b.block_id for b in blocks))


class UndercountingBackend(StackBackend):
    def get_num_free_blocks(self) -> int:
        return (
            self.num_blocks - self.next_fresh + len(self.stack) - 1
        )  # slip: off by one


class ResetlessBackend(StackBackend):
    def reset(self, blocks: Sequence[BlockStatus]) -> None:
        for (
            block
        ) in blocks:  # slip: frees only the tracked blocks, keeps the fresh mark
            self.free(block)


def _core(policy: CachePolicy, num_blocks: int) -> OffloadingManager:
    return OffloadingManagerCore(
        CPUBackend(BLOCK_SIZE, num_blocks), policy, enable_events=True
    )


def make_fifo_ignores_protected(num_blocks: int) -> OffloadingManager:
    return _core(FifoIgnoresProtected(num_blocks), num_blocks)


def make_fifo_evicts_readers(num_blocks: int) -> OffloadingManager:
    return _core(FifoEvictsReaders(num_blocks), num_blocks)


def make_fifo_partial_evict(num_blocks: int) -> OffloadingManager:
    return _core(FifoPartialEvict(num_blocks), num_blocks)


def make_backend_fifo_free(num_blocks: int) -> OffloadingManager:
    return LRUOffloadingManager(
        FifoStackBackend(BLOCK_SIZE, num_blocks), enable_events=True
    )


def make_backend_undercounts(num_blocks: int) -> OffloadingManager:
    return LRUOffloadingManager(
        UndercountingBackend(BLOCK_SIZE, num_blocks), enable_events=True
    )


def make_backend_resetless(num_blocks: int) -> OffloadingManager:
    return LRUOffloadingManager(
        ResetlessBackend(BLOCK_SIZE, num_blocks), enable_events=True
    )


def make_backend_sorted_spec(num_blocks: int) -> OffloadingManager:
    return LRUOffloadingManager(
        SortedSpecBackend(BLOCK_SIZE, num_blocks), enable_events=True
    )
