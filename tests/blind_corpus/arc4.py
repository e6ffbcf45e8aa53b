"""Design E: ARC with four OrderedDicts (T1, T2, B1, B2), as docs/SPEC.md §6.

Key table: ``key -> [slot, ref]``. Slots: a fresh counter and a LIFO stack.
Implements the optional ``InspectableManager`` protocol.
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
    Phase,
    PrepareStoreOutput,
    ReqContext,
)

from ._common import (
    ABSENT,
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

List = OrderedDict[OffloadKey, None]


class FourListARC(OffloadingManager):
    def __init__(self, num_blocks: int) -> None:
        self.capacity = check_size(num_blocks)
        self.table: dict[OffloadKey, list[int]] = {}  # key -> [slot, ref]
        self.t1: List = OrderedDict()
        self.t2: List = OrderedDict()
        self.b1: List = OrderedDict()
        self.b2: List = OrderedDict()
        self.target = 0.0
        self.high_water = 0
        self.freed: list[int] = []
        self.events: list[OffloadingEvent] = []

    # -- slots -----------------------------------------------------------
    def _free(self) -> int:
        return self.capacity - self.high_water + len(self.freed)

    def _take_slot(self) -> int:
        if self.high_water < self.capacity:
            self.high_water += 1
            return self.high_water - 1
        return self.freed.pop()

    # -- ARC pieces ------------------------------------------------------
    def _insert(self, key: OffloadKey) -> None:
        self.b1.pop(key, None)
        self.b2.pop(key, None)
        self.t1[key] = None

    def _prefer_t1(self, virtual_t1: int) -> bool:
        return virtual_t1 >= int(self.target)

    def _after_t1_victim(self, virtual_t1: int) -> int:
        return virtual_t1 - 1

    def _first_eligible(
        self, lst: List, protected: set[OffloadKey], taken: set[OffloadKey]
    ) -> OffloadKey | None:
        for key in lst:
            if key not in protected and key not in taken and self.table[key][1] == 0:
                return key
        return None

    def _pick(
        self, prefer_t1: bool, protected: set[OffloadKey], taken: set[OffloadKey]
    ) -> tuple[OffloadKey, bool] | None:
        first, second = (self.t1, self.t2) if prefer_t1 else (self.t2, self.t1)
        key = self._first_eligible(first, protected, taken)
        if key is not None:
            return key, first is self.t1
        key = self._first_eligible(second, protected, taken)
        if key is not None:
            return key, second is self.t1
        return None

    def _victims(
        self, need: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, bool]] | None:
        virtual_t1 = len(self.t1)
        chosen: list[tuple[OffloadKey, bool]] = []
        taken: set[OffloadKey] = set()
        while len(chosen) < need:
            pick = self._pick(self._prefer_t1(virtual_t1), protected, taken)
            if pick is None:
                return None
            chosen.append(pick)
            taken.add(pick[0])
            if pick[1]:
                virtual_t1 = self._after_t1_victim(virtual_t1)
        return chosen

    def _ghost(self, key: OffloadKey, from_t1: bool) -> None:
        ghosts = self.b1 if from_t1 else self.b2
        ghosts[key] = None

    def _trim(self) -> None:
        for ghosts in (self.b1, self.b2):
            while len(ghosts) > self.capacity:
                ghosts.popitem(last=False)

    def _clamp_up(self, value: float) -> float:
        return min(value, float(self.capacity))

    def _b1_delta(self) -> float:
        return max(1.0, len(self.b2) / len(self.b1))

    def _touch_one(self, key: OffloadKey) -> None:
        entry = self.table.get(key)
        if key in self.t1:
            assert entry is not None
            if entry[1] < 0:
                self.t1.move_to_end(key)
            else:
                del self.t1[key]
                self.t2[key] = None
        elif key in self.t2:
            self.t2.move_to_end(key)
        elif key in self.b1:
            self.target = self._clamp_up(self.target + self._b1_delta())
            self.b1.move_to_end(key)
        elif key in self.b2:
            delta = max(1.0, len(self.b1) / len(self.b2))
            self.target = max(self.target - delta, 0.0)
            self.b2.move_to_end(key)

    def _forget_failed(self, key: OffloadKey) -> None:
        self.t1.pop(key, None)
        self.t2.pop(key, None)

    def _clear_policy(self) -> None:
        for lst in (self.t1, self.t2, self.b1, self.b2):
            lst.clear()
        self.target = 0.0

    # -- InspectableManager (pure queries) --------------------------------
    def phase(self, key: OffloadKey) -> Phase:
        entry = self.table.get(key)
        return phase_of_ref(None if entry is None else entry[1])

    def slot_of(self, key: OffloadKey) -> int | None:
        entry = self.table.get(key)
        return None if entry is None else entry[0]

    # -- contract --------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool:
        entry = self.table.get(key) if isinstance(key, bytes) else None
        return entry is not None and entry[1] >= 0

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
        offered = dedup(validated(keys))
        new = [k for k in offered if k not in self.table]
        if not new:
            return PrepareStoreOutput((), cpu_spec([]), ())
        need = len(new) - self._free()
        evicted: list[OffloadKey] = []
        if need > 0:
            chosen = self._victims(need, set(offered))
            if chosen is None:
                return None
            for key, from_t1 in chosen:
                (self.t1 if from_t1 else self.t2).pop(key)
                self.freed.append(self.table.pop(key)[0])
                self._ghost(key, from_t1)
                evicted.append(key)
            self._trim()
            self.events.append(event(evicted, removed=True))
        slots = []
        for key in new:
            slot = self._take_slot()
            self.table[key] = [slot, -1]
            self._insert(key)
            slots.append(slot)
        return PrepareStoreOutput(tuple(new), cpu_spec(slots), tuple(evicted))

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        success: bool = True,
    ) -> None:
        uniq = dedup(as_key(k) for k in keys)
        for key in uniq:
            if key not in self.table:
                raise illegal(key, ABSENT, store_call(success))
        pending = [k for k in uniq if self.table[k][1] < 0]
        if success:
            for key in pending:
                self.table[key][1] = 0
            if pending:
                self.events.append(event(pending, removed=False))
            return
        for key in pending:
            self.freed.append(self.table.pop(key)[0])
            self._forget_failed(key)

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> LoadStoreSpec:
        seq = [as_key(k) for k in keys]
        for key in seq:
            entry = self.table.get(key)
            if entry is None or entry[1] < 0:
                raise illegal(
                    key,
                    phase_of_ref(None if entry is None else entry[1]),
                    Call.PREPARE_LOAD,
                )
        for key in seq:
            self.table[key][1] += 1
        return cpu_spec(self.table[k][0] for k in seq)

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> None:
        seq = [as_key(k) for k in keys]
        after: dict[OffloadKey, int] = {}
        for key in seq:
            entry = self.table.get(key)
            ref = after.get(key, None if entry is None else entry[1])
            if ref is None or ref < 1:
                raise illegal(key, phase_of_ref(ref), Call.COMPLETE_LOAD)
            after[key] = ref - 1
        for key, ref in after.items():
            self.table[key][1] = ref

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in reversed(list(keys)):
            if isinstance(key, bytes):
                self._touch_one(key)

    def reset_cache(self) -> None:
        refuse_reset_with_loads((k, e[1]) for k, e in self.table.items())
        readable = sorted((e[0], k) for k, e in self.table.items() if e[1] >= 0)
        self.table.clear()
        self.high_water = 0
        self.freed.clear()
        self._clear_policy()
        if readable:
            self.events.append(event([k for _, k in readable], removed=True))

    def take_events(self) -> Iterable[OffloadingEvent]:
        out = self.events
        self.events = []
        return out


def make(num_blocks: int) -> OffloadingManager:
    return FourListARC(num_blocks)


# -- defective twins -------------------------------------------------------


class GhostsNotTrimmed(FourListARC):
    def _trim(self) -> None:
        pass  # slip: ghost lists grow without bound


class B1DeltaInverted(FourListARC):
    def _b1_delta(self) -> float:
        return max(1.0, len(self.b1) / max(1, len(self.b2)))  # slip: ratio upside down


class PreferT1Strict(FourListARC):
    def _prefer_t1(self, virtual_t1: int) -> bool:
        return virtual_t1 > int(self.target)  # slip: '>' for '>='


class VirtualT1Frozen(FourListARC):
    def _after_t1_victim(self, virtual_t1: int) -> int:
        return virtual_t1  # slip: T1's shrinking size not tracked within one call


class InsertKeepsGhost(FourListARC):
    def _insert(self, key: OffloadKey) -> None:
        self.t1[key] = None  # slip: a re-stored ghost stays in B1/B2


class PromotesPending(FourListARC):
    def _touch_one(self, key: OffloadKey) -> None:
        if key in self.t1:  # slip: PENDING keys promoted to T2 as well
            del self.t1[key]
            self.t2[key] = None
            return
        super()._touch_one(key)


class ResetKeepsTarget(FourListARC):
    def _clear_policy(self) -> None:
        for lst in (self.t1, self.t2, self.b1, self.b2):
            lst.clear()  # slip: target survives a reset


class FailedStoreGhosted(FourListARC):
    def _forget_failed(self, key: OffloadKey) -> None:
        if self.t1.pop(key, 0) is None:  # slip: failed store remembered as a T1 ghost
            self.b1[key] = None
            self._trim()
        self.t2.pop(key, None)


class NoFallbackList(FourListARC):
    def _pick(
        self, prefer_t1: bool, protected: set[OffloadKey], taken: set[OffloadKey]
    ) -> tuple[OffloadKey, bool] | None:
        lst = self.t1 if prefer_t1 else self.t2  # slip: textbook ARC, no fallback
        key = self._first_eligible(lst, protected, taken)
        return None if key is None else (key, prefer_t1)


class TargetNotClamped(FourListARC):
    def _clamp_up(self, value: float) -> float:
        return value  # slip: target may exceed capacity


def make_ghosts_not_trimmed(num_blocks: int) -> OffloadingManager:
    return GhostsNotTrimmed(num_blocks)


def make_b1_delta_inverted(num_blocks: int) -> OffloadingManager:
    return B1DeltaInverted(num_blocks)


def make_prefer_t1_strict(num_blocks: int) -> OffloadingManager:
    return PreferT1Strict(num_blocks)


def make_virtual_t1_frozen(num_blocks: int) -> OffloadingManager:
    return VirtualT1Frozen(num_blocks)


def make_insert_keeps_ghost(num_blocks: int) -> OffloadingManager:
    return InsertKeepsGhost(num_blocks)


def make_promotes_pending(num_blocks: int) -> OffloadingManager:
    return PromotesPending(num_blocks)


def make_reset_keeps_target(num_blocks: int) -> OffloadingManager:
    return ResetKeepsTarget(num_blocks)


def make_failed_store_ghosted(num_blocks: int) -> OffloadingManager:
    return FailedStoreGhosted(num_blocks)


def make_no_fallback_list(num_blocks: int) -> OffloadingManager:
    return NoFallbackList(num_blocks)


def make_target_not_clamped(num_blocks: int) -> OffloadingManager:
    return TargetNotClamped(num_blocks)
