"""Design A: one OrderedDict is both the key table and the LRU order.

Policy: exact LRU. Slots come from a fresh-counter plus LIFO free stack.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable

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
    SlotPool,
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


class _Entry:
    __slots__ = ("ref", "slot")

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.ref = -1


class OrderedDictLRU(OffloadingManager):
    def __init__(self, num_blocks: int, enable_events: bool = True) -> None:
        self.num_blocks = check_size(num_blocks)
        self.enable_events = enable_events
        self.table: OrderedDict[OffloadKey, _Entry] = OrderedDict()
        self.pool = SlotPool(num_blocks)
        self.events: list[OffloadingEvent] = []

    # -- helpers ---------------------------------------------------------
    def _emit(self, keys: Iterable[OffloadKey], removed: bool) -> None:
        if self.enable_events:
            self.events.append(event(keys, removed))

    def _ref(self, key: OffloadKey) -> int | None:
        entry = self.table.get(key)
        return None if entry is None else entry.ref

    def _offered(self, keys: list[OffloadKey]) -> list[OffloadKey]:
        return dedup(keys)

    def _protected(
        self, offered: list[OffloadKey], new: list[OffloadKey]
    ) -> set[OffloadKey]:
        return set(offered)

    def _enough(self, eligible: int, need: int) -> bool:
        return eligible >= need

    def _evict(self, need: int, protected: set[OffloadKey]) -> list[OffloadKey] | None:
        candidates = [  # least recent first
            key
            for key, entry in self.table.items()
            if entry.ref == 0 and key not in protected
        ]
        if not self._enough(len(candidates), need):
            return None
        victims = candidates[:need]
        for key in victims:
            self.pool.give(self.table.pop(key).slot)
        return victims

    # -- contract --------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool:
        ref = self._ref(key) if isinstance(key, bytes) else None
        return ref is not None and ref >= 0

    def lookup_prefix(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> int:
        n = 0
        for key in keys:
            if not self.lookup(key, req_context):
                break
            n += 1
        return n

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        offered = self._offered(validated(keys))
        new = [k for k in offered if k not in self.table]
        if not new:
            return PrepareStoreOutput((), cpu_spec([]), ())
        need = len(new) - self.pool.free_count()
        victims: list[OffloadKey] = []
        if need > 0:
            picked = self._evict(need, self._protected(offered, new))
            if picked is None:
                return None
            victims = picked
            self._emit(victims, removed=True)
        slots = []
        for key in new:
            slot = self.pool.take()
            self.table[key] = _Entry(slot)
            slots.append(slot)
        return PrepareStoreOutput(tuple(new), cpu_spec(slots), tuple(victims))

    def _missing_on_complete_store(self, key: OffloadKey, success: bool) -> Exception:
        return illegal(key, ABSENT, store_call(success))

    def _on_stored(self, key: OffloadKey) -> None:
        """Recency does not change when a store completes."""

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        success: bool = True,
    ) -> None:
        uniq = dedup(as_key(k) for k in keys)
        for key in uniq:
            if key not in self.table:
                raise self._missing_on_complete_store(key, success)
        pending = self._pending_of(uniq, success)
        if success:
            for key in pending:
                self.table[key].ref = 0
                self._on_stored(key)
            if pending:
                self._emit(pending, removed=False)
        else:
            for key in pending:
                self.pool.give(self.table.pop(key).slot)
            self._after_failed_store(pending)

    def _pending_of(self, uniq: list[OffloadKey], success: bool) -> list[OffloadKey]:
        return [k for k in uniq if self.table[k].ref == -1]

    def _after_failed_store(self, keys: list[OffloadKey]) -> None:
        """A failed store is never announced."""

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> LoadStoreSpec:
        checked = [as_key(k) for k in keys]
        for key in checked:
            ref = self._ref(key)
            if ref is None or ref < 0:
                raise illegal(key, phase_of_ref(ref), Call.PREPARE_LOAD)
        slots = []
        for key in checked:
            entry = self.table[key]
            entry.ref += 1
            slots.append(entry.slot)
        return cpu_spec(slots)

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> None:
        checked = [as_key(k) for k in keys]
        left: dict[OffloadKey, int] = {}
        for key in checked:
            ref = left.get(key, self._ref(key))
            if ref is None or ref < 1:
                raise illegal(key, phase_of_ref(ref), Call.COMPLETE_LOAD)
            left[key] = ref - 1
        for key, ref in left.items():
            self.table[key].ref = ref

    def _touch_order(self, keys: list[OffloadKey]) -> list[OffloadKey]:
        return keys[::-1]

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in self._touch_order([k for k in keys if isinstance(k, bytes)]):
            if key in self.table:
                self.table.move_to_end(key)

    def reset_cache(self) -> None:
        refuse_reset_with_loads((k, e.ref) for k, e in self.table.items())
        readable = sorted(
            ((e.slot, k) for k, e in self.table.items() if e.ref >= 0),
            key=lambda t: t[0],
        )
        self.table.clear()
        self.pool.reset()
        if readable:
            self._emit((k for _, k in readable), removed=True)

    def take_events(self) -> Iterable[OffloadingEvent]:
        out, self.events = self.events, []
        return out


def make(num_blocks: int) -> OffloadingManager:
    return OrderedDictLRU(num_blocks)


# -- defective twins -------------------------------------------------------


class RefusesAtExactFit(OrderedDictLRU):
    def _enough(self, eligible: int, need: int) -> bool:
        return eligible > need  # slip: '>' where '>=' is meant


class FiltersAfterSlicing(OrderedDictLRU):
    def _evict(self, need: int, protected: set[OffloadKey]) -> list[OffloadKey] | None:
        oldest = list(self.table)[
            :need
        ]  # slip: slices first, then drops pinned/offered
        victims = [k for k in oldest if self.table[k].ref == 0 and k not in protected]
        if len(victims) < need:
            return None
        for key in victims:
            self.pool.give(self.table.pop(key).slot)
        return victims


class ProtectsOnlyNewKeys(OrderedDictLRU):
    def _protected(
        self, offered: list[OffloadKey], new: list[OffloadKey]
    ) -> set[OffloadKey]:
        return set(new)  # slip: a tracked offered key is evictable


class TouchForward(OrderedDictLRU):
    def _touch_order(self, keys: list[OffloadKey]) -> list[OffloadKey]:
        return keys  # slip: the last key ends most recent


class FailedStoreAnnounced(OrderedDictLRU):
    def _pending_of(self, uniq: list[OffloadKey], success: bool) -> list[OffloadKey]:
        return [k for k in uniq if self.table[k].ref == -1]

    def _after_failed_store(self, keys: list[OffloadKey]) -> None:
        if keys:
            self._emit(keys, removed=False)  # slip: announces a failed store


class NonAtomicRefusal(OrderedDictLRU):
    def _evict(self, need: int, protected: set[OffloadKey]) -> list[OffloadKey] | None:
        victims: list[OffloadKey] = []
        for key in list(
            self.table
        ):  # slip: pops victims before knowing there are enough
            if len(victims) == need:
                break
            entry = self.table[key]
            if entry.ref == 0 and key not in protected:
                self.pool.give(self.table.pop(key).slot)
                victims.append(key)
        return victims if len(victims) == need else None


class NoDedupOnOffer(OrderedDictLRU):
    def _offered(self, keys: list[OffloadKey]) -> list[OffloadKey]:
        return keys  # slip: repeated keys are allocated twice


class KeyErrorOnUnknownStore(OrderedDictLRU):
    def _missing_on_complete_store(self, key: OffloadKey, success: bool) -> Exception:
        return KeyError(key)  # slip: untyped error


class StoreCompletionRefreshes(OrderedDictLRU):
    def _on_stored(self, key: OffloadKey) -> None:
        self.table.move_to_end(key)  # slip: completing a store bumps recency


class EventsNotDrained(OrderedDictLRU):
    def take_events(self) -> Iterable[OffloadingEvent]:
        return list(self.events)  # slip: the queue is not emptied


class FailureDropsReady(OrderedDictLRU):
    def _pending_of(self, uniq: list[OffloadKey], success: bool) -> list[OffloadKey]:
        if success:
            return [k for k in uniq if self.table[k].ref == -1]
        return [
            k for k in uniq if self.table[k].ref <= 0
        ]  # slip: a failure also drops READY keys


def make_failure_drops_ready(num_blocks: int) -> OffloadingManager:
    return FailureDropsReady(num_blocks)


def make_refuses_at_exact_fit(num_blocks: int) -> OffloadingManager:
    return RefusesAtExactFit(num_blocks)


def make_protects_only_new(num_blocks: int) -> OffloadingManager:
    return ProtectsOnlyNewKeys(num_blocks)


def make_touch_forward(num_blocks: int) -> OffloadingManager:
    return TouchForward(num_blocks)


def make_failed_store_announced(num_blocks: int) -> OffloadingManager:
    return FailedStoreAnnounced(num_blocks)


def make_non_atomic_refusal(num_blocks: int) -> OffloadingManager:
    return NonAtomicRefusal(num_blocks)


def make_no_dedup_on_offer(num_blocks: int) -> OffloadingManager:
    return NoDedupOnOffer(num_blocks)


def make_keyerror_on_unknown_store(num_blocks: int) -> OffloadingManager:
    return KeyErrorOnUnknownStore(num_blocks)


def make_store_completion_refreshes(num_blocks: int) -> OffloadingManager:
    return StoreCompletionRefreshes(num_blocks)


def make_events_not_drained(num_blocks: int) -> OffloadingManager:
    return EventsNotDrained(num_blocks)


def make_filters_after_slicing(num_blocks: int) -> OffloadingManager:
    return FiltersAfterSlicing(num_blocks)
