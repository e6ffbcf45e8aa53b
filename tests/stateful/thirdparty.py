"""Third-party-style managers for the kit's acceptance tests.

Written from scratch against the public contract only (nothing here
subclasses or reuses ``kvoffload.impl``), the way an outside backend author
would write them:

- :class:`DictLRUManager`: a correct manager on today's key + request-context
  API (typed errors, exact LRU order, ``phase``/``slot_of`` introspection);
  :class:`CountingReuseFilter` a correct reuse filter in front of any manager.
- :class:`LegacyLRUManager`, :class:`LegacyARCManager`: correct managers on
  the block-hash-list API of vLLM 0.11–0.19 (``KeyError``/``assert`` for
  illegal calls, no ``reset_cache``), audited through
  :class:`~kvoffload.stateful.LegacyManagerAdapter`.
- Defective variants of each, one realistic slip apiece.

Every factory here takes ``num_blocks`` and enables events; the tables
:data:`MODERN_MANAGERS` and :data:`LEGACY_MANAGERS` say how each is audited
and, for the defective ones, which invariants may be reported.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import attrs

from kvoffload.spec.contract import (
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
)
from kvoffload.spec.errors import IllegalTransitionError
from kvoffload.spec.invariants import Invariant
from kvoffload.spec.keys import OffloadKey, validate_offload_key
from kvoffload.spec.lifecycle import ABSENT, PENDING, READY, Call, Phase, loading
from kvoffload.stateful import LegacyManagerAdapter, ReuseFilterParams

BLOCK_SIZE = 16
MEDIUM = "CPU"


class SlotSpec(LoadStoreSpec):
    """CPU slots, in order (``block_ids`` is what the kit reads)."""

    def __init__(self, block_ids: Iterable[int]) -> None:
        self.block_ids = tuple(block_ids)

    @staticmethod
    def medium() -> str:
        return MEDIUM


@attrs.define
class Entry:
    """One tracked block: its slot and ``ref_cnt`` (-1 pending, n loads)."""

    slot: int
    ref_cnt: int = -1


# --- today's API ---------------------------------------------------------------


class DictLRUManager(OffloadingManager):
    """A correct LRU manager: one ``OrderedDict`` holds recency (least recent
    first), slots come from a free list, illegal calls raise
    :class:`IllegalTransitionError` and change nothing."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.blocks: OrderedDict[OffloadKey, Entry] = OrderedDict()
        self.free_slots: list[int] = list(range(num_blocks))
        self.events: list[OffloadingEvent] = []

    # introspection for the kit (InspectableManager)
    def phase(self, key: OffloadKey) -> Phase:
        entry = self.blocks.get(key)
        if entry is None:
            return ABSENT
        if entry.ref_cnt < 0:
            return PENDING
        return READY if entry.ref_cnt == 0 else loading(entry.ref_cnt)

    def slot_of(self, key: OffloadKey) -> int | None:
        entry = self.blocks.get(key)
        return None if entry is None else entry.slot

    def _event(self, keys: Sequence[OffloadKey], removed: bool) -> None:
        self.events.append(OffloadingEvent(tuple(keys), BLOCK_SIZE, MEDIUM, removed))

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool:
        entry = self.blocks.get(key)
        return entry is not None and entry.ref_cnt >= 0

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> LoadStoreSpec:
        keys = list(keys)
        for key in keys:
            if not self.lookup(key, req_context):
                raise IllegalTransitionError(key, self.phase(key), Call.PREPARE_LOAD)
        for key in keys:
            self.blocks[key].ref_cnt += 1
        return self.spec_of([self.blocks[key].slot for key in keys])

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> None:
        keys = list(keys)
        remaining: Counter[OffloadKey] = Counter()
        for key in keys:
            entry = self.blocks.get(key)
            loads = entry.ref_cnt if entry is not None else 0
            if remaining[key] >= loads:
                raise IllegalTransitionError(key, self.phase(key), Call.COMPLETE_LOAD)
            remaining[key] += 1
        for key in keys:
            self.blocks[key].ref_cnt -= 1

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in reversed(list(keys)):
            if key in self.blocks:
                self.blocks.move_to_end(key)

    def victims(self, need: int, offered: Collection[OffloadKey]) -> list[OffloadKey] | None:
        """The ``need`` least recent READY keys not offered, or None."""
        chosen = [
            key
            for key, entry in self.blocks.items()
            if entry.ref_cnt == 0 and key not in offered
        ][:need]
        return chosen if len(chosen) == need else None

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        offered = [validate_offload_key(key) for key in keys]
        new = [key for key in dict.fromkeys(offered) if key not in self.blocks]
        evicted: list[OffloadKey] = []
        need = len(new) - len(self.free_slots)
        if need > 0:
            chosen = self.victims(need, set(offered))
            if chosen is None:
                return None
            for key in chosen:
                self.free_slots.append(self.blocks.pop(key).slot)
            self._event(chosen, removed=True)
            evicted = chosen
        slots = [self.take_free_slot() for _ in new]
        for key, slot in zip(new, slots):
            self.blocks[key] = Entry(slot)
        return PrepareStoreOutput(tuple(new), self.spec_of(slots), tuple(evicted))

    def take_free_slot(self) -> int:
        """The free slot the next new key gets (oldest freed first)."""
        return self.free_slots.pop(0)

    def spec_of(self, slots: list[int]) -> LoadStoreSpec:
        """The spec naming ``slots``, for stores and loads alike."""
        return SlotSpec(slots)

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        success: bool = True,
    ) -> None:
        unique = list(dict.fromkeys(keys))
        call = Call.COMPLETE_STORE_OK if success else Call.COMPLETE_STORE_FAILED
        for key in unique:
            if key not in self.blocks:
                raise IllegalTransitionError(key, ABSENT, call)
        pending = [key for key in unique if self.blocks[key].ref_cnt < 0]
        if success:
            for key in pending:
                self.blocks[key].ref_cnt = 0
            if pending:
                self._event(pending, removed=False)
        else:
            for key in pending:
                self.free_slots.append(self.blocks.pop(key).slot)

    def take_events(self) -> list[OffloadingEvent]:
        taken, self.events = self.events, []
        return taken

    def reset_cache(self) -> None:
        for key, entry in self.blocks.items():
            if entry.ref_cnt > 0:  # a load in flight still reads its slot
                raise IllegalTransitionError(key, self.phase(key), Call.RESET)
        readable = sorted((e.slot, k) for k, e in self.blocks.items() if e.ref_cnt >= 0)
        if readable:
            self._event([key for _, key in readable], removed=True)
        self.blocks.clear()
        self.free_slots = list(range(self.num_blocks))


class CountingReuseFilter(OffloadingManager):
    """A correct reuse filter: counts lookups in an LRU-bounded table and
    offers a key to ``backing`` once counted ``threshold`` times, or when
    ``backing`` already holds it ready (so it stays protected)."""

    def __init__(self, backing: OffloadingManager, threshold: int, table_size: int) -> None:
        self.backing = backing
        self.threshold = threshold
        self.table_size = table_size
        self.counts: OrderedDict[OffloadKey, int] = OrderedDict()

    def phase(self, key: OffloadKey) -> Phase:
        return self.backing.phase(key)  # type: ignore[attr-defined,no-any-return]

    def slot_of(self, key: OffloadKey) -> int | None:
        return self.backing.slot_of(key)  # type: ignore[attr-defined,no-any-return]

    def count(self, key: OffloadKey) -> None:
        if key in self.counts:
            self.counts.move_to_end(key)
            self.counts[key] += 1
            return
        if len(self.counts) >= self.table_size:
            self.counts.popitem(last=False)
        self.counts[key] = 1

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        self.count(key)
        return self.backing.lookup(key, req_context)

    def lookup_prefix(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> int | None:
        keys = list(keys)
        for key in keys:
            self.count(key)
        return self.backing.lookup_prefix(keys, req_context)

    def admitted(self, key: OffloadKey, req_context: ReqContext) -> bool:
        return (
            self.counts.get(key, 0) >= self.threshold
            or self.backing.lookup(key, req_context) is True
        )

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        offered = [validate_offload_key(key) for key in keys]
        passed = [key for key in offered if self.admitted(key, req_context)]
        return self.backing.prepare_store(passed, req_context)

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        return self.backing.prepare_load(keys, req_context)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.backing.touch(keys, req_context)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.backing.complete_load(keys, req_context)

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        self.backing.complete_store(keys, req_context, success)

    def take_events(self) -> Iterable[OffloadingEvent]:
        return self.backing.take_events()

    def reset_cache(self) -> None:
        self.backing.reset_cache()
        self.counts.clear()


# --- defective variants of today's API --------------------------------------


class ScanAllLRUManager(DictLRUManager):
    """Defect: the victim scan forgets to skip blocks that are not READY, so a
    store evicts a block still being written or read."""

    def victims(self, need: int, offered: Collection[OffloadKey]) -> list[OffloadKey] | None:
        chosen = [key for key in self.blocks if key not in offered][:need]
        return chosen if len(chosen) == need else None


class UnprotectedLRUManager(DictLRUManager):
    """Defect: the victim scan ignores the offered keys, so a store may evict
    a key it was just asked to keep."""

    def victims(self, need: int, offered: Collection[OffloadKey]) -> list[OffloadKey] | None:
        chosen = [key for key, entry in self.blocks.items() if entry.ref_cnt == 0][:need]
        return chosen if len(chosen) == need else None


class AnnouncesFailedStoresManager(DictLRUManager):
    """Defect: ``complete_store`` announces every key it is given, including
    those whose store failed (a consumer then believes they are readable)."""

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        success: bool = True,
    ) -> None:
        pending = [k for k in dict.fromkeys(keys) if k in self.blocks and self.blocks[k].ref_cnt < 0]
        super().complete_store(keys, req_context, success)
        if pending and not success:
            self._event(pending, removed=False)


class UntypedErrorsManager(DictLRUManager):
    """Defect: illegal loads fail with a bare ``KeyError``/``assert`` instead
    of the contract's :class:`IllegalTransitionError`."""

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> LoadStoreSpec:
        keys = list(keys)
        for key in keys:
            entry = self.blocks[key]  # KeyError for an ABSENT key
            if entry.ref_cnt < 0:
                raise AssertionError("block is not ready")
        for key in keys:
            self.blocks[key].ref_cnt += 1
        return SlotSpec(self.blocks[key].slot for key in keys)


class ThresholdOnlyFilter(CountingReuseFilter):
    """Defect: the filter offers only keys counted often enough and drops the
    rest, even keys the backing manager holds ready, which then lose their
    protection from this store's evictions."""

    def admitted(self, key: OffloadKey, req_context: ReqContext) -> bool:
        return self.counts.get(key, 0) >= self.threshold


# --- the legacy block-hash-list API (vLLM 0.11-0.19) ---------------------


@attrs.frozen
class LegacyStoreOutput:
    block_hashes_to_store: list[bytes]
    store_spec: SlotSpec
    block_hashes_evicted: list[bytes]


@attrs.frozen
class LegacyEvent:
    block_hashes: list[bytes]
    block_size: int
    medium: str
    removed: bool


class LegacyLRUManager:
    """A correct LRU manager on the block-hash-list API, in the style of the
    older references: ``assert``/``KeyError`` for illegal calls, no
    ``reset_cache``."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.blocks: OrderedDict[bytes, Entry] = OrderedDict()
        self.free_slots: list[int] = list(range(num_blocks))
        self.events: list[LegacyEvent] = []

    def lookup(self, block_hashes: Iterable[bytes]) -> int:
        hits = 0
        for block_hash in block_hashes:
            entry = self.blocks.get(block_hash)
            if entry is None or entry.ref_cnt < 0:
                break
            hits += 1
        return hits

    def prepare_load(self, block_hashes: Iterable[bytes]) -> SlotSpec:
        hashes = list(block_hashes)
        for block_hash in hashes:
            assert self.blocks[block_hash].ref_cnt >= 0, "block is not ready"
        for block_hash in hashes:
            self.blocks[block_hash].ref_cnt += 1
        return SlotSpec(self.blocks[h].slot for h in hashes)

    def touch(self, block_hashes: Iterable[bytes]) -> None:
        for block_hash in reversed(list(block_hashes)):
            if block_hash in self.blocks:
                self.blocks.move_to_end(block_hash)

    def complete_load(self, block_hashes: Iterable[bytes]) -> None:
        hashes = list(block_hashes)
        for block_hash, releases in Counter(hashes).items():  # check all, then change
            assert self.blocks[block_hash].ref_cnt >= releases, "no load in flight"
        for block_hash in hashes:
            self.blocks[block_hash].ref_cnt -= 1

    def choose_victims(self, need: int, offered: set[bytes]) -> list[bytes] | None:
        chosen = [
            h for h, entry in self.blocks.items() if entry.ref_cnt == 0 and h not in offered
        ][:need]
        return chosen if len(chosen) == need else None

    def forget(self, block_hash: bytes) -> None:
        """Drop an evicted or failed block (subclasses keep history here)."""
        self.free_slots.append(self.blocks.pop(block_hash).slot)

    def admit(self, block_hash: bytes, slot: int) -> None:
        self.blocks[block_hash] = Entry(slot)

    def prepare_store(self, block_hashes: Iterable[bytes]) -> LegacyStoreOutput | None:
        hashes = list(block_hashes)
        new = [h for h in dict.fromkeys(hashes) if h not in self.blocks]
        need = len(new) - len(self.free_slots)
        evicted: list[bytes] = []
        if need > 0:
            chosen = self.choose_victims(need, set(hashes))
            if chosen is None:
                return None
            for block_hash in chosen:
                self.forget(block_hash)
            self.events.append(LegacyEvent(chosen, BLOCK_SIZE, MEDIUM, True))
            evicted = chosen
        slots = [self.free_slots.pop(0) for _ in new]
        for block_hash, slot in zip(new, slots):
            self.admit(block_hash, slot)
        return LegacyStoreOutput(new, SlotSpec(slots), evicted)

    def complete_store(self, block_hashes: Iterable[bytes], success: bool = True) -> None:
        hashes = list(dict.fromkeys(block_hashes))
        entries = [self.blocks[h] for h in hashes]  # KeyError for an unknown hash
        pending = [h for h, entry in zip(hashes, entries) if entry.ref_cnt < 0]
        if success:
            for block_hash in pending:
                self.blocks[block_hash].ref_cnt = 0
            if pending:
                self.events.append(LegacyEvent(pending, BLOCK_SIZE, MEDIUM, False))
        else:
            for block_hash in pending:
                self.forget(block_hash)

    def take_events(self) -> Iterable[LegacyEvent]:
        taken, self.events = self.events, []
        yield from taken


class LegacyARCManager(LegacyLRUManager):
    """A correct ARC manager on the legacy API (audited as ``policy="any"``):
    T1/T2 recency lists, ghost lists B1/B2, adaptive target; a victim is taken
    from the other list when the preferred one has none."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.t2: set[bytes] = set()  # members of self.blocks that are in T2
        self.b1: OrderedDict[bytes, None] = OrderedDict()
        self.b2: OrderedDict[bytes, None] = OrderedDict()
        self.target_t1 = 0.0

    def t_lists(self) -> tuple[list[bytes], list[bytes]]:
        t1 = [h for h in self.blocks if h not in self.t2]
        t2 = [h for h in self.blocks if h in self.t2]
        return t1, t2

    def touch(self, block_hashes: Iterable[bytes]) -> None:
        for block_hash in reversed(list(block_hashes)):
            entry = self.blocks.get(block_hash)
            if entry is not None:
                if entry.ref_cnt >= 0:
                    self.t2.add(block_hash)
                self.blocks.move_to_end(block_hash)
            elif block_hash in self.b1:
                self.target_t1 = min(
                    self.target_t1 + max(1.0, len(self.b2) / len(self.b1)), self.num_blocks
                )
            elif block_hash in self.b2:
                self.target_t1 = max(self.target_t1 - max(1.0, len(self.b1) / len(self.b2)), 0)

    def oldest_evictable(
        self, order: list[bytes], offered: set[bytes], taken: list[bytes]
    ) -> bytes | None:
        for block_hash in order:
            if (
                self.blocks[block_hash].ref_cnt == 0
                and block_hash not in offered
                and block_hash not in taken
            ):
                return block_hash
        return None

    def preferred_lists(self, t1_size: int) -> tuple[list[bytes], list[bytes]]:
        t1, t2 = self.t_lists()
        return (t1, t2) if t1_size >= int(self.target_t1) else (t2, t1)

    def choose_victims(self, need: int, offered: set[bytes]) -> list[bytes] | None:
        t1_size = len(self.t_lists()[0])
        chosen: list[bytes] = []
        while len(chosen) < need:
            preferred, other = self.preferred_lists(t1_size)
            victim = self.oldest_evictable(preferred, offered, chosen)
            if victim is None:
                victim = self.oldest_evictable(other, offered, chosen)
            if victim is None:
                return None
            if victim not in self.t2:
                t1_size -= 1
            chosen.append(victim)
        return chosen

    def forget(self, block_hash: bytes) -> None:
        ghost = self.b2 if block_hash in self.t2 else self.b1
        if self.blocks[block_hash].ref_cnt >= 0:  # evicted, not a failed store
            ghost[block_hash] = None
            while len(ghost) > self.num_blocks:
                ghost.popitem(last=False)
        self.t2.discard(block_hash)
        super().forget(block_hash)

    def admit(self, block_hash: bytes, slot: int) -> None:
        self.b1.pop(block_hash, None)
        self.b2.pop(block_hash, None)
        super().admit(block_hash, slot)


# --- defective variants of the legacy API -----------------------------------


class LegacyRefusingARCManager(LegacyARCManager):
    """Defect (vLLM 0.19's ARC): when the preferred list has no
    evictable block the store is refused, though the other list has one."""

    def choose_victims(self, need: int, offered: set[bytes]) -> list[bytes] | None:
        t1_size = len(self.t_lists()[0])
        chosen: list[bytes] = []
        while len(chosen) < need:
            preferred, _ = self.preferred_lists(t1_size)
            victim = self.oldest_evictable(preferred, offered, chosen)
            if victim is None:
                return None
            if victim not in self.t2:
                t1_size -= 1
            chosen.append(victim)
        return chosen


class LegacyEvictsReadersManager(LegacyLRUManager):
    """Defect: eviction tests ``ref_cnt <= 0`` ("not being read") and so also
    takes PENDING blocks whose store is still in flight."""

    def choose_victims(self, need: int, offered: set[bytes]) -> list[bytes] | None:
        chosen = [
            h for h, entry in self.blocks.items() if entry.ref_cnt <= 0 and h not in offered
        ][:need]
        return chosen if len(chosen) == need else None


class LegacyPendingHitsManager(LegacyLRUManager):
    """Defect: ``lookup`` counts every tracked block as a hit, including those
    whose store has not completed."""

    def lookup(self, block_hashes: Iterable[bytes]) -> int:
        hits = 0
        for block_hash in block_hashes:
            if block_hash not in self.blocks:
                break
            hits += 1
        return hits


class LegacySilentFailureManager(LegacyLRUManager):
    """Defect: a failed store marks the blocks READY anyway (no event), as if
    ``success`` were ignored on the failure path."""

    def complete_store(self, block_hashes: Iterable[bytes], success: bool = True) -> None:
        if success:
            super().complete_store(block_hashes, success)
            return
        for block_hash in dict.fromkeys(block_hashes):
            entry = self.blocks[block_hash]
            if entry.ref_cnt < 0:
                entry.ref_cnt = 0


# --- how each is audited ------------------------------------------------------

ModernFactory = Callable[[int], OffloadingManager]
FILTER = ReuseFilterParams(store_threshold=2, max_tracker_size=4)
"""A table smaller than the kit's 6 keys by two, so a stored key's count can
fall out of it within the default budget (with 5 the protection defect is
not reached; docs/KIT.md)."""


def dict_lru(num_blocks: int) -> OffloadingManager:
    return DictLRUManager(num_blocks)


def scan_all_lru(num_blocks: int) -> OffloadingManager:
    return ScanAllLRUManager(num_blocks)


def unprotected_lru(num_blocks: int) -> OffloadingManager:
    return UnprotectedLRUManager(num_blocks)


def announces_failed_stores(num_blocks: int) -> OffloadingManager:
    return AnnouncesFailedStoresManager(num_blocks)


def untyped_errors(num_blocks: int) -> OffloadingManager:
    return UntypedErrorsManager(num_blocks)


def counting_filter(num_blocks: int) -> OffloadingManager:
    return CountingReuseFilter(
        DictLRUManager(num_blocks), FILTER.store_threshold, FILTER.max_tracker_size
    )


def threshold_only_filter(num_blocks: int) -> OffloadingManager:
    return ThresholdOnlyFilter(
        DictLRUManager(num_blocks), FILTER.store_threshold, FILTER.max_tracker_size
    )


def legacy(cls: Callable[[int], Any], name: str) -> ModernFactory:
    """A factory presenting ``cls(num_blocks)`` through the adapter, known
    (in replay scripts) as this module's attribute ``name``."""

    def factory(num_blocks: int) -> OffloadingManager:
        return LegacyManagerAdapter(cls(num_blocks))

    factory.__name__ = factory.__qualname__ = name
    return factory


legacy_lru = legacy(LegacyLRUManager, "legacy_lru")
legacy_arc = legacy(LegacyARCManager, "legacy_arc")
legacy_refusing_arc = legacy(LegacyRefusingARCManager, "legacy_refusing_arc")
legacy_evicts_readers = legacy(LegacyEvictsReadersManager, "legacy_evicts_readers")
legacy_pending_hits = legacy(LegacyPendingHitsManager, "legacy_pending_hits")
legacy_silent_failure = legacy(LegacySilentFailureManager, "legacy_silent_failure")


@attrs.frozen
class ThirdParty:
    """One row of the acceptance table: how to audit a factory, and (for a
    defective one) the invariants a correct finding may name."""

    name: str
    api: str
    factory: ModernFactory
    policy: str
    defect: str | None = None
    invariants: frozenset[Invariant] = frozenset()
    reuse_filter: ReuseFilterParams | None = None

    @property
    def legacy(self) -> bool:
        return self.api == "legacy"

    @property
    def import_path(self) -> str:
        return f"tests.stateful.thirdparty:{self.factory.__name__}"


EVICTION = frozenset({Invariant.EVICTION})

THIRD_PARTY: tuple[ThirdParty, ...] = (
    ThirdParty("DictLRUManager", "key+ctx", dict_lru, "lru"),
    ThirdParty("DictLRUManager as any", "key+ctx", dict_lru, "any"),
    ThirdParty("CountingReuseFilter(DictLRU)", "key+ctx", counting_filter, "lru", reuse_filter=FILTER),
    ThirdParty("LegacyLRUManager", "legacy", legacy_lru, "lru"),
    ThirdParty("LegacyARCManager", "legacy", legacy_arc, "any"),
    ThirdParty(
        "ScanAllLRUManager", "key+ctx", scan_all_lru, "any",
        "evicts PENDING/LOADING blocks", EVICTION,
    ),
    ThirdParty(
        "UnprotectedLRUManager", "key+ctx", unprotected_lru, "any",
        "evicts keys offered to the same store", EVICTION,
    ),
    ThirdParty(
        "AnnouncesFailedStoresManager", "key+ctx", announces_failed_stores, "lru",
        "stored event for a failed store", frozenset({Invariant.EVENTS}),
    ),
    ThirdParty(
        "UntypedErrorsManager", "key+ctx", untyped_errors, "lru",
        "KeyError/AssertionError for illegal loads", frozenset({Invariant.ERRORS}),
    ),
    ThirdParty(
        "ThresholdOnlyFilter(DictLRU)", "key+ctx", threshold_only_filter, "lru",
        "filter drops protection of stored keys", frozenset({Invariant.PROTECTION, Invariant.EVICTION}),
        FILTER,
    ),
    ThirdParty(
        "LegacyRefusingARCManager", "legacy", legacy_refusing_arc, "any",
        "refuses when the preferred ARC list has no victim", frozenset({Invariant.LIVENESS}),
    ),
    ThirdParty(
        "LegacyEvictsReadersManager", "legacy", legacy_evicts_readers, "any",
        "evicts PENDING blocks (ref_cnt <= 0)", EVICTION,
    ),
    ThirdParty(
        "LegacyPendingHitsManager", "legacy", legacy_pending_hits, "lru",
        "lookup counts PENDING blocks as hits", frozenset({Invariant.LOOKUP}),
    ),
    ThirdParty(
        "LegacySilentFailureManager", "legacy", legacy_silent_failure, "lru",
        "failed store leaves the block READY",
        # the kit also makes illegal calls of legacy managers now: loading
        # the failed key is accepted
        frozenset({
            Invariant.LOOKUP, Invariant.EVICTION, Invariant.LIVENESS, Invariant.EVENTS,
            Invariant.STORE_SPEC, Invariant.ERRORS,
        }),
    ),
)
