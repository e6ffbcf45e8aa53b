"""The reuse filter as an immutable model.

:class:`ReuseFilterModel` stands in front of a
:class:`~kvoffload.spec.model.ManagerModel` (``backing``) as
``FilterReusedOffloadingManager`` stands in front of a manager. Its own state
is ``counts``: ``(key, count)`` pairs, least-recently-seen first, at most
``max_tracker_size`` of them. What feeds the table is the backing profile's
``filter_counts`` (:class:`~kvoffload.spec.profile.FilterCounts`); the
default, ``LOOKUPS``:

- ``lookup(key)`` records ``key``; ``lookup_prefix(keys)`` records every key
  given, in order, even past the first miss. Recording a key: if counted,
  move it to the MRU end and add one; else, if the table is full, drop the
  least-recent entry, then add the key with count 1. Both then answer as the
  backing does.
- ``prepare_store(keys)`` validates every key (:class:`InvalidKeyError`), then
  offers the backing, in offer order, the keys counted at least
  ``store_threshold`` times plus the offered keys the backing already reads
  (``lookup`` True) — so a stored key stays protected from eviction
  (invariant 3) though below the threshold. It changes no count.
- ``reset_cache`` resets the backing and empties the table (kept under a
  profile whose ``filter_reset_clears`` is False).
- Every other call is the backing's.

``LOOKUPS_TO_FIRST_MISS`` records, of a ``lookup_prefix``, only the keys up
to and including the first one that is not readable. ``OFFERS`` records no
lookup but every offered key, before the threshold is applied (so also when
the store is then refused); ``OFFERS_KEEPING_OFFERED`` records offers without
letting an offer push its own keys out of a full table.

Transitions return ``(new_filter, result)`` like the manager model's, and
:meth:`ReuseFilterModel.apply` takes the same operation values.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import SupportsIndex

import attrs

from kvoffload.spec.contract import LookupResult, OffloadingEvent
from kvoffload.spec.errors import ConfigurationError
from kvoffload.spec.keys import OffloadKey, validate_offload_key, validate_offload_keys
from kvoffload.spec.model import (
    ManagerModel,
    Operation,
    Result,
    StoreResult,
    dedup,
)
from kvoffload.spec.profile import FilterCounts

Counts = tuple[tuple[OffloadKey, int], ...]


def _check_threshold(instance: object, attribute: object, value: int) -> None:
    if value < 2:
        raise ConfigurationError(f"store_threshold must be >= 2, got {value}")


def _check_tracker_size(instance: object, attribute: object, value: int) -> None:
    if value < 1:
        raise ConfigurationError(f"max_tracker_size must be >= 1, got {value}")


@attrs.frozen
class ReuseFilterModel:
    """A reuse filter over ``backing`` (see the module docstring).

    Raises :class:`ConfigurationError` for ``store_threshold < 2`` or
    ``max_tracker_size < 1``.
    """

    backing: ManagerModel
    store_threshold: int = attrs.field(default=2, validator=_check_threshold)
    max_tracker_size: int = attrs.field(default=64_000, validator=_check_tracker_size)
    counts: Counts = ()

    # --- queries ------------------------------------------------------------

    @property
    def core(self) -> ManagerModel:
        """The manager model behind the filter."""
        return self.backing

    def passed_keys(self, keys: tuple[OffloadKey, ...]) -> tuple[OffloadKey, ...]:
        """The keys a ``prepare_store(keys)`` passes to the backing (counted
        after the offer, where offers are counted)."""
        return self._counted_offer(keys).eligible(keys)

    @property
    def counting(self) -> FilterCounts:
        """What feeds the table (the backing profile's ``filter_counts``)."""
        return self.backing.profile.filter_counts

    def offered(self, keys: Sequence[OffloadKey], request: int = 0) -> ReuseFilterModel:
        """What an offer of ``keys`` records before any room is sought: the
        counts (where offers count) and what the backing records of the keys
        passed to it. A refused ``prepare_store`` leaves this model."""
        counted = self._counted_offer(keys)
        passed = dedup(counted.eligible(keys))
        return counted._with(counted.backing.offered(passed, request))

    def _counted_offer(self, keys: Sequence[OffloadKey]) -> ReuseFilterModel:
        if self.counting is FilterCounts.OFFERS:
            return attrs.evolve(self, counts=self._recorded(keys))
        if self.counting is FilterCounts.OFFERS_KEEPING_OFFERED:
            return attrs.evolve(self, counts=self._recorded_keeping(keys))
        return self

    def _recorded_keeping(self, keys: Sequence[OffloadKey]) -> Counts:
        """The table after counting an offer without dropping its own keys:
        counted keys first (each occurrence), then new keys while an entry
        outside the offer remains to drop from a full table."""
        table = OrderedDict(self.counts)
        kept: set[OffloadKey] = set()
        for key in keys:
            if key in table:
                table.move_to_end(key)
                table[key] += 1
                kept.add(key)
        droppable = len(table) - len(kept)
        for key in keys:
            if key in table:
                continue
            if len(table) >= self.max_tracker_size:
                if droppable == 0:
                    continue
                table.popitem(last=False)
                droppable -= 1
            table[key] = 1
        return tuple(table.items())

    def count(self, key: OffloadKey) -> int:
        """How often ``key`` was looked up (0 if not in the table)."""
        return dict(self.counts).get(key, 0)

    def eligible(self, keys: Iterable[OffloadKey]) -> tuple[OffloadKey, ...]:
        """The keys ``prepare_store(keys)`` passes to the backing, in offer
        order (repeats kept): counted ``>= store_threshold`` or readable."""
        counted = dict(self.counts)
        return tuple(
            key
            for key in keys
            if counted.get(key, 0) >= self.store_threshold
            or self.backing.phase(key).readable
        )

    def _recorded(self, keys: Iterable[OffloadKey]) -> Counts:
        table = OrderedDict(self.counts)  # linear in the table and the keys
        for key in keys:
            count = table.pop(key, 0)
            if not count and len(table) >= self.max_tracker_size:
                table.popitem(last=False)
            table[key] = count + 1
        return tuple(table.items())

    def _with(self, backing: ManagerModel) -> ReuseFilterModel:
        return attrs.evolve(self, backing=backing)

    # --- calls --------------------------------------------------------------

    def lookup(
        self, key: OffloadKey, *, request: int = 0
    ) -> tuple[ReuseFilterModel, bool | LookupResult | None]:
        validate_offload_key(key)
        counts = self.counts
        if self.counting in (FilterCounts.LOOKUPS, FilterCounts.LOOKUPS_TO_FIRST_MISS):
            counts = self._recorded((key,))
        backing, answer = self.backing.lookup(key, request=request)
        return attrs.evolve(self, counts=counts, backing=backing), answer

    def lookup_prefix(
        self, keys: Sequence[OffloadKey], *, request: int = 0
    ) -> tuple[ReuseFilterModel, int | None]:
        keys = validate_offload_keys(keys)
        backing, hits = self.backing.lookup_prefix(keys, request=request)
        counts = self.counts
        if self.counting is FilterCounts.LOOKUPS:
            counts = self._recorded(keys)
        elif self.counting is FilterCounts.LOOKUPS_TO_FIRST_MISS:
            ready = self.backing.ready_prefix(keys) if hits is None else hits
            counts = self._recorded(keys[: ready + 1])
        return attrs.evolve(self, counts=counts, backing=backing), hits

    def prepare_store(
        self,
        keys: Sequence[OffloadKey],
        *,
        victims: Sequence[OffloadKey] | None = None,
        slots: Iterable[SupportsIndex] | None = None,
        request: int = 0,
    ) -> tuple[ReuseFilterModel, StoreResult | None]:
        checked = tuple(validate_offload_keys(keys))
        counted = self._counted_offer(checked)
        backing, result = counted.backing.prepare_store(
            counted.eligible(checked), victims=victims, slots=slots, request=request
        )
        return counted._with(backing), result

    def complete_store(
        self, keys: Iterable[OffloadKey], success: bool = True, *, request: int = 0
    ) -> tuple[ReuseFilterModel, None]:
        return self._with(self.backing.complete_store(keys, success, request=request)[0]), None

    def prepare_load(
        self, keys: Sequence[OffloadKey], *, request: int = 0
    ) -> tuple[ReuseFilterModel, tuple[int, ...]]:
        backing, slots = self.backing.prepare_load(keys, request=request)
        return self._with(backing), slots

    def complete_load(self, keys: Sequence[OffloadKey]) -> tuple[ReuseFilterModel, None]:
        return self._with(self.backing.complete_load(keys)[0]), None

    def touch(self, keys: Sequence[OffloadKey]) -> tuple[ReuseFilterModel, None]:
        return self._with(self.backing.touch(keys)[0]), None

    def reset_cache(self) -> tuple[ReuseFilterModel, None]:
        counts = () if self.backing.profile.filter_reset_clears else self.counts
        return attrs.evolve(self, backing=self.backing.reset_cache()[0], counts=counts), None

    def take_events(
        self,
    ) -> tuple[ReuseFilterModel, tuple[OffloadingEvent, ...]]:
        backing, events = self.backing.take_events()
        return self._with(backing), events

    def start_request(self, request: int) -> tuple[ReuseFilterModel, None]:
        return self._with(self.backing.start_request(request)[0]), None

    def finish_request(self, request: int) -> tuple[ReuseFilterModel, None]:
        return self._with(self.backing.finish_request(request)[0]), None

    def schedule_end(self) -> tuple[ReuseFilterModel, None]:
        return self._with(self.backing.schedule_end()[0]), None

    def apply(self, op: Operation) -> tuple[ReuseFilterModel, Result]:
        """Perform the call ``op`` describes."""
        return op.apply_to(self)


__all__ = ["ReuseFilterModel"]
