"""prepare_store, events and the LRU policy against hand-worked examples.

Recency orders are written least recent first, as ``recency_order()`` gives
them.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from kvoffload.impl.backend import CPUBackend
from kvoffload.impl.manager import CPUOffloadingManager, LRUOffloadingManager, OffloadingManagerCore
from kvoffload.impl.policies import LRUCachePolicy
from kvoffload.impl.specs import CPULoadStoreSpec
from kvoffload.spec.contract import PrepareStoreOutput
from kvoffload.spec.errors import IllegalTransitionError
from kvoffload.spec.keys import OffloadKey
from tests.impl.impl_helpers import (
    ABSENT,
    BLOCK_SIZE,
    CTX,
    PENDING,
    READY,
    cpu_manager,
    drive_to,
    key,
    keys,
    loading,
    observe,
    removed,
    slots,
    store,
    stored,
)


def lru_order(manager: OffloadingManagerCore) -> list[OffloadKey]:
    policy = manager.policy
    assert isinstance(policy, LRUCachePolicy)
    return policy.recency_order()


# --- prepare_store ---------------------------------------------------------------


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_prepare_store_dedups_and_skips_tracked_keys(policy: str) -> None:
    manager = cpu_manager(8, policy)
    a, b, c, d, e = keys("a b c d e")
    drive_to(manager, a, READY)
    drive_to(manager, b, PENDING)
    drive_to(manager, c, loading(1))
    output = manager.prepare_store([d, a, d, b, e, c, e], CTX)
    assert output is not None
    assert output.keys_to_store == (d, e)
    assert output.evicted_keys == ()
    assert slots(output.store_spec) == [manager.slot_of(d), manager.slot_of(e)] == [3, 4]
    assert output.store_spec.medium() == "CPU"
    assert [manager.phase(k) for k in (a, b, c, d, e)] == [READY, PENDING, loading(1), PENDING, PENDING]


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_prepare_store_of_nothing_new_changes_nothing(policy: str) -> None:
    manager = cpu_manager(2, policy)
    a, b = keys("a b")
    drive_to(manager, a, READY)
    drive_to(manager, b, PENDING)
    before = observe(manager, [a, b])
    for offered in ([], [a], [b, a, b]):
        output = manager.prepare_store(offered, CTX)
        assert output == PrepareStoreOutput((), CPULoadStoreSpec([]), ())
        assert observe(manager, [a, b]) == before


def test_slots_are_fresh_ascending_then_freed_last_in_first_out() -> None:
    manager = cpu_manager(5)
    a, b, c, d, e, f, g, h = keys("a b c d e f g h")
    output = manager.prepare_store([a, b, c], CTX)
    assert output is not None and slots(output.store_spec) == [0, 1, 2]
    manager.complete_store([a, b, c], CTX)
    manager.complete_store([b], CTX, success=False)  # READY: no-op
    output = manager.prepare_store([d], CTX)
    assert output is not None and slots(output.store_spec) == [3]
    manager.complete_store([d], CTX, success=False)  # frees 3
    # order least recent first: a b c (d is gone); 3 and 4 are free.
    # f and g need one victim: a, whose slot 0 is freed after 3.
    output = manager.prepare_store([e, f, g], CTX)
    assert output is not None
    assert output.evicted_keys == (a,)
    # fresh slot 4 first, then the free list last-in-first-out: 0, then 3
    assert slots(output.store_spec) == [4, 0, 3]
    manager.complete_store([e, f, g], CTX)
    output = manager.prepare_store([h], CTX)
    assert output is not None and output.evicted_keys == (b,)
    assert slots(output.store_spec) == [1]


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_store_is_refused_only_when_room_is_short(policy: str) -> None:
    """Invariant 5: None iff new keys > free slots + READY keys not offered."""
    manager = cpu_manager(5, policy)
    ready1, ready2, offered_ready, pinned, pending = keys("r1 r2 offered pinned pending")
    for k in (ready1, ready2, offered_ready):
        drive_to(manager, k, READY)
    drive_to(manager, pinned, loading(1))
    drive_to(manager, pending, PENDING)
    universe = [ready1, ready2, offered_ready, pinned, pending, *keys("n1 n2 n3")]
    before = observe(manager, universe)
    # 0 free + 2 READY outside the offer (offered_ready is protected): 3 new is too many
    assert manager.prepare_store([offered_ready, *keys("n1 n2 n3")], CTX) is None
    assert observe(manager, universe) == before
    assert manager.take_events() == [stored([ready1]), stored([ready2]), stored([offered_ready]), stored([pinned])]
    before = observe(manager, universe)
    # exactly enough room: 2 new keys take both unoffered READY blocks
    output = manager.prepare_store([offered_ready, *keys("n1 n2")], CTX)
    assert output is not None
    assert output.keys_to_store == tuple(keys("n1 n2"))
    assert set(output.evicted_keys) == {ready1, ready2}
    assert manager.phase(offered_ready) == READY


# --- events ---------------------------------------------------------------------


def test_events_one_removed_per_evicting_store_then_stored_per_completion() -> None:
    manager = cpu_manager(3)
    a, b, c, d, e = keys("a b c d e")
    manager.prepare_store([a, b], CTX)
    manager.prepare_store([c], CTX)
    manager.complete_store([c, b, a], CTX)  # listed in call order
    manager.complete_store([b, a], CTX)  # already READY: no event
    manager.touch([a], CTX)  # order a b c (insertion) → b c a
    output = manager.prepare_store([d, e], CTX)
    assert output is not None and output.evicted_keys == (b, c)
    manager.complete_store([e, d, e], CTX)
    events = manager.take_events()
    assert isinstance(events, list)
    assert events == [stored([c, b, a]), removed([b, c]), stored([e, d])]
    assert all(event.block_size == BLOCK_SIZE and event.medium == "CPU" for event in events)
    assert manager.take_events() == []


def test_events_are_not_collected_when_disabled() -> None:
    manager = CPUOffloadingManager(BLOCK_SIZE, 1)
    a, b = keys("a b")
    store(manager, [a])
    store(manager, [b])
    manager.reset_cache()
    assert manager.take_events() == []


def test_a_consumer_applying_events_tracks_the_readable_keys() -> None:
    """Invariant 6 on a hand-picked run with evictions, a failure and a reset."""
    manager = cpu_manager(3)
    universe = keys("a b c d e f")
    a, b, c, d, e, f = universe
    seen: set[OffloadKey] = set()

    def consume() -> None:
        for event in manager.take_events():
            for k in event.keys:
                if event.removed:
                    assert k in seen
                    seen.remove(k)
                else:
                    assert k not in seen
                    seen.add(k)
        assert seen == {k for k in universe if manager.lookup(k, CTX)}

    store(manager, [a, b])
    consume()
    manager.prepare_store([c, d], CTX)
    manager.complete_store([c], CTX)
    manager.complete_store([d], CTX, success=False)
    consume()
    manager.prepare_load([c], CTX)
    store(manager, [e, f])
    consume()
    manager.complete_load([c], CTX)  # a reset waits for loads in flight
    manager.reset_cache()
    consume()
    assert seen == set()


# --- LRU order ------------------------------------------------------------------


def test_insertion_makes_keys_most_recent_in_keys_to_store_order() -> None:
    manager = cpu_manager(6)
    a, b, c, d = keys("a b c d")
    store(manager, [b])
    manager.prepare_store([c, b, a, d, a], CTX)
    assert lru_order(manager) == [b, c, a, d]


def test_touch_walks_keys_in_reverse_so_the_first_ends_most_recent() -> None:
    manager = cpu_manager(6)
    a, b, c, d, e = keys("a b c d e")
    store(manager, [a, b, c, d, e])
    manager.touch([c, a, key("absent")], CTX)
    # reverse walk: absent is ignored, then a moves to the end, then c:
    # the first key offered (c) ends most recent
    assert lru_order(manager) == [b, d, e, a, c]
    manager.touch([b], CTX)
    assert lru_order(manager) == [d, e, a, c, b]


def test_victims_least_recent_first_skipping_pinned_and_offered() -> None:
    manager = cpu_manager(6)
    a, b, c, d, e, f = keys("a b c d e f")
    store(manager, [a, b, c, d])
    manager.touch([a], CTX)  # order: b c d a
    manager.prepare_load([b], CTX)  # b pinned
    manager.prepare_store([e], CTX)  # e PENDING: order b c d a e
    manager.prepare_store([f], CTX)  # all 6 slots used: b c d a e f
    g, h = keys("g h")
    # victims: b pinned, c offered → d, then a
    output = manager.prepare_store([c, g, h], CTX)
    assert output is not None
    assert output.evicted_keys == (d, a)
    assert lru_order(manager) == [b, c, e, f, g, h]
    assert [manager.phase(k) for k in (d, a)] == [ABSENT, ABSENT]


def test_finished_load_keeps_its_old_recency() -> None:
    """prepare_load/complete_load do not touch: a loaded key that was least
    recent is the next victim once its load completes."""
    manager = cpu_manager(3)
    a, b, c, d = keys("a b c d")
    store(manager, [a, b, c])
    manager.prepare_load([a], CTX)
    output = manager.prepare_store([d], CTX)
    assert output is not None and output.evicted_keys == (b,)
    manager.complete_store([d], CTX)
    manager.complete_load([a], CTX)
    output = manager.prepare_store([key("x")], CTX)
    assert output is not None and output.evicted_keys == (a,)


def test_touching_a_pending_key_moves_it_without_making_it_evictable() -> None:
    manager = cpu_manager(3)
    a, b, c, d = keys("a b c d")
    store(manager, [a, b])
    manager.prepare_store([c], CTX)
    manager.touch([c, a], CTX)
    assert lru_order(manager) == [b, a, c]
    assert manager.phase(c) == PENDING
    output = manager.prepare_store([d, key("e")], CTX)
    assert output is not None and output.evicted_keys == (b, a)
    assert manager.phase(c) == PENDING


def test_failed_eviction_keeps_the_order() -> None:
    manager = cpu_manager(3)
    a, b, c = keys("a b c")
    store(manager, [a, b, c])
    manager.touch([a], CTX)
    manager.prepare_load([c], CTX)
    # READY outside the offer: only b (a is offered, c pinned): 2 new fail
    assert manager.prepare_store([a, *keys("x y")], CTX) is None
    assert lru_order(manager) == [b, c, a]
    output = manager.prepare_store(keys("x y"), CTX)
    assert output is not None and output.evicted_keys == (b, a)


# --- LRUOffloadingManager is the same machine --------------------------------------


def run_script(manager: OffloadingManagerCore, seed: int) -> list[Any]:
    """A fixed pseudo-random mix of legal and illegal calls, recording every
    answer (errors by key, phase and call)."""
    rng = random.Random(seed)
    pool = [key(f"k{i}") for i in range(10)]
    record: list[Any] = []
    for _ in range(400):
        op = rng.randrange(7)
        chosen = rng.sample(pool, rng.randint(1, 3))
        try:
            if op == 0:
                out = manager.prepare_store(chosen, CTX)
                record.append(
                    None if out is None else (out.keys_to_store, slots(out.store_spec), out.evicted_keys)
                )
            elif op == 1:
                manager.complete_store(chosen, CTX, success=rng.random() < 0.8)
            elif op == 2:
                record.append(slots(manager.prepare_load(chosen, CTX)))
            elif op == 3:
                manager.complete_load(chosen, CTX)
            elif op == 4:
                manager.touch(chosen, CTX)
            elif op == 5:
                record.append(manager.lookup_prefix(chosen, CTX))
            elif rng.random() < 0.05:
                manager.reset_cache()
        except IllegalTransitionError as error:
            record.append(("error", error.key, error.phase, error.call))
        record.append([manager.phase(k) for k in pool])
    record.append(manager.take_events())
    return record


@pytest.mark.parametrize("seed", range(4))
def test_lru_offloading_manager_behaves_as_cpu_manager_lru(seed: int) -> None:
    reference = CPUOffloadingManager(BLOCK_SIZE, 5, "lru", enable_events=True)
    over_backend = LRUOffloadingManager(CPUBackend(BLOCK_SIZE, 5), enable_events=True)
    assert over_backend.block_size == BLOCK_SIZE and over_backend.medium == "CPU"
    assert run_script(over_backend, seed) == run_script(reference, seed)
