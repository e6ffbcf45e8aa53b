"""Design D: a slab of slots swept by a CLOCK hand (second-chance eviction).

``slab[slot]`` holds the key stored there (or None); per-key state lives in
``state[key] = [slot, ref, referenced]``. A touch sets the referenced bit;
the hand clears bits as it sweeps and takes the first eligible slot whose
bit is clear. The sweep is simulated on a copy and committed only when it
found enough victims. The order is CLOCK's own, so it is audited as "any".
Store specs are the design's own ``SlabSpec`` (block ids, medium "CPU").
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from kvoffload import (
    BlockIDsLoadStoreSpec,
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
    dedup,
    event,
    illegal,
    phase_of_ref,
    refuse_reset_with_loads,
    store_call,
    validated,
)


class SlabSpec(BlockIDsLoadStoreSpec):
    """Slots of the CLOCK slab."""

    @staticmethod
    def medium() -> str:
        return "CPU"


class ClockSlab(OffloadingManager):
    def __init__(self, num_blocks: int) -> None:
        self.n = check_size(num_blocks)
        self.slab: list[OffloadKey | None] = [None] * num_blocks
        self.state: dict[OffloadKey, list[int]] = {}  # key -> [slot, ref, referenced]
        self.hand = 0
        self.untouched_from = 0  # slots >= this were never handed out
        self.recycled: list[int] = []
        self.out: list[OffloadingEvent] = []

    # -- slots -----------------------------------------------------------
    def _free_count(self) -> int:
        return self.n - self.untouched_from + len(self.recycled)

    def _alloc(self) -> int:
        if self.untouched_from < self.n:
            self.untouched_from += 1
            return self.untouched_from - 1
        return self.recycled.pop()

    def _release(self, key: OffloadKey) -> None:
        slot = self.state.pop(key)[0]
        self.slab[slot] = None
        self.recycled.append(slot)

    # -- CLOCK -----------------------------------------------------------
    def _sweep_limit(self) -> int:
        return 2 * self.n  # one pass clears every bit, the second finds a victim

    def _need(self, new: int) -> int:
        return new - self._free_count()

    def _sweep(self, need: int, protected: set[OffloadKey]) -> list[OffloadKey] | None:
        bits = {k: s[2] for k, s in self.state.items()}
        hand = self.hand
        victims: list[OffloadKey] = []
        for _ in range(self._sweep_limit()):
            if len(victims) == need:
                break
            key = self.slab[hand]
            hand = (hand + 1) % self.n
            if (
                key is None
                or key in protected
                or key in victims
                or self.state[key][1] != 0
            ):
                continue
            if bits[key]:
                bits[key] = 0
                continue
            victims.append(key)
        if len(victims) < need:
            return None
        self.hand = hand
        for key, bit in bits.items():
            self.state[key][2] = bit
        return victims

    # -- contract --------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool:
        entry = self.state.get(key) if isinstance(key, bytes) else None
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
        new = [k for k in offered if k not in self.state]
        if not new:
            return PrepareStoreOutput((), SlabSpec([]), ())
        need = self._need(len(new))
        victims: list[OffloadKey] = []
        if need > 0:
            swept = self._sweep(need, set(offered))
            if swept is None:
                return None
            victims = swept
            for key in victims:
                self._release(key)
            self.out.append(event(victims, removed=True))
        slots = []
        for key in new:
            slot = self._alloc()
            self.slab[slot] = key
            self.state[key] = [slot, -1, 0]
            slots.append(slot)
        return PrepareStoreOutput(tuple(new), SlabSpec(slots), tuple(victims))

    def _stored(self, uniq: list[OffloadKey]) -> list[OffloadKey]:
        done = [k for k in uniq if self.state[k][1] == -1]
        for key in done:
            self.state[key][1] = 0
        return done

    def _fail(self, key: OffloadKey) -> None:
        self._release(key)

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        success: bool = True,
    ) -> None:
        uniq = dedup(as_key(k) for k in keys)
        for key in uniq:
            if key not in self.state:
                raise illegal(key, ABSENT, store_call(success))
        if success:
            done = self._stored(uniq)
            if done:
                self.out.append(event(done, removed=False))
        else:
            for key in uniq:
                if self.state[key][1] == -1:
                    self._fail(key)

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> LoadStoreSpec:
        seq = [as_key(k) for k in keys]
        for key in seq:
            entry = self.state.get(key)
            ref = None if entry is None else entry[1]
            if ref is None or ref < 0:
                raise illegal(key, phase_of_ref(ref), Call.PREPARE_LOAD)
        for key in seq:
            self.state[key][1] += 1
        return SlabSpec([self.state[k][0] for k in seq])

    def _unload(self, key: OffloadKey, times: int) -> None:
        self.state[key][1] -= times

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> None:
        seq = [as_key(k) for k in keys]
        used: dict[OffloadKey, int] = {}
        for key in seq:
            entry = self.state.get(key)
            ref = None if entry is None else entry[1] - used.get(key, 0)
            if ref is None or ref < 1:
                raise illegal(key, phase_of_ref(ref), Call.COMPLETE_LOAD)
            used[key] = used.get(key, 0) + 1
        for key, times in used.items():
            self._unload(key, times)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in keys:  # order is irrelevant to CLOCK: a bit per key
            entry = self.state.get(key) if isinstance(key, bytes) else None
            if entry is not None:
                entry[2] = 1

    def reset_cache(self) -> None:
        refuse_reset_with_loads((k, st[1]) for k, st in self.state.items())
        readable = [k for k in self.slab if k is not None and self.state[k][1] >= 0]
        self.slab = [None] * self.n
        self.state.clear()
        self.hand = 0
        self.untouched_from = 0
        self.recycled.clear()
        if readable:
            self.out.append(event(readable, removed=True))

    def take_events(self) -> Iterable[OffloadingEvent]:
        taken, self.out = self.out, []
        return taken


def make(num_blocks: int) -> OffloadingManager:
    return ClockSlab(num_blocks)


# -- defective twins -------------------------------------------------------


class SinglePass(ClockSlab):
    def _sweep_limit(self) -> int:
        return self.n  # slip: one revolution, so all-referenced means "no room"


class EvictsForWholeBatch(ClockSlab):
    def _need(self, new: int) -> int:
        free = self._free_count()
        return new if new > free else 0  # slip: evicts for every new key once short


class UnloadClearsAllLoads(ClockSlab):
    def _unload(self, key: OffloadKey, times: int) -> None:
        self.state[key][1] = 0  # slip: any complete_load makes the block READY


class FirstEmptySlot(ClockSlab):
    def _alloc(self) -> int:
        slot = self.slab.index(None)  # slip: lowest empty slot, not the backend's order
        if slot >= self.untouched_from:
            self.untouched_from = slot + 1
        elif slot in self.recycled:
            self.recycled.remove(slot)
        return slot


class ReannouncesStored(ClockSlab):
    def _stored(self, uniq: list[OffloadKey]) -> list[OffloadKey]:
        for key in uniq:  # slip: READY/LOADING keys announced again
            if self.state[key][1] == -1:
                self.state[key][1] = 0
        return uniq


class DoubleFreeOnFailure(ClockSlab):
    def _fail(self, key: OffloadKey) -> None:
        slot = self.state[key][0]
        self._release(key)
        self.recycled.append(slot)  # slip: the slot is freed twice


class PrefixCountsAllHits(ClockSlab):
    def lookup_prefix(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> int:
        return sum(self.lookup(k, req_context) for k in keys)  # slip: not a prefix


def make_prefix_counts_all_hits(num_blocks: int) -> OffloadingManager:
    return PrefixCountsAllHits(num_blocks)


def make_single_pass(num_blocks: int) -> OffloadingManager:
    return SinglePass(num_blocks)


def make_evicts_for_whole_batch(num_blocks: int) -> OffloadingManager:
    return EvictsForWholeBatch(num_blocks)


def make_unload_clears_all_loads(num_blocks: int) -> OffloadingManager:
    return UnloadClearsAllLoads(num_blocks)


def make_first_empty_slot(num_blocks: int) -> OffloadingManager:
    return FirstEmptySlot(num_blocks)


def make_reannounces_stored(num_blocks: int) -> OffloadingManager:
    return ReannouncesStored(num_blocks)


def make_double_free_on_failure(num_blocks: int) -> OffloadingManager:
    return DoubleFreeOnFailure(num_blocks)
