"""The reuse filter: counting, admission by threshold, and protection of
offered keys that are already stored (invariant 3)."""

from __future__ import annotations

import pytest

from kvoffload.impl.manager import CPUOffloadingManager
from kvoffload.impl.policies import LRUCachePolicy
from kvoffload.impl.reuse import FilterReusedOffloadingManager
from kvoffload.spec.contract import RequestOffloadingContext
from kvoffload.spec.keys import OffloadKey
from tests.impl.impl_helpers import (
    ABSENT,
    CTX,
    READY,
    cpu_manager,
    key,
    keys,
    removed,
    slots,
    stored,
)


def filtered(
    num_blocks: int = 4, policy: str = "lru", threshold: int = 2, tracker: int = 64_000
) -> tuple[FilterReusedOffloadingManager, CPUOffloadingManager]:
    backing = cpu_manager(num_blocks, policy)
    return FilterReusedOffloadingManager(backing, threshold, tracker), backing


def see(filter_: FilterReusedOffloadingManager, k: OffloadKey, times: int) -> None:
    for _ in range(times):
        filter_.lookup(k, CTX)


def test_defaults() -> None:
    filter_ = FilterReusedOffloadingManager(cpu_manager(1))
    assert (filter_.store_threshold, filter_.max_tracker_size) == (2, 64_000)


def test_lookup_counts_the_key_and_answers_for_the_backing() -> None:
    filter_, backing = filtered()
    a, b = keys("a b")
    assert filter_.lookup(a, CTX) is False
    assert filter_.lookup(a, CTX) is False
    assert filter_.lookup(b, CTX) is False
    assert dict(filter_.counts) == {a: 2, b: 1}
    output = filter_.prepare_store([a], CTX)
    assert output is not None
    filter_.complete_store([a], CTX)
    assert filter_.lookup(a, CTX) is True
    assert dict(filter_.counts) == {a: 3, b: 1}
    assert backing.lookup(a, CTX) is True


def test_lookup_prefix_counts_every_key_even_past_the_first_miss() -> None:
    filter_, _ = filtered()
    a, b, c, d = keys("a b c d")
    see(filter_, a, 2)
    assert filter_.prepare_store([a], CTX) is not None
    filter_.complete_store([a], CTX)
    # a is ready, b is not: the prefix stops at b, yet c and d are counted
    assert filter_.lookup_prefix([a, b, c, d], CTX) == 1
    assert dict(filter_.counts) == {a: 3, b: 1, c: 1, d: 1}
    assert filter_.lookup_prefix(iter([b, c]), CTX) == 0
    assert dict(filter_.counts) == {a: 3, b: 2, c: 2, d: 1}


def test_counts_table_drops_the_least_recently_counted() -> None:
    filter_, _ = filtered(tracker=2)
    a, b, c = keys("a b c")
    see(filter_, a, 1)
    see(filter_, b, 1)
    see(filter_, a, 1)  # a is now more recently counted than b
    see(filter_, c, 1)  # table full: b is dropped, not a
    assert list(filter_.counts.items()) == [(a, 2), (c, 1)]
    see(filter_, b, 1)  # b starts again from 1; a is dropped
    assert list(filter_.counts.items()) == [(c, 1), (b, 1)]
    # a lost its count: it is not admitted any more
    output = filter_.prepare_store([a], CTX)
    assert output is not None and output.keys_to_store == ()


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_prepare_store_admits_only_keys_at_the_threshold(policy: str) -> None:
    filter_, backing = filtered(policy=policy, threshold=3)
    a, b, c = keys("a b c")
    see(filter_, a, 3)
    see(filter_, b, 2)
    counts_before = dict(filter_.counts)
    output = filter_.prepare_store([c, b, a, a], CTX)
    assert output is not None
    assert output.keys_to_store == (a,)
    assert slots(output.store_spec) == [0]
    assert dict(filter_.counts) == counts_before  # prepare_store does not count
    assert [backing.slot_of(k) for k in (a, b, c)] == [0, None, None]
    see(filter_, b, 1)
    output = filter_.prepare_store([c, b, a], CTX)
    assert output is not None and output.keys_to_store == (b,)


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_offered_ready_key_below_threshold_stays_protected(policy: str) -> None:
    """x is stored, then its count is dropped from the table. Offering x and
    a new z must not evict x, even though x alone would not be admitted: the
    filter passes x on (not stored again, but protected) and y goes instead."""
    filter_, backing = filtered(num_blocks=2, policy=policy, tracker=2)
    twin_filter, twin = filtered(num_blocks=2, policy=policy, tracker=2)
    x, y, z = keys("x y z")
    for f in (filter_, twin_filter):
        for k in (x, y):
            see(f, k, 2)
            assert f.prepare_store([k], CTX) is not None
            f.complete_store([k], CTX)
        see(f, z, 2)  # counting z drops x, the least recently counted
        assert dict(f.counts) == {y: 2, z: 2}

    # without the rule, only z reaches the backing and x (stored first,
    # least recent, T1's oldest under ARC) is the victim
    unprotected = twin.prepare_store([z], CTX)
    assert unprotected is not None and unprotected.evicted_keys == (x,)

    output = filter_.prepare_store([x, z], CTX)
    assert output is not None
    assert output.keys_to_store == (z,)
    assert output.evicted_keys == (y,)
    assert backing.phase(x) == READY
    assert dict(filter_.counts) == {y: 2, z: 2}
    assert filter_.take_events() == [stored([x]), stored([y]), removed([y])]


def test_filter_refusal_leaves_counts_and_backing_alone() -> None:
    filter_, backing = filtered(num_blocks=1)
    a, b = keys("a b")
    see(filter_, a, 2)
    assert filter_.prepare_store([a], CTX) is not None  # a PENDING, cache full
    see(filter_, b, 2)
    counts_before = dict(filter_.counts)
    assert filter_.prepare_store([b], CTX) is None
    assert dict(filter_.counts) == counts_before
    assert backing.phase(b) == ABSENT


def test_reset_cache_clears_counts_and_backing() -> None:
    filter_, backing = filtered()
    a, b = keys("a b")
    see(filter_, a, 2)
    see(filter_, b, 1)
    assert filter_.prepare_store([a], CTX) is not None
    filter_.complete_store([a], CTX)
    filter_.reset_cache()
    assert dict(filter_.counts) == {}
    assert backing.lookup(a, CTX) is False
    assert filter_.take_events() == [stored([a]), removed([a])]
    # a must be seen twice again before it is stored
    see(filter_, a, 1)
    output = filter_.prepare_store([a], CTX)
    assert output is not None and output.keys_to_store == ()


def test_other_calls_reach_the_backing() -> None:
    filter_, backing = filtered()
    a = key("a")
    req = CTX
    assert filter_.on_new_request(req) == RequestOffloadingContext(req_id=req.req_id)
    see(filter_, a, 2)
    assert filter_.prepare_store([a], req) is not None
    filter_.complete_store([a], req)
    assert slots(filter_.prepare_load([a], req)) == [0]
    assert backing.phase(a).loads == 1
    filter_.complete_load([a], req)
    assert backing.phase(a) == READY
    b = key("b")
    see(filter_, b, 2)
    assert filter_.prepare_store([b], req) is not None
    filter_.complete_store([b], req, success=False)
    assert backing.slot_of(b) is None
    c = key("c")
    see(filter_, c, 2)
    assert filter_.prepare_store([c], req) is not None
    filter_.complete_store([c], req)
    policy = backing.policy
    assert isinstance(policy, LRUCachePolicy)
    assert policy.recency_order() == [a, c]
    filter_.touch([a], req)
    assert policy.recency_order() == [c, a]
    filter_.on_request_finished(req)
    filter_.on_schedule_end()
    assert filter_.take_events() == [stored([a]), stored([c])]
    filter_.shutdown()
