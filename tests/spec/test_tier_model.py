"""The tier table and model (kvoffload.spec.tier_model), and their docs."""

from __future__ import annotations

import itertools
import re
import zlib
from pathlib import Path

import pytest

from kvoffload.spec.contract import LookupResult
from kvoffload.spec.keys import make_offload_key
from kvoffload.spec.tier_contract import TierJob
from kvoffload.spec.tier_model import (
    FORBIDDEN,
    TIER_TRANSITIONS,
    IllegalTierCallError,
    InvalidTierJobError,
    TierCall,
    TierKey,
    TierModel,
    TierPhaseKind,
    check_capacity,
    check_drained,
    chunk_pattern,
    render_tier_mermaid,
    render_tier_table,
    tier_apply,
)
from kvoffload.spec.violations import Invariant, SpecViolation

A, B = make_offload_key(b"a", 0), make_offload_key(b"b", 0)
SPEC = Path(__file__).resolve().parents[2] / "docs" / "SPEC.md"

STATES = [
    TierKey(),
    TierKey(storing=(1,)),
    TierKey(storing=(1, 2)),
    TierKey(present=True, versions=frozenset({1})),
    TierKey(present=True, versions=frozenset({1}), storing=(2,)),
    TierKey(present=True, versions=frozenset({1}), loads=1),
    TierKey(present=True, versions=frozenset({1}), loads=2),
    TierKey(present=False, loads=1, evicted_under_load=True),
]


@pytest.mark.parametrize(("state", "call"), list(itertools.product(STATES, TierCall)))
def test_every_pair_follows_the_table_or_is_refused(state: TierKey, call: TierCall) -> None:
    version = state.storing[0] if state.storing and call in (
        TierCall.STORE_OK, TierCall.STORE_FAILED) else 9
    row = TIER_TRANSITIONS.get((state.kind, call))
    if row is None:
        expected = FORBIDDEN.get((state.kind, call))
        error_type = SpecViolation if expected else IllegalTierCallError
        with pytest.raises(error_type):
            tier_apply(A, state, call, version)
        return
    if call in (TierCall.STORE_OK, TierCall.STORE_FAILED) and not state.storing:
        with pytest.raises(IllegalTierCallError):
            tier_apply(A, state, call, version)
        return
    after = tier_apply(A, state, call, version)
    assert after.kind in row.targets


def test_readable_only_after_a_store_completed() -> None:
    model = TierModel(2)
    with pytest.raises(SpecViolation) as caught:
        model.observe(A, LookupResult.HIT)
    assert caught.value.invariant is Invariant.TIER_READABLE
    job = TierJob(0, (A,), (3,), False)
    model = model.submit_store(job, [1])
    assert model.phase(A) is TierPhaseKind.STORING
    assert model.observe(A, LookupResult.MISS).phase(A) is TierPhaseKind.STORING
    model, _, made = model.report(0, True, None)
    assert made == {A} and model.phase(A) is TierPhaseKind.PRESENT
    assert model.acceptable_chunks(A, 16) == {chunk_pattern(A, 1, 16)}
    evicted = model.observe(A, LookupResult.MISS)
    assert evicted.phase(A) is TierPhaseKind.ABSENT and not evicted.acceptable_chunks(A, 16)


def test_a_failed_store_leaves_the_key_absent_and_its_bytes_unreadable() -> None:
    model = TierModel(2).submit_store(TierJob(0, (A, B), (0, 1), False), [1, 1])
    model, _, made = model.report(0, False, [B])
    assert made == {B}
    assert model.phase(A) is TierPhaseKind.ABSENT and model.phase(B) is TierPhaseKind.PRESENT


def test_each_result_is_reported_exactly_once_and_names_only_its_keys() -> None:
    model = TierModel(2).submit_store(TierJob(0, (A,), (0,), False), [1])
    with pytest.raises(SpecViolation, match="never submitted") as unknown:
        model.report(7, True, None)
    assert unknown.value.invariant is Invariant.TIER_JOBS
    with pytest.raises(SpecViolation, match="does not hold"):
        model.report(0, False, [B])
    with pytest.raises(SpecViolation, match="success=True"):
        model.submit_store(TierJob(1, (B,), (1,), False), [1]).report(1, True, [])
    done, _, _ = model.report(0, True, None)
    with pytest.raises(SpecViolation, match="second time") as twice:
        done.report(0, True, None)
    assert twice.value.invariant is Invariant.TIER_JOBS


def _present(key: bytes = A) -> TierModel:
    model = TierModel(2).submit_store(TierJob(0, (A,), (0,), False), [1])
    return model.report(0, True, None)[0]


def test_a_promotion_pins_its_keys_until_reported() -> None:
    model = _present().submit_load(TierJob(1, (A,), (5,), True))
    assert model.phase(A) is TierPhaseKind.LOADING
    seen_evicted = model.observe(A, LookupResult.MISS)
    # evicted after the copy finished: legal if the load makes it...
    after, _, _ = seen_evicted.report(1, True, None)
    assert after.phase(A) is TierPhaseKind.ABSENT
    # ...a breach of the pin if it fails
    with pytest.raises(SpecViolation) as caught:
        seen_evicted.report(1, False, None)
    assert caught.value.invariant is Invariant.TIER_LIFECYCLE


def test_a_promotion_of_a_key_the_tier_lost_must_fail() -> None:
    model = _present().submit_load(TierJob(1, (A,), (5,), True))
    model = model.confirm_load(1, A, LookupResult.MISS)  # evicted before the load
    assert model.phase(A) is TierPhaseKind.ABSENT
    with pytest.raises(SpecViolation) as caught:
        model.report(1, True, None)
    assert caught.value.invariant is Invariant.TIER_READABLE
    failed, _, made = model.report(1, False, None)
    assert not made and not failed.jobs


def test_a_store_in_flight_may_serve_a_promotion_of_its_key() -> None:
    model = _present().submit_load(TierJob(1, (A,), (5,), True))
    model = model.confirm_load(1, A, LookupResult.MISS)
    model = model.submit_store(TierJob(2, (A,), (6,), False), [2])
    after, record, made = model.report(1, True, None)
    assert made == {A} and chunk_pattern(A, 2, 8) in after.acceptable_chunks(A, 8, record)


def test_a_job_the_model_cannot_take_is_refused_with_a_typed_error() -> None:
    model = TierModel(2).submit_store(TierJob(0, (A,), (0,), False), [1])
    for job in (TierJob(0, (B,), (1,), False), TierJob(1, (A, A), (1, 2), False),
                TierJob(2, (B,), (1, 2), True)):
        with pytest.raises(InvalidTierJobError):
            model.submit_load(job) if job.is_promotion else model.submit_store(job, [1])


def test_capacity_and_drain() -> None:
    model = TierModel(1)
    check_capacity(model, [A])
    with pytest.raises(SpecViolation) as caught:
        check_capacity(model, [A, B])
    assert caught.value.invariant is Invariant.TIER_CAPACITY
    busy = model.submit_store(TierJob(0, (A,), (0,), False), [1])
    with pytest.raises(SpecViolation) as drained:
        check_drained(busy, None)
    assert drained.value.invariant is Invariant.TIER_DRAIN
    with pytest.raises(SpecViolation):
        check_drained(model, True)
    check_drained(model, False)


def test_chunk_patterns_are_unique_per_key_and_version() -> None:
    patterns = {chunk_pattern(k, v, 48) for k in (A, B) for v in range(1, 20)}
    assert len(patterns) == 38 and all(len(p) == 48 for p in patterns)


def test_mermaid_draws_every_row_and_target() -> None:
    diagram = render_tier_mermaid()
    arrows = [line for line in diagram.splitlines() if "-->" in line and "[*]" not in line]
    assert len(arrows) == len({a.split(":")[0] for a in arrows})
    labels = sum(a.split(": ", 1)[1].count("<br/>") + 1 for a in arrows)
    assert labels == sum(len(row.targets) for row in TIER_TRANSITIONS.values())


def test_spec_doc_shows_the_tier_table_and_diagram() -> None:
    spec = SPEC.read_text(encoding="utf-8")
    blocks = re.findall(r"```mermaid\n(.*?)```", spec, flags=re.DOTALL)
    assert render_tier_mermaid() in blocks, (
        "docs/SPEC.md's tier diagram is stale: paste `python -c 'from "
        "kvoffload.spec.tier_model import render_tier_mermaid; print(render_tier_mermaid(), end=\"\")'`"
    )
    assert render_tier_table() in spec, "docs/SPEC.md's tier table is stale (render_tier_table())"


def _held(loads_succeed: bool = False, evicts_on_store: bool = False) -> TierModel:
    model = TierModel(2, loads_succeed=loads_succeed, evicts_on_store=evicts_on_store)
    model = model.submit_store(TierJob(0, (A,), (0,), False), [1])
    return model.report(0, True, None)[0]


def test_tier_loads_succeed_makes_a_failed_load_of_a_pinned_key_a_breach() -> None:
    submitted = _held(loads_succeed=True).submit_load(TierJob(1, (A,), (5,), True))
    pinned = submitted.confirm_load(1, A, LookupResult.HIT)
    with pytest.raises(SpecViolation, match="tier_loads_succeed") as caught:
        pinned.report(1, False, None)
    assert caught.value.invariant is Invariant.TIER_LIFECYCLE
    # a key not pinned (the tier answered RETRY right after the load) may fail
    unpinned = submitted.confirm_load(1, A, LookupResult.RETRY)
    assert not unpinned.report(1, False, None)[2]
    # without the option (a lossy tier, vllm-0.33) any promotion may fail
    lax = _held().submit_load(TierJob(1, (A,), (5,), True)).confirm_load(1, A, LookupResult.HIT)
    after, _, made = lax.report(1, False, None)
    assert not made and after.phase(A) is TierPhaseKind.PRESENT


def test_tier_evicts_on_store_allows_a_miss_only_after_a_cascade_since_the_last_hit() -> None:
    held = _held(evicts_on_store=True)
    with pytest.raises(SpecViolation, match="tier_evicts_on_store") as caught:
        held.observe(A, LookupResult.MISS)
    assert caught.value.invariant is Invariant.TIER_LIFECYCLE
    # a cascade of another key may have evicted it
    room = held.submit_store(TierJob(1, (B,), (1,), False), [1])
    assert room.key(A).room_made
    assert room.observe(A, LookupResult.MISS).phase(A) is TierPhaseKind.ABSENT
    # ...also once seen held again while that cascade is in flight (it may
    # allocate when its copy lands), but not after it was reported
    seen = room.observe(A, LookupResult.HIT)
    assert seen.observe(A, LookupResult.MISS).phase(A) is TierPhaseKind.ABSENT
    seen = seen.report(1, True, None)[0].observe(A, LookupResult.HIT)
    with pytest.raises(SpecViolation, match="tier_evicts_on_store"):
        seen.observe(A, LookupResult.MISS)
    # nor through a promotion's lookup right after submit_load
    loading = held.submit_load(TierJob(2, (A,), (5,), True))
    with pytest.raises(SpecViolation, match="tier_evicts_on_store"):
        loading.confirm_load(2, A, LookupResult.MISS)
    # without the option a MISS is an eviction whenever it comes
    assert _held().observe(A, LookupResult.MISS).phase(A) is TierPhaseKind.ABSENT


def test_a_store_reported_keeps_the_room_a_cascade_made_while_it_was_in_flight() -> None:
    model = TierModel(2, evicts_on_store=True).submit_store(TierJob(0, (A,), (0,), False), [1])
    model = model.submit_store(TierJob(1, (B,), (1,), False), [1])  # may evict A's copy
    model = model.report(0, True, None)[0]
    assert model.observe(A, LookupResult.MISS).phase(A) is TierPhaseKind.ABSENT
    # a key re-stored after it was seen absent is held with no room made for it
    fresh = _held(evicts_on_store=True).submit_store(TierJob(1, (B,), (1,), False), [1])
    fresh = fresh.observe(A, LookupResult.MISS).submit_store(TierJob(2, (A,), (2,), False), [2])
    fresh = fresh.report(1, True, None)[0].report(2, True, None)[0]
    with pytest.raises(SpecViolation, match="tier_evicts_on_store"):
        fresh.observe(A, LookupResult.MISS)


def test_chunk_patterns_of_even_versions_do_not_compress() -> None:
    assert len(zlib.compress(chunk_pattern(A, 2, 64))) > 64
    assert len(zlib.compress(chunk_pattern(A, 1, 64))) < 64


def test_a_hit_during_the_only_store_of_a_key_releases_its_slot() -> None:
    """A HIT says the copy landed (base.py: "present and ready"): the slot of
    the key's only cascade in flight is the tier's no more (``T3``)."""
    model = TierModel(4).submit_store(TierJob(1, (A, B), (3, 7), False), [1, 1])
    after = model.observe(B, LookupResult.HIT)
    assert after.landed_slot(model, B) == 7
    # a MISS, a RETRY, or a key already held release nothing
    assert model.observe(B, LookupResult.MISS).landed_slot(model, B) is None
    assert model.observe(B, LookupResult.RETRY).landed_slot(model, B) is None
    again = after.observe(B, LookupResult.HIT)
    assert again.landed_slot(after, B) is None
    # with two stores of the key in flight the other may still copy: none
    two = model.submit_store(TierJob(2, (B,), (9,), False), [2])
    assert two.observe(B, LookupResult.HIT).landed_slot(two, B) is None
    # a re-store of a key held: the HIT may be the old copy's
    held, _, _ = model.report(1, True, None)
    restore = held.submit_store(TierJob(3, (A,), (4,), False), [2])
    assert restore.observe(A, LookupResult.HIT).landed_slot(restore, A) is None


def test_a_hit_after_the_load_pins_nothing_when_a_store_may_have_landed_after_an_eviction() -> None:
    """The key may have been evicted before the load (a cascade since it was
    last seen held) and re-stored by a store in flight landing since: the
    HIT right after ``submit_load`` may be that store's, so the load does
    not pin the key and may fail for it (the tier never saw it held)."""
    model = _held(loads_succeed=True, evicts_on_store=True)
    restored = model.submit_store(TierJob(7, (A,), (8,), False), [2])
    other = restored.submit_store(TierJob(8, (B,), (9,), False), [1])  # may evict A
    loaded = other.submit_load(TierJob(9, (A,), (5,), True)).confirm_load(9, A, LookupResult.HIT)
    assert A not in loaded.jobs[9].pinned
    after, _, made = loaded.report(9, False, None)
    assert not made
    # without a cascade since A was last seen held, the HIT pins it
    pinned = restored.submit_load(TierJob(9, (A,), (5,), True)).confirm_load(9, A, LookupResult.HIT)
    with pytest.raises(SpecViolation, match="tier_loads_succeed"):
        pinned.report(9, False, None)
