"""Unit tests of the models: value semantics, each call's edges, and the
hand-worked LRU and ARC examples of docs/SPEC.md."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from kvoffload.spec.contract import OffloadingEvent
from kvoffload.spec.errors import (
    ConfigurationError,
    IllegalTransitionError,
    InvalidArgumentError,
    InvalidKeyError,
)
from kvoffload.spec.invariants import Invariant, Step, Violation, check_step, liveness
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.lifecycle import ABSENT, PENDING, READY, Call, loading
from kvoffload.spec.model import (
    Block,
    FrozenMap,
    ManagerModel,
    PrepareStore,
    SpecViolation,
    StoreResult,
)
from kvoffload.spec.policies import ARCModel, LRUModel
from kvoffload.spec.profile import DEFAULT
from kvoffload.spec.reuse import ReuseFilterModel

A, B, C, D, E = (OffloadKey(bytes([c]) * 4) for c in b"ABCDE")


def stored(model: ManagerModel, *keys: OffloadKey) -> ManagerModel:
    """``model`` after storing ``keys`` successfully."""
    model, result = model.prepare_store(keys)
    assert result is not None
    return model.complete_store(keys)[0]


# --- value semantics ----------------------------------------------------------


def test_equal_states_hash_equal_whatever_the_path() -> None:
    one = stored(ManagerModel.create(3, "arc", enable_events=True), A, B)
    other = ManagerModel.create(3, "arc", enable_events=True)
    other = other.prepare_store([A])[0].prepare_store([B])[0]
    other = other.complete_store([A, B])[0]
    assert one == other and hash(one) == hash(other)
    assert one != other.touch([A])[0]
    assert len({one, other, other.touch([A])[0]}) == 2


def test_frozen_map_is_a_value() -> None:
    forward = FrozenMap([(A, 1), (B, 2)])
    backward = FrozenMap([(B, 2), (A, 1)])
    assert forward == backward and hash(forward) == hash(backward)
    assert forward.set(C, 3) != forward and C not in forward
    assert forward.without([A]) == FrozenMap([(B, 2)])


def test_transitions_never_mutate() -> None:
    model = stored(ManagerModel.create(2, "lru", enable_events=True), A)
    snapshot = (hash(model), repr(model))
    model.prepare_store([B, C])
    model.prepare_load([A])
    model.touch([A])
    model.reset_cache()
    model.take_events()
    assert (hash(model), repr(model)) == snapshot
    with pytest.raises(AttributeError):
        model.num_blocks = 3  # type: ignore[misc]


def test_configuration_errors() -> None:
    with pytest.raises(ConfigurationError):
        ManagerModel.create(0)
    with pytest.raises(ConfigurationError):
        ManagerModel.create(2, "fifo")
    backing = ManagerModel.create(2)
    with pytest.raises(ConfigurationError):
        ReuseFilterModel(backing, store_threshold=1)
    with pytest.raises(ConfigurationError):
        ReuseFilterModel(backing, max_tracker_size=0)


# --- calls ----------------------------------------------------------------------


def test_prepare_store_rejects_bad_keys_and_changes_nothing() -> None:
    model = ManagerModel.create(2)
    for bad in (b"abc", "abcd", 1234):
        with pytest.raises(InvalidKeyError):
            model.prepare_store([A, bad])  # type: ignore[list-item]


def test_prepare_store_dedups_and_skips_tracked_keys() -> None:
    model = stored(ManagerModel.create(4), A)
    after, result = model.prepare_store([B, A, B, C])
    assert result == StoreResult((B, C), (1, 2), ())
    assert after.phase(B) == after.phase(C) == PENDING
    assert after.prepare_store([A, B]) == (after, StoreResult((), (), ()))


def test_slots_fresh_ascending_then_lifo() -> None:
    model = stored(ManagerModel.create(3, "lru"), A, B, C)  # slots 0, 1, 2
    after, result = model.prepare_store([D, E])  # evicts A (0) then B (1)
    assert result == StoreResult((D, E), (1, 0), (A, B))
    failed = after.complete_store([E, D], success=False)[0]
    assert failed.free_list == (0, 1)
    assert failed.prepare_store([A])[1] == StoreResult((A,), (1,), ())
    reset = failed.reset_cache()[0]
    assert reset.prepare_store([A, B])[1] == StoreResult((A, B), (0, 1), ())


def test_refused_store_returns_the_same_model() -> None:
    model = ManagerModel.create(1, "lru").prepare_store([A])[0]  # A PENDING
    assert model.prepare_store([B]) == (model, None)
    assert liveness(Step(model, PrepareStore((B,)), model, None)) is None


def test_complete_store_errors_and_events() -> None:
    model = ManagerModel.create(3, "lru", enable_events=True).prepare_store([A, B])[0]
    with pytest.raises(IllegalTransitionError) as raised:
        model.complete_store([A, C])
    assert (raised.value.key, raised.value.phase, raised.value.call) == (
        C, ABSENT, Call.COMPLETE_STORE_OK)
    done = model.complete_store([B, A, B])[0]
    assert done.events == (OffloadingEvent((B, A), 16, "CPU", False),)
    assert done.complete_store([A])[0] == done  # READY: no-op, no event
    failed = model.complete_store([B], success=False)[0]
    assert failed.phase(B) == ABSENT and failed.events == () and failed.free_list == (1,)


def test_loads_count_per_occurrence() -> None:
    model = stored(ManagerModel.create(2), A, B)
    loaded, slots = model.prepare_load([B, A, B])
    assert slots == (1, 0, 1)
    assert loaded.phase(B) == loading(2) and loaded.phase(A) == loading(1)
    with pytest.raises(IllegalTransitionError) as raised:
        loaded.complete_load([A, A])
    assert (raised.value.key, raised.value.phase) == (A, READY)
    with pytest.raises(IllegalTransitionError):
        model.prepare_load([A, C])
    with pytest.raises(IllegalTransitionError):
        model.prepare_store([C])[0].prepare_load([C])  # PENDING
    assert loaded.complete_load([B, A, B])[0] == model


def test_lookups() -> None:
    model = stored(ManagerModel.create(3), A, B).prepare_store([C])[0]
    model = model.prepare_load([B])[0]
    assert [model.lookup(k)[1] for k in (A, B, C, D)] == [True, True, False, False]
    assert model.lookup_prefix([A, B, C, A])[1] == 2
    assert model.lookup_prefix([C, A])[1] == 0


def test_reset_announces_readable_keys_in_slot_order() -> None:
    model = stored(ManagerModel.create(3, "arc", enable_events=True), B, A)
    model = model.prepare_store([C])[0].prepare_load([A])[0].take_events()[0]
    with pytest.raises(IllegalTransitionError) as refused:  # A's load is in flight
        model.reset_cache()
    assert refused.value.key == A and refused.value.call is Call.RESET
    model = model.complete_load([A])[0]
    after = model.reset_cache()[0]
    assert after.events == (OffloadingEvent((B, A), 16, "CPU", True),)
    assert after.blocks == FrozenMap() and after.policy == ARCModel(capacity=3)
    assert after.take_events()[0].consumer_view == frozenset()


def test_a_profile_with_reset_with_loads_frees_slots_being_read() -> None:
    profile = attrs.evolve(DEFAULT, name="reset-with-loads", reset_with_loads=True)
    model = stored(ManagerModel.create(2, profile=profile), A).prepare_load([A])[0]
    after = model.reset_cache()[0]
    assert after.blocks == FrozenMap() and after.fresh == (0, 1)


def test_complete_store_demands_a_bool_success() -> None:
    model = ManagerModel.create(2).prepare_store([A])[0]
    for success in ("no", None, 1, 0):
        with pytest.raises(InvalidArgumentError):
            model.complete_store([A], success)  # type: ignore[arg-type]


def test_hooks_change_nothing_under_the_default_profile() -> None:
    model = stored(ManagerModel.create(2), A).prepare_load([A], request=1)[0]
    assert model.start_request(1) == (model, None)
    assert model.finish_request(1) == (model, None)
    assert model.schedule_end() == (model, None)


# --- auditing: victims and slots chosen by an implementation ---------------------


def test_any_policy_accepts_every_legal_choice_and_nothing_else() -> None:
    model = stored(ManagerModel.create(3, "any"), A, B, C)
    after, result = model.prepare_store([D, E], victims=[C, A], slots=[2, 0])
    assert result == StoreResult((D, E), (2, 0), (C, A))
    assert after.blocks[D] == Block(PENDING, 2)
    for victims, slots in (([C], [2, 0]), ([C, C], [2, 0]), ([D, A], [2, 0]),
                           ([C, A], [2, 1]), ([C, A], [2])):
        with pytest.raises(SpecViolation):
            model.prepare_store([D, E], victims=victims, slots=slots)
    with pytest.raises(SpecViolation):  # offered keys are protected
        model.prepare_store([D, E, A], victims=[C, A], slots=[2, 0])
    # an implementation's numpy slot ids are fine, non-integers are not
    assert model.prepare_store([D, E], victims=[C, A], slots=np.array([2, 0]))[1] == result
    with pytest.raises(SpecViolation):
        model.prepare_store([D, E], victims=[C, A], slots=[2.0, 0.0])  # type: ignore[list-item]


def test_lru_and_arc_accept_only_their_own_victims() -> None:
    for policy in ("lru", "arc"):
        model = stored(ManagerModel.create(2, policy), A, B)
        assert model.prepare_store([C], victims=[A], slots=[0])[1] is not None
        with pytest.raises(SpecViolation) as raised:
            model.prepare_store([C], victims=[B], slots=[1])
        assert "evicts" in raised.value.reason


# --- hand-worked examples (docs/SPEC.md) ----------------------------------------


def test_lru_worked_example() -> None:
    m = ManagerModel.create(2, "lru")
    m, r = m.prepare_store([A, B])
    assert r == StoreResult((A, B), (0, 1), ())
    m = m.complete_store([A, B])[0]
    m = m.touch([B, A])[0]  # reverse walk: A, then B; B ends most recent
    assert m.policy == LRUModel((A, B))
    m, r = m.prepare_store([C])
    assert r == StoreResult((C,), (0,), (A,)) and m.policy == LRUModel((B, C))
    assert m.prepare_store([A, B]) == (m, None)  # B offered, C PENDING: no victim
    m = m.complete_store([C])[0]
    m, slots = m.prepare_load([B])
    assert slots == (1,)
    m, r = m.prepare_store([A])  # B is LOADING: C goes although more recent
    assert r == StoreResult((A,), (0,), (C,)) and m.policy == LRUModel((B, A))


def test_arc_worked_example() -> None:
    m = ManagerModel.create(2, "arc")
    m = stored(m, A, B)
    assert m.policy == ARCModel(2, t1=(A, B))
    m = m.touch([A])[0]  # READY in T1: promoted
    assert m.policy == ARCModel(2, t1=(B,), t2=(A,))
    m, r = m.prepare_store([C])  # |T1|=1 >= int(0.0): T1 first, B goes to B1
    assert r == StoreResult((C,), (1,), (B,))
    assert m.policy == ARCModel(2, t1=(C,), t2=(A,), b1=(B,))
    m = m.touch([C])[0]  # PENDING in T1: stays in T1
    assert m.policy == ARCModel(2, t1=(C,), t2=(A,), b1=(B,))
    m = m.complete_store([C])[0]
    m = m.touch([B])[0]  # ghost hit in B1: target + max(1, 0/1)
    assert m.policy == ARCModel(2, t1=(C,), t2=(A,), b1=(B,), target=1.0)
    m = m.touch([C])[0]
    assert m.policy == ARCModel(2, t2=(A, C), b1=(B,), target=1.0)
    m, r = m.prepare_store([D])  # |T1|=0 < int(1.0): T2 first, A goes to B2
    assert r == StoreResult((D,), (0,), (A,))
    assert m.policy == ARCModel(2, t1=(D,), t2=(C,), b1=(B,), b2=(A,), target=1.0)
    m = m.touch([A])[0]  # ghost hit in B2: target - max(1, 1/1)
    assert m.policy.target == 0.0  # type: ignore[union-attr]
    m = m.complete_store([D])[0]
    m, r = m.prepare_store([E])
    assert r == StoreResult((E,), (0,), (D,))
    assert m.policy == ARCModel(2, t1=(E,), t2=(C,), b1=(B, D), b2=(A,))


def test_arc_falls_back_to_the_other_list_and_trims_ghosts() -> None:
    m = stored(ManagerModel.create(2, "arc"), A, B).touch([A, B])[0]  # T2 = (B, A)
    m = m.prepare_load([B])[0]
    m, r = m.prepare_store([C])  # T1 empty: T2; B is LOADING, A goes
    assert r is not None and r.evicted == (A,)
    assert m.policy == ARCModel(2, t1=(C,), t2=(B,), b2=(A,))


def test_arc_trims_ghost_lists_to_capacity() -> None:
    m = stored(stored(stored(ManagerModel.create(1, "arc"), A), B), C)
    assert m.policy == ARCModel(1, t1=(C,), b1=(B,))  # A trimmed from B1's LRU end


def test_arc_refusal_is_atomic() -> None:
    m = stored(ManagerModel.create(2, "arc"), A).prepare_store([B])[0]
    m = m.prepare_load([A])[0]
    assert m.prepare_store([C]) == (m, None)


# --- reuse filter -------------------------------------------------------------


def test_reuse_filter_counts_and_protects_stored_keys() -> None:
    f = ReuseFilterModel(ManagerModel.create(1, "lru"), max_tracker_size=2)
    f = f.lookup_prefix([A, B, A])[0]  # every key counts, even past a miss
    assert f.counts == ((B, 1), (A, 2))
    f, r = f.prepare_store([A, B])
    assert r == StoreResult((A,), (0,), ())  # B below the threshold
    assert f.counts == ((B, 1), (A, 2))  # prepare_store counts nothing
    f = f.complete_store([A])[0]
    f = f.lookup_prefix([C, B, C, B])[0]  # full table drops B, then A
    assert f.counts == ((C, 2), (B, 2))
    assert f.eligible([B, A]) == (B, A)  # A: count 0, but stored
    f_after, r = f.prepare_store([B, A])
    assert r is None and f_after == f  # A protected: no victim for B
    f, r = f.prepare_store([B])
    assert r == StoreResult((B,), (0,), (A,))
    f = f.reset_cache()[0]
    assert f.counts == () and f.backing.blocks == FrozenMap()


def test_check_step_reports_a_broken_step() -> None:
    before = stored(ManagerModel.create(2, "lru"), A, B)
    after, result = before.prepare_store([C])
    bogus = Step(before, PrepareStore((C,)), after, StoreResult((C,), (1,), (A,)))
    found = check_step(bogus)
    assert found and all(isinstance(v, Violation) for v in found)
    assert any(v.invariant is Invariant.STORE_SPEC for v in found)
    assert not check_step(Step(before, PrepareStore((C,)), after, result))
