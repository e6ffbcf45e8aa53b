"""Shared vocabulary of the impl unit tests: keys, phases, driving a manager
into a phase, and an observation of everything a failed call must not change."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvoffload.impl.manager import CPUOffloadingManager, OffloadingManagerCore
from kvoffload.impl.policies import ARCCachePolicy, LRUCachePolicy
from kvoffload.impl.specs import BlockIDsLoadStoreSpec
from kvoffload.spec.contract import LoadStoreSpec, OffloadingEvent, ReqContext
from kvoffload.spec.keys import OffloadKey, make_offload_key
from kvoffload.spec.lifecycle import Phase, PhaseKind

CTX = ReqContext(req_id="req-0")
BLOCK_SIZE = 16

ABSENT = Phase(PhaseKind.ABSENT)
PENDING = Phase(PhaseKind.PENDING)
READY = Phase(PhaseKind.READY)


def loading(n: int) -> Phase:
    return Phase(PhaseKind.LOADING, n)


def key(name: str, group: int = 0) -> OffloadKey:
    """A readable key: the block hash is ``name`` itself."""
    return make_offload_key(name.encode(), group)


def keys(names: str) -> list[OffloadKey]:
    """``keys("a b c")`` → the keys named a, b, c, in that order."""
    return [key(name) for name in names.split()]


def slots(spec: LoadStoreSpec) -> list[int]:
    """The slot ids a block-id spec names, in order."""
    assert isinstance(spec, BlockIDsLoadStoreSpec)
    return [int(slot) for slot in spec.block_ids.tolist()]


def cpu_manager(num_blocks: int, policy: str = "lru") -> CPUOffloadingManager:
    return CPUOffloadingManager(BLOCK_SIZE, num_blocks, policy, enable_events=True)


def stored(keys_: Sequence[OffloadKey]) -> OffloadingEvent:
    return OffloadingEvent(tuple(keys_), BLOCK_SIZE, "CPU", removed=False)


def removed(keys_: Sequence[OffloadKey]) -> OffloadingEvent:
    return OffloadingEvent(tuple(keys_), BLOCK_SIZE, "CPU", removed=True)


def store(manager: OffloadingManagerCore, keys_: Sequence[OffloadKey]) -> None:
    """Store ``keys_`` completely (prepare + complete); the store must fit."""
    output = manager.prepare_store(keys_, CTX)
    assert output is not None, f"no room to store {keys_!r}"
    manager.complete_store(keys_, CTX)


def drive_to(manager: OffloadingManagerCore, key_: OffloadKey, phase: Phase) -> None:
    """Bring the ABSENT ``key_`` into ``phase`` through public calls."""
    assert manager.phase(key_) == ABSENT
    if phase.kind is PhaseKind.ABSENT:
        return
    output = manager.prepare_store([key_], CTX)
    assert output is not None and output.keys_to_store == (key_,)
    if phase.kind is PhaseKind.PENDING:
        return
    manager.complete_store([key_], CTX)
    for _ in range(phase.loads):
        manager.prepare_load([key_], CTX)
    assert manager.phase(key_) == phase


def observe(manager: OffloadingManagerCore, keys_: Sequence[OffloadKey]) -> dict[str, Any]:
    """Everything observable about ``keys_`` and the manager's order state.

    Two equal observations mean the manager answers the same, will evict in
    the same order and holds the same unread events.
    """
    state: dict[str, Any] = {
        "phases": [manager.phase(k) for k in keys_],
        "lookup": [manager.lookup(k, CTX) for k in keys_],
        "slots": [manager.slot_of(k) for k in keys_],
        "events": list(manager.events) if manager.events is not None else None,
        "free": manager.backend.get_num_free_blocks(),
    }
    policy = manager.policy
    if isinstance(policy, LRUCachePolicy):
        state["lru"] = policy.recency_order()
    if isinstance(policy, ARCCachePolicy):
        state["arc"] = (
            list(policy.t1),
            list(policy.t2),
            list(policy.b1),
            list(policy.b2),
            policy.target_t1_size,
        )
    return state


def probe(manager: OffloadingManagerCore, num_blocks: int) -> list[Any]:
    """Store fresh keys one at a time and record slots and victims.

    Reveals the whole future eviction order and slot hand-out order, so that
    equal probes of two managers mean their hidden state agrees too.
    """
    record: list[Any] = []
    for i in range(num_blocks + 1):
        fresh = key(f"probe-{i}")
        output = manager.prepare_store([fresh], CTX)
        if output is None:
            record.append(None)
            continue
        record.append((output.keys_to_store, slots(output.store_spec), output.evicted_keys))
        manager.complete_store([fresh], CTX)
    record.append(manager.take_events())
    return record
