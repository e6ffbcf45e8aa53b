"""Design K: ARC (docs/SPEC.md §6) with one record per key and logical stamps.

Every key ARC knows about — tracked or ghost — has one record: which list it
is on ("T1", "T2", "B1", "B2"), the stamp of its last move (its position in
that list: smallest stamp = LRU end) and, for tracked keys, its slot and ref
count. Lists are materialised by sorting on demand. Slots: ascending
never-used ones, then a LIFO stack of freed ones.
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
class Rec:
    where: str  # "T1", "T2", "B1" or "B2"
    stamp: int
    slot: int = -1
    ref: int = -1


class TaggedARC(OffloadingManager):
    def __init__(self, num_blocks: int) -> None:
        self.cap = check_size(num_blocks)
        self.recs: dict[OffloadKey, Rec] = {}
        self.target = 0.0
        self.stamp = 0
        self.unused = list(range(self.cap - 1, -1, -1))  # pop() gives ascending
        self.freed: list[int] = []
        self.events: list[OffloadingEvent] = []

    # -- bookkeeping -----------------------------------------------------
    def _tick(self) -> int:
        self.stamp += 1
        return self.stamp

    def _move(self, key: OffloadKey, where: str) -> None:
        rec = self.recs[key]
        rec.where = where
        rec.stamp = self._tick()

    def _members(self, where: str) -> list[OffloadKey]:
        keys = [k for k, r in self.recs.items() if r.where == where]
        return sorted(keys, key=lambda k: self.recs[k].stamp)

    def _size(self, where: str) -> int:
        return sum(1 for r in self.recs.values() if r.where == where)

    def _tracked(self, key: OffloadKey) -> Rec | None:
        rec = self.recs.get(key)
        return rec if rec is not None and rec.where in ("T1", "T2") else None

    def _t1_size(self) -> int:
        return self._size("T1")

    def _prefers_t1(self, virtual_t1: int) -> bool:
        return virtual_t1 >= int(self.target)

    def _ghost_of(self, where: str) -> str:
        return "B1" if where == "T1" else "B2"

    def _trim(self, ghosts: str) -> None:
        members = self._members(ghosts)
        for key in members[: max(0, len(members) - self.cap)]:
            del self.recs[key]

    def _b2_delta(self) -> float:
        return max(1.0, self._size("B1") / self._size("B2"))

    def _ghost_hit_moves(self) -> bool:
        return True

    def _choose(
        self, need: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, str]] | None:
        lists = {w: self._members(w) for w in ("T1", "T2")}
        virtual_t1 = self._t1_size()
        taken: list[tuple[OffloadKey, str]] = []
        used: set[OffloadKey] = set()
        for _ in range(need):
            order = ("T1", "T2") if self._prefers_t1(virtual_t1) else ("T2", "T1")
            pick: tuple[OffloadKey, str] | None = None
            for where in order:
                for key in lists[where]:
                    if (
                        key not in used
                        and key not in protected
                        and self.recs[key].ref == 0
                    ):
                        pick = (key, where)
                        break
                if pick is not None:
                    break
            if pick is None:
                return None
            taken.append(pick)
            used.add(pick[0])
            if pick[1] == "T1":
                virtual_t1 -= 1
        return taken

    def _touch(self, key: OffloadKey) -> None:
        rec = self.recs.get(key)
        if rec is None:
            return
        if rec.where == "T1":
            self._move(key, "T1" if rec.ref < 0 else "T2")
        elif rec.where == "T2":
            self._move(key, "T2")
        elif rec.where == "B1":
            delta = max(1.0, self._size("B2") / self._size("B1"))
            self.target = min(self.target + delta, float(self.cap))
            if self._ghost_hit_moves():
                self._move(key, "B1")
        else:
            self.target = max(self.target - self._b2_delta(), 0.0)
            if self._ghost_hit_moves():
                self._move(key, "B2")

    # -- contract --------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool:
        rec = self._tracked(key) if isinstance(key, bytes) else None
        return rec is not None and rec.ref >= 0

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
        new = [k for k in offered if self._tracked(k) is None]
        if not new:
            return PrepareStoreOutput((), cpu_spec([]), ())
        need = len(new) - len(self.unused) - len(self.freed)
        victims: list[OffloadKey] = []
        if need > 0:
            chosen = self._choose(need, set(offered))
            if chosen is None:
                return None
            for key, where in chosen:
                self.freed.append(self.recs[key].slot)
                self.recs[key] = Rec(self._ghost_of(where), self._tick())
                victims.append(key)
            self._trim("B1")
            self._trim("B2")
            self.events.append(event(victims, removed=True))
        slots = []
        for key in new:
            slot = self.unused.pop() if self.unused else self.freed.pop()
            self.recs[key] = Rec("T1", self._tick(), slot, -1)
            slots.append(slot)
        return PrepareStoreOutput(tuple(new), cpu_spec(slots), tuple(victims))

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        success: bool = True,
    ) -> None:
        uniq = dedup(as_key(k) for k in keys)
        for key in uniq:
            if self._tracked(key) is None:
                raise illegal(key, ABSENT, store_call(success))
        pending = [k for k in uniq if self.recs[k].ref < 0]
        for key in pending:
            if success:
                self.recs[key].ref = 0
            else:
                self.freed.append(self.recs.pop(key).slot)
        if success and pending:
            self.events.append(event(pending, removed=False))

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> LoadStoreSpec:
        seq = [as_key(k) for k in keys]
        for key in seq:
            rec = self._tracked(key)
            ref = None if rec is None else rec.ref
            if ref is None or ref < 0:
                raise illegal(key, phase_of_ref(ref), Call.PREPARE_LOAD)
        for key in seq:
            self.recs[key].ref += 1
        return cpu_spec(self.recs[k].slot for k in seq)

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> None:
        seq = [as_key(k) for k in keys]
        minus: dict[OffloadKey, int] = {}
        for key in seq:
            rec = self._tracked(key)
            ref = None if rec is None else rec.ref - minus.get(key, 0)
            if ref is None or ref < 1:
                raise illegal(key, phase_of_ref(ref), Call.COMPLETE_LOAD)
            minus[key] = minus.get(key, 0) + 1
        for key, n in minus.items():
            self.recs[key].ref -= n

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in reversed(list(keys)):
            if isinstance(key, bytes):
                self._touch(key)

    def reset_cache(self) -> None:
        refuse_reset_with_loads((k, r.ref) for k, r in self.recs.items())
        announced = sorted(
            (r.slot, k)
            for k, r in self.recs.items()
            if r.where in ("T1", "T2") and r.ref >= 0
        )
        self.recs.clear()
        self.target = 0.0
        self.unused = list(range(self.cap - 1, -1, -1))
        self.freed.clear()
        if announced:
            self.events.append(event([k for _, k in announced], removed=True))

    def take_events(self) -> Iterable[OffloadingEvent]:
        out, self.events = self.events, []
        return out


def make(num_blocks: int) -> OffloadingManager:
    return TaggedARC(num_blocks)


# -- defective twins -------------------------------------------------------


class B2DeltaInverted(TaggedARC):
    def _b2_delta(self) -> float:
        return max(
            1.0, self._size("B2") / self._size("B1") if self._size("B1") else 1.0
        )  # slip


class TrimsNewestGhost(TaggedARC):
    def _trim(self, ghosts: str) -> None:
        members = self._members(ghosts)
        for key in members[self.cap :]:  # slip: drops the most recent ghosts
            del self.recs[key]


class T2VictimsToB1(TaggedARC):
    def _ghost_of(self, where: str) -> str:
        return "B1"  # slip: every victim remembered in B1


class GhostHitStaysPut(TaggedARC):
    def _ghost_hit_moves(self) -> bool:
        return False  # slip: a ghost hit adapts the target but keeps its place


class VirtualT1CountsStored(TaggedARC):
    def _t1_size(self) -> int:
        # slip: T1's size taken as its stored members only (PENDING skipped)
        return sum(1 for r in self.recs.values() if r.where == "T1" and r.ref >= 0)


class TargetNotTruncated(TaggedARC):
    def _prefers_t1(self, virtual_t1: int) -> bool:
        return virtual_t1 >= self.target  # slip: compares with the float target


def make_b2_delta_inverted(num_blocks: int) -> OffloadingManager:
    return B2DeltaInverted(num_blocks)


def make_trims_newest_ghost(num_blocks: int) -> OffloadingManager:
    return TrimsNewestGhost(num_blocks)


def make_t2_victims_to_b1(num_blocks: int) -> OffloadingManager:
    return T2VictimsToB1(num_blocks)


def make_ghost_hit_stays_put(num_blocks: int) -> OffloadingManager:
    return GhostHitStaysPut(num_blocks)


def make_virtual_t1_counts_stored(num_blocks: int) -> OffloadingManager:
    return VirtualT1CountsStored(num_blocks)


def make_target_not_truncated(num_blocks: int) -> OffloadingManager:
    return TargetNotTruncated(num_blocks)
