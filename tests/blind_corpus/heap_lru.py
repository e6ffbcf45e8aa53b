"""Design C: LRU with a min-heap of (tick, key) and lazy deletion.

A key's live tick is in ``ticks``; heap entries whose tick is stale are
skipped (and dropped) when found. Victim search pops into a scratch list and
pushes back what it did not take, so a refusal leaves the policy unchanged.
"""

from __future__ import annotations

import heapq

from kvoffload import Call, OffloadingManager, OffloadKey

from ._common import SlotPool, illegal, phase_of_ref
from ._skeleton import Eligible, HookedManager


class HeapLRU(HookedManager):
    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.heap: list[tuple[int, OffloadKey]] = []
        self.ticks: dict[OffloadKey, int] = {}
        self.clock = 0

    def _stamp(self, key: OffloadKey) -> None:
        self.clock += 1
        self.ticks[key] = self.clock
        heapq.heappush(self.heap, (self.clock, key))

    def _live(self, tick: int, key: OffloadKey) -> bool:
        return self.ticks.get(key) == tick

    def policy_insert(self, keys: list[OffloadKey]) -> None:
        for key in keys:
            self._stamp(key)

    def policy_touch(self, key: OffloadKey) -> None:
        self._stamp(key)

    def policy_victims(self, need: int, eligible: Eligible) -> list[OffloadKey] | None:
        popped: list[tuple[int, OffloadKey]] = []
        victims: list[OffloadKey] = []
        while self.heap and len(victims) < need:
            tick, key = heapq.heappop(self.heap)
            if not self._live(tick, key):
                continue  # stale entry: drop it for good
            popped.append((tick, key))
            if eligible(key) and key not in victims:
                victims.append(key)
        for item in popped:
            heapq.heappush(self.heap, item)
        return victims if len(victims) == need else None

    def policy_forget(self, key: OffloadKey) -> None:
        del self.ticks[key]  # its heap entries become stale

    def policy_clear(self) -> None:
        self.heap.clear()
        self.ticks.clear()


def make(num_blocks: int) -> OffloadingManager:
    return HeapLRU(num_blocks)


# -- defective twins -------------------------------------------------------


class _FifoPool(SlotPool):
    def take(self) -> int:
        if self.fresh < self.num_blocks:
            self.fresh += 1
            return self.fresh - 1
        return self.freed.pop(0)  # slip: oldest freed slot first


class FreeListFifo(HeapLRU):
    def _make_pool(self, num_blocks: int) -> SlotPool:
        return _FifoPool(num_blocks)


class _StickyPool(SlotPool):
    def reset(self) -> None:
        self.freed = list(range(self.fresh))  # slip: fresh mark kept, all freed instead


class ResetKeepsSlotOrder(HeapLRU):
    def _make_pool(self, num_blocks: int) -> SlotPool:
        return _StickyPool(num_blocks)


class ResetAnnouncesPending(HeapLRU):
    def _reset_announced(self) -> list[OffloadKey]:
        return sorted(self.refs, key=self.slots.__getitem__)  # slip: PENDING too


class UnloadIgnoresRepeats(HeapLRU):
    def _check_unloads(self, keys: list[OffloadKey]) -> dict[OffloadKey, int]:
        remaining: dict[OffloadKey, int] = {}
        for key in keys:
            ref = self.refs.get(key)  # slip: earlier occurrences not counted
            if ref is None or ref < 1:
                raise illegal(key, phase_of_ref(ref), Call.COMPLETE_LOAD)
            remaining[key] = remaining.get(key, ref) - 1
        return remaining


class EventPerVictim(HeapLRU):
    def _emit_removed(self, victims: list[OffloadKey]) -> None:
        for key in victims:  # slip: one event per key instead of one per call
            super()._emit_removed([key])


class FailedStoreLeaksSlot(HeapLRU):
    def _fail_pending(self, key: OffloadKey) -> None:
        del self.refs[key]  # slip: the slot is never returned to the pool
        del self.slots[key]
        self.policy_forget(key)


class StaleHeapEntries(HeapLRU):
    def _live(self, tick: int, key: OffloadKey) -> bool:
        return key in self.ticks  # slip: any entry of a tracked key counts


class RemovedEventReversed(HeapLRU):
    def _emit_removed(self, victims: list[OffloadKey]) -> None:
        super()._emit_removed(victims[::-1])  # slip: most recent victim first


def make_removed_event_reversed(num_blocks: int) -> OffloadingManager:
    return RemovedEventReversed(num_blocks)


def make_free_list_fifo(num_blocks: int) -> OffloadingManager:
    return FreeListFifo(num_blocks)


def make_reset_keeps_slot_order(num_blocks: int) -> OffloadingManager:
    return ResetKeepsSlotOrder(num_blocks)


def make_reset_announces_pending(num_blocks: int) -> OffloadingManager:
    return ResetAnnouncesPending(num_blocks)


def make_unload_ignores_repeats(num_blocks: int) -> OffloadingManager:
    return UnloadIgnoresRepeats(num_blocks)


def make_event_per_victim(num_blocks: int) -> OffloadingManager:
    return EventPerVictim(num_blocks)


def make_failed_store_leaks_slot(num_blocks: int) -> OffloadingManager:
    return FailedStoreLeaksSlot(num_blocks)


def make_stale_heap_entries(num_blocks: int) -> OffloadingManager:
    return StaleHeapEntries(num_blocks)
