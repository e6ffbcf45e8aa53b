"""Design F: my own reuse filter (docs/SPEC.md §7) in front of the library's
``CPUOffloadingManager`` (LRU). Audited with ``--reuse-threshold``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable

from kvoffload import (
    ConfigurationError,
    CPUOffloadingManager,
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)

from ._common import BLOCK_SIZE, dedup, validated


class ReuseGate(OffloadingManager):
    def __init__(
        self, backing: OffloadingManager, threshold: int = 2, table_size: int = 64000
    ) -> None:
        if threshold < 2 or table_size < 1:
            raise ConfigurationError(
                f"bad reuse gate: threshold={threshold} size={table_size}"
            )
        self.backing = backing
        self.threshold = threshold
        self.table_size = table_size
        self.counts: OrderedDict[OffloadKey, int] = OrderedDict()

    def _record(self, key: OffloadKey) -> None:
        if key in self.counts:
            self.counts.move_to_end(key)
            self.counts[key] += 1
            return
        if len(self.counts) >= self.table_size:
            self.counts.popitem(last=False)
        self.counts[key] = 1

    def _reused(self, key: OffloadKey) -> bool:
        return self.counts.get(key, 0) >= self.threshold

    def _passed(
        self, offered: list[OffloadKey], req_context: ReqContext
    ) -> list[OffloadKey]:
        return [
            k for k in offered if self._reused(k) or self.backing.lookup(k, req_context)
        ]

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        self._record(key)
        return self.backing.lookup(key, req_context)

    def lookup_prefix(
        self, keys: Iterable[OffloadKey], req_context: ReqContext
    ) -> int | None:
        seq = list(keys)
        for key in seq:
            self._record(key)
        return self.backing.lookup_prefix(seq, req_context)

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        offered = dedup(self._validate(keys))
        return self.backing.prepare_store(
            self._passed(offered, req_context), req_context
        )

    def _validate(self, keys: Collection[OffloadKey]) -> list[OffloadKey]:
        return validated(keys)

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        success: bool = True,
    ) -> None:
        self.backing.complete_store(keys, req_context, success)

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> LoadStoreSpec:
        return self.backing.prepare_load(keys, req_context)

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> None:
        self.backing.complete_load(keys, req_context)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.backing.touch(keys, req_context)

    def reset_cache(self) -> None:
        self.backing.reset_cache()
        self.counts.clear()

    def take_events(self) -> Iterable[OffloadingEvent]:
        return self.backing.take_events()

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return self.backing.on_new_request(req_context)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.backing.on_request_finished(req_context)

    def on_schedule_end(self) -> None:
        self.backing.on_schedule_end()

    def shutdown(self) -> None:
        self.backing.shutdown()


def _lru(num_blocks: int) -> OffloadingManager:
    return CPUOffloadingManager(
        block_size=BLOCK_SIZE,
        num_blocks=num_blocks,
        cache_policy="lru",
        enable_events=True,
    )


def make(num_blocks: int) -> OffloadingManager:
    return ReuseGate(_lru(num_blocks), threshold=2)


def make_threshold3(num_blocks: int) -> OffloadingManager:
    return ReuseGate(_lru(num_blocks), threshold=3)


SMALL_TABLE = 3


def make_small_table(num_blocks: int) -> OffloadingManager:
    return ReuseGate(_lru(num_blocks), threshold=2, table_size=SMALL_TABLE)


# -- defective twins -------------------------------------------------------


class ForgetsProtection(ReuseGate):
    def _passed(
        self, offered: list[OffloadKey], req_context: ReqContext
    ) -> list[OffloadKey]:
        return [
            k for k in offered if self._reused(k)
        ]  # slip: stored keys not passed on


class DropsNewestWhenFull(ReuseGate):
    def _record(self, key: OffloadKey) -> None:
        if key not in self.counts and len(self.counts) >= self.table_size:
            self.counts.popitem()  # slip: drops the most recently seen entry
            self.counts[key] = 1
            return
        super()._record(key)


class RecountKeepsPlace(ReuseGate):
    def _record(self, key: OffloadKey) -> None:
        if key in self.counts:
            self.counts[key] += 1  # slip: a recount does not refresh its place
            return
        super()._record(key)


class PrefixStopsAtMiss(ReuseGate):
    def lookup_prefix(
        self, keys: Iterable[OffloadKey], req_context: ReqContext
    ) -> int | None:
        hits = 0
        for key in keys:  # slip: counting stops at the first miss
            self._record(key)
            if not self.backing.lookup(key, req_context):
                break
            hits += 1
        return hits


class StoreCountsOffers(ReuseGate):
    def _passed(
        self, offered: list[OffloadKey], req_context: ReqContext
    ) -> list[OffloadKey]:
        passed = super()._passed(offered, req_context)
        for key in offered:  # slip: an offer counts as a use
            self._record(key)
        return passed


class ThresholdStrict(ReuseGate):
    def _reused(self, key: OffloadKey) -> bool:
        return self.counts.get(key, 0) > self.threshold  # slip: '>' for '>='


class ResetKeepsCounts(ReuseGate):
    def reset_cache(self) -> None:
        self.backing.reset_cache()  # slip: the table survives a reset


class ValidatesPassedOnly(ReuseGate):
    def _validate(self, keys: Collection[OffloadKey]) -> list[OffloadKey]:
        return [
            k for k in keys if isinstance(k, bytes)
        ]  # slip: relies on the backing to validate


class LookupNotCounted(ReuseGate):
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        return self.backing.lookup(key, req_context)  # slip: only lookup_prefix counts


def make_forgets_protection(num_blocks: int) -> OffloadingManager:
    return ForgetsProtection(_lru(num_blocks))


def make_prefix_stops_at_miss(num_blocks: int) -> OffloadingManager:
    return PrefixStopsAtMiss(_lru(num_blocks))


def make_store_counts_offers(num_blocks: int) -> OffloadingManager:
    return StoreCountsOffers(_lru(num_blocks))


def make_threshold_strict(num_blocks: int) -> OffloadingManager:
    return ThresholdStrict(_lru(num_blocks))


def make_reset_keeps_counts(num_blocks: int) -> OffloadingManager:
    return ResetKeepsCounts(_lru(num_blocks))


def make_validates_passed_only(num_blocks: int) -> OffloadingManager:
    return ValidatesPassedOnly(_lru(num_blocks))


def make_lookup_not_counted(num_blocks: int) -> OffloadingManager:
    return LookupNotCounted(_lru(num_blocks))


def make_small_forgets_protection(num_blocks: int) -> OffloadingManager:
    return ForgetsProtection(_lru(num_blocks), table_size=SMALL_TABLE)


def make_small_drops_newest(num_blocks: int) -> OffloadingManager:
    return DropsNewestWhenFull(_lru(num_blocks), table_size=SMALL_TABLE)


def make_small_recount_keeps_place(num_blocks: int) -> OffloadingManager:
    return RecountKeepsPlace(_lru(num_blocks), table_size=SMALL_TABLE)
