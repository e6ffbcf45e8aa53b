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
import importlib

import attrs


class LookupAnswer(enum.Enum):
    """What ``lookup`` returns for one key."""

    #: ``True`` (READY or LOADING), ``False`` (anything else), ``None`` (retry).
    BOOL = "bool"
    #: A result enum: ``MISS``, ``HIT``, ``HIT_PENDING`` (a store is in
    #: flight), ``RETRY``.
    RESULT = "result"


class FilterCounts(enum.Enum):
    """What feeds a reuse filter's count table (each recorded key: moved to
    the table's most-recent end with one more count, or added with count 1
    after the least-recent entry is dropped from a full table)."""

    #: Every key given to ``lookup`` / ``lookup_prefix``, also past a miss.
    LOOKUPS = "lookups"
    #: Keys given to ``lookup`` and, of ``lookup_prefix``, those up to and
    #: including the first key that is not readable (what a scheduler that
    #: stops at the first miss shows the filter).
    LOOKUPS_TO_FIRST_MISS = "lookups-to-first-miss"
    #: Every key offered to ``prepare_store``, in offer order, before the
    #: threshold is applied (also when the store is then refused).
    OFFERS = "offers"
    #: As ``OFFERS``, but an offer never pushes its own keys out of a full
    #: table: the offered keys already counted are counted first; a new key
    #: is added only while the table holds an entry outside the offer to
    #: drop (else it is not counted).
    OFFERS_KEEPING_OFFERED = "offers-keeping-offered"


class RecencyCommit(enum.Enum):
    """When a use of a block reaches the replacement policy."""

    #: At ``touch`` (and at store), immediately; loads and offers are no use.
    TOUCH = "touch"
    #: ``touch`` still counts at once, and each request's loads and offers
    #: are also uses, committed when the request finishes
    #: (``on_request_finished``): LRU moves the keys the request used to the
    #: most-recent end, ARC promotes the ready keys it reused to T2; storing
    #: a ghost key adapts ARC's target once per request (see docs/SPEC.md,
    #: "Profiles").
    REQUEST_END = "request-end"


class LRURank(enum.Enum):
    """Where LRU places a block in its recency order."""

    #: When it is stored (``prepare_store``, most recent) and at each use.
    USE = "use"
    #: Only evictable blocks (READY, no load in flight) are ordered: a block
    #: becomes most recent when its store completes or its last load
    #: completes, leaves the order while a load pins it, and ``touch`` moves
    #: evictable blocks only. ARC is not affected.
    EVICTABLE = "evictable"


class ResetAnnounce(enum.Enum):
    """Who publishes that ``reset_cache`` dropped every block."""

    #: The manager: one ``removed`` event listing the announced keys.
    MANAGER = "manager"
    #: The engine: ``reset_cache`` emits no event; consumers clear on their own.
    ENGINE = "engine"


class Cascade(enum.Enum):
    """When a tiered manager submits a stored block's copy to its tiers
    (``Profile.secondary_tiers >= 1``). Both modes pin the block at
    ``complete_store`` until the copy's result is taken; they differ at
    ``reset_cache`` only, which drops the batched copies."""

    #: One store job per tier at ``complete_store``.
    WRITE_THROUGH = "write-through"
    #: The step's blocks, batched per request, submitted at ``on_schedule_end``.
    WRITE_BACK = "write-back"


class TierPoll(enum.Enum):
    """When a tiered manager (``Profile.secondary_tiers >= 1``) takes its
    tiers' finished jobs (a *poll*: promotions complete, cascades release
    their pins), and when it submits the step's promotions."""

    #: At ``on_schedule_end``, after submitting the step's batched jobs (so
    #: a promotion completes at the end of the step that started it), and
    #: at ``reset_cache`` (kvoffload's ``TieredOffloadingManager``).
    STEP_END = "step-end"
    #: At every ``prepare_store``, at a step's first ``lookup`` (a gate that
    #: any poll closes and the step's end opens again), at
    #: ``on_schedule_end`` before submitting the step's promotions when the
    #: gate is open, and at ``reset_cache``: a promotion submitted at a
    #: step's end completes at the next poll (vLLM 0.33's
    #: ``TieringOffloadingManager``).
    CALLS = "calls"


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
    ``validates_keys``: ``prepare_store`` rejects a key that is not ``bytes``
    of at least 4 bytes (``InvalidKeyError``, or any exception under
    ``ErrorStyle.ANY``); when False the kit never offers malformed keys.
    ``complete_store_ignores_absent``: ``complete_store`` of a key that is
    not tracked (never stored, evicted, failed, reset) is a no-op instead of
    an illegal call.
    ``tier_capacity_bounded``: a secondary tier holds at most the
    ``capacity_blocks`` it was built with (``T4 tier capacity``); when False
    (vLLM 0.33's ``example`` and ``fs`` tiers take no capacity) the tier is
    bounded only by its medium and the kit does not count its keys.
    ``tier_stale_misses``: a tier's ``lookup`` may answer MISS from a
    verdict cached earlier in the request (vLLM 0.33's ``fs`` tier caches
    each probe until every request that asked has finished), so a MISS does
    not show that the key left the tier; when False it does.
    ``reset_with_loads``: ``reset_cache`` is legal while
    loads are in flight and frees their slots at once (the engine guarantees
    no load in flight at a reset is still reading: vLLM flushes them first);
    when False, ``reset_cache`` with a LOADING key raises
    ``IllegalTransitionError`` and changes nothing.

    ``secondary_tiers``: 0 for a plain manager; n >= 1 for a tiered manager
    (``kvoffload.TieredOffloadingManager``'s answers) over n secondary tiers
    that each hold every block cascaded to them (no capacity eviction, no
    failed job) and finish every job by the next poll point
    (``on_schedule_end``, ``reset_cache``), reported in submission order.
    Then a stored block stays LOADING (one pin per tier) until the step's
    end; a ``lookup`` of an ABSENT key a tier holds starts a promotion (the
    key becomes PENDING as ``prepare_store`` would make it, victims by the
    same policy) and answers ``None`` (``HIT_PENDING``), or ``False`` beyond
    ``max_promotions_in_flight`` keys in flight or without room; the
    promotion completes at the next ``on_schedule_end`` (READY, a stored
    event). ``cascade``: when the copies are submitted (:class:`Cascade`).
    ``max_promotions_in_flight``: the bound on keys being promoted (0: a
    quarter of the slots, at least 1, the tiered manager's default).

    ``tier_poll``: when the tiers' jobs are taken (:class:`TierPoll`).
    ``max_promotions_in_flight=None``: no bound (at most every slot).
    ``promotion_offers_chain``: a lookup's promotion offers the keys of the
    chain before its key along (they are protected from its evictions);
    when False it offers its key alone (``prepare_store([key])``), so a
    promotion may evict a key the same chain just found readable.
    ``prefix_walks_promotions``: ``lookup_prefix`` walks on past the ready
    prefix, promoting every ABSENT key the tiers hold up to the first key
    it cannot; when False it is the engine's loop of ``lookup`` (vLLM's
    managers have none): the ready prefix, then one ``lookup`` of the next
    key, answering None when that answer is ``HIT_PENDING``/``RETRY``.
    ``reset_holds_promotions``: after ``reset_cache`` a ``lookup`` of an
    ABSENT key is a miss (no promotion) until the engine reports the reset
    flushed, which the kit does at the next ``on_schedule_end`` (vLLM's
    ``on_reset_flushed``, called by the kit's vLLM adapter after that call).

    ``stores_completed_whole``: the engine calls ``complete_store`` once
    per ``prepare_store`` that stored keys, with exactly its
    ``keys_to_store`` (success or failure for all), and never for a store a
    reset dropped; when False (kvoffload's contract) a store may be
    completed in parts, and keys already stored completed again (a no-op).
    vLLM 0.33's tiering manager counts its stores in flight per request by
    calls and asserts when a ``complete_store`` has no store left.

    ``tier_pending_work``: a tier's ``has_pending_work()`` is True while a
    job of it is unreported (in flight, or its result not yet taken), as
    :mod:`kvoffload.spec.tier_contract` says; when False (vLLM 0.33's
    ``base.py`` default answers False, its tier-poll thread polls anyway)
    the kit asks it only after a drain.

    ``tier_loads_succeed``: a promotion makes it for every key it pins
    (the key answered HIT right after ``submit_load``): HIT means "present
    and ready" (``base.py``), so only an eviction the tier was seen to make
    excuses a failed load; when False (a lossy tier; vLLM 0.33, whose
    manager counts promotion failures and whose ``fs`` tier fails a load
    of a file removed behind it) any promotion may fail.
    ``tier_evicts_on_store``: a key the tier holds leaves it only to make
    room for a cascade submitted since the key was last seen held
    (``base.py`` lists eviction among ``submit_store``'s duties); when
    False a tier may drop keys at any time (a TTL, a shared store).
    ``tier_shutdown_removes_temp``: ``shutdown`` releases the temporary
    files and directories the tier made (under ``tempfile``'s directory,
    which the kit points at a directory of its own for each run), as it
    releases its threads; when False a tier may leave them behind.
    ``tier_disk_faults``: a store may meet a failing disk (every file write
    fails) and must then report exactly the keys it wrote: a key reported
    failed is not readable; when False (vLLM 0.33, whose ``fs`` tier fails
    a batch as a whole although the keys written before the failing one
    stay readable: docs/FINDINGS.md F11) the kit injects no disk fault.

    docs/SPEC.md ("Profiles") gives each option's meaning in the models.
    """

    name: str = "kvoffload"
    lookup_answer: LookupAnswer = LookupAnswer.BOOL
    filter_counts: FilterCounts = FilterCounts.LOOKUPS
    filter_reset_clears: bool = True
    recency_commit: RecencyCommit = RecencyCommit.TOUCH
    lru_rank: LRURank = LRURank.USE
    reset_announce: ResetAnnounce = ResetAnnounce.MANAGER
    offers_repeat_keys: bool = True
    errors: ErrorStyle = ErrorStyle.TYPED
    has_reset: bool = True
    private_events: bool = False
    event_block_size: bool = True
    validates_keys: bool = True
    complete_store_ignores_absent: bool = False
    tier_capacity_bounded: bool = True
    tier_stale_misses: bool = False
    secondary_tiers: int = 0
    cascade: Cascade = Cascade.WRITE_THROUGH
    max_promotions_in_flight: int | None = 0
    reset_with_loads: bool = False
    tier_pending_work: bool = True
    tier_poll: TierPoll = TierPoll.STEP_END
    promotion_offers_chain: bool = True
    prefix_walks_promotions: bool = True
    reset_holds_promotions: bool = False
    stores_completed_whole: bool = False

    tier_loads_succeed: bool = True
    tier_evicts_on_store: bool = True
    tier_shutdown_removes_temp: bool = True
    tier_disk_faults: bool = True

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

#: Managers of the older block-hash-list API audited through
#: ``LegacyManagerAdapter``: illegal calls fail with any exception
#: (``KeyError``, ``assert``), no ``reset_cache``, no key validation.
LEGACY = attrs.evolve(
    DEFAULT,
    name="legacy",
    errors=ErrorStyle.ANY,
    has_reset=False,
    validates_keys=False,
)

#: ``kvoffload.TieredOffloadingManager`` over one tier, write-through, at
#: most 2 keys promoted at once (the built-in ``tiered_*`` targets).
TIERED = attrs.evolve(DEFAULT, name="kvoffload-tiered", secondary_tiers=1,
                      max_promotions_in_flight=2)

#: A lossy secondary tier (a backend whose reads may fail, e.g. over a
#: network): a promotion of a key that answered HIT may fail.
LOSSY_TIER = attrs.evolve(DEFAULT, name="kvoffload-lossy-tier", tier_loads_succeed=False)

#: As :data:`TIERED`, write-back.
TIERED_WRITE_BACK = attrs.evolve(TIERED, name="kvoffload-tiered-write-back",
                                 cascade=Cascade.WRITE_BACK)

PRESETS: dict[str, Profile] = {
    profile.name: profile
    for profile in (DEFAULT, LEGACY, TIERED, TIERED_WRITE_BACK, LOSSY_TIER)
}
"""Every named profile, by name. :mod:`kvoffload.spec.releases` adds one
preset per vLLM generation (its ``PRESETS``) when first asked for a name."""

_RELEASES_MODULE = "kvoffload.spec.releases"


def _load_release_presets() -> None:
    try:
        module = importlib.import_module(_RELEASES_MODULE)
    except ModuleNotFoundError as error:
        if error.name != _RELEASES_MODULE:
            raise
        return
    for profile in getattr(module, "PRESETS", ()):
        register(profile)


def register(profile: Profile) -> Profile:
    """Add ``profile`` to :data:`PRESETS` under its name; a different
    profile already there under that name is a :class:`ValueError`."""
    known = PRESETS.setdefault(profile.name, profile)
    if known != profile:
        raise ValueError(f"a different profile is already named {profile.name!r}")
    return profile


def preset_names() -> tuple[str, ...]:
    """The names :func:`profile_named` accepts."""
    _load_release_presets()
    return tuple(PRESETS)


def profile_named(name: str) -> Profile:
    """The preset called ``name`` (``"kvoffload"``, ``"legacy"``, or a vLLM
    release's, e.g. ``"vllm-0.33"``); ``KeyError`` naming the known ones."""
    _load_release_presets()
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"no profile named {name!r}; known: {', '.join(PRESETS)}") from None


__all__ = [
    "DEFAULT",
    "LEGACY",
    "TIERED",
    "TIERED_WRITE_BACK",
    "Cascade",
    "PRESETS",
    "ErrorStyle",
    "FilterCounts",
    "LRURank",
    "LookupAnswer",
    "Profile",
    "RecencyCommit",
    "ResetAnnounce",
    "TierPoll",
    "preset_names",
    "profile_named",
    "register",
]
