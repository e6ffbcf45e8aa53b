"""Profiles of vLLM's released offloading contract, one per generation.

Each preset is a :class:`~kvoffload.spec.profile.Profile` named after the
first vLLM release that has that shape of the scheduler-side contract; a
release is audited under the preset of its generation (``python -m kvoffload
audit --vllm DIR`` detects it from the code). Every option's value is
justified below by the release file (a path inside the ``vllm`` wheel) and
the behaviour that file has. Options not named keep kvoffload's default.

Conventions every vLLM release shares:

- ``errors=ANY``: illegal calls fail on ``assert`` (``cpu/manager.py``:
  ``prepare_load`` asserts ``block is not None`` and ``block.is_ready``;
  ``complete_load`` asserts ``ref_cnt > 0``), never a typed error.
- ``offers_repeat_keys=False``: ``cpu/manager.py`` ``prepare_store`` takes one
  slot per offered key it does not track, so an offer naming a key twice
  takes two slots for one key; the scheduler offers each new block once.
- ``validates_keys=False``: ``cpu/manager.py`` ``prepare_store`` accepts any
  hashable as a key (keys are made by the scheduler, never by a user).
- ``complete_store_ignores_absent=True``: ``cpu/manager.py``
  ``complete_store`` skips every key it does not track (``if block is not
  None and not block.is_ready``).
"""

from __future__ import annotations

import attrs

from kvoffload.spec.profile import (
    ErrorStyle,
    FilterCounts,
    LookupAnswer,
    LRURank,
    Profile,
    RecencyCommit,
    ResetAnnounce,
    TierPoll,
)

_VLLM = Profile(
    name="vllm",
    errors=ErrorStyle.ANY,
    offers_repeat_keys=False,
    validates_keys=False,
    complete_store_ignores_absent=True,
    # the engine never completes a load in flight at a reset and flushes
    # them before new stores: its managers free every slot at once.
    reset_with_loads=True,
)

VLLM_0_19 = attrs.evolve(
    _VLLM,
    name="vllm-0.19",
    # abstract.py: OffloadingEvent(block_hashes, block_size, medium, removed).
    event_block_size=True,
    # reuse_manager.py: FilterReusedOffloadingManager.lookup(block_hashes)
    # records every hash of the list, also those past the first miss.
    filter_counts=FilterCounts.LOOKUPS,
    # cpu/manager.py: CPUOffloadingManager has no reset_cache.
    has_reset=False,
)
"""vLLM 0.19: block-hash lists (``lookup(list) -> int``)."""

VLLM_0_20 = attrs.evolve(
    VLLM_0_19,
    name="vllm-0.20",
    # abstract.py: OffloadingEvent(keys, medium, removed): no block_size.
    event_block_size=False,
    # reuse_manager.py: lookup(key, ctx) records the one key it is given, and
    # the manager has no lookup_prefix: the engine looks keys up one by one
    # and stops at the first miss, so that is what the filter counts.
    filter_counts=FilterCounts.LOOKUPS_TO_FIRST_MISS,
)
"""vLLM 0.20: ``OffloadKey`` and ``ReqContext``, half-migrated."""

VLLM_0_21 = attrs.evolve(VLLM_0_20, name="vllm-0.21")
"""vLLM 0.21: keys and a request context on every call (base.py); the
filter a separate class (reuse_manager.py); no ``reset_cache``. Same
conventions as 0.20."""

VLLM_0_22 = attrs.evolve(
    VLLM_0_21,
    name="vllm-0.22",
    # cpu/manager.py: reset_cache() added.
    has_reset=True,
    # cpu/manager.py reset_cache clears the policy and the slot pool and
    # appends no event: the engine publishes its own all-cleared event.
    reset_announce=ResetAnnounce.ENGINE,
    # cpu/manager.py reset_cache leaves self.counts (the folded-in filter's
    # table) as it was.
    filter_reset_clears=False,
)
"""vLLM 0.22–0.23: the filter folded into ``CPUOffloadingManager``
(``store_threshold``, ``max_tracker_size``), ``reset_cache``; 0.23 adds the
request hooks (base.py ``on_new_request``), which change nothing in the CPU
manager."""

VLLM_0_24 = attrs.evolve(
    VLLM_0_22,
    name="vllm-0.24",
    # cpu/policies/lru.py: LRUCachePolicy keeps an OrderedDict of the blocks
    # with ref_cnt 0 only; cpu/manager.py calls mark_evictable (append at the
    # most recent end) when a store completes or a block's last load
    # completes, and mark_non_evictable when a first load pins it; touch
    # moves only blocks in that dict. cpu/policies/arc.py is unchanged.
    lru_rank=LRURank.EVICTABLE,
)
"""vLLM 0.24: LRU ranks a block when it becomes evictable."""

VLLM_0_25 = attrs.evolve(
    VLLM_0_24,
    name="vllm-0.25",
    # base.py: lookup -> LookupResult {MISS, HIT, HIT_PENDING, RETRY};
    # cpu/manager.py answers HIT_PENDING for a block whose store is in flight.
    lookup_answer=LookupAnswer.RESULT,
)
"""vLLM 0.25–0.28: ``lookup`` answers a ``LookupResult``; LRU as 0.24."""

VLLM_0_29 = attrs.evolve(
    VLLM_0_25,
    name="vllm-0.29",
    # cpu/manager.py: lookup no longer records keys; prepare_store records
    # every offered key (_record_access) before filtering on the threshold,
    # also when it then refuses the store.
    filter_counts=FilterCounts.OFFERS,
)
"""vLLM 0.29: the filter counts offers."""

VLLM_0_30 = attrs.evolve(
    VLLM_0_29,
    name="vllm-0.30",
    # cpu/manager.py _record_accesses ("Record an offer without evicting its
    # tracked candidates"): the offered keys already counted are counted
    # first, and a new key is added only while the table holds an entry
    # outside the offer to drop.
    filter_counts=FilterCounts.OFFERS_KEEPING_OFFERED,
)
"""vLLM 0.30: capacity in chunks (``num_chunks``, a shape the kit's factory
takes); an offer keeps its own keys in the count table."""

VLLM_0_31 = attrs.evolve(
    VLLM_0_30,
    name="vllm-0.31",
    # cpu/policies/base.py: CachePolicy.on_request_finished; cpu/manager.py
    # on_request_finished hands the policy the keys the request loaded and
    # stored, in prefix order: LRU recency and ARC's T1->T2 promotion are
    # committed when the request finishes (cpu/policies/lru.py, arc.py), and
    # ARC adapts its target when a request stores a ghost key
    # (on_store_miss).
    recency_commit=RecencyCommit.REQUEST_END,
    # cpu/policies/lru.py: a block's rank is assigned when it is stored and
    # at each committed use, pinned or not (a lazy heap of evictable blocks
    # ordered by that rank): ranking no longer waits for the block to become
    # evictable.
    lru_rank=LRURank.USE,
)
"""vLLM 0.31–0.32: request-scoped recency."""

VLLM_0_33 = attrs.evolve(
    VLLM_0_31,
    name="vllm-0.33",
    # base.py: OffloadingEvent.metadata_only; cpu/manager.py complete_store
    # with success=False appends a metadata_only removal for keys never
    # announced stored; the engine does not publish such events.
    private_events=True,
    # tiering/example/manager.py and tiering/fs/manager.py take no capacity:
    # the example tier grows without bound, the fs tier is bounded by its disk.
    tier_capacity_bounded=False,
    # tiering/async_lookup.py caches each probe's verdict until every request
    # that asked has finished: a MISS may predate a store that completed since.
    tier_stale_misses=True,
    # tiering/base.py: has_pending_work() "whether this tier needs the engine
    # to keep stepping", False by default even with jobs in flight.
    tier_pending_work=False,
    # tiering/base.py: loads report per-key failures (JobResult.successful_keys)
    # and the manager counts promotion failures; the fs tier fails a load of a
    # file removed behind it. Eviction stays submit_store's (base.py's list).
    tier_loads_succeed=False,
    # tiering/fs/io.py batch_store_block: one task per job "raises on first
    # error", so a job fails as a whole though the files written before the
    # failing one stay in place and read HIT (docs/FINDINGS.md F11).
    tier_disk_faults=False,
)
"""vLLM 0.33: private clean-up events; secondary tiers without a capacity,
whose lookups may answer a stale MISS."""

VLLM_0_33_TIERED = attrs.evolve(
    VLLM_0_33,
    name="vllm-0.33-tiered",
    # tiering/manager.py, TieringOffloadingManager over one secondary tier
    # that holds every chunk and completes each job at submit (the example
    # tier): complete_store cascades to every tier (write-through).
    secondary_tiers=1,
    # lookup() and prepare_store() run _process_finished_jobs (lookup once
    # per step, behind _processed_jobs_this_step); on_schedule_end polls
    # when the gate is open, then submits the step's promotions
    # (_flush_pending_promotions).
    tier_poll=TierPoll.CALLS,
    # _initiate_promotion: no bound on promotions in flight ...
    max_promotions_in_flight=None,
    # ... and primary_tier.prepare_write([key]): the key alone.
    promotion_offers_chain=False,
    # no lookup_prefix: the connector's loop of lookup() stops at the first
    # answer that is not HIT.
    prefix_walks_promotions=False,
    # reset_cache sets _promotions_held until on_reset_flushed().
    reset_holds_promotions=True,
    # complete_store decrements RequestState.pending_primary_stores, counted
    # per prepare_store that stored keys, and asserts it was positive.
    stores_completed_whole=True,
)
"""vLLM 0.33's ``TieringOffloadingManager`` over its CPU primary tier and
one secondary tier holding every chunk (the ``tiered`` target of ``audit
--vllm``)."""

GENERATION_PRESETS: tuple[Profile, ...] = (
    VLLM_0_19,
    VLLM_0_20,
    VLLM_0_21,
    VLLM_0_22,
    VLLM_0_24,
    VLLM_0_25,
    VLLM_0_29,
    VLLM_0_30,
    VLLM_0_31,
    VLLM_0_33,
)
"""One preset per generation of the contract, oldest first."""

RELEASE_GENERATION: dict[int, Profile] = {
    23: VLLM_0_22,
    26: VLLM_0_25,
    27: VLLM_0_25,
    28: VLLM_0_25,
    32: VLLM_0_31,
}
"""The releases 0.19-0.33 that start no generation of their own, each with
the preset of the generation it belongs to."""

PRESETS: tuple[Profile, ...] = tuple(
    sorted(
        GENERATION_PRESETS
        + tuple(
            attrs.evolve(profile, name=f"vllm-0.{minor}")
            for minor, profile in RELEASE_GENERATION.items()
        ),
        key=lambda profile: int(profile.name.rsplit(".", 1)[1]),
    )
) + (VLLM_0_33_TIERED,)
"""Every preset, one per release 0.19-0.33 (``vllm-0.27`` is 0.25's
generation under the release's own name), oldest first; then
``vllm-0.33-tiered`` (0.33's tiering manager)."""

_BY_GENERATION: dict[str, Profile] = {
    "0.19": VLLM_0_19,
    "0.20": VLLM_0_20,
    "0.21": VLLM_0_21,
    "0.22": VLLM_0_22,
    "0.23": VLLM_0_22,
    "0.24": VLLM_0_24,
    "0.25": VLLM_0_25,
    "0.29": VLLM_0_29,
    "0.30": VLLM_0_30,
    "0.31": VLLM_0_31,
    "0.33": VLLM_0_33,
}


def preset_for_generation(generation: str) -> Profile:
    """The preset describing a generation of the contract, given as the
    release that introduced it (``"0.19"`` ... ``"0.33"``, the values of
    :class:`kvoffload.vllm_release.Generation`). ``KeyError`` for others."""
    return _BY_GENERATION[generation]


def preset(name: str) -> Profile:
    """The preset called ``name`` (e.g. ``"vllm-0.22"``); ``KeyError`` if none."""
    for profile in PRESETS:
        if profile.name == name:
            return profile
    raise KeyError(name)


__all__ = [
    "PRESETS",
    "VLLM_0_19",
    "VLLM_0_20",
    "VLLM_0_21",
    "VLLM_0_22",
    "VLLM_0_24",
    "VLLM_0_25",
    "VLLM_0_29",
    "VLLM_0_30",
    "VLLM_0_31",
    "VLLM_0_33",
    "VLLM_0_33_TIERED",
    "preset",
    "preset_for_generation",
]
