"""``stats()``: the snapshot agrees with the phases it summarises, after
any sequence of calls, and its counters count what they say."""

from __future__ import annotations

import random

import pytest

from kvoffload import ReqContext, make_offload_key
from kvoffload.impl.manager import CPUOffloadingManager
from kvoffload.impl.reuse import FilterReusedOffloadingManager
from kvoffload.impl.stats import ManagerStats
from kvoffload.spec.errors import OffloadingError
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.lifecycle import ABSENT, PENDING, READY

CAPACITY = 6


def key(index: int) -> OffloadKey:
    return make_offload_key(index.to_bytes(2, "big"), 0)


KEYS = [key(i) for i in range(12)]


def scanned(manager: CPUOffloadingManager) -> tuple[int, int, int]:
    """(pending, loading, ready) counted key by key."""
    phases = [manager.phase(k) for k in KEYS if manager.phase(k) != ABSENT]
    pending = sum(1 for p in phases if p == PENDING)
    ready = sum(1 for p in phases if p == READY)
    return pending, len(phases) - pending - ready, ready


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("seed", range(5))
def test_occupancy_agrees_with_the_phases(policy: str, seed: int) -> None:
    rng = random.Random(seed)
    manager = CPUOffloadingManager(16, CAPACITY, policy)
    ctx = ReqContext(req_id="r")
    for _ in range(300):
        chosen = rng.sample(KEYS, rng.randrange(1, 4))
        call = rng.randrange(6)
        try:
            if call == 0:
                manager.prepare_store(chosen, ctx)
            elif call == 1:
                manager.complete_store(chosen, ctx, rng.random() < 0.8)
            elif call == 2:
                manager.prepare_load(chosen, ctx)
            elif call == 3:
                manager.complete_load(chosen, ctx)
            elif call == 4 and rng.random() < 0.05:
                manager.reset_cache()
            else:
                manager.touch(chosen, ctx)
        except OffloadingError:
            pass  # an illegal call changes nothing
        stats = manager.stats()
        assert (stats.pending, stats.loading, stats.ready) == scanned(manager)
        assert stats.free + stats.pending + stats.loading + stats.ready == CAPACITY
        assert stats.capacity == CAPACITY


def test_counters_count_what_they_say() -> None:
    manager = CPUOffloadingManager(16, 2)
    ctx = ReqContext(req_id="r")
    a, b, c = KEYS[:3]
    manager.prepare_store([a, b], ctx)
    assert manager.stats().write_usage == 1.0
    manager.complete_store([a], ctx)
    manager.complete_store([b], ctx, success=False)
    manager.prepare_load([a, a], ctx)  # one block, two loads
    stats = manager.stats()
    assert (stats.blocks_stored, stats.store_failures, stats.loading) == (1, 1, 1)
    assert stats.read_usage == 0.5 and stats.usage == 0.5
    assert manager.prepare_store([b, c], ctx) is None  # a is pinned: no room for two
    manager.complete_load([a, a], ctx)
    output = manager.prepare_store([b, c], ctx)
    assert output is not None and output.evicted_keys == (a,)
    stats = manager.stats()
    assert (stats.stores_refused, stats.blocks_evicted, stats.loading, stats.pending) == (
        1,
        1,
        0,
        2,
    )


def test_a_filter_adds_the_keys_it_skipped() -> None:
    manager = FilterReusedOffloadingManager(CPUOffloadingManager(16, 4))
    ctx = ReqContext(req_id="r")
    manager.lookup(KEYS[0], ctx)
    manager.lookup(KEYS[0], ctx)
    manager.prepare_store(KEYS[:3], ctx)  # KEYS[0] passes, two are skipped
    stats = manager.stats()
    assert isinstance(stats, ManagerStats)
    assert (stats.stores_skipped, stats.pending) == (2, 1)


def test_an_empty_manager_reports_no_usage() -> None:
    stats = CPUOffloadingManager(16, 0, allow_empty=True).stats()
    assert (stats.capacity, stats.usage, stats.write_usage, stats.read_usage) == (0, 0.0, 0.0, 0.0)
