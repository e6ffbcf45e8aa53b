"""The tiered options vLLM 0.33's ``TieringOffloadingManager`` needs, in the
one manager model (``tier_poll``, an unbounded ``max_promotions_in_flight``,
``promotion_offers_chain``, ``prefix_walks_promotions``,
``reset_holds_promotions``, ``stores_completed_whole``; preset
``vllm-0.33-tiered``), each shown on the model alone, and the kit's drivers
under ``stores_completed_whole``. The audit of vLLM's own manager is opt-in
(tests/vllm/test_vllm_tiers.py)."""

from __future__ import annotations

from typing import Any

import attrs

from kvoffload.spec.contract import LookupResult
from kvoffload.spec.keys import OffloadKey, make_offload_key
from kvoffload.spec.lifecycle import ABSENT, PENDING, READY, Phase
from kvoffload.spec.model import (
    CompleteStore,
    ManagerModel,
    PrepareStore,
    ResetCache,
    StoreResult,
    TakeEvents,
)
from kvoffload.spec.profile import TIERED, Profile, TierPoll, profile_named
from kvoffload.stateful.harness import KitConfig
from kvoffload.stateful.shrink import engine_protocol
from kvoffload.stateful.swarm import observe_runs
from kvoffload.stateful.targets import tiered_memory

K = [make_offload_key(b"blk%02d" % i, 0) for i in range(8)]
VLLM = profile_named("vllm-0.33-tiered")


def _stored(model: ManagerModel, key: OffloadKey) -> ManagerModel:
    model, result = model.prepare_store([key])
    assert result is not None and result.keys_to_store == (key,)
    return model.complete_store([key], True)[0]


def _below(model: ManagerModel, *keys: OffloadKey) -> ManagerModel:
    """``keys`` stored, cascaded and evicted from the primary (the tier
    holds them), the step ended."""
    for key in keys:
        model = _stored(model, key)
    for key in K[6:]:
        model = _stored(model, key)
    return model.schedule_end()[0]


def test_the_preset_names_vllm_tiering() -> None:
    assert VLLM.secondary_tiers == 1 and VLLM.tier_poll is TierPoll.CALLS
    assert VLLM.max_promotions_in_flight is None and not VLLM.promotion_offers_chain
    assert not VLLM.prefix_walks_promotions and VLLM.reset_holds_promotions
    assert VLLM.stores_completed_whole
    defaults = Profile()
    assert defaults.tier_poll is TierPoll.STEP_END and defaults.max_promotions_in_flight == 0
    assert defaults.promotion_offers_chain and defaults.prefix_walks_promotions
    assert not defaults.reset_holds_promotions and not defaults.stores_completed_whole


def test_calls_poll_releases_a_cascade_pin_at_the_next_store() -> None:
    for profile, released in ((VLLM, True), (attrs.evolve(VLLM, tier_poll=TierPoll.STEP_END), False)):
        model = _stored(ManagerModel.create(1, "lru", profile=profile), K[0])
        assert model.phase(K[0]) == Phase.from_ref_cnt(1)  # the cascade's pin
        model, result = model.prepare_store([K[1]])
        # polled first (vLLM): the pin is gone and K[0] is the victim
        assert (result is not None and result.evicted == (K[0],)) is released


def test_calls_promotion_completes_at_the_next_poll_behind_the_gate() -> None:
    model = _below(ManagerModel.create(2, "lru", profile=VLLM), K[0])
    assert model.phase(K[0]) == ABSENT and K[0] in model.below
    model, answer = model.lookup(K[0])
    assert answer is LookupResult.HIT_PENDING and model.phase(K[0]) == PENDING
    model = model.schedule_end()[0]  # submitted, not taken
    assert model.phase(K[0]) == PENDING and model.submitted_promotions() == {K[0]}
    model, answer = model.lookup(K[0])  # the step's first lookup polls
    assert answer is LookupResult.HIT and model.phase(K[0]) == READY
    # the gate is closed: a promotion submitted now waits for the step's end
    model = _below(model, K[1])
    model, _ = model.lookup(K[1])
    model, _ = model.schedule_end()
    model, answer = model.lookup(K[1])
    assert answer is LookupResult.HIT
    model, answer = model.lookup(K[2])
    assert model.polled


def test_no_bound_promotes_into_every_slot() -> None:
    bounded = attrs.evolve(VLLM, max_promotions_in_flight=1)
    for profile, second in ((VLLM, LookupResult.HIT_PENDING), (bounded, LookupResult.MISS)):
        model = _below(ManagerModel.create(2, "lru", profile=profile), K[0], K[1])
        model, first = model.lookup(K[0])
        assert first is LookupResult.HIT_PENDING
        assert model.lookup(K[1])[1] is second


def test_a_promotion_alone_may_evict_the_chain_before_it() -> None:
    chained = attrs.evolve(VLLM, promotion_offers_chain=True)
    for profile, evicts_chain in ((VLLM, True), (chained, False)):
        model = _below(ManagerModel.create(2, "lru", profile=profile), K[0])
        model = model.lookup(K[5])[0]  # polls: K[6], K[7] READY (K[6] least recent)
        model = model.touch([K[6]])[0]  # K[7] is now the policy's victim
        model, answer = model.lookup_prefix([K[7], K[0]])
        assert answer is None  # K[0]'s promotion started: ask again
        assert (model.phase(K[7]) == ABSENT) is evicts_chain


def test_a_non_walking_prefix_stops_at_the_first_key_promoted() -> None:
    walking = attrs.evolve(VLLM, prefix_walks_promotions=True)
    for profile, promoted in ((VLLM, {K[0]}), (walking, {K[0], K[1]})):
        model = _below(ManagerModel.create(2, "lru", profile=profile), K[0], K[1])
        model, answer = model.lookup_prefix([K[0], K[1]])
        assert answer is None and model.promoting_keys() == promoted


def test_reset_holds_promotions_until_the_step_ends_and_drops_those_in_flight() -> None:
    model = _below(ManagerModel.create(2, "lru", enable_events=True, profile=VLLM), K[0], K[1])
    model = model.lookup(K[0])[0]
    model = model.schedule_end()[0]  # K[0]'s promotion in flight
    model = model.take_events()[0]
    model = model.reset_cache()[0]
    assert model.events == () and not model.blocks  # dropped, unannounced
    assert model.lookup(K[1])[1] is LookupResult.MISS  # held
    model = model.schedule_end()[0]  # the engine reports the reset flushed
    assert model.lookup(K[1])[1] is LookupResult.HIT_PENDING
    unheld = attrs.evolve(VLLM, reset_holds_promotions=False)
    model = _below(ManagerModel.create(2, "lru", profile=unheld), K[1]).reset_cache()[0]
    assert model.lookup(K[1])[1] is LookupResult.HIT_PENDING


def _completions(profile: Profile, runs: int) -> tuple[list[tuple[Any, ...]], int]:
    """The kit's swarm over kvoffload's tiered manager under ``profile``:
    each ``complete_store`` with the keys its store had in flight, and how
    many stores were made."""
    config = KitConfig(tiered_memory, policy="lru", profile=profile, max_blocks=6, num_keys=12)
    seen: list[tuple[Any, ...]] = []
    stores = 0
    pending: dict[tuple[int, frozenset[OffloadKey]], None] = {}  # of the run

    def observe(before: Any, op: Any, after: Any) -> None:
        nonlocal stores
        if isinstance(op, PrepareStore):
            result = op.apply_to(before)[1]
            if isinstance(result, StoreResult) and result.keys_to_store:
                stores += 1
                pending[(op.request, frozenset(result.keys_to_store))] = None
        if isinstance(op, CompleteStore):
            seen.append((op.request, frozenset(op.keys), tuple(pending)))
            pending.pop((op.request, frozenset(op.keys)), None)
        if isinstance(op, ResetCache) and not after.blocks:
            pending.clear()  # the reset dropped them

    observe_runs(config, runs, observe, before_run=pending.clear)
    return seen, stores


def test_whole_store_completion_completes_each_store_once_with_its_keys() -> None:
    whole, stores = _completions(attrs.evolve(TIERED, stores_completed_whole=True), 60)
    assert stores >= 50 and len(whole) >= 50
    for request, keys, in_flight in whole:
        assert (request, keys) in in_flight, (request, keys)
    parts, _ = _completions(TIERED, 60)  # kvoffload's contract: parts and repeats too
    assert any((request, keys) not in in_flight for request, keys, in_flight in parts)


def test_the_shrinker_keeps_the_engines_take_events_before_a_reset() -> None:
    """Under ``ResetAnnounce.ENGINE`` the drivers take the events right
    before each reset; a shrunk candidate that drops that call is no
    candidate (the model's consumer would miss events it was owed)."""
    engine = KitConfig(tiered_memory, policy="lru", profile=VLLM)
    manager = KitConfig(tiered_memory, policy="lru", profile=TIERED)
    store = PrepareStore((K[0],))
    assert engine_protocol(engine, [store, TakeEvents(), ResetCache()])
    assert not engine_protocol(engine, [store, ResetCache()])
    assert not engine_protocol(engine, [ResetCache()])
    assert engine_protocol(manager, [store, ResetCache()])
