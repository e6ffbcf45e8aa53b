"""Checks on a manager's outputs that the model does not predict itself.

- :class:`EventMetadata`: every event names the specification's medium
  (``"CPU"``) and, where the profile says events carry it, one positive
  ``block_size`` — the manager's own ``block_size`` attribute when it has
  one — the same in every event.
- :func:`store_slots`: the slots a ``prepare_store`` allocated, from
  whatever the manager shows: the store spec's ``block_ids``, else its
  ``slot_of`` introspection; ``None`` when it shows neither. The kit never
  invents slots for a manager: the model takes these, and what depends on
  slots nobody showed (the order of keys in a reset's event) gets no
  verdict.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Sequence

from kvoffload.spec.keys import OffloadKey


def medium_name(medium: object) -> str:
    """A medium as text: an enum's value (or name), else ``str``."""
    if isinstance(medium, enum.Enum):
        value = medium.value
        return value if isinstance(value, str) else medium.name
    return str(medium)


class EventMetadata:
    """What the manager's events must agree on (see the module docstring).

    ``check(event)`` returns ``None`` or the reason the event's metadata is
    wrong. ``carries_block_size``: the profile's events carry ``block_size``.
    """

    def __init__(
        self, manager: object, medium: str, *, carries_block_size: bool = True
    ) -> None:
        own = getattr(manager, "block_size", None)
        self.block_size: int | None = (
            own if isinstance(own, int) and not isinstance(own, bool) else None
        )
        self.medium = medium
        self.carries_block_size = carries_block_size

    def check(self, event: object) -> str | None:
        if not hasattr(event, "medium"):
            return "an event has no medium"
        name = medium_name(getattr(event, "medium"))
        if name != self.medium:
            return f"an event names medium {name!r}, the specification says {self.medium!r}"
        if not self.carries_block_size:
            return None
        size = getattr(event, "block_size", None)
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            return f"an event's block_size is {size!r}, not a positive int"
        if self.block_size is None:
            self.block_size = size
        elif size != self.block_size:
            return f"an event's block_size is {size}, the manager's is {self.block_size}"
        return None


def spec_block_ids(spec: object) -> tuple[int, ...] | None:
    """The block ids a load/store spec names, if it exposes ``block_ids``."""
    block_ids = getattr(spec, "block_ids", None)
    if block_ids is None:
        return None
    return tuple(int(i) for i in list(block_ids))


def store_slots(
    manager: object, spec: object, keys: Sequence[OffloadKey], inspectable: bool
) -> tuple[int, ...] | None:
    """The slots ``keys`` (just stored) were given, as the manager shows
    them (see the module docstring); ``-1`` for a key ``slot_of`` does not
    place (the model then rejects the slots)."""
    ids = spec_block_ids(spec)
    if ids is not None:
        return ids
    if not inspectable:
        return None
    slot_of = getattr(manager, "slot_of")
    slots: list[int] = []
    for key in keys:
        slot = slot_of(key)
        slots.append(-1 if slot is None else int(slot))
    return tuple(slots)


_GROUP_ZERO = (0).to_bytes(4, "big")


def flood_key(index: int) -> OffloadKey:
    """The ``index``-th key of a probe's flood of a reuse filter's table."""
    return OffloadKey(b"flood%07d" % index + _GROUP_ZERO)


@functools.lru_cache(maxsize=4)
def flood_keys(count: int) -> tuple[OffloadKey, ...]:
    """The first ``count`` flood keys (cached: a flood of a production-size
    table is tens of thousands of keys)."""
    return tuple(flood_key(i) for i in range(count))


def compact_call(op: object) -> str | None:
    """``m.lookup_prefix(...)`` of the flood keys ``0..n-1``, written as a
    comprehension; None for any other call."""
    keys = getattr(op, "keys", None)
    if getattr(op, "method", None) != "lookup_prefix" or not keys or len(keys) <= 64:
        return None
    if keys[0] != flood_key(0) or tuple(keys) != flood_keys(len(keys)):
        return None
    request = getattr(op, "request", 0)
    return (
        f"m.lookup_prefix([make_offload_key(b'flood%07d' % i, 0) "
        f"for i in range({len(keys)})], ctx({request}))"
    )


__all__ = [
    "EventMetadata",
    "compact_call",
    "flood_key",
    "flood_keys",
    "medium_name",
    "spec_block_ids",
    "store_slots",
]
