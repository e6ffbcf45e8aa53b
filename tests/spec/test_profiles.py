"""Each option of a :class:`Profile` means something in the models: hand-worked
sequences under the default profile and under the other choice."""

from __future__ import annotations

import attrs
import pytest

from kvoffload.spec.contract import LookupResult, OffloadingEvent
from kvoffload.spec.errors import IllegalTransitionError
from kvoffload.spec.invariants import Step, check_step
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.model import ManagerModel, PrepareStore, ResetCache, StoreResult
from kvoffload.spec.profile import (
    DEFAULT,
    LEGACY,
    PRESETS,
    FilterCounts,
    LookupAnswer,
    LRURank,
    Profile,
    ResetAnnounce,
    preset_names,
    profile_named,
    register,
)
from kvoffload.spec.reuse import ReuseFilterModel

A, B, C, D, E = (OffloadKey(bytes([c]) * 4) for c in b"ABCDE")


def manager(profile: Profile = DEFAULT, num_blocks: int = 2) -> ManagerModel:
    return ManagerModel.create(num_blocks, "lru", enable_events=True, profile=profile)


def counting(counts: FilterCounts, tracker: int = 4, num_blocks: int = 2) -> ReuseFilterModel:
    profile = attrs.evolve(DEFAULT, filter_counts=counts)
    return ReuseFilterModel(manager(profile, num_blocks), 2, tracker)


# --- lookup_answer ------------------------------------------------------------


def test_lookup_answers_a_bool_by_default_and_a_result_when_asked() -> None:
    model = manager().prepare_store([A])[0]
    assert model.lookup(A)[1] is False and model.lookup(B)[1] is False
    assert model.complete_store([A])[0].lookup(A)[1] is True

    result = manager(attrs.evolve(DEFAULT, lookup_answer=LookupAnswer.RESULT))
    pending = result.prepare_store([A])[0]
    assert pending.lookup(A)[1] is LookupResult.HIT_PENDING
    assert pending.lookup(B)[1] is LookupResult.MISS
    ready = pending.complete_store([A])[0]
    assert ready.lookup(A)[1] is LookupResult.HIT
    assert ready.prepare_load([A])[0].lookup(A)[1] is LookupResult.HIT  # LOADING reads
    assert ready.lookup_prefix([A, B])[1] == 1


# --- filter_counts --------------------------------------------------------------


def test_lookups_count_every_key_given_also_past_a_miss() -> None:
    model = counting(FilterCounts.LOOKUPS)
    model = model.lookup_prefix([A, B, A])[0].lookup(C)[0]
    assert model.counts == ((B, 1), (A, 2), (C, 1))
    assert model.prepare_store([A, B])[1] == StoreResult((A,), (0,), ())
    assert model.prepare_store([A, B])[0].counts == model.counts  # offers do not count


def test_lookups_to_the_first_miss_count_what_a_scheduler_shows() -> None:
    model = counting(FilterCounts.LOOKUPS_TO_FIRST_MISS)
    model = model.lookup_prefix([A, B, C])[0]
    assert model.counts == ((A, 1),)  # A is the first miss: B and C are never looked up
    assert model.prepare_store([A])[1] == StoreResult((), (), ())  # seen once: not stored
    model = model.lookup_prefix([A, B, C])[0].prepare_store([A])[0].complete_store([A])[0]
    assert model.counts == ((A, 2),) and model.backing.phase(A).readable
    # A now hits: the lookup walks on to B, the first miss, and stops there
    model = model.lookup_prefix([A, B, C])[0]
    assert model.counts == ((A, 3), (B, 1))
    assert model.lookup(D)[0].counts[-1] == (D, 1)  # a single lookup counts its key


def test_offers_count_and_lookups_do_not() -> None:
    model = counting(FilterCounts.OFFERS)
    assert model.lookup_prefix([A, B])[0].lookup(A)[0].counts == ()
    first, result = model.prepare_store([A, B])
    assert result == StoreResult((), (), ()) and first.counts == ((A, 1), (B, 1))
    second, result = first.prepare_store([A])
    assert result == StoreResult((A,), (0,), ()) and second.counts == ((B, 1), (A, 2))


def test_a_refused_offer_is_still_counted_and_that_is_atomic() -> None:
    # one slot, held by a LOADING key: nothing can be evicted
    model = counting(FilterCounts.OFFERS, num_blocks=1)
    model = model.prepare_store([A])[0].prepare_store([A])[0].complete_store([A])[0]
    model = model.prepare_load([A])[0]
    once = model.prepare_store([B])[0]
    after, result = once.prepare_store([B])
    assert result is None and after.count(B) == 2 and after != once
    assert after == once.offered([B])
    assert not check_step(Step(once, PrepareStore((B,)), after, result))
    # under a lookup-counting filter the same refusal changes nothing
    lookups = counting(FilterCounts.LOOKUPS, num_blocks=1)
    lookups = lookups.lookup(A)[0].lookup(A)[0].lookup(B)[0].lookup(B)[0]
    lookups = lookups.prepare_store([A])[0].complete_store([A])[0].prepare_load([A])[0]
    assert lookups.prepare_store([B]) == (lookups, None)


def test_offers_keeping_offered_never_push_out_their_own_keys() -> None:
    plain = counting(FilterCounts.OFFERS, tracker=2)
    keeping = counting(FilterCounts.OFFERS_KEEPING_OFFERED, tracker=2)
    for model in (plain, keeping):
        model = model.prepare_store([A, B])[0]
        assert model.counts == ((A, 1), (B, 1))
    # [A, C] on (A:1, B:1): A counted first; C replaces B either way
    assert plain.prepare_store([A, B])[0].prepare_store([A, C])[0].counts == ((A, 2), (C, 1))
    kept = keeping.prepare_store([A, B])[0].prepare_store([A, C])[0]
    assert kept.counts == ((A, 2), (C, 1))
    # [C, D, E] on (A:2, C:1): plain counting lets D and E push out C; keeping
    # counts C, drops A for D, and has nothing left to drop for E
    plain_after = plain.prepare_store([A, B])[0].prepare_store([A, C])[0]
    assert plain_after.prepare_store([C, D, E])[0].counts == ((D, 1), (E, 1))
    assert kept.prepare_store([C, D, E])[0].counts == ((C, 2), (D, 1))


def test_reset_clears_the_counts_unless_the_profile_keeps_them() -> None:
    model = counting(FilterCounts.LOOKUPS).lookup(A)[0]
    assert model.reset_cache()[0].counts == ()
    kept = ReuseFilterModel(manager(attrs.evolve(DEFAULT, filter_reset_clears=False)))
    kept = kept.lookup(A)[0]
    assert kept.reset_cache()[0].counts == ((A, 1),)


# --- lru_rank ---------------------------------------------------------------------


def test_lru_ranks_a_block_when_stored_or_when_it_becomes_evictable() -> None:
    """A is stored first but completes last. Ranked at use, A is the older
    and the victim; ranked when evictable, B is."""
    for rank, victim in ((LRURank.USE, A), (LRURank.EVICTABLE, B)):
        model = manager(attrs.evolve(DEFAULT, lru_rank=rank))
        model = model.prepare_store([A])[0].prepare_store([B])[0]
        model = model.complete_store([B])[0].complete_store([A])[0]
        assert model.prepare_store([C])[1] == StoreResult((C,), (0,) if victim == A else (1,), (victim,))


def test_under_evictable_ranking_a_load_unranks_and_its_last_completion_reranks() -> None:
    def run(rank: LRURank) -> ManagerModel:
        model = manager(attrs.evolve(DEFAULT, lru_rank=rank), num_blocks=3)
        model = model.prepare_store([A, B, C])[0].complete_store([A, B, C])[0]
        model = model.prepare_load([A, A])[0].touch([A])[0].touch([B])[0]
        return model.complete_load([A])[0]

    evictable = run(LRURank.EVICTABLE)
    # pinned by its loads, A left the order and touch([A]) did nothing
    assert evictable.policy.state_view() == {"order": (C, B)}
    evictable = evictable.complete_load([A])[0]  # the last load: A is most recent
    assert evictable.policy.state_view() == {"order": (C, B, A)}
    assert evictable.prepare_store([D, E])[1] == StoreResult((D, E), (1, 2), (C, B))

    used = run(LRURank.USE).complete_load([A])[0]
    assert used.policy.state_view() == {"order": (C, A, B)}
    assert used.prepare_store([D, E])[1] == StoreResult((D, E), (0, 2), (C, A))


# --- reset_announce ---------------------------------------------------------------


def test_reset_is_announced_by_the_manager_or_by_the_engine() -> None:
    model = manager().prepare_store([A, B])[0].complete_store([A])[0]
    model = model.take_events()[0]
    after = model.reset_cache()[0]
    assert after.events == (OffloadingEvent((A,), 16, "CPU", True),)
    assert not check_step(Step(model, ResetCache(), after, None))

    engine = attrs.evolve(DEFAULT, reset_announce=ResetAnnounce.ENGINE)
    model = manager(engine).prepare_store([A, B])[0].complete_store([A])[0]
    model = model.take_events()[0]
    assert model.consumer_view == {A}
    after = model.reset_cache()[0]
    assert after.events == () and after.consumer_view == frozenset()
    assert not check_step(Step(model, ResetCache(), after, None))


# --- complete_store_ignores_absent ----------------------------------------------


def test_completing_an_unknown_store_is_illegal_or_ignored() -> None:
    model = manager().prepare_store([A])[0]
    with pytest.raises(IllegalTransitionError):
        model.complete_store([A, B])
    lenient = manager(attrs.evolve(DEFAULT, complete_store_ignores_absent=True))
    lenient = lenient.prepare_store([A])[0]
    after = lenient.complete_store([A, B])[0]
    assert after.phase(A).readable and B not in after.blocks


# --- presets ---------------------------------------------------------------------


def test_presets_by_name() -> None:
    assert profile_named("kvoffload") is DEFAULT
    assert profile_named("legacy") is LEGACY
    assert {"kvoffload", "legacy"} <= set(preset_names())
    with pytest.raises(KeyError, match="known: kvoffload"):
        profile_named("vllm-0.0")
    assert register(LEGACY) is LEGACY  # the same profile again is fine
    with pytest.raises(ValueError):
        register(attrs.evolve(LEGACY, has_reset=True))
    assert PRESETS["legacy"] is LEGACY
    assert "errors=any" in LEGACY.describe() and LEGACY.describe().startswith("legacy: ")
