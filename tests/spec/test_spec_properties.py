"""Every transition of every model preserves every invariant.

Random call sequences over 6 keys and 1–4 slots drive the models alone (LRU,
ARC, Any with victims and slots chosen at random among the legal ones, and a
reuse filter over each); after every call that returns, every invariant of
:mod:`kvoffload.spec.invariants` is checked; every call that raises must be
one the lifecycle table forbids and must leave nothing behind. The last test
asserts every row of the lifecycle table was reached and prints the tally.
"""

from __future__ import annotations

from collections import Counter

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvoffload.spec.errors import IllegalTransitionError, InvalidKeyError
from kvoffload.spec.invariants import (
    Step,
    check_step,
    manager_of,
    passed_keys,
    table_calls,
)
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.lifecycle import TRANSITIONS, Call, PhaseKind, apply, is_legal
from kvoffload.spec.model import (
    CompleteLoad,
    CompleteStore,
    FinishRequest,
    KeyListOperation,
    Lookup,
    LookupPrefix,
    ManagerModel,
    Operation,
    PrepareLoad,
    PrepareStore,
    ResetCache,
    ScheduleEnd,
    StartRequest,
    StoreResult,
    TakeEvents,
    Touch,
)
from kvoffload.spec.policies import AnyPolicyModel, ARCModel
from kvoffload.spec.profile import (
    DEFAULT,
    FilterCounts,
    LookupAnswer,
    Profile,
    RecencyCommit,
    ResetAnnounce,
)
from kvoffload.spec.reuse import ReuseFilterModel

KEYS = tuple(OffloadKey(bytes([i]) * 4) for i in range(6))
BAD_KEY = b"ab"

REACHED: Counter[tuple[PhaseKind, Call]] = Counter()
OUTCOMES: Counter[str] = Counter()

Model = ManagerModel | ReuseFilterModel


def key_lists(
    data: st.DataObject, likely: tuple[OffloadKey, ...] = (), max_size: int = 4
) -> tuple[OffloadKey, ...]:
    """Up to ``max_size`` keys, repeats allowed; mostly from ``likely`` (the
    keys for which the call is legal) when there are any, so that sequences
    go deep instead of failing early."""
    if not likely or data.draw(st.integers(0, 4)) == 0:
        if not likely and data.draw(st.integers(0, 2)) > 0:
            return ()
        return tuple(data.draw(st.lists(st.sampled_from(KEYS), max_size=max_size)))
    return tuple(data.draw(st.lists(st.sampled_from(likely), min_size=1, max_size=max_size)))


def with_phase(state: Model, *kinds: PhaseKind) -> tuple[OffloadKey, ...]:
    manager = manager_of(state)
    return tuple(k for k in KEYS if manager.phase(k).kind in kinds)


def draw_op(data: st.DataObject, state: Model) -> Operation:
    kind = data.draw(
        st.sampled_from(
            ["lookup", "prefix", "prefix", "store", "store", "store", "store", "complete",
             "complete", "complete", "load", "load", "unload", "unload", "touch", "touch",
             "touch", "events", "hook"] + ["reset"] * (data.draw(st.integers(0, 9)) == 0)
        )
    )
    if kind == "lookup":
        return Lookup(data.draw(st.sampled_from(KEYS)))
    if kind == "prefix":
        return LookupPrefix(key_lists(data, max_size=6))
    tracked = with_phase(state, PhaseKind.PENDING, PhaseKind.READY, PhaseKind.LOADING)
    if kind == "complete":
        pending = with_phase(state, PhaseKind.PENDING)
        return CompleteStore(
            key_lists(data, pending or tracked), data.draw(st.integers(0, 3)) > 0
        )
    if kind == "load":
        readable = with_phase(state, PhaseKind.READY, PhaseKind.LOADING)
        return PrepareLoad(key_lists(data, readable, max_size=2))
    if kind == "unload":
        return CompleteLoad(key_lists(data, with_phase(state, PhaseKind.LOADING), max_size=3))
    if kind == "touch":
        policy = manager_of(state).policy
        ghosts = policy.b1 + policy.b2 if isinstance(policy, ARCModel) else ()
        return Touch(key_lists(data, tracked + ghosts))
    if kind == "reset":
        return ResetCache()
    if kind == "events":
        return TakeEvents()
    if kind == "hook":
        request = data.draw(st.integers(0, 2))
        hook = data.draw(st.sampled_from([StartRequest, FinishRequest]))
        return hook(request) if data.draw(st.booleans()) else ScheduleEnd()
    absent = with_phase(state, PhaseKind.ABSENT)
    keys = key_lists(data, absent, max_size=3) + key_lists(data, tracked, max_size=2)
    if data.draw(st.integers(0, 30)) == 0:
        return PrepareStore(keys + (BAD_KEY,))  # type: ignore[operator]
    manager = manager_of(state)
    if isinstance(state, ReuseFilterModel) and data.draw(st.booleans()):
        return LookupPrefix(keys)  # feed the reuse counts with the keys offered
    if not isinstance(manager.policy, AnyPolicyModel) or not data.draw(st.booleans()):
        return PrepareStore(keys)
    # The implementation's choice: any legal victims, any free slots.
    passed = passed_keys(state, keys)
    new = manager.new_keys(passed)
    need = len(new) - manager.free_count()
    eligible = manager.eligible_victims(passed)
    if not new or need > len(eligible):
        return PrepareStore(keys)
    victims = tuple(data.draw(st.permutations(eligible)))[: max(need, 0)]
    pool = manager.fresh + manager.free_list + tuple(manager.blocks[v].slot for v in victims)
    slots = tuple(data.draw(st.permutations(pool)))[: len(new)]
    return PrepareStore(keys, victims=victims, slots=slots)


def expect_illegal(state: Model, op: Operation, error: Exception) -> None:
    """A raised call must be one the table forbids, and is named right."""
    if isinstance(error, InvalidKeyError):
        assert isinstance(op, PrepareStore) and BAD_KEY in op.keys
        OUTCOMES["InvalidKeyError"] += 1
        return
    assert isinstance(error, IllegalTransitionError), error
    assert not is_legal(error.phase, error.call)
    if isinstance(op, ResetCache):  # refused while a load is in flight
        assert error.phase.kind is PhaseKind.LOADING
        assert error.phase == manager_of(state).phase(OffloadKey(error.key))
        OUTCOMES["IllegalTransitionError: reset_cache with a load in flight"] += 1
        return
    assert error.key in getattr(op, "keys", ())
    if isinstance(op, (PrepareLoad, CompleteStore)):
        assert error.phase == manager_of(state).phase(OffloadKey(error.key))
    OUTCOMES[f"IllegalTransitionError: {error.call.value} on {error.phase.kind.value}"] += 1


def run_sequence(data: st.DataObject, state: Model, steps: int) -> None:
    engine_resets = manager_of(state).profile.reset_announce is ResetAnnounce.ENGINE
    for _ in range(steps):
        op = draw_op(data, state)
        if isinstance(op, (KeyListOperation, Lookup)):
            op = attrs.evolve(op, request=data.draw(st.integers(0, 2)))
        if isinstance(op, ResetCache) and engine_resets:
            state = state.take_events()[0]  # the engine drains, then resets
        try:
            after, result = state.apply(op)
        except (IllegalTransitionError, InvalidKeyError) as error:
            expect_illegal(state, op, error)
            continue
        step = Step(state, op, after, result)
        violations = check_step(step)
        assert not violations, "\n".join(map(str, violations)) + f"\nstep: {step!r}"
        # Determinism, and the audit path: the model agrees with itself.
        assert state.apply(op) == (after, result)
        if isinstance(op, PrepareStore) and isinstance(result, StoreResult) and op.victims is None:
            audited = state.prepare_store(
                op.keys, victims=result.evicted, slots=result.store_slots, request=op.request
            )
            assert audited == (after, result)
            OUTCOMES["prepare_store evicting" if result.evicted else "prepare_store, room free"] += 1
        elif isinstance(op, PrepareStore):
            OUTCOMES["prepare_store None" if result is None else "prepare_store with given victims/slots"] += 1
        OUTCOMES["steps"] += 1
        tally(step)
        state = after


def tally(step: Step) -> None:
    before, after = manager_of(step.before), manager_of(step.after)
    for key in KEYS:
        phase = before.phase(key)
        for call in table_calls(step, key):
            REACHED[(phase.kind, call)] += 1
            phase = apply(key, phase, call)[0]
    policy_before, policy_after = before.policy, after.policy
    if isinstance(policy_before, ARCModel) and isinstance(policy_after, ARCModel):
        if policy_after.target > policy_before.target:
            OUTCOMES["ARC target up (B1 ghost hit)"] += 1
        if policy_after.target < policy_before.target:
            OUTCOMES["ARC target down (B2 ghost hit)"] += 1
        if len(policy_after.t2) > len(policy_before.t2) and isinstance(step.op, Touch):
            OUTCOMES["ARC promotion T1 -> T2"] += 1
        if len(policy_after.b2) > len(policy_before.b2):
            OUTCOMES["ARC eviction from T2"] += 1
        if len(policy_after.b1) > len(policy_before.b1):
            OUTCOMES["ARC eviction from T1"] += 1


configs = st.fixed_dictionaries(
    {
        "num_blocks": st.integers(1, 4),
        "enable_events": st.booleans(),
        "steps": st.integers(10, 80),
    }
)

SETTINGS = settings(
    max_examples=75,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("policy", ["lru", "arc", "any"])
@SETTINGS
@given(config=configs, data=st.data())
def test_manager_model_keeps_every_invariant(
    policy: str, config: dict[str, int], data: st.DataObject
) -> None:
    state = ManagerModel.create(
        config["num_blocks"], policy, enable_events=bool(config["enable_events"])
    )
    run_sequence(data, state, config["steps"])


@pytest.mark.parametrize("policy", ["lru", "arc", "any"])
@SETTINGS
@given(config=configs, data=st.data(), tracker=st.integers(1, 8), threshold=st.integers(2, 3))
def test_reuse_filter_model_keeps_every_invariant(
    policy: str, config: dict[str, int], data: st.DataObject, tracker: int, threshold: int
) -> None:
    backing = ManagerModel.create(
        config["num_blocks"], policy, enable_events=bool(config["enable_events"])
    )
    state = ReuseFilterModel(backing, store_threshold=threshold, max_tracker_size=tracker)
    run_sequence(data, state, config["steps"])


#: Every option away from its default at once (where the models read it).
VARIANT = Profile(
    name="variant",
    lookup_answer=LookupAnswer.RESULT,
    filter_counts=FilterCounts.OFFERS_KEEPING_OFFERED,
    filter_reset_clears=False,
    recency_commit=RecencyCommit.REQUEST_END,
    reset_announce=ResetAnnounce.ENGINE,
    complete_store_ignores_absent=True,
)


@pytest.mark.parametrize("counts", list(FilterCounts))
@pytest.mark.parametrize("policy", ["lru", "arc"])
@settings(SETTINGS, max_examples=25)
@given(config=configs, data=st.data(), tracker=st.integers(1, 8))
def test_models_keep_every_invariant_under_other_profiles(
    policy: str, counts: FilterCounts, config: dict[str, int], data: st.DataObject, tracker: int
) -> None:
    profile = VARIANT if counts is FilterCounts.OFFERS_KEEPING_OFFERED else Profile(
        name=counts.value, filter_counts=counts
    )
    backing = ManagerModel.create(
        config["num_blocks"], policy, enable_events=bool(config["enable_events"]),
        profile=profile,
    )
    run_sequence(data, ReuseFilterModel(backing, max_tracker_size=tracker), config["steps"])
    assert DEFAULT.filter_counts is FilterCounts.LOOKUPS


def test_every_table_row_was_reached() -> None:
    if not OUTCOMES["steps"]:
        pytest.skip("run together with the property tests above")
    print(f"\nproperty test: {OUTCOMES['steps']} successful model steps")
    for (kind, call), count in sorted(REACHED.items(), key=lambda kv: (kv[0][0].value, kv[0][1].value)):
        print(f"  {kind.value:8} {call.value:45} {count}")
    for outcome, count in sorted(OUTCOMES.items()):
        print(f"  {outcome:60} {count}")
    missing = set(TRANSITIONS) - set(REACHED)
    assert not missing, f"table rows never reached: {sorted((k.value, c.value) for k, c in missing)}"
