"""Requests in the model: under request-scoped recency (vLLM 0.31 on:
``cpu/manager.py`` records each request's accesses, ``cpu/policies/lru.py``
and ``arc.py`` commit them in ``on_request_finished``, ARC adapts in
``on_store_miss``), worked by hand; under the default profile the hooks
change nothing."""

from __future__ import annotations

import attrs

from kvoffload.spec.invariants import Step, check_step
from kvoffload.spec.keys import make_offload_key
from kvoffload.spec.model import (
    FinishRequest,
    ManagerModel,
    PrepareStore,
    RequestRecord,
)
from kvoffload.spec.policies import ARCModel, LRUModel
from kvoffload.spec.profile import DEFAULT, Profile, RecencyCommit

REQUEST_END = attrs.evolve(DEFAULT, name="request-end", recency_commit=RecencyCommit.REQUEST_END)

# four blocks of one KV group, and a fifth key of group 1
A, B, C, D = (make_offload_key(name, 0) for name in (b"a", b"b", b"c", b"d"))
A1 = make_offload_key(b"a", 1)


def model(policy: str, num_blocks: int, profile: Profile = REQUEST_END) -> ManagerModel:
    return ManagerModel.create(num_blocks, policy, profile=profile)


def stored(state: ManagerModel, keys: tuple[bytes, ...], request: int) -> ManagerModel:
    state, result = state.prepare_store(keys, request=request)  # type: ignore[arg-type]
    assert result is not None and result.keys_to_store == keys
    return state.complete_store(keys)[0]  # type: ignore[arg-type]


def lru_order(state: ManagerModel) -> tuple[bytes, ...]:
    assert isinstance(state.policy, LRUModel)
    return state.policy.order


def test_lru_commits_a_request_when_it_finishes() -> None:
    state = stored(model("lru", 3), (A, B, C), request=0)
    assert lru_order(state) == (A, B, C)  # insertion: MRU end, in order
    assert state.record(0) == RequestRecord(
        seen=(A, B, C), inserted=frozenset({A, B, C}), store_missed=frozenset({A, B, C})
    )
    # finishing commits the request's uses as a touch of them: A ends most recent
    state = state.finish_request(0)[0]
    assert lru_order(state) == (C, B, A) and 0 not in state.requests
    # request 1 loads B: nothing moves until it finishes
    state = state.start_request(1)[0].prepare_load([B], request=1)[0]
    state = state.complete_load([B])[0]
    assert lru_order(state) == (C, B, A)
    state = state.finish_request(1)[0]
    assert lru_order(state) == (C, A, B)
    # touch still counts at once
    assert lru_order(state.touch([C])[0]) == (A, B, C)


def test_under_the_default_profile_loads_and_finishes_move_nothing() -> None:
    state = stored(model("lru", 3, DEFAULT), (A, B, C), request=0)
    after = state.prepare_load([B], request=1)[0].finish_request(1)[0].finish_request(0)[0]
    assert lru_order(after) == (A, B, C) and not after.requests and not state.requests


def test_a_request_commits_its_keys_group_by_group() -> None:
    # the request uses A1 (group 1) before A (group 0): the commit takes
    # group 0 first, so A1, walked last, is not the most recent...
    state = stored(model("lru", 3), (A1, A), request=0)
    assert state.record(0).order() == (A, A1)
    assert lru_order(state.finish_request(0)[0]) == (A1, A)


def test_arc_promotes_what_a_request_reused_when_it_finishes() -> None:
    state = stored(model("arc", 2), (A,), request=0)
    state = stored(state, (B,), request=0)
    state = state.finish_request(0)[0]  # stored only: no promotion, T1 order committed
    assert isinstance(state.policy, ARCModel)
    assert (state.policy.t1, state.policy.t2) == ((B, A), ())
    state = state.prepare_load([B], request=1)[0].complete_load([B])[0]
    assert isinstance(state.policy, ARCModel)
    assert (state.policy.t1, state.policy.t2) == ((B, A), ())  # not yet
    state = state.finish_request(1)[0]
    assert isinstance(state.policy, ARCModel)
    assert (state.policy.t1, state.policy.t2) == ((A,), (B,))
    # a key the request stored and then loaded itself is no reuse
    state = state.reset_cache()[0]
    state = stored(state, (C,), request=2).prepare_load([C], request=2)[0]
    state = state.complete_load([C])[0].finish_request(2)[0]
    assert isinstance(state.policy, ARCModel) and state.policy.t1 == (C,)


def test_arc_adapts_once_per_request_when_it_stores_a_ghost_key() -> None:
    state = stored(model("arc", 2), (A, B), request=0)
    state = state.prepare_store((C, D), request=0)[0]  # evicts A, B into B1
    assert isinstance(state.policy, ARCModel) and state.policy.b1 == (A, B)
    # C and D are PENDING: no room, but the offer of ghost A is a store miss
    once, result = state.prepare_store((A,), request=5)
    assert result is None and isinstance(once.policy, ARCModel)
    assert once.policy.target == 1.0 and once.policy.b1 == (B, A)
    assert once == state.offered((A,), 5)  # what a refusal may leave
    assert not check_step(Step(state, PrepareStore((A,), request=5), once, None))
    # the same request offering A again: no second adaptation
    again = once.prepare_store((A,), request=5)[0]
    assert isinstance(again.policy, ARCModel) and again.policy.target == 1.0
    # another request: one more
    other = again.prepare_store((A,), request=6)[0]
    assert isinstance(other.policy, ARCModel) and other.policy.target == 2.0
    # the default profile does not adapt on a store at all
    plain = stored(model("arc", 2, DEFAULT), (A, B), request=0)
    plain = plain.prepare_store((C, D))[0]
    assert plain.prepare_store((A,), request=5) == (plain, None)


def test_a_reset_forgets_what_open_requests_used() -> None:
    state = stored(model("lru", 2), (A, B), request=0).finish_request(0)[0]
    state = state.start_request(1)[0].prepare_load([B], request=1)[0]
    state = state.complete_load([B])[0]  # a reset waits for loads in flight
    state = state.reset_cache()[0]
    assert dict(state.requests) == {1: RequestRecord()}
    state = stored(state, (C, D), request=1)
    after = state.finish_request(1)[0]
    assert lru_order(after) == (D, C)  # only what came after the reset
    assert not check_step(Step(state, FinishRequest(1), after, None))
