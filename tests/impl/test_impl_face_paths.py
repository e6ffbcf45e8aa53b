"""The core's paths that vLLM 0.33's face runs on (branch arcface): the
per-key lookup answered by :class:`KeyAnswers`, the slot specs built
without the id check, and ARC's recency moves (``touch``,
``commit_request``) through :meth:`RecencyQueue.renew` and ``take``,
parked members included."""

from __future__ import annotations

import numpy as np
import pytest

from kvoffload import ReqContext
from kvoffload.impl.block import BlockStatus
from kvoffload.impl.manager import CPUOffloadingManager, KeyAnswers, RequestUse
from kvoffload.impl.policies import USE_INSERTED, USE_REUSED, USE_STORE_MISSED, ARCCachePolicy
from kvoffload.impl.recency import RecencyQueue
from kvoffload.impl.specs import CPULoadStoreSpec
from kvoffload.spec.errors import InvalidKeyError
from kvoffload.spec.profile import RecencyCommit

from .impl_helpers import key, keys, slots

CTX = ReqContext(req_id="r")


def test_key_answers_gives_the_callers_values_by_phase() -> None:
    core = CPUOffloadingManager(1, 4, "arc")
    answers = KeyAnswers(core, "hit", "pending", "miss")
    a, b = key("a"), key("b")
    core.prepare_store([a, b], CTX)
    core.complete_store([a], CTX)
    assert answers.lookup(a, CTX) == "hit"
    assert answers.lookup(b, CTX) == "pending"
    assert answers.lookup(key("c"), CTX) == "miss"
    core.prepare_load([a], CTX)  # LOADING is readable too
    assert answers.lookup(a, CTX) == "hit"


@pytest.mark.parametrize("bad", [b"", b"ab", "a string key", 12, memoryview(b"0123456789")])
def test_key_answers_rejects_a_malformed_key(bad: object) -> None:
    core = CPUOffloadingManager(1, 4, "lru")
    with pytest.raises(InvalidKeyError):
        KeyAnswers(core, 1, 2, 3).lookup(bad, CTX)  # type: ignore[arg-type]


def test_unchecked_slot_spec_equals_the_checked_one() -> None:
    ids = [5, 0, 3]
    unchecked = CPULoadStoreSpec(ids, checked=False)
    assert unchecked == CPULoadStoreSpec(ids)
    assert unchecked.block_ids.dtype == np.int64
    assert CPULoadStoreSpec([], checked=False) == CPULoadStoreSpec([])


def test_backend_specs_name_the_allocated_slots() -> None:
    core = CPUOffloadingManager(1, 3, "lru")
    output = core.prepare_store(keys("a b c"), CTX)
    assert output is not None
    assert slots(output.store_spec) == [0, 1, 2]
    core.complete_store(keys("a b c"), CTX)
    assert slots(core.prepare_load(keys("c a"), CTX)) == [2, 0]


def test_renew_and_take_reach_parked_members() -> None:
    queue: RecencyQueue[bytes] = RecencyQueue()
    a, b, c = (BlockStatus(slot) for slot in range(3))
    a.ref_cnt = 1  # pinned: the victim search parks it
    b.ref_cnt = c.ref_cnt = 0
    queue.add_many([b"a", b"b", b"c"], [a, b, c])
    scan = queue.scan(())
    assert scan.next() == b"b"
    scan.rollback()  # "a" stays parked
    assert not queue.renew(b"x")
    assert queue.renew(b"a")  # back from the parked table, most recent
    assert list(queue) == [b"b", b"c", b"a"]
    assert queue.take(b"b") is b
    assert queue.take(b"b") is None
    assert list(queue) == [b"c", b"a"]


def _arc(capacity: int) -> ARCCachePolicy:
    policy = ARCCachePolicy(capacity)
    for index, name in enumerate("abcdef"):
        block = BlockStatus(index)
        block.ref_cnt = 0
        policy.insert(key(name), block)
    return policy


def test_arc_commit_request_moves_as_documented() -> None:
    policy = _arc(8)
    policy.touch([key("a")])  # a: T1 -> T2
    a, b, c, d, e = keys("a b c d e")
    # order: first use first; walked in reverse
    # b and a reused, c only inserted, d and e neither (a ghost or untracked)
    policy.commit_request(
        [b, a, c, d, e], [USE_REUSED, USE_REUSED | USE_INSERTED, USE_INSERTED, 0, 0]
    )
    state = policy.state()
    # c stays in T1 and ends most recent there; b is promoted; a renewed
    assert state["t1"] == tuple(keys("d e f c"))
    assert state["t2"] == (a, b)


def test_arc_touch_keeps_a_pending_block_in_t1() -> None:
    policy = _arc(8)
    pending = BlockStatus(9)  # ref_cnt -1: a store in flight
    policy.insert(key("p"), pending)
    policy.touch(keys("p a"))
    state = policy.state()
    assert state["t1"] == tuple(keys("b c d e f p"))
    assert state["t2"] == (key("a"),)


def test_face_options_commit_through_the_core() -> None:
    core = CPUOffloadingManager(1, 2, "arc", recency_commit=RecencyCommit.REQUEST_END)
    a, b = keys("a b")
    core.on_new_request(CTX)
    core.prepare_store([a, b], CTX)
    core.complete_store([a, b], CTX)
    core.on_request_finished(CTX)
    second = ReqContext(req_id="s")
    core.on_new_request(second)
    core.prepare_load([a], second)
    core.complete_load([a], second)
    core.on_request_finished(second)
    assert core.policy_state()["t2"] == (a,)
    assert core.policy_state()["t1"] == (b,)


def test_unchecked_slot_spec_gives_its_ids_without_an_array() -> None:
    ids = [4, 1, 7]
    spec = CPULoadStoreSpec(ids, checked=False)
    listed = spec.id_list()
    assert listed == [4, 1, 7] and listed is not ids  # a copy: the spec keeps its own
    listed.append(9)
    assert len(spec) == 3 and spec.id_list() == [4, 1, 7]
    assert spec.block_ids.tolist() == [4, 1, 7]
    assert CPULoadStoreSpec([2, 3]).id_list() == [2, 3]  # a checked spec too


def test_request_record_flags_follow_the_model() -> None:
    """One request stores a and b, loads a again (not a reuse: it stored
    a), loads c (stored by another request: a reuse) and offers d, then b
    and d again (one store miss each)."""
    core = CPUOffloadingManager(1, 8, "arc", recency_commit=RecencyCommit.REQUEST_END)
    a, b, c, d = keys("a b c d")
    other = ReqContext(req_id="other")
    core.prepare_store([c], other)
    core.complete_store([c], other)
    core.on_request_finished(other)
    use = RequestUse()
    core._requests[CTX.req_id] = use
    core.prepare_store([a, b], CTX)
    core.complete_store([a, b], CTX)
    core.prepare_load([a, c], CTX)
    core.complete_load([a, c], CTX)
    core.prepare_store([c, d], CTX)  # c readable: a use already counted
    assert use.flags == {
        a: USE_STORE_MISSED | USE_INSERTED,
        b: USE_STORE_MISSED | USE_INSERTED,
        c: USE_REUSED,
        d: USE_STORE_MISSED | USE_INSERTED,
    }
    assert use.commit_order() == ([a, b, c, d], list(use.flags.values()))
    # offered again (d PENDING, b READY): no new store miss, nothing changes
    core.prepare_store([b, d], CTX)
    assert use.miss(d) is False
    assert list(use.flags) == [a, b, c, d]


def test_request_record_commits_group_by_group() -> None:
    use = RequestUse()
    g0, g1 = key("x", 0), key("y", 1)
    h0 = key("z", 0)
    use.miss(g1)
    use.reuse([g0, h0])
    assert use.commit_order() == ([g0, h0, g1], [USE_REUSED, USE_REUSED, USE_STORE_MISSED])


@pytest.mark.parametrize("success", [True, False])
def test_complete_store_takes_a_repeated_key_once(success: bool) -> None:
    core = CPUOffloadingManager(1, 4, "lru", enable_events=True)
    a, b = keys("a b")
    core.prepare_store([a, b], CTX)
    core.complete_store([a, b, a], CTX, success)
    stats = core.stats()
    assert stats.pending == 0
    if success:
        assert stats.blocks_stored == 2 and stats.ready == 2
        assert [event.keys for event in core.take_events()] == [(a, b)]
    else:
        assert stats.store_failures == 2 and stats.free == 4
        assert core.take_events() == []
