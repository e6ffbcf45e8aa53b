"""Design B: LRU by logical timestamps.

Every tracked key carries the tick of its last insert/touch; victims are the
eligible keys with the smallest ticks. Slots: an ascending list of never-used
slots consumed from the front, then a LIFO stack of freed ones.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from kvoffload import (
    Call,
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
)

from ._common import (
    ABSENT,
    PENDING,
    as_key,
    check_size,
    cpu_spec,
    dedup,
    event,
    illegal,
    phase_of_ref,
    refuse_reset_with_loads,
    store_call,
    validated,
)


@dataclass
class Block:
    slot: int
    ref: int  # -1 pending, 0 ready, n loads
    tick: int


class TimestampLRU(OffloadingManager):
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = check_size(num_blocks)
        self.blocks: dict[OffloadKey, Block] = {}
        self.never_used: list[int] = list(range(num_blocks))
        self.next_unused = 0
        self.free_stack: list[int] = []
        self.tick = 0
        self.queue: list[OffloadingEvent] = []

    def _now(self) -> int:
        self.tick += 1
        return self.tick

    def _free_slots(self) -> int:
        return len(self.never_used) - self.next_unused + len(self.free_stack)

    def _alloc(self) -> int:
        if self.next_unused < len(self.never_used):
            self.next_unused += 1
            return self.never_used[self.next_unused - 1]
        return self.free_stack.pop()

    def _evictable(self, block: Block) -> bool:
        return block.ref == 0

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool:
        block = self.blocks.get(key) if isinstance(key, bytes) else None
        return block is not None and block.ref >= 0

    def lookup_prefix(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> int:
        count = 0
        for key in keys:
            if not self.lookup(key, req_context):
                return count
            count += 1
        return count

    def _nothing_new(self, offered: list[OffloadKey]) -> None:
        """No change at all."""

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        offered = dedup(validated(keys))
        new = [k for k in offered if k not in self.blocks]
        if not new:
            self._nothing_new(offered)
            return PrepareStoreOutput((), cpu_spec(()), ())
        need = len(new) - self._free_slots()
        victims: list[OffloadKey] = []
        if need > 0:
            protected = set(offered)
            ranked = sorted(
                (b.tick, k)
                for k, b in self.blocks.items()
                if self._evictable(b) and k not in protected
            )
            if len(ranked) < need:
                return None
            victims = [k for _, k in ranked[:need]]
            for key in victims:
                self.free_stack.append(self.blocks.pop(key).slot)
            self.queue.append(event(victims, removed=True))
        slots: list[int] = []
        for key in new:
            slot = self._alloc()
            self.blocks[key] = Block(slot, -1, self._now())
            slots.append(slot)
        return PrepareStoreOutput(tuple(new), cpu_spec(slots), tuple(victims))

    def _announce(self, stored: list[OffloadKey]) -> None:
        if stored:
            self.queue.append(event(stored, removed=False))

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        success: bool = True,
    ) -> None:
        uniq = dedup(as_key(k) for k in keys)
        self._check_tracked(uniq, success)
        pending = [k for k in uniq if self.blocks[k].ref < 0]
        if success:
            for key in pending:
                self.blocks[key].ref = 0
            self._announce(pending)
        else:
            for key in pending:
                self.free_stack.append(self.blocks.pop(key).slot)

    def _check_tracked(self, uniq: list[OffloadKey], success: bool) -> None:
        for key in uniq:
            if key not in self.blocks:
                raise illegal(key, ABSENT, store_call(success))

    def _check_loadable(self, key: OffloadKey) -> None:
        block = self.blocks.get(key)
        if block is None:
            raise illegal(key, ABSENT, Call.PREPARE_LOAD)
        if block.ref < 0:
            raise illegal(key, PENDING, Call.PREPARE_LOAD)

    def _pin(self, keys: list[OffloadKey]) -> list[int]:
        for key in keys:
            self._check_loadable(key)
        slots = []
        for key in keys:
            block = self.blocks[key]
            block.ref += 1
            slots.append(block.slot)
        return slots

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> LoadStoreSpec:
        return cpu_spec(self._pin([as_key(k) for k in keys]))

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> None:
        seq = [as_key(k) for k in keys]
        taken: dict[OffloadKey, int] = {}
        for key in seq:
            block = self.blocks.get(key)
            current = None if block is None else block.ref - taken.get(key, 0)
            if current is None or current < 1:
                raise illegal(key, phase_of_ref(current), Call.COMPLETE_LOAD)
            taken[key] = taken.get(key, 0) + 1
        for key, n in taken.items():
            self.blocks[key].ref -= n

    def _touchable(self, block: Block) -> bool:
        return True

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in reversed(list(keys)):
            block = self.blocks.get(key) if isinstance(key, bytes) else None
            if block is not None and self._touchable(block):
                block.tick = self._now()

    def reset_cache(self) -> None:
        refuse_reset_with_loads((k, b.ref) for k, b in self.blocks.items())
        announced = sorted((b.slot, k) for k, b in self.blocks.items() if b.ref >= 0)
        self.blocks = {}
        self.next_unused = 0
        self.free_stack = []
        if announced:
            self.queue.append(event([k for _, k in announced], removed=True))

    def take_events(self) -> Iterable[OffloadingEvent]:
        taken = self.queue
        self.queue = []
        return taken


def make(num_blocks: int) -> OffloadingManager:
    return TimestampLRU(num_blocks)


# -- defective twins -------------------------------------------------------


class EvictsLoading(TimestampLRU):
    def _evictable(self, block: Block) -> bool:
        return block.ref >= 0  # slip: 'not pending' taken to mean 'evictable'


class EvictsPending(TimestampLRU):
    def _evictable(self, block: Block) -> bool:
        return block.ref <= 0  # slip: 'no reader' taken to mean 'evictable'


class NothingNewStillTouches(TimestampLRU):
    def _nothing_new(self, offered: list[OffloadKey]) -> None:
        for key in reversed(offered):  # slip: a no-op offer refreshes recency
            self.blocks[key].tick = self._now()


class RepeatedLoadCountedOnce(TimestampLRU):
    def _pin(self, keys: list[OffloadKey]) -> list[int]:
        for key in keys:
            self._check_loadable(key)
        for key in set(keys):  # slip: one load per distinct key
            self.blocks[key].ref += 1
        return [self.blocks[k].slot for k in keys]


class LoadPinsBeforeChecking(TimestampLRU):
    def _pin(self, keys: list[OffloadKey]) -> list[int]:
        slots = []
        for key in keys:  # slip: pins earlier keys, then raises on a bad one
            self._check_loadable(key)
            block = self.blocks[key]
            block.ref += 1
            slots.append(block.slot)
        return slots


class LoadRefreshesRecency(TimestampLRU):
    def _pin(self, keys: list[OffloadKey]) -> list[int]:
        slots = super()._pin(keys)
        for key in reversed(keys):  # slip: reading a block counts as a use
            self.blocks[key].tick = self._now()
        return slots


class EmptyStoredEvent(TimestampLRU):
    def _announce(self, stored: list[OffloadKey]) -> None:
        self.queue.append(event(stored, removed=False))  # slip: even with no key


class TouchSkipsPending(TimestampLRU):
    def _touchable(self, block: Block) -> bool:
        return block.ref >= 0  # slip: only stored blocks get their tick bumped


class StoreCompletesBeforeChecking(TimestampLRU):
    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        success: bool = True,
    ) -> None:
        done: list[OffloadKey] = []
        for key in dedup(as_key(k) for k in keys):  # slip: one pass, raising midway
            block = self.blocks.get(key)
            if block is None:
                raise illegal(key, ABSENT, store_call(success))
            if block.ref < 0 and success:
                block.ref = 0
                done.append(key)
            elif block.ref < 0:
                self.free_stack.append(self.blocks.pop(key).slot)
        if success:
            self._announce(done)


def make_store_completes_before_checking(num_blocks: int) -> OffloadingManager:
    return StoreCompletesBeforeChecking(num_blocks)


def make_evicts_loading(num_blocks: int) -> OffloadingManager:
    return EvictsLoading(num_blocks)


def make_evicts_pending(num_blocks: int) -> OffloadingManager:
    return EvictsPending(num_blocks)


def make_nothing_new_touches(num_blocks: int) -> OffloadingManager:
    return NothingNewStillTouches(num_blocks)


def make_repeated_load_once(num_blocks: int) -> OffloadingManager:
    return RepeatedLoadCountedOnce(num_blocks)


def make_load_pins_before_check(num_blocks: int) -> OffloadingManager:
    return LoadPinsBeforeChecking(num_blocks)


def make_load_refreshes(num_blocks: int) -> OffloadingManager:
    return LoadRefreshesRecency(num_blocks)


def make_empty_stored_event(num_blocks: int) -> OffloadingManager:
    return EmptyStoredEvent(num_blocks)


def make_touch_skips_pending(num_blocks: int) -> OffloadingManager:
    return TouchSkipsPending(num_blocks)
