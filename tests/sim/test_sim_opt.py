"""OPT: equal to an exhaustive optimum on tiny traces, never below a policy."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.sim.opt import next_uses, simulate_opt
from kvoffload.sim.replay import PolicySpec, simulate
from kvoffload.workloads import RequestRecord, Trace, compile_trace


def exhaustive_optimum(chains: Sequence[Sequence[int]], capacity: int) -> int:
    """Most prefix hits any strategy reaches: after each request's lookup,
    the cache may become any set of at most ``capacity`` blocks drawn from
    what it held and the request's missed blocks, provided the offered
    blocks it already held stay (protection). Dropping blocks at will is
    allowed, which only makes this bound more generous."""

    @functools.cache
    def best(index: int, cache: frozenset[int]) -> int:
        if index == len(chains):
            return 0
        chain = chains[index]
        hits = 0
        while hits < len(chain) and chain[hits] in cache:
            hits += 1
        offered = set(chain[hits:])
        required = cache & offered
        optional = sorted((cache - offered) | (offered - cache))
        room = capacity - len(required)
        result = 0
        for mask in range(1 << len(optional)):
            if bin(mask).count("1") > room:
                continue
            chosen = {block for bit, block in enumerate(optional) if mask >> bit & 1}
            result = max(result, best(index + 1, frozenset(required | chosen)))
        return hits + result

    return best(0, frozenset())


segment = st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(1, 3))
request = st.lists(segment, min_size=1, max_size=2)


def trace_of(requests: list[list[tuple[str, int]]]) -> Trace:
    return compile_trace(
        RequestRecord(f"r{i}", segments=tuple(segs)) for i, segs in enumerate(requests)
    )


@settings(max_examples=150, deadline=None)
@given(st.lists(request, min_size=1, max_size=7), st.integers(1, 3))
def test_opt_equals_exhaustive_optimum_on_tiny_traces(
    requests: list[list[tuple[str, int]]], capacity: int
) -> None:
    trace = trace_of(requests)
    result = simulate_opt(trace, capacity)
    assert result.hit_blocks == exhaustive_optimum(trace.chains, capacity)


POLICIES = [
    PolicySpec("lru"),
    PolicySpec("arc"),
    PolicySpec("lru", reuse_threshold=2),
    PolicySpec("arc", reuse_threshold=2),
    PolicySpec("arc", reuse_threshold=3),
]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(segment, min_size=1, max_size=3), min_size=1, max_size=30),
    st.integers(1, 8),
)
def test_opt_is_never_below_any_policy(
    requests: list[list[tuple[str, int]]], capacity: int
) -> None:
    trace = trace_of(requests)
    optimum = simulate_opt(trace, capacity)
    for spec in POLICIES:
        result = simulate(trace, spec, capacity)
        assert optimum.hit_blocks >= result.hit_blocks, spec.label
        assert result.block_refs == optimum.block_refs == trace.num_block_refs


def test_opt_bypasses_blocks_never_used_again() -> None:
    trace = trace_of([[("a", 3)], [("b", 2)], [("a", 2)]])
    result = simulate_opt(trace, 8)
    # only a's first two blocks are ever reused
    assert result.blocks_stored == 2
    assert result.hit_blocks == 2


def test_opt_keeps_the_block_needed_soonest() -> None:
    # capacity 1: after "a" and "b", only one of them can stay; "a" comes back
    # next, so it must be kept and "b" bypassed.
    trace = trace_of([[("a", 1)], [("b", 1)], [("a", 1)], [("b", 1)]])
    result = simulate_opt(trace, 1)
    assert result.hit_blocks == 1
    assert result.hit_blocks == exhaustive_optimum(trace.chains, 1)


def test_next_uses_points_at_the_next_request_holding_the_block() -> None:
    trace = trace_of([[("a", 2)], [("b", 1)], [("a", 1)]])
    never = trace.num_requests
    assert next_uses(trace) == [[2, never], [never], [never]]
