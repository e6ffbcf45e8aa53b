"""The reuse filter (reference 000) as an immutable model.

:class:`ReuseFilterModel` stands in front of a
:class:`~kvoffload.spec.model.ManagerModel` (``backing``) as
``FilterReusedOffloadingManager`` stands in front of a manager. Its own state
is ``counts``: ``(key, count)`` pairs, least-recently-seen first, at most
``max_tracker_size`` of them.

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
- ``reset_cache`` resets the backing and empties the table.
- Every other call is the backing's.

Transitions return ``(new_filter, result)`` like the manager model's, and
:meth:`ReuseFilterModel.apply` takes the same operation values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import SupportsIndex

import attrs

from kvoffload.spec.contract import OffloadingEvent
from kvoffload.spec.errors import ConfigurationError
from kvoffload.spec.keys import OffloadKey, validate_offload_key, validate_offload_keys
from kvoffload.spec.model import (
    ManagerModel,
    Operation,
    Result,
    StoreResult,
)

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
        """The keys a ``prepare_store(keys)`` passes to the backing."""
        return self.eligible(keys)

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
        counts = self.counts
        for key in keys:
            found = [c for k, c in counts if k == key]
            if found:
                counts = tuple(e for e in counts if e[0] != key) + ((key, found[0] + 1),)
            else:
                if len(counts) >= self.max_tracker_size:
                    counts = counts[1:]
                counts = counts + ((key, 1),)
        return counts

    def _with(self, backing: ManagerModel) -> ReuseFilterModel:
        return attrs.evolve(self, backing=backing)

    # --- calls --------------------------------------------------------------

    def lookup(self, key: OffloadKey) -> tuple[ReuseFilterModel, bool]:
        validate_offload_key(key)
        return attrs.evolve(self, counts=self._recorded((key,))), self.backing.lookup(key)[1]

    def lookup_prefix(
        self, keys: Sequence[OffloadKey]
    ) -> tuple[ReuseFilterModel, int]:
        keys = validate_offload_keys(keys)
        recorded = attrs.evolve(self, counts=self._recorded(keys))
        return recorded, self.backing.lookup_prefix(keys)[1]

    def prepare_store(
        self,
        keys: Sequence[OffloadKey],
        *,
        victims: Sequence[OffloadKey] | None = None,
        slots: Iterable[SupportsIndex] | None = None,
    ) -> tuple[ReuseFilterModel, StoreResult | None]:
        checked = tuple(validate_offload_keys(keys))
        backing, result = self.backing.prepare_store(
            self.eligible(checked), victims=victims, slots=slots
        )
        return self._with(backing), result

    def complete_store(
        self, keys: Iterable[OffloadKey], success: bool = True
    ) -> tuple[ReuseFilterModel, None]:
        return self._with(self.backing.complete_store(keys, success)[0]), None

    def prepare_load(
        self, keys: Sequence[OffloadKey]
    ) -> tuple[ReuseFilterModel, tuple[int, ...]]:
        backing, slots = self.backing.prepare_load(keys)
        return self._with(backing), slots

    def complete_load(self, keys: Sequence[OffloadKey]) -> tuple[ReuseFilterModel, None]:
        return self._with(self.backing.complete_load(keys)[0]), None

    def touch(self, keys: Sequence[OffloadKey]) -> tuple[ReuseFilterModel, None]:
        return self._with(self.backing.touch(keys)[0]), None

    def reset_cache(self) -> tuple[ReuseFilterModel, None]:
        return attrs.evolve(self, backing=self.backing.reset_cache()[0], counts=()), None

    def take_events(
        self,
    ) -> tuple[ReuseFilterModel, tuple[OffloadingEvent, ...]]:
        backing, events = self.backing.take_events()
        return self._with(backing), events

    def request_hook(self, name: str) -> tuple[ReuseFilterModel, None]:
        return self, None

    def apply(self, op: Operation) -> tuple[ReuseFilterModel, Result]:
        """Perform the call ``op`` describes."""
        return op.apply_to(self)


__all__ = ["ReuseFilterModel"]
