"""The bulk eviction path of the built-in policies.

``evict`` takes the least recent members in one pass each when the victim
search would take exactly those; these tests check that it chooses the same
victims, in the same order, with the same ghosts and recency afterwards, as
the one-at-a-time search (a subclass that turns the bulk path off), over
random operation sequences that pin, touch, fail stores, protect offered
keys and evict many blocks at once; and that freed block objects are
handed out again.
"""

from __future__ import annotations

import random
from collections.abc import Collection

import pytest

from kvoffload.impl.backend import CPUBackend
from kvoffload.impl.block import BlockStatus
from kvoffload.impl.manager import CPUOffloadingManager, OffloadingManagerCore
from kvoffload.impl.policies import (
    ARCCachePolicy,
    CachePolicy,
    EvictedBlocks,
    LRUCachePolicy,
    split_victims,
)
from kvoffload.spec.keys import OffloadKey
from tests.impl.impl_helpers import BLOCK_SIZE, CTX, key, keys, slots


class OneAtATimeLRU(LRUCachePolicy):
    """LRU with the bulk path off: every eviction is the scanning search."""

    def _evict_oldest(
        self, n: int, protected: Collection[OffloadKey]
    ) -> EvictedBlocks | None:
        return None


class OneAtATimeARC(ARCCachePolicy):
    """ARC with the bulk path off."""

    def _evict_oldest(
        self, n: int, protected: Collection[OffloadKey]
    ) -> EvictedBlocks | None:
        return None


def _pair(policy: str, capacity: int) -> tuple[OffloadingManagerCore, OffloadingManagerCore]:
    slow_policy: CachePolicy = (
        OneAtATimeLRU(capacity) if policy == "lru" else OneAtATimeARC(capacity)
    )
    fast = CPUOffloadingManager(BLOCK_SIZE, capacity, policy, enable_events=True)
    slow = OffloadingManagerCore(CPUBackend(BLOCK_SIZE, capacity), slow_policy, True)
    return fast, slow


def _observe(manager: OffloadingManagerCore, pool: list[OffloadKey]) -> object:
    return (
        manager.policy_state(),
        [(manager.phase(k), manager.slot_of(k)) for k in pool],
    )


def _run(policy: str, seed: int) -> int:
    """Drive both managers through one random sequence; the number of
    blocks evicted in stores that evicted more than one."""
    rng = random.Random(seed)
    capacity = rng.randint(2, 10)
    pool = [key(f"k{i}") for i in range(3 * capacity)]
    fast, slow = _pair(policy, capacity)
    loads: list[list[OffloadKey]] = []
    pending: list[OffloadKey] = []
    bulk = 0
    for _ in range(80):
        op = rng.random()
        ready = [k for k in pool if fast.phase(k).kind.name in ("READY", "LOADING")]
        if op < 0.45:
            offered = rng.sample(pool, rng.randint(1, capacity + 1))
            if rng.random() < 0.2:
                offered += offered[:2]  # repeats
            out_fast = fast.prepare_store(offered, CTX)
            out_slow = slow.prepare_store(offered, CTX)
            if out_fast is None or out_slow is None:
                assert out_fast is None and out_slow is None
            else:
                assert out_fast.keys_to_store == out_slow.keys_to_store
                assert out_fast.evicted_keys == out_slow.evicted_keys
                assert slots(out_fast.store_spec) == slots(out_slow.store_spec)
                if len(out_fast.evicted_keys) > 1:
                    bulk += len(out_fast.evicted_keys)
                pending += out_fast.keys_to_store
        elif op < 0.6 and pending:
            done = rng.sample(pending, rng.randint(1, len(pending)))
            success = rng.random() < 0.85
            fast.complete_store(done, CTX, success)
            slow.complete_store(done, CTX, success)
            pending = [k for k in pending if k not in done]
        elif op < 0.75 and ready:
            chosen = rng.sample(ready, rng.randint(1, min(3, len(ready))))
            fast.prepare_load(chosen, CTX)
            slow.prepare_load(chosen, CTX)
            loads.append(chosen)
        elif op < 0.85 and loads:
            done = loads.pop(rng.randrange(len(loads)))
            fast.complete_load(done, CTX)
            slow.complete_load(done, CTX)
        else:
            touched = rng.sample(pool, rng.randint(1, capacity))
            fast.touch(touched, CTX)
            slow.touch(touched, CTX)
        assert _observe(fast, pool) == _observe(slow, pool)
        assert fast.take_events() == slow.take_events()
    return bulk


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_bulk_path_evicts_as_the_one_at_a_time_search(policy: str) -> None:
    evicted_in_bulk = sum(_run(policy, seed) for seed in range(150))
    assert evicted_in_bulk > 500  # the sequences did evict many blocks at once


def test_arc_bulk_order_t1_then_t2_then_t1_again() -> None:
    """T1 above its target gives its oldest, then T2 (preferred once T1 is
    at the target) until it runs dry, then T1 again; ghosts follow."""
    fast, slow = _pair("arc", 6)
    for manager in (fast, slow):
        out = manager.prepare_store(keys("a b c d e f"), CTX)
        assert out is not None
        manager.complete_store(out.keys_to_store, CTX)
        manager.touch(keys("e f"), CTX)  # e, f to T2
        policy = manager.policy
        assert isinstance(policy, ARCCachePolicy)
        policy.target_t1_size = 2.0  # T1 holds 4: prefer T1 for 3 victims
    results = [m.prepare_store(keys("g h i j k l"), CTX) for m in (fast, slow)]
    assert results[0] is not None and results[1] is not None
    assert results[0].evicted_keys == results[1].evicted_keys == tuple(keys("a b c f e d"))
    assert fast.policy_state() == slow.policy_state()


def test_evict_returns_keys_and_blocks_as_pairs() -> None:
    manager = CPUOffloadingManager(BLOCK_SIZE, 3, "lru")
    out = manager.prepare_store(keys("a b c"), CTX)
    assert out is not None
    manager.complete_store(out.keys_to_store, CTX)
    blocks = [manager.policy.get(k) for k in keys("a b c")]
    victims = manager.policy.evict(2, ())
    assert victims is not None
    assert list(victims) == [(key("a"), blocks[0]), (key("b"), blocks[1])]
    assert len(victims) == 2 and victims[1] == (key("b"), blocks[1])
    assert split_victims(victims) == (keys("a b"), blocks[:2])
    assert split_victims([(key("x"), BlockStatus(7))])[0] == [key("x")]


def test_freed_blocks_are_handed_out_again_pending_on_their_slots() -> None:
    backend = CPUBackend(BLOCK_SIZE, 4)
    first = backend.allocate_blocks(keys("a b c d"))
    for block in first[1:3]:
        block.ref_cnt = 0
        backend.free(block)
    again = backend.allocate_blocks(keys("x y"))
    assert again == [first[2], first[1]]  # last freed first, the same objects
    assert [b.block_id for b in again] == [2, 1]
    assert all(b.ref_cnt == -1 for b in again)
    assert backend.get_num_free_blocks() == 0
