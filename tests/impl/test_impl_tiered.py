"""The tiered manager, path by path: cascades (write-through, write-back),
promotions (success, partial, failure, the bound), polling, reset, events,
illegal calls, shutdown and the lock."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from kvoffload import (
    CPUOffloadingManager,
    FileSystemTier,
    MemoryTier,
    TieredOffloadingManager,
)
from kvoffload.impl.specs import CPULoadStoreSpec
from kvoffload.spec.contract import LookupResult, ReqContext
from kvoffload.spec.errors import (
    ConfigurationError,
    IllegalTransitionError,
    InvalidKeyError,
    OffloadingError,
)
from kvoffload.spec.keys import OffloadKey, make_offload_key
from kvoffload.spec.lifecycle import PENDING, READY, PhaseKind, loading

CTX = ReqContext("r")


def key(n: int) -> OffloadKey:
    return make_offload_key(n.to_bytes(8, "big"), 0)


A, B, C, D, E = (key(n) for n in range(5))


def make(
    capacity: int = 4,
    tiers: int = 1,
    tier_capacity: int = 16,
    immediate: bool = False,
    **options: object,
) -> tuple[TieredOffloadingManager, list[MemoryTier]]:
    made = [
        MemoryTier(tier_capacity, medium=f"T{i}", block_size=16, complete_on_submit=immediate)
        for i in range(tiers)
    ]
    primary = CPUOffloadingManager(16, capacity, enable_events=True)
    return TieredOffloadingManager(primary, made, **options), made  # type: ignore[arg-type]


def store(manager: TieredOffloadingManager, *keys: OffloadKey, ok: bool = True) -> None:
    out = manager.prepare_store(list(keys), CTX)
    assert out is not None
    manager.complete_store(list(out.keys_to_store), CTX, success=ok)


def run_all(manager: TieredOffloadingManager, tiers: list[MemoryTier]) -> None:
    manager.on_schedule_end()
    for tier in tiers:
        tier.run_jobs()
    manager.poll()


# --- cascades ---------------------------------------------------------------


def test_write_through_cascades_at_complete_store_with_the_slots_pinned() -> None:
    manager, (tier,) = make()
    store(manager, A, B)
    # one job submitted at complete_store, the slots pinned for it
    assert tier.jobs_queued == 1 and manager.jobs_in_flight == 1
    assert manager.phase(A) == loading(1) and manager.cascade_pins(A) == 1
    assert manager.lookup(A, CTX) is True  # pinned for a cascade, still readable
    tier.run_jobs()
    assert manager.phase(A) == loading(1)  # the result is not taken yet
    assert manager.poll() == 1
    assert manager.phase(A) == READY and manager.cascade_pins(A) == 0
    assert A in tier and B in tier
    assert manager.stats.cascades_done == [2]


def test_write_through_reaches_every_tier_with_one_pin_each() -> None:
    manager, tiers = make(tiers=2)
    store(manager, A)
    assert manager.phase(A) == loading(2)
    tiers[1].run_jobs()
    manager.poll()
    assert manager.phase(A) == loading(1)
    tiers[0].run_jobs()
    manager.poll()
    assert manager.phase(A) == READY and all(A in t for t in tiers)


def test_a_failed_store_is_never_cascaded() -> None:
    manager, (tier,) = make()
    store(manager, A, ok=False)
    assert manager.jobs_in_flight == 0 and tier.jobs_queued == 0
    assert manager.phase(A).kind is PhaseKind.ABSENT


def test_write_back_defers_the_cascade_to_the_step_end_but_pins_at_once() -> None:
    manager, (tier,) = make(cascade="write-back")
    store(manager, A)
    store(manager, B)
    assert tier.jobs_queued == 0 and manager.jobs_in_flight == 0
    assert manager.phase(A) == loading(1)  # held: cannot be evicted before it
    manager.on_schedule_end()
    assert tier.jobs_queued == 1  # one batched job for the request's step
    tier.run_jobs()
    manager.poll()
    assert manager.phase(A) == READY and A in tier and B in tier


def test_a_block_whose_cascade_runs_cannot_be_evicted() -> None:
    manager, (tier,) = make(capacity=2)
    store(manager, A, B)
    assert manager.prepare_store([C], CTX) is None  # both slots pinned
    tier.run_jobs()
    assert manager.prepare_store([C], CTX) is None  # result not taken yet
    manager.poll()
    out = manager.prepare_store([C], CTX)
    assert out is not None and len(out.evicted_keys) == 1


def test_a_failed_cascade_releases_its_pins_and_the_key_stays_readable() -> None:
    manager, (tier,) = make()
    store(manager, A, B)
    (job,) = [j for j in manager._jobs]
    tier.fail_job(job, successful_keys=[A])
    manager.poll()
    assert manager.phase(A) == READY and manager.phase(B) == READY
    assert A in tier and B not in tier
    assert manager.stats.cascades_failed == [1]


# --- promotions -------------------------------------------------------------


def evicted_to_tier(manager: TieredOffloadingManager, tiers: list[MemoryTier],
                    *keys: OffloadKey) -> None:
    """``keys`` stored, cascaded, and gone from the primary."""
    store(manager, *keys)
    run_all(manager, tiers)
    for tier in tiers:
        assert all(k in tier for k in keys)
    manager.reset_cache()
    assert all(manager.phase(k).kind is PhaseKind.ABSENT for k in keys)


def test_a_lookup_promotes_and_answers_ask_again_until_it_completes() -> None:
    manager, tiers = make()
    evicted_to_tier(manager, tiers, A)
    manager.take_events()
    assert manager.lookup(A, CTX) is None
    assert manager.phase(A) == PENDING and manager.is_promoting(A)
    assert manager.lookup(A, CTX) is None  # still promoting; no second job
    with pytest.raises(IllegalTransitionError):
        manager.prepare_load([A], CTX)
    manager.on_schedule_end()  # submits the batched job
    assert tiers[0].jobs_queued == 1
    tiers[0].run_jobs()
    manager.poll()
    assert manager.lookup(A, CTX) is True and manager.phase(A) == READY
    stored = [e for e in manager.take_events() if not e.removed]
    assert [(e.keys, e.medium) for e in stored] == [((A,), "CPU")]
    assert manager.stats.promotions_done == [1]


def test_promotion_is_not_cascaded_back() -> None:
    manager, tiers = make()
    evicted_to_tier(manager, tiers, A)
    manager.lookup(A, CTX)
    run_all(manager, tiers)
    assert manager.phase(A) == READY and manager.jobs_in_flight == 0


def test_lookup_prefix_promotes_the_whole_run_in_one_job() -> None:
    manager, tiers = make(capacity=8, max_promotions_in_flight=8)
    evicted_to_tier(manager, tiers, A, B, C)
    store(manager, D)
    run_all(manager, tiers)
    # D is in the primary, A B C only in the tier, E nowhere
    assert manager.lookup_prefix([A, B, C, E], CTX) is None
    assert all(manager.is_promoting(k) for k in (A, B, C))
    manager.on_schedule_end()
    assert tiers[0].jobs_queued == 1
    run_all(manager, tiers)
    assert manager.lookup_prefix([A, B, C, E], CTX) == 3


def test_a_partial_promotion_makes_only_the_keys_that_made_it_readable() -> None:
    manager, tiers = make(max_promotions_in_flight=4)
    evicted_to_tier(manager, tiers, A, B, C)
    manager.take_events()
    assert manager.lookup_prefix([A, B, C], CTX) is None
    manager.on_schedule_end()
    (job,) = list(manager._jobs)
    tiers[0].fail_job(job, successful_keys=[B])
    manager.poll()
    assert manager.phase(B) == READY
    assert manager.phase(A).kind is PhaseKind.ABSENT
    assert manager.phase(C).kind is PhaseKind.ABSENT
    events = manager.take_events()
    assert [(e.keys, e.removed) for e in events] == [((B,), False)]
    assert manager.stats.promotions_failed == [2]


def test_a_failed_promotion_is_a_miss_never_a_hit() -> None:
    manager, tiers = make()
    evicted_to_tier(manager, tiers, A)
    manager.take_events()
    manager.lookup(A, CTX)
    manager.on_schedule_end()
    (job,) = list(manager._jobs)
    tiers[0].fail_job(job)
    manager.poll()
    assert manager.phase(A).kind is PhaseKind.ABSENT and manager.slot_of(A) is None
    assert manager.take_events() == []
    # the tier still holds A: the next lookup promotes again
    assert manager.lookup(A, CTX) is None


def test_the_bound_on_promotions_in_flight_answers_a_miss_beyond_it() -> None:
    manager, tiers = make(capacity=8, max_promotions_in_flight=2)
    evicted_to_tier(manager, tiers, A, B, C, D)
    assert manager.lookup_prefix([A, B, C, D], CTX) is None
    assert manager.promotions_in_flight == 2
    assert manager.is_promoting(A) and manager.is_promoting(B)
    assert manager.phase(C).kind is PhaseKind.ABSENT
    assert manager.stats.promotions_refused == 2
    assert manager.lookup(C, CTX) is False  # refused: a miss, nothing evicted
    assert manager.lookup_result(D, CTX) is LookupResult.MISS
    run_all(manager, tiers)
    assert manager.promotions_in_flight == 0
    assert manager.lookup_prefix([A, B, C, D], CTX) is None  # the rest now
    run_all(manager, tiers)
    assert manager.lookup_prefix([A, B, C, D], CTX) == 4


def test_a_promotion_never_evicts_the_prefix_it_serves() -> None:
    manager, tiers = make(capacity=3, max_promotions_in_flight=3)
    evicted_to_tier(manager, tiers, C)
    store(manager, A, B)  # A, B fill the primary with C's room
    run_all(manager, tiers)
    store(manager, D)  # primary full: A B D
    run_all(manager, tiers)
    manager.touch([D], CTX)  # A is least recent
    assert manager.lookup_prefix([A, B, C], CTX) is None
    assert manager.phase(A) == READY and manager.phase(B) == READY
    assert manager.phase(D).kind is PhaseKind.ABSENT  # the victim
    run_all(manager, tiers)
    assert manager.lookup_prefix([A, B, C], CTX) == 3


def test_no_room_for_a_promotion_is_a_miss() -> None:
    manager, tiers = make(capacity=1)
    evicted_to_tier(manager, tiers, A)
    out = manager.prepare_store([B], CTX)  # the only slot, PENDING
    assert out is not None
    assert manager.lookup(A, CTX) is False
    assert manager.stats.promotions_refused == 1


def test_a_tier_retry_is_ask_again_without_promotion() -> None:
    class Busy(MemoryTier):
        def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
            return LookupResult.RETRY

    primary = CPUOffloadingManager(16, 4)
    manager = TieredOffloadingManager(primary, [Busy(4)])
    assert manager.lookup(A, CTX) is None
    assert manager.lookup_result(A, CTX) is LookupResult.RETRY
    assert manager.promotions_in_flight == 0


def test_a_second_tier_serves_what_the_first_lacks() -> None:
    manager, tiers = make(tiers=2)
    evicted_to_tier(manager, tiers, A)
    tiers[0].evict([A])
    assert manager.lookup(A, CTX) is None
    run_all(manager, tiers)
    assert manager.stats.promotions_done == [0, 1]


def test_lookup_result_speaks_vllm_033() -> None:
    manager, tiers = make()
    evicted_to_tier(manager, tiers, A)
    assert manager.lookup_result(B, CTX) is LookupResult.MISS
    assert manager.lookup_result(A, CTX) is LookupResult.HIT_PENDING
    assert manager.lookup_result(A, CTX) is LookupResult.HIT_PENDING
    out = manager.prepare_store([C], CTX)
    assert out is not None and manager.lookup_result(C, CTX) is LookupResult.HIT_PENDING
    run_all(manager, tiers)
    assert manager.lookup_result(A, CTX) is LookupResult.HIT


# --- bytes ------------------------------------------------------------------


def test_bytes_go_to_the_tier_and_come_back_into_a_fresh_slot() -> None:
    memory = np.zeros((4, 32), dtype=np.uint8)
    tier = MemoryTier(8, memory.data, complete_on_submit=True)
    manager = TieredOffloadingManager(CPUOffloadingManager(16, 4), [tier])
    out = manager.prepare_store([A], CTX)
    assert out is not None and isinstance(out.store_spec, CPULoadStoreSpec)
    slot = int(out.store_spec.block_ids[0])
    memory[slot] = 7
    manager.complete_store([A], CTX)
    manager.poll()
    manager.reset_cache()
    memory[:] = 0
    store(manager, B)  # takes slot 0 again
    assert manager.lookup(A, CTX) is None
    manager.on_schedule_end()
    new_slot = manager.slot_of(A)
    assert new_slot is not None and new_slot != manager.slot_of(B)
    assert (memory[new_slot] == 7).all() and manager.lookup(A, CTX) is True


# --- reset, events, illegal calls, shutdown, lock ---------------------------


def test_reset_drains_every_job_before_freeing_slots() -> None:
    manager, tiers = make(tiers=2)
    evicted_to_tier(manager, tiers, A)
    store(manager, B)  # cascades queued in both tiers
    assert manager.lookup(A, CTX) is None
    manager.on_schedule_end()  # the promotion queued too
    assert tiers[0].jobs_queued + tiers[1].jobs_queued == 3
    manager.reset_cache()
    assert manager.jobs_in_flight == 0 and not manager.has_pending_work()
    assert all(t.jobs_queued == 0 for t in tiers)
    assert manager.phase(A).kind is PhaseKind.ABSENT
    assert manager.phase(B).kind is PhaseKind.ABSENT
    assert all(B in t for t in tiers)  # tiers keep their chunks
    assert manager.cascade_pins(B) == 0


def test_reset_drops_batched_work_that_was_never_submitted() -> None:
    manager, tiers = make(cascade="write-back")
    evicted_to_tier(manager, tiers, A)
    store(manager, B)
    assert manager.lookup(A, CTX) is None
    assert manager.has_pending_work()
    manager.reset_cache()
    assert not manager.has_pending_work() and manager.promotions_in_flight == 0
    manager.on_schedule_end()
    assert tiers[0].jobs_queued == 0


def test_events_are_per_tier_with_their_medium() -> None:
    manager, tiers = make(tiers=2, immediate=True)
    store(manager, A)
    manager.poll()
    events = manager.take_events()
    assert {(e.medium, e.keys, e.removed) for e in events} == {
        ("CPU", (A,), False), ("T0", (A,), False), ("T1", (A,), False),
    }


def test_complete_store_of_a_key_being_promoted_is_illegal_and_changes_nothing() -> None:
    manager, tiers = make()
    evicted_to_tier(manager, tiers, A)
    manager.lookup(A, CTX)
    with pytest.raises(IllegalTransitionError):
        manager.complete_store([A], CTX)
    assert manager.phase(A) == PENDING and manager.is_promoting(A)
    with pytest.raises(IllegalTransitionError):
        manager.complete_store([A], CTX, success=False)
    assert manager.phase(A) == PENDING


def test_complete_load_may_not_release_a_cascade_pin() -> None:
    manager, (tier,) = make()
    store(manager, A)
    with pytest.raises(IllegalTransitionError):
        manager.complete_load([A], CTX)
    assert manager.phase(A) == loading(1) and manager.cascade_pins(A) == 1
    manager.prepare_load([A], CTX)
    manager.complete_load([A], CTX)  # the caller's own load: fine
    with pytest.raises(IllegalTransitionError):
        manager.complete_load([A], CTX)
    assert manager.phase(A) == loading(1)


def test_malformed_keys_raise_the_cores_errors() -> None:
    manager, _ = make()
    with pytest.raises(InvalidKeyError):
        manager.lookup(b"x", CTX)  # type: ignore[arg-type]
    with pytest.raises(InvalidKeyError):
        manager.lookup_prefix([A, b"x"], CTX)  # type: ignore[list-item]
    with pytest.raises(InvalidKeyError):
        manager.complete_store([b"x"], CTX)  # type: ignore[list-item]
    with pytest.raises(IllegalTransitionError):
        manager.complete_store([A], CTX)  # never prepared


def test_a_tier_reporting_a_job_it_was_not_given_raises() -> None:
    class Liar(MemoryTier):
        def get_finished_jobs(self):  # type: ignore[no-untyped-def]
            from kvoffload.spec.tier_contract import TierJobResult

            return [TierJobResult(99, True)]

    manager = TieredOffloadingManager(CPUOffloadingManager(16, 2), [Liar(2)])
    with pytest.raises(OffloadingError):
        manager.poll()


def test_shutdown_shuts_every_tier_down_even_when_one_fails() -> None:
    class Broken(MemoryTier):
        def shutdown(self) -> None:
            raise RuntimeError("disk gone")

    broken, fine = Broken(2), MemoryTier(2)
    manager = TieredOffloadingManager(CPUOffloadingManager(16, 2), [broken, fine])
    with pytest.raises(RuntimeError, match="disk gone"):
        manager.shutdown()
    assert fine.closed


def test_the_lock_is_real_and_no_method_takes_it() -> None:
    manager, tiers = make(immediate=True)
    assert isinstance(manager.lock, type(threading.Lock()))
    with manager.lock:  # callers hold it: every call still runs
        store(manager, A)
        manager.on_schedule_end()
        assert manager.lookup(A, CTX) is True
        manager.reset_cache()
    assert not manager.lock.locked()


@pytest.mark.parametrize(
    "options",
    [
        {"cascade": "sometimes"},
        {"max_promotions_in_flight": 0},
        {"max_promotions_in_flight": True},
    ],
)
def test_bad_options_raise_configuration_error(options: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        TieredOffloadingManager(
            CPUOffloadingManager(16, 2), [MemoryTier(2)], **options  # type: ignore[arg-type]
        )


def test_a_primary_and_tiers_are_required() -> None:
    with pytest.raises(ConfigurationError):
        TieredOffloadingManager(CPUOffloadingManager(16, 2), [])
    with pytest.raises(ConfigurationError):
        TieredOffloadingManager(object(), [MemoryTier(2)])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        TieredOffloadingManager(CPUOffloadingManager(16, 2), [object()])  # type: ignore[list-item]


# --- over the file tier ---------------------------------------------------------


def file_setup(tmp_path: object, slots: int = 4) -> tuple[
    TieredOffloadingManager, FileSystemTier, np.ndarray
]:
    memory = np.zeros((slots, 4096), dtype=np.uint8)
    tier = FileSystemTier(str(tmp_path), 32, memory.data, num_threads=2, enable_events=True)
    primary = CPUOffloadingManager(16, slots, enable_events=True)
    return TieredOffloadingManager(primary, [tier], max_promotions_in_flight=slots), tier, memory


def test_a_round_trip_through_files(tmp_path: object) -> None:
    manager, tier, memory = file_setup(tmp_path)
    out = manager.prepare_store([A, B], CTX)
    assert out is not None
    slots = [int(s) for s in out.store_spec.block_ids]  # type: ignore[attr-defined]
    memory[slots[0]], memory[slots[1]] = 1, 2
    manager.complete_store([A, B], CTX)
    tier.drain_jobs()
    manager.poll()
    assert tier.stored_keys() == {A, B}
    manager.reset_cache()
    memory[:] = 0
    assert manager.lookup_prefix([A, B], CTX) is None
    manager.on_schedule_end()
    tier.drain_jobs()
    manager.poll()
    assert manager.lookup_prefix([A, B], CTX) == 2
    a, b = manager.slot_of(A), manager.slot_of(B)
    assert a is not None and b is not None
    assert (memory[a] == 1).all() and (memory[b] == 2).all()
    manager.shutdown()


def test_a_poller_thread_under_the_lock(tmp_path: object) -> None:
    """A second thread polls under the callers' lock while the scheduler
    thread stores and looks up under it: every promotion ends READY."""
    manager, tier, memory = file_setup(tmp_path, slots=8)
    keys = [key(n) for n in range(6)]
    for position, k in enumerate(keys):
        out = manager.prepare_store([k], CTX)
        assert out is not None
        memory[manager.slot_of(k)] = position + 1
        manager.complete_store([k], CTX)
    tier.drain_jobs()
    manager.poll()
    manager.reset_cache()
    stop = threading.Event()

    def poller() -> None:
        while not stop.is_set():
            with manager.lock:
                manager.poll()
            stop.wait(0.001)

    thread = threading.Thread(target=poller, daemon=True)
    thread.start()
    try:
        for _ in range(200):
            with manager.lock:
                found = manager.lookup_prefix(keys, CTX)
                if found == len(keys):
                    break
                manager.on_schedule_end()
            stop.wait(0.005)
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()
    assert found == len(keys)
    for position, k in enumerate(keys):
        assert (memory[manager.slot_of(k)] == position + 1).all()
    manager.shutdown()
