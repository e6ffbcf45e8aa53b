"""The specification's invariants (docs/SPEC.md §5) as predicates over model states and steps.

Each predicate returns ``None`` when the invariant holds, else a
:class:`Violation` saying which invariant, which key (where one is to blame)
and why, in words. State predicates take a model state
(:class:`~kvoffload.spec.model.ManagerModel` or
:class:`~kvoffload.spec.reuse.ReuseFilterModel`); step predicates take a
:class:`Step` ``(before, op, after, result)`` of a call that returned (a call
that raised has no step: the state is the one before).

=========================  =====  ==========================================
predicate                  kind   invariant
=========================  =====  ==========================================
``well_formed``            state  0: the model's own bookkeeping is coherent
``capacity``               state  1: ≤ num_blocks tracked, slots distinct and
                                  in range, free pool = the other slots
``events_consistent``      state  6: events alternate per key and a consumer
                                  applying them holds the readable keys
``follows_table``          step   0: every phase change is a table row
``only_ready_evicted``     step   2: only READY blocks are evicted
``offered_not_evicted``    step   3: no offered key is evicted by that store
``atomic_refusal``         step   4: ``None`` leaves the state identical
``liveness``               step   5: ``None`` only when room does not exist,
                                  and exactly the victims needed are taken
``events_taken``           step   6: ``take_events`` hands over the queue,
                                  other calls only append their own events
``store_spec``             step   7: store/load slots are the keys' slots,
                                  in order
=========================  =====  ==========================================

:func:`check_state` and :func:`check_step` run them all (``check_step`` also
checks the state after). Every predicate reports one member of
:class:`~kvoffload.spec.violations.Invariant` (re-exported here), the one
set of names the models, the kit, the tests and the docs use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Union

import attrs

from kvoffload.spec.errors import OffloadingError
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.lifecycle import READY as READY_PHASE
from kvoffload.spec.lifecycle import Call, Phase, PhaseKind
from kvoffload.spec.lifecycle import apply as apply_call
from kvoffload.spec.model import (
    CompleteStore,
    Lookup,
    LookupPrefix,
    ManagerModel,
    Operation,
    PrepareLoad,
    PrepareStore,
    ResetCache,
    Result,
    ScheduleEnd,
    StoreResult,
    TakeEvents,
    dedup,
)
from kvoffload.spec.reuse import ReuseFilterModel
from kvoffload.spec.violations import Invariant, Violation

State = Union[ManagerModel, ReuseFilterModel]
"""A state the invariants are stated over."""


@attrs.frozen
class Step:
    """One call that returned: the state before, the call, the state after
    and the result."""

    before: State
    op: Operation
    after: State
    result: Result


def manager_of(state: State) -> ManagerModel:
    """The manager model inside ``state`` (the backing one of a filter)."""
    return state.core


def passed_keys(state: State, keys: tuple[OffloadKey, ...]) -> tuple[OffloadKey, ...]:
    """The keys a ``prepare_store(keys)`` on ``state`` offers the manager:
    all of them, or those the reuse filter lets through."""
    return state.passed_keys(keys)


# --- state invariants -------------------------------------------------------


def well_formed(state: State) -> Violation | None:
    """0: LOADING counts are positive, the policy orders exactly the tracked
    keys, ARC's lists are disjoint and its ghosts untracked and bounded,
    ``0 <= target <= capacity``; a filter's table is bounded with positive
    counts."""
    name = Invariant.WELL_FORMED
    model = manager_of(state)
    for key, block in model.blocks.items():
        if block.phase.kind is PhaseKind.ABSENT:
            return Violation(name, "an ABSENT key is stored as tracked", key)
        if (block.phase.kind is PhaseKind.LOADING) != (block.phase.loads > 0):
            return Violation(name, f"phase {block.phase} has a bad load count", key)
    resident = model.policy.resident()
    if resident is not None and resident != frozenset(model.blocks):
        return Violation(
            name,
            f"policy orders {sorted(resident)!r}, tracked keys are {sorted(model.blocks)!r}",
        )
    problem = model.policy.problems(frozenset(model.blocks))
    if problem is not None:
        return Violation(name, problem)
    if isinstance(state, ReuseFilterModel):
        keys = [k for k, _ in state.counts]
        if len(keys) > state.max_tracker_size or len(set(keys)) != len(keys):
            return Violation(name, "the reuse table is over its size or repeats a key")
        if any(c < 1 for _, c in state.counts):
            return Violation(name, "the reuse table holds a count below 1")
    return None


def capacity(state: State) -> Violation | None:
    """1: at most ``num_blocks`` keys tracked; their slots distinct and in
    ``[0, num_blocks)``; the free pool is exactly the other slots."""
    name = Invariant.CAPACITY
    model = manager_of(state)
    if len(model.blocks) > model.num_blocks:
        return Violation(name, f"{len(model.blocks)} keys tracked in {model.num_blocks} slots")
    used: dict[int, OffloadKey] = {}
    for key, block in model.blocks.items():
        if not 0 <= block.slot < model.num_blocks:
            return Violation(name, f"slot {block.slot} outside [0, {model.num_blocks})", key)
        if block.slot in used:
            return Violation(name, f"slot {block.slot} shared with {used[block.slot]!r}", key)
        used[block.slot] = key
    pool = model.fresh + model.free_list
    everything = set(range(model.num_blocks))
    if len(set(pool)) != len(pool) or set(pool) != everything - set(used):
        return Violation(
            name, f"free pool {pool!r} is not the complement of the used slots {sorted(used)!r}"
        )
    return None


def events_consistent(state: State) -> Violation | None:
    """6: per key, events alternate stored, removed, stored… starting with
    stored; a consumer that applied the taken events and then the queued
    ones holds exactly the readable keys. (Vacuous with events disabled,
    where the queue must stay empty.)"""
    name = Invariant.EVENTS
    model = manager_of(state)
    if not model.enable_events:
        if model.events or model.consumer_view:
            return Violation(name, "events recorded though events are disabled")
        return None
    view = model.consumer_view
    for event in model.events:
        if len(set(event.keys)) != len(event.keys) or not event.keys:
            return Violation(name, f"event {event!r} is empty or repeats a key")
        for key in event.keys:
            if event.removed and key not in view:
                return Violation(name, "removed without having been stored", key)
            if not event.removed and key in view:
                return Violation(name, "stored twice without a removal between", key)
        view = view - set(event.keys) if event.removed else view | set(event.keys)
    readable = model.readable_keys()
    if view != readable:
        odd = sorted(view ^ readable)
        return Violation(
            name, f"consumer view and readable keys differ on {odd!r}", odd[0]
        )
    return None


# --- step invariants --------------------------------------------------------


def table_calls(step: Step, key: OffloadKey) -> list[Call]:
    """The lifecycle-table calls ``step`` makes on ``key``, in order: what
    :func:`follows_table` replays, and what a coverage count tallies.
    A tiered manager (profile ``secondary_tiers``) adds its own: a lookup's
    promotion (PREPARE_STORE) and its victims (EVICT), a stored block's
    cascade pins (PREPARE_LOAD, one per tier), and at ``on_schedule_end``
    the promotions' COMPLETE_STORE and the cascades' COMPLETE_LOADs."""
    before = manager_of(step.before)
    if not before.tiered:
        return step.op.table_calls(step.before, step.result, key)
    polled = before.poll_for(step.op)
    calls = _poll_calls(before, polled, key)
    calls += step.op.table_calls(polled, step.result, key)
    return calls + _tier_calls(after_poll(step), polled, manager_of(step.after), key)


def after_poll(step: Step) -> Step:
    """``step`` from the poll its call starts with (a tiered manager under
    ``TierPoll.CALLS``; ``step`` itself otherwise): what the call did past
    the tier jobs it took first."""
    before = manager_of(step.before)
    if before is not step.before or not before.polls_at_calls:
        return step
    polled = before.poll_for(step.op)
    return step if polled is before else Step(polled, step.op, step.after, step.result)


def _poll_calls(before: ManagerModel, polled: ManagerModel, key: OffloadKey) -> list[Call]:
    """The calls a poll makes on ``key``: its promotion's COMPLETE_STORE,
    its cascades' COMPLETE_LOADs."""
    if polled is before:
        return []
    calls = []
    if key in before.submitted_promotions() and before.phase(key) != polled.phase(key):
        calls.append(Call.COMPLETE_STORE_OK)
    released = before.cascade_pins(key) - polled.cascade_pins(key)
    return calls + [Call.COMPLETE_LOAD] * max(0, released)


def _tier_calls(
    step: Step, before: ManagerModel, after: ManagerModel, key: OffloadKey
) -> list[Call]:
    op = step.op
    if isinstance(op, (Lookup, LookupPrefix)):
        was, now = before.phase(key).kind, after.phase(key).kind
        if was is PhaseKind.ABSENT and now is PhaseKind.PENDING:
            return [Call.PREPARE_STORE]
        if was is PhaseKind.READY and now is PhaseKind.ABSENT:
            return [Call.EVICT]
        return []
    if isinstance(op, CompleteStore):
        pins = after.cascade_pins(key) - before.cascade_pins(key)
        return [Call.PREPARE_LOAD] * pins if pins > 0 else []
    if isinstance(op, ScheduleEnd):
        if before.polls_at_calls:
            return []  # its poll is the step's start; its promotions are submitted
        if key in before.promoting_keys():
            return [Call.COMPLETE_STORE_OK]
        return [Call.COMPLETE_LOAD] * before.cascade_pins(key)
    return []


def _mentioned(op: Operation) -> frozenset[OffloadKey]:
    return frozenset(OffloadKey(k) for k in op.keys_mentioned if isinstance(k, bytes))


def follows_table(step: Step) -> Violation | None:
    """0: each key's phase after the step is what the lifecycle table gives
    for the calls the step made on it (no call: no change)."""
    before, after = manager_of(step.before), manager_of(step.after)
    for key in set(before.blocks) | set(after.blocks) | _mentioned(step.op):
        phase: Phase = before.phase(key)
        try:
            for call in table_calls(step, key):
                phase = apply_call(key, phase, call)[0]
        except OffloadingError as error:
            return Violation(Invariant.LIFECYCLE, f"the step made an illegal call: {error}", key)
        if phase != after.phase(key):
            return Violation(
                Invariant.LIFECYCLE,
                f"went {before.phase(key)} -> {after.phase(key)}, the table says {phase}",
                key,
            )
    return None


def only_ready_evicted(step: Step) -> Violation | None:
    """2: a key leaves the cache only as a READY victim of ``prepare_store``,
    a PENDING key of a failed ``complete_store``, or by ``reset_cache``."""
    name = Invariant.EVICTION_SAFETY
    before, after = manager_of(step.before), manager_of(step.after)
    op, result = step.op, step.result
    if isinstance(result, StoreResult):
        for key in result.evicted:
            if before.phase(key).kind is not PhaseKind.READY:
                return Violation(name, f"evicted while {before.phase(key)}", key)
    for key in set(before.blocks) - set(after.blocks):
        was = before.phase(key)
        if isinstance(op, ResetCache):
            continue
        if isinstance(op, CompleteStore) and not op.success and was.kind is PhaseKind.PENDING:
            continue
        if isinstance(result, StoreResult) and key in result.evicted:
            continue
        if before.tiered and isinstance(op, (Lookup, LookupPrefix)) and was == READY_PHASE:
            continue  # a READY victim of the promotion the lookup started
        return Violation(name, f"left the cache from {was} under {op!r}", key)
    return None


def offered_not_evicted(step: Step) -> Violation | None:
    """3: no key offered to ``prepare_store`` (to the filter, if there is
    one) is evicted by it; offered keys already tracked keep phase and
    slot."""
    name = Invariant.PROTECTION
    op, result = step.op, step.result
    if not isinstance(op, PrepareStore) or not isinstance(result, StoreResult):
        return None
    before, after = manager_of(step.before), manager_of(step.after)
    for key in dedup(op.keys):
        if key in result.evicted:
            return Violation(name, "an offered key was evicted", key)
        if key in before.blocks and before.blocks[key] != after.blocks.get(key):
            return Violation(name, "an offered, tracked key changed phase or slot", key)
    return None


def atomic_refusal(step: Step) -> Violation | None:
    """4: ``prepare_store`` answering ``None`` leaves the whole state —
    phases, slots, recency, ghosts, target, counts, events — as it was, but
    for what the profile says an offer records before room is sought
    (``before.offered(keys)``: nothing under the default profile)."""
    op = step.op
    if isinstance(op, PrepareStore) and step.result is None:
        if step.after != step.before.offered(op.keys, op.request):
            return Violation(
                Invariant.ATOMICITY, "prepare_store returned None but changed the state"
            )
    return None


def liveness(step: Step) -> Violation | None:
    """5: ``prepare_store`` answers ``None`` only when the new keys outnumber
    free slots plus READY keys outside the offered set; when it succeeds it
    evicts exactly ``max(0, new - free)`` keys."""
    name = Invariant.LIVENESS
    op, result = step.op, step.result
    if not isinstance(op, PrepareStore):
        return None
    before = manager_of(step.before)
    passed = passed_keys(step.before, op.keys)
    new = before.new_keys(passed)
    free = before.free_count()
    room = free + len(before.eligible_victims(passed))
    if result is None:
        if len(new) <= room:
            return Violation(
                name, f"refused {len(new)} new keys with {free} free slots and "
                f"{room - free} evictable blocks"
            )
        return None
    if isinstance(result, StoreResult) and len(result.evicted) != max(0, len(new) - free):
        return Violation(
            name, f"evicted {len(result.evicted)} blocks, {max(0, len(new) - free)} were needed"
        )
    return None


def events_taken(step: Step) -> Violation | None:
    """6 (step): ``take_events`` returns the queue, oldest first, and empties
    it; every other call leaves queued events in place, appending at most
    one event of its own."""
    name = Invariant.EVENTS
    before, after = manager_of(step.before), manager_of(step.after)
    if isinstance(step.op, TakeEvents):
        if step.result != before.events or after.events:
            return Violation(name, "take_events did not hand over exactly the queue")
        return None
    if after.events[: len(before.events)] != before.events:
        return Violation(name, "a call changed events already queued")
    allowed = 1
    if isinstance(step.op, ScheduleEnd):  # a tiered manager: one per promotion batch
        allowed = max(1, len(before.promoting))
    if len(after.events) - len(before.events) > allowed:
        return Violation(name, "a call queued more events than it may")
    return None


def store_spec(step: Step) -> Violation | None:
    """7: ``prepare_store``'s slots are those allocated to ``keys_to_store``
    (the new offered keys, offer order), in that order; ``prepare_load``'s
    are the slots of its keys, in call order."""
    name = Invariant.STORE_SPEC
    op, result = step.op, step.result
    before, after = manager_of(step.before), manager_of(step.after)
    if isinstance(op, PrepareStore) and isinstance(result, StoreResult):
        expected = before.new_keys(passed_keys(step.before, op.keys))
        if result.keys_to_store != expected:
            return Violation(name, f"keys_to_store {result.keys_to_store!r}, expected {expected!r}")
        if len(result.store_slots) != len(expected):
            return Violation(name, "store spec and keys_to_store differ in length")
        for key, slot in zip(expected, result.store_slots):
            if after.slot(key) != slot:
                return Violation(name, f"spec names slot {slot}, key holds {after.slot(key)}", key)
    if isinstance(op, PrepareLoad):
        slots = tuple(before.slot(k) for k in op.keys)
        if step.result != slots:
            return Violation(name, f"load spec {step.result!r}, the keys' slots are {slots!r}")
    return None


StatePredicate = Callable[[State], Violation | None]
StepPredicate = Callable[[Step], Violation | None]

STATE_INVARIANTS: Mapping[Invariant, StatePredicate] = MappingProxyType(
    {
        Invariant.WELL_FORMED: well_formed,
        Invariant.CAPACITY: capacity,
        Invariant.EVENTS: events_consistent,
    }
)
"""Every state invariant: the rule and its predicate."""

STEP_INVARIANTS: Mapping[Invariant, StepPredicate] = MappingProxyType(
    {
        Invariant.LIFECYCLE: follows_table,
        Invariant.EVICTION_SAFETY: only_ready_evicted,
        Invariant.PROTECTION: offered_not_evicted,
        Invariant.ATOMICITY: atomic_refusal,
        Invariant.LIVENESS: liveness,
        Invariant.EVENTS: events_taken,
        Invariant.STORE_SPEC: store_spec,
    }
)
"""Every step invariant: the rule and its predicate."""


def check_state(state: State) -> tuple[Violation, ...]:
    """Every state invariant's violation (empty when all hold)."""
    return tuple(v for p in STATE_INVARIANTS.values() if (v := p(state)) is not None)


def check_step(step: Step) -> tuple[Violation, ...]:
    """Every step invariant's violation, then the state invariants' on
    ``step.after``."""
    main = after_poll(step)
    found = tuple(
        v
        for name, p in STEP_INVARIANTS.items()
        if (v := p(step if name is Invariant.LIFECYCLE else main)) is not None
    )
    return found + check_state(step.after)


__all__ = [
    "STATE_INVARIANTS",
    "STEP_INVARIANTS",
    "Invariant",
    "State",
    "Step",
    "Violation",
    "atomic_refusal",
    "capacity",
    "check_state",
    "check_step",
    "events_consistent",
    "events_taken",
    "after_poll",
    "follows_table",
    "liveness",
    "manager_of",
    "offered_not_evicted",
    "only_ready_evicted",
    "passed_keys",
    "store_spec",
    "table_calls",
    "well_formed",
]
