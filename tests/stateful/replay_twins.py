"""Defective managers and correct twins for the replay tests: each defect
has a twin that keeps the specification as the defect's base class does,
and a *fixed* version that also makes other legal choices (the highest free
slot first, the most recent READY victim under policy ``any``, ``None``
lookups for keys still being stored), which a replay must not hold against
it."""

from __future__ import annotations

from collections.abc import Collection

from kvoffload.spec.contract import OffloadingManager, ReqContext
from kvoffload.spec.keys import OffloadKey
from tests.stateful.thirdparty import DictLRUManager


class HighSlotsLRU(DictLRUManager):
    """Correct: LRU, but each new key takes the highest free slot."""

    def take_free_slot(self) -> int:
        slot = max(self.free_slots)
        self.free_slots.remove(slot)
        return slot


class MostRecentVictims(HighSlotsLRU):
    """Correct under policy ``any``: evicts the most recent READY keys not
    offered (a legal victim choice, not LRU's)."""

    def victims(self, need: int, offered: Collection[OffloadKey]) -> list[OffloadKey] | None:
        chosen = [
            key
            for key, entry in reversed(self.blocks.items())
            if entry.ref_cnt == 0 and key not in offered
        ][:need]
        return chosen if len(chosen) == need else None


class RetriesPending(HighSlotsLRU):
    """Correct: a key whose store is in flight answers ``None`` ("ask
    again") instead of ``False``."""

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:  # type: ignore[override]
        entry = self.blocks.get(key)
        if entry is not None and entry.ref_cnt < 0:
            return None
        return super().lookup(key, req_context)


class Unprotected(DictLRUManager):
    """Defect: a store may evict a key it was asked to keep."""

    def victims(self, need: int, offered: Collection[OffloadKey]) -> list[OffloadKey] | None:
        chosen = [key for key, entry in self.blocks.items() if entry.ref_cnt == 0][:need]
        return chosen if len(chosen) == need else None


class TouchOrderSlip(DictLRUManager):
    """Defect: ``touch`` leaves the *last* key most recent, not the first."""

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in keys:
            if key in self.blocks:
                self.blocks.move_to_end(key)


class CrashesOnAbsentTouch(DictLRUManager):
    """Defect: touching a key it does not hold raises ``KeyError``."""

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in reversed(list(keys)):
            self.blocks.move_to_end(key)


class AcceptsBadLoad(DictLRUManager):
    """Defect: ``prepare_load`` of a key it does not hold returns an empty
    spec instead of raising."""

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext):  # type: ignore[no-untyped-def]
        if any(key not in self.blocks for key in keys):
            return self.spec_of([])
        return super().prepare_load(keys, req_context)


class PendingHits(DictLRUManager):
    """Defect: a key whose store is in flight answers ``True``."""

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool:
        return key in self.blocks


class AnnouncesFailedStores(DictLRUManager):
    """Defect: a failed store is announced as stored."""

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        pending = [k for k in dict.fromkeys(keys) if k in self.blocks and self.blocks[k].ref_cnt < 0]
        super().complete_store(keys, req_context, success)
        if pending and not success:
            self._event(pending, removed=False)


def correct(num_blocks: int) -> OffloadingManager:
    return DictLRUManager(num_blocks)


def high_slots(num_blocks: int) -> OffloadingManager:
    return HighSlotsLRU(num_blocks)


def most_recent_victims(num_blocks: int) -> OffloadingManager:
    return MostRecentVictims(num_blocks)


def retries_pending(num_blocks: int) -> OffloadingManager:
    return RetriesPending(num_blocks)


def unprotected(num_blocks: int) -> OffloadingManager:
    return Unprotected(num_blocks)


def touch_order_slip(num_blocks: int) -> OffloadingManager:
    return TouchOrderSlip(num_blocks)


def crashes_on_absent_touch(num_blocks: int) -> OffloadingManager:
    return CrashesOnAbsentTouch(num_blocks)


def accepts_bad_load(num_blocks: int) -> OffloadingManager:
    return AcceptsBadLoad(num_blocks)


def pending_hits(num_blocks: int) -> OffloadingManager:
    return PendingHits(num_blocks)


def announces_failed_stores(num_blocks: int) -> OffloadingManager:
    return AnnouncesFailedStores(num_blocks)


class EvictsReaders(DictLRUManager):
    """Defect: a block being loaded may be evicted."""

    def victims(self, need: int, offered: Collection[OffloadKey]) -> list[OffloadKey] | None:
        chosen = [k for k, e in self.blocks.items() if e.ref_cnt >= 0 and k not in offered][:need]
        return chosen if len(chosen) == need else None


def evicts_readers(num_blocks: int) -> OffloadingManager:
    return EvictsReaders(num_blocks)
