"""The manager follows the lifecycle table of :mod:`kvoffload.spec.lifecycle`.

Every row of ``TRANSITIONS`` whose call is a manager call is driven on a real
manager (LRU and ARC): a key is put in the source phase through public calls,
the call is applied, and the phase and event must be what ``apply`` says.
Every (phase, call) pair outside the table must raise
``IllegalTransitionError`` naming the key, the phase found and the call, and
change nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvoffload.impl.manager import OffloadingManagerCore
from kvoffload.spec.contract import OffloadingEvent, PrepareStoreOutput
from kvoffload.spec.errors import IllegalTransitionError, OffloadingError
from kvoffload.spec.lifecycle import TRANSITIONS, Call, Phase, apply, is_legal
from tests.impl.impl_helpers import (
    ABSENT,
    CTX,
    PENDING,
    READY,
    cpu_manager,
    drive_to,
    key,
    keys,
    loading,
    observe,
    probe,
    removed,
    stored,
)

NUM_BLOCKS = 4
SUBJECT = key("subject")
FILLERS = keys("f1 f2 f3 f4")
OTHER = key("other")
UNIVERSE = [SUBJECT, OTHER, *FILLERS]

SOURCE_PHASES = [ABSENT, PENDING, READY, loading(1), loading(2)]
POLICIES = ["lru", "arc"]

Action = Callable[[OffloadingManagerCore], object]

# The calls of the table that are one manager call on the subject key.
# EVICT is not a call on the key: it is driven by filling the cache (below).
DIRECT_CALLS: dict[Call, Action] = {
    Call.PREPARE_STORE: lambda m: m.prepare_store([SUBJECT], CTX),
    Call.COMPLETE_STORE_OK: lambda m: m.complete_store([SUBJECT], CTX),
    Call.COMPLETE_STORE_FAILED: lambda m: m.complete_store([SUBJECT], CTX, success=False),
    Call.PREPARE_LOAD: lambda m: m.prepare_load([SUBJECT], CTX),
    Call.COMPLETE_LOAD: lambda m: m.complete_load([SUBJECT], CTX),
    Call.TOUCH: lambda m: m.touch([SUBJECT], CTX),
    Call.RESET: lambda m: m.reset_cache(),
}


def manager_with_subject_in(phase: Phase, policy: str) -> OffloadingManagerCore:
    manager = cpu_manager(NUM_BLOCKS, policy)
    drive_to(manager, SUBJECT, phase)
    manager.take_events()
    return manager


def expected_events(source: Phase, event_name: str | None) -> list[OffloadingEvent]:
    if event_name is None:
        return []
    if event_name == "STORED":
        return [stored([SUBJECT])]
    if event_name == "REMOVED":
        return [removed([SUBJECT])]
    assert event_name == "REMOVED_IF_ANNOUNCED"
    return [removed([SUBJECT])] if source.readable else []


def legal_cases() -> list[tuple[Phase, Call]]:
    return [
        (phase, call)
        for phase in SOURCE_PHASES
        for call in [*DIRECT_CALLS, Call.EVICT]
        if is_legal(phase, call)
    ]


def illegal_cases() -> list[tuple[Phase, Call]]:
    return [
        (phase, call)
        for phase in SOURCE_PHASES
        for call in [*DIRECT_CALLS, Call.EVICT]
        if not is_legal(phase, call)
    ]


def as_params(cases: list[tuple[Phase, Call]]) -> list[object]:
    return [pytest.param(phase, call, id=f"{phase}-{call.name}") for phase, call in cases]


def test_every_row_of_the_table_is_driven() -> None:
    driven = {(phase.kind, call) for phase, call in legal_cases()}
    manager_calls = set(DIRECT_CALLS) | {Call.EVICT}
    table_rows = {row for row in TRANSITIONS if row[1] in manager_calls}
    assert table_rows == driven
    # the calls this suite maps onto the manager are all calls of the table
    assert manager_calls <= set(Call)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("source", "call"), as_params(legal_cases()))
def test_legal_row(source: Phase, call: Call, policy: str) -> None:
    manager = manager_with_subject_in(source, policy)
    target, event = apply(SUBJECT, source, call)

    if call is Call.EVICT:
        # every other slot holds a pinned (PENDING) block: the subject is the
        # only victim another key's store can take.
        free = NUM_BLOCKS - 1
        output = manager.prepare_store(FILLERS[:free], CTX)
        assert output is not None
        manager.take_events()
        output = manager.prepare_store([OTHER], CTX)
        assert output is not None
        assert output.evicted_keys == (SUBJECT,)
    else:
        result = DIRECT_CALLS[call](manager)
        if call is Call.PREPARE_STORE:
            assert isinstance(result, PrepareStoreOutput)
            assert result.keys_to_store == ((SUBJECT,) if source == ABSENT else ())

    assert manager.phase(SUBJECT) == target
    assert manager.lookup(SUBJECT, CTX) is target.readable
    assert (manager.slot_of(SUBJECT) is None) == (target == ABSENT)
    event_name = None if event is None else event.name
    assert manager.take_events() == expected_events(source, event_name)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("source", "call"), as_params(illegal_cases()))
def test_illegal_pair_raises_and_changes_nothing(
    source: Phase, call: Call, policy: str
) -> None:
    if call is Call.EVICT:
        check_never_evicted(source, policy)
        return
    manager = manager_with_subject_in(source, policy)
    store_others = manager.prepare_store(FILLERS[:2], CTX)
    assert store_others is not None
    manager.complete_store(FILLERS[:1], CTX)  # one READY and one PENDING neighbour
    twin = manager_with_subject_in(source, policy)
    assert twin.prepare_store(FILLERS[:2], CTX) is not None
    twin.complete_store(FILLERS[:1], CTX)
    before = observe(manager, UNIVERSE)

    with pytest.raises(IllegalTransitionError) as raised:
        DIRECT_CALLS[call](manager)

    error = raised.value
    assert isinstance(error, OffloadingError)
    assert error.key == SUBJECT
    assert error.phase == source
    assert error.call is call
    assert not is_legal(error.phase, error.call)
    assert observe(manager, UNIVERSE) == before
    assert probe(manager, NUM_BLOCKS) == probe(twin, NUM_BLOCKS)


def check_never_evicted(source: Phase, policy: str) -> None:
    """A key outside READY is never a victim: with every other slot pinned,
    another key's store finds no room and changes nothing."""
    manager = manager_with_subject_in(source, policy)
    used = 0 if source == ABSENT else 1
    output = manager.prepare_store(FILLERS[: NUM_BLOCKS - used], CTX)
    assert output is not None
    before = observe(manager, UNIVERSE)
    assert manager.prepare_store([OTHER], CTX) is None
    assert observe(manager, UNIVERSE) == before
    assert manager.phase(SUBJECT) == source


# --- whole paths through the table -------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_store_then_load_twice_path(policy: str) -> None:
    manager = cpu_manager(NUM_BLOCKS, policy)
    k = SUBJECT
    output = manager.prepare_store([k], CTX)
    assert output is not None
    assert (manager.phase(k), manager.lookup(k, CTX)) == (PENDING, False)
    manager.complete_store([k], CTX)
    assert (manager.phase(k), manager.lookup(k, CTX)) == (READY, True)
    manager.prepare_load([k], CTX)
    assert manager.phase(k) == loading(1)
    manager.prepare_load([k], CTX)
    assert manager.phase(k) == loading(2)
    assert manager.lookup(k, CTX) is True
    manager.complete_load([k], CTX)
    assert manager.phase(k) == loading(1)
    manager.complete_load([k], CTX)
    assert manager.phase(k) == READY
    assert manager.take_events() == [stored([k])]


@pytest.mark.parametrize("policy", POLICIES)
def test_failed_store_frees_the_slot_and_is_never_announced(policy: str) -> None:
    manager = cpu_manager(2, policy)
    a, b, c = keys("a b c")
    output = manager.prepare_store([a, b], CTX)
    assert output is not None
    slot_of_a = manager.slot_of(a)
    manager.complete_store([a], CTX, success=False)
    assert manager.phase(a) == ABSENT
    assert manager.slot_of(a) is None
    assert manager.backend.get_num_free_blocks() == 1
    # the freed slot is handed out again without evicting anything
    output = manager.prepare_store([c], CTX)
    assert output is not None
    assert output.evicted_keys == ()
    assert manager.slot_of(c) == slot_of_a
    assert manager.take_events() == []


@pytest.mark.parametrize("policy", POLICIES)
def test_complete_store_on_ready_or_loading_is_a_no_op(policy: str) -> None:
    manager = cpu_manager(NUM_BLOCKS, policy)
    a, b = keys("a b")
    drive_to(manager, a, READY)
    drive_to(manager, b, loading(1))
    manager.take_events()
    before = observe(manager, [a, b])
    for success in (True, False):
        manager.complete_store([a, b], CTX, success=success)
        assert observe(manager, [a, b]) == before


@pytest.mark.parametrize("policy", POLICIES)
def test_complete_store_on_absent_key_changes_no_other_key_of_the_call(policy: str) -> None:
    for success in (True, False):
        manager = cpu_manager(NUM_BLOCKS, policy)
        pending, absent = keys("pending absent")
        assert manager.prepare_store([pending], CTX) is not None
        manager.take_events()
        before = observe(manager, [pending, absent])
        with pytest.raises(IllegalTransitionError) as raised:
            manager.complete_store([pending, absent], CTX, success=success)
        assert raised.value.key == absent
        assert raised.value.phase == ABSENT
        expected_call = Call.COMPLETE_STORE_OK if success else Call.COMPLETE_STORE_FAILED
        assert raised.value.call is expected_call
        assert observe(manager, [pending, absent]) == before
        assert manager.phase(pending) == PENDING


@pytest.mark.parametrize("policy", POLICIES)
def test_touch_never_changes_a_phase(policy: str) -> None:
    manager = cpu_manager(NUM_BLOCKS, policy)
    subjects = keys("absent pending ready loading")
    phases = [ABSENT, PENDING, READY, loading(1)]
    for k, phase in zip(subjects, phases):
        drive_to(manager, k, phase)
    for _ in range(2):
        manager.touch(subjects, CTX)
        manager.touch(list(reversed(subjects)), CTX)
        assert [manager.phase(k) for k in subjects] == phases


@pytest.mark.parametrize("policy", POLICIES)
def test_reset_cache_announces_readable_keys_in_slot_order(policy: str) -> None:
    manager = cpu_manager(6, policy)
    # slots: d=0 b=1 a=2 e=3 c=4 f=5
    d, b, a, e, c, f = order = keys("d b a e c f")
    assert manager.prepare_store(order, CTX) is not None
    manager.complete_store([a, b, c, d], CTX)
    manager.prepare_load([c], CTX)
    manager.prepare_load([d, d], CTX)
    manager.take_events()
    # e and f are PENDING: never announced, so never announced as removed
    # a reset waits for the loads in flight (their slots are being read)
    with pytest.raises(IllegalTransitionError):
        manager.reset_cache()
    manager.complete_load([c, d, d], CTX)

    manager.reset_cache()

    assert [manager.phase(k) for k in order] == [ABSENT] * 6
    assert [manager.lookup(k, CTX) for k in order] == [False] * 6
    assert manager.take_events() == [removed([d, b, a, c])]
    assert manager.backend.get_num_free_blocks() == 6
    # every slot is free again, handed out from 0 upward
    output = manager.prepare_store(keys("x y"), CTX)
    assert output is not None
    assert [manager.slot_of(k) for k in output.keys_to_store] == [0, 1]
    # nothing of before the reset can complete after it
    with pytest.raises(IllegalTransitionError):
        manager.complete_load([c], CTX)


def test_reset_cache_of_an_empty_manager_announces_nothing() -> None:
    manager = cpu_manager(2)
    manager.reset_cache()
    assert manager.take_events() == []
