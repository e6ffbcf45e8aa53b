"""Named options of the specification: one model, several generations.

Offloading managers in the wild (vLLM's releases, engines' own backends)
agree on the block lifecycle but differ in a handful of documented choices:
what ``lookup`` answers, what a reuse filter counts, when recency is
committed, who announces a reset, whether offers may repeat a key, how an
illegal call fails. A :class:`Profile` names one choice for each. The
specification's models take a profile, and so does the conformance kit;
nothing else special-cases a backend.

:data:`DEFAULT` is kvoffload's own contract. Presets named after the releases
they describe live in :mod:`kvoffload.spec.releases`.
"""

from __future__ import annotations

import enum

import attrs


class LookupAnswer(enum.Enum):
    """What ``lookup`` returns for one key."""

    #: ``True`` (READY or LOADING), ``False`` (anything else), ``None`` (retry).
    BOOL = "bool"
    #: A result enum: ``MISS``, ``HIT``, ``HIT_PENDING`` (a store is in
    #: flight), ``RETRY``.
    RESULT = "result"


class FilterCounts(enum.Enum):
    """What feeds a reuse filter's count table."""

    #: Every key given to ``lookup`` / ``lookup_prefix``, also past a miss.
    LOOKUPS = "lookups"
    #: Keys given to ``lookup_prefix`` up to and including the first miss
    #: (what a scheduler that stops at the first miss shows the filter).
    LOOKUPS_TO_FIRST_MISS = "lookups-to-first-miss"
    #: Keys offered to ``prepare_store``.
    OFFERS = "offers"


class RecencyCommit(enum.Enum):
    """When a use of a block reaches the replacement policy."""

    #: At ``touch`` (and at store), immediately.
    TOUCH = "touch"
    #: When the request that used the block finishes (``on_request_finished``).
    REQUEST_END = "request-end"


class ResetAnnounce(enum.Enum):
    """Who publishes that ``reset_cache`` dropped every block."""

    #: The manager: one ``removed`` event listing the announced keys.
    MANAGER = "manager"
    #: The engine: ``reset_cache`` emits no event; consumers clear on their own.
    ENGINE = "engine"


class ErrorStyle(enum.Enum):
    """How an illegal call fails (it must change nothing either way)."""

    #: An :class:`~kvoffload.spec.errors.OffloadingError` subclass.
    TYPED = "typed"
    #: Any exception (e.g. an ``AssertionError`` or ``KeyError``).
    ANY = "any"


@attrs.frozen
class Profile:
    """One choice per option; see each enum for the meanings.

    ``filter_reset_clears``: ``reset_cache`` also clears a reuse filter's
    counts. ``offers_repeat_keys``: an offer may name a key twice (the engine
    may send duplicates); when False, the kit only makes offers of distinct
    keys. ``has_reset``: the manager implements ``reset_cache``.
    ``private_events``: events flagged ``metadata_only`` are internal
    clean-up never published to consumers; the kit drops them.
    ``event_block_size``: events carry ``block_size``.
    """

    name: str = "kvoffload"
    lookup_answer: LookupAnswer = LookupAnswer.BOOL
    filter_counts: FilterCounts = FilterCounts.LOOKUPS
    filter_reset_clears: bool = True
    recency_commit: RecencyCommit = RecencyCommit.TOUCH
    reset_announce: ResetAnnounce = ResetAnnounce.MANAGER
    offers_repeat_keys: bool = True
    errors: ErrorStyle = ErrorStyle.TYPED
    has_reset: bool = True
    private_events: bool = False
    event_block_size: bool = True

    def describe(self) -> str:
        """One line naming every option's value."""
        fields = attrs.fields(Profile)
        parts = []
        for field in fields:
            if field.name == "name":
                continue
            value = getattr(self, field.name)
            shown = value.value if isinstance(value, enum.Enum) else value
            parts.append(f"{field.name}={shown}")
        return f"{self.name}: " + ", ".join(parts)


#: kvoffload's own contract: today's behaviour of every built-in manager.
DEFAULT = Profile()
