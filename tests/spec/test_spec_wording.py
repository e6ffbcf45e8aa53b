"""The four places of docs/SPEC.md a careful reader resolved differently
from the model (issue 18, item 11), stated as the model behaves."""

from __future__ import annotations

import attrs

from kvoffload.spec.keys import make_offload_key
from kvoffload.spec.model import ManagerModel
from kvoffload.spec.profile import DEFAULT, RecencyCommit
from kvoffload.stateful.harness import lookup_agrees

REQUEST_END = attrs.evolve(DEFAULT, name="request-end", recency_commit=RecencyCommit.REQUEST_END)
A, B, C = (make_offload_key(b"k%d" % i, 0) for i in range(3))


def model() -> ManagerModel:
    return ManagerModel.create(2, "lru", enable_events=False, profile=REQUEST_END)


def test_a_key_a_request_stored_itself_is_never_reused_by_it() -> None:
    m, _ = model().prepare_store([A], request=0)
    m, _ = m.complete_store([A], True)
    m, _ = m.prepare_store([A], request=0)  # offered again while readable
    m, _ = m.prepare_load([A], request=0)
    record = m.record(0)
    assert A in record.inserted and A not in record.reused and A in record.seen
    m, _ = m.prepare_store([A], request=1)  # another request: reused
    assert A in m.record(1).reused


def test_a_store_miss_counts_once_per_request_offers_while_new_only() -> None:
    m, out = ManagerModel.create(1, "lru", enable_events=False, profile=REQUEST_END).prepare_store(
        [A], request=0
    )
    assert A in m.record(0).store_missed  # offered while new
    m, _ = m.complete_store([A], True)
    m, _ = m.prepare_load([A], request=1)
    m, out = m.prepare_store([B], request=2)  # A is pinned: refused, B missed
    assert out is None and B in m.record(2).store_missed
    m, out = m.prepare_store([B], request=2)  # refused again: not a new miss
    assert m.record(2).store_missed == frozenset({B})
    m, _ = m.prepare_store([A], request=3)  # offered while readable: no miss
    assert A not in m.record(3).store_missed


def test_an_offer_with_nothing_new_records_its_readable_keys() -> None:
    m, _ = model().prepare_store([A, B], request=0)
    m, _ = m.complete_store([A, B], True)
    m, out = m.prepare_store([B, A], request=1)
    assert out is not None and not out.keys_to_store
    assert m.record(1).seen == (B, A) and m.record(1).reused == frozenset({A, B})


def test_lookups_may_ask_again_forever() -> None:
    for expected in (True, False):
        assert all(lookup_agrees(None, expected) for _ in range(1000))
