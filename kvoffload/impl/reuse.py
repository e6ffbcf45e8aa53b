"""Reuse-frequency gate in front of any manager."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any, cast

import attrs
from mypy_extensions import mypyc_attr

from kvoffload.impl.build import BoolArg, IntArg, KeyArg
from kvoffload.impl.manager import check_success, keys_of
from kvoffload.impl.stats import ManagerStats
from kvoffload.spec.contract import (
    InspectableManager,
    InspectablePolicy,
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    require_context,
)
from kvoffload.spec.errors import ConfigurationError
from kvoffload.spec.keys import GROUP_IDX_BYTES, OffloadKey, validate_offload_key
from kvoffload.spec.lifecycle import Phase
from kvoffload.spec.profile import FilterCounts

# What a backing manager must offer (checked at construction).
_BACKING_CALLS = (
    "lookup", "lookup_prefix", "prepare_store", "complete_store",
    "prepare_load", "complete_load", "touch", "take_events", "reset_cache",
)


@mypyc_attr(allow_interpreted_subclasses=True)
class FilterReusedOffloadingManager(OffloadingManager):
    """Stores only blocks looked up at least ``store_threshold`` times.

    ``lookup`` and ``lookup_prefix`` count every key they are given in a
    table of at most ``max_tracker_size`` entries (least recently counted
    dropped first). ``prepare_store`` passes to ``backing`` the offered keys
    that reached the threshold, plus offered keys ``backing`` already holds
    ready — those are not stored again but stay protected from eviction by
    this call. Everything else is delegated unchanged.

    Every call that takes keys raises :class:`InvalidKeyError` for a
    malformed key (or a bare key where a list is expected) before it counts
    or delegates anything.

    Options named after the :class:`~kvoffload.spec.profile.Profile`
    options they implement (docs/SPEC.md §8): ``filter_counts`` says what
    feeds the table (default ``LOOKUPS``, as above; ``OFFERS`` and
    ``OFFERS_KEEPING_OFFERED`` count the keys offered to ``prepare_store``
    before the threshold is applied, and lookups not at all;
    ``LOOKUPS_TO_FIRST_MISS`` counts a ``lookup_prefix`` only up to its first
    miss); ``filter_reset_clears=False`` keeps the counts across
    ``reset_cache``.

    Raises :class:`ConfigurationError` if ``backing`` lacks a manager call,
    ``store_threshold < 2`` or ``max_tracker_size < 1``.
    """

    def __init__(
        self,
        backing: OffloadingManager,
        store_threshold: IntArg = 2,
        max_tracker_size: IntArg = 64_000,
        *,
        filter_counts: FilterCounts = FilterCounts.LOOKUPS,
        filter_reset_clears: BoolArg = True,
    ) -> None:
        missing = [
            name for name in _BACKING_CALLS if not callable(getattr(backing, name, None))
        ]
        if missing:
            raise ConfigurationError(
                f"backing must be an offloading manager; {backing!r} has no "
                + ", ".join(missing)
            )
        if isinstance(store_threshold, bool) or not isinstance(store_threshold, int):
            raise ConfigurationError("store_threshold must be an int")
        if store_threshold < 2:
            raise ConfigurationError(
                f"store_threshold must be >= 2 (1 would not filter), got {store_threshold}"
            )
        if isinstance(max_tracker_size, bool) or not isinstance(max_tracker_size, int):
            raise ConfigurationError("max_tracker_size must be an int")
        if max_tracker_size < 1:
            raise ConfigurationError(
                f"max_tracker_size must be >= 1, got {max_tracker_size}"
            )
        self.backing = backing
        self.store_threshold: int = store_threshold
        self.max_tracker_size: int = max_tracker_size
        self.counts: OrderedDict[OffloadKey, int] = OrderedDict()
        self.filter_counts: FilterCounts = filter_counts
        self._counts_lookups: bool = filter_counts in (
            FilterCounts.LOOKUPS,
            FilterCounts.LOOKUPS_TO_FIRST_MISS,
        )
        self.filter_reset_clears: bool = bool(filter_reset_clears)
        self.stores_skipped = 0  # offered keys not passed on (stats())
        self._inspected: InspectableManager | None = None  # the backing last found inspectable

    @property
    def lock(self) -> AbstractContextManager[object]:
        """The backing manager's lock: one lock guards the filter's table
        and everything behind it."""
        return self.backing.lock

    def phase(self, key: KeyArg) -> Phase:
        """The backing manager's phase of ``key`` (needs an inspectable backing)."""
        return self._inspectable_backing().phase(cast(Any, key))

    def slot_of(self, key: KeyArg) -> int | None:
        """The backing manager's slot of ``key`` (needs an inspectable backing)."""
        return self._inspectable_backing().slot_of(cast(Any, key))

    def policy_state(self) -> Mapping[str, object]:
        """The backing manager's policy state (needs an inspectable backing)."""
        if not isinstance(self.backing, InspectablePolicy):
            raise TypeError(f"{type(self.backing).__name__} does not offer policy_state()")
        return self.backing.policy_state()

    def _inspectable_backing(self) -> InspectableManager:
        # isinstance against a runtime-checkable Protocol inspects the class
        # on every call (microseconds); the answer is kept per backing object
        inspected = self._inspected
        if inspected is None or inspected is not cast(object, self.backing):
            backing = self.backing
            if not isinstance(backing, InspectableManager):
                raise TypeError(f"{type(backing).__name__} does not offer phase()/slot_of()")
            self._inspected = inspected = backing
        return inspected

    def count_of(self, key: OffloadKey) -> int:
        """How many times ``key`` was counted (0 if not in the table)."""
        return self.counts.get(key, 0)

    def _record(self, key: OffloadKey) -> None:
        counts = self.counts
        count = counts.get(key)
        if count is not None:
            counts.move_to_end(key)
            counts[key] = count + 1
        else:
            if len(counts) >= self.max_tracker_size:
                counts.popitem(last=False)
            counts[key] = 1

    # --- intercepted -----------------------------------------------------

    def lookup(self, key: KeyArg, req_context: ReqContext) -> bool | None:
        if type(req_context) is not ReqContext:
            require_context(req_context)
        if type(key) is bytes and len(key) >= GROUP_IDX_BYTES:
            checked = OffloadKey(key)
        else:
            checked = validate_offload_key(key)
        if self._counts_lookups:
            self._record(checked)
        return self.backing.lookup(checked, req_context)

    def lookup_prefix(
        self, keys: Iterable[OffloadKey], req_context: ReqContext
    ) -> int | None:
        listed = keys_of(keys, req_context)
        counting = self.filter_counts
        if counting is FilterCounts.LOOKUPS:
            for key in listed:
                self._record(key)
        hits = self.backing.lookup_prefix(listed, req_context)
        if counting is FilterCounts.LOOKUPS_TO_FIRST_MISS:
            for key in listed[: (hits or 0) + 1]:
                self._record(key)
        return hits

    def _record_offer(self, keys: list[OffloadKey]) -> None:
        """``OFFERS_KEEPING_OFFERED``: count an offer without dropping its
        own keys from a full table: the keys already counted first (each
        occurrence), then each new key while an entry outside the offer is
        left to drop (else it is not counted)."""
        counts = self.counts
        kept: set[OffloadKey] = set()
        for key in keys:
            count = counts.get(key)
            if count is not None:
                counts.move_to_end(key)
                counts[key] = count + 1
                kept.add(key)
        droppable = len(counts) - len(kept)
        limit = self.max_tracker_size
        for key in keys:
            if key in counts:
                continue
            if len(counts) >= limit:
                if droppable == 0:
                    continue
                counts.popitem(last=False)
                droppable -= 1
            counts[key] = 1

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        offered = keys_of(keys, req_context)
        counting = self.filter_counts
        if counting is FilterCounts.OFFERS:
            for key in offered:
                self._record(key)
        elif counting is FilterCounts.OFFERS_KEEPING_OFFERED:
            self._record_offer(offered)
        threshold, counts, backing = self.store_threshold, self.counts, self.backing
        passed = [
            key
            for key in offered
            if counts.get(key, 0) >= threshold or backing.lookup(key, req_context) is True
        ]
        self.stores_skipped += len(offered) - len(passed)
        return backing.prepare_store(passed, req_context)

    def stats(self) -> ManagerStats:
        """The backing manager's :class:`ManagerStats` with
        ``stores_skipped``: offered keys this filter did not pass on.
        Raises :class:`TypeError` when the backing keeps no stats."""
        snapshot = getattr(self.backing, "stats", None)
        if not callable(snapshot):
            raise TypeError(f"{type(self.backing).__name__} keeps no stats()")
        found = snapshot()
        if not isinstance(found, ManagerStats):
            raise TypeError(f"{type(self.backing).__name__}.stats() is not a ManagerStats")
        return attrs.evolve(found, stores_skipped=found.stores_skipped + self.stores_skipped)

    def reset_cache(self) -> None:
        self.backing.reset_cache()
        if self.filter_reset_clears:
            self.counts.clear()

    # --- delegated -------------------------------------------------------

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> LoadStoreSpec:
        listed = keys_of(keys, req_context)
        return self.backing.prepare_load(listed, req_context)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        listed = keys_of(keys, req_context)
        self.backing.touch(listed, req_context)

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> None:
        listed = keys_of(keys, req_context)
        self.backing.complete_load(listed, req_context)

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        success: BoolArg = True,
    ) -> None:
        listed = keys_of(keys, req_context)
        self.backing.complete_store(listed, req_context, check_success(success))

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        require_context(req_context)
        return self.backing.on_new_request(req_context)

    def on_request_finished(self, req_context: ReqContext) -> None:
        require_context(req_context)
        self.backing.on_request_finished(req_context)

    def on_schedule_end(self) -> None:
        self.backing.on_schedule_end()

    def take_events(self) -> Iterable[OffloadingEvent]:
        return self.backing.take_events()

    def shutdown(self) -> None:
        self.backing.shutdown()
