"""The lock contract: one manager shared between threads, every call under
``manager.lock`` (docs/SPEC.md, "Threads and the lock").

The locked run checks every structural invariant after the threads are
joined. What the lock prevents is shown by replaying, in one thread, the
interleaving it excludes (a lookup hit separated from the ``prepare_load``
that pins it): deterministic, unlike a race between real threads. The
corruption of unlocked sharing itself (two keys in one slot, a leaked slot,
a recency order missing keys, as issue 20 measured on vLLM 0.33's manager)
depends on where the interpreter switches threads, so no test asserts it.
"""

from __future__ import annotations

import copy
import pickle
import random
import sys
import threading
from collections.abc import Iterator

import pytest

from kvoffload import ReqContext, make_offload_key
from kvoffload.impl.lock import ManagerLock
from kvoffload.impl.manager import CPUOffloadingManager
from kvoffload.impl.reuse import FilterReusedOffloadingManager
from kvoffload.spec.contract import OffloadingEvent, OffloadingManager
from kvoffload.spec.errors import IllegalTransitionError
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.lifecycle import ABSENT, READY

CAPACITY = 24
THREADS = 4
ROUNDS = 300
JOIN_TIMEOUT_S = 60.0



def key(space: str, index: int) -> OffloadKey:
    return make_offload_key(f"{space}-{index}".encode(), 0)


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Switch threads every 10 µs, so calls of different threads interleave."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


def run_shared(manager: OffloadingManager, spaces: list[str]) -> list[BaseException]:
    """``THREADS`` threads, thread i drawing prompts from key space
    ``spaces[i]``: each round, under the lock, looks a prompt up, pins the
    hits and offers the rest; completes earlier loads and stores in a later
    locked section. Returns what the threads raised."""
    errors: list[BaseException] = []
    lock = manager.lock

    def worker(index: int) -> None:
        rng = random.Random(index)
        space = spaces[index]
        ctx = ReqContext(req_id=f"t{index}")
        loading: list[list[OffloadKey]] = []
        storing: list[list[OffloadKey]] = []
        try:
            for _ in range(ROUNDS):
                start = rng.randrange(0, 12)
                prompt = [key(space, i) for i in range(start, start + rng.randrange(1, 6))]
                with lock:
                    hits = manager.lookup_prefix(prompt, ctx) or 0
                    if hits:
                        manager.prepare_load(prompt[:hits], ctx)
                        loading.append(prompt[:hits])
                    output = manager.prepare_store(prompt[hits:], ctx)
                    if output is not None and output.keys_to_store:
                        storing.append(list(output.keys_to_store))
                if loading and rng.random() < 0.6:
                    with lock:
                        manager.complete_load(loading.pop(0), ctx)
                if storing and rng.random() < 0.6:
                    with lock:
                        manager.complete_store(storing.pop(0), ctx, rng.random() < 0.9)
            with lock:
                for keys in loading:
                    manager.complete_load(keys, ctx)
                for keys in storing:
                    manager.complete_store(keys, ctx)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT_S)
    stuck = [t.name for t in threads if t.is_alive()]
    assert not stuck, f"threads still running after {JOIN_TIMEOUT_S} s: {stuck}"
    return errors


def check_invariants(manager: CPUOffloadingManager, every_key: list[OffloadKey]) -> None:
    """Every invariant a quiescent manager keeps (no load or store in flight)."""
    tracked = {k: manager.phase(k) for k in every_key if manager.phase(k) != ABSENT}
    slots = [manager.slot_of(k) for k in tracked]
    # capacity: distinct slots in range, as many free slots as untracked ones
    assert len(set(slots)) == len(slots), "two tracked keys share a slot"
    assert all(s is not None and 0 <= s < CAPACITY for s in slots)
    assert manager.backend.get_num_free_blocks() + len(tracked) == CAPACITY, "a slot leaked"
    # quiescent: every tracked key READY, and lookup agrees
    assert set(tracked.values()) <= {READY}
    ctx = ReqContext(req_id="check")
    for k in every_key:
        assert manager.lookup(k, ctx) is (k in tracked)
    # the policy orders exactly the tracked keys
    state = manager.policy_state()
    if manager.cache_policy == "lru":
        order = state["order"]
        assert isinstance(order, tuple)
        assert sorted(order) == sorted(tracked)
    else:
        t1, t2 = state["t1"], state["t2"]
        assert isinstance(t1, tuple) and isinstance(t2, tuple)
        assert not set(t1) & set(t2)
        assert sorted(t1 + t2) == sorted(tracked)
    # events: a consumer that applied them all holds the readable keys
    view: set[OffloadKey] = set()
    for event in manager.take_events():
        assert isinstance(event, OffloadingEvent)
        (view.difference_update if event.removed else view.update)(event.keys)
    assert view == set(tracked)
    # every slot is usable again: a full store of fresh keys evicts them all
    fresh = [key("fresh", i) for i in range(CAPACITY)]
    output = manager.prepare_store(fresh, ctx)
    assert output is not None
    assert sorted(output.evicted_keys) == sorted(tracked)


SPACES = {
    "disjoint": [f"t{i}" for i in range(THREADS)],
    "overlapping": ["shared"] * THREADS,
}


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("sharing", sorted(SPACES))
@pytest.mark.usefixtures("fast_switching")
def test_threads_sharing_a_manager_under_its_lock_keep_every_invariant(
    policy: str, sharing: str
) -> None:
    manager = CPUOffloadingManager(16, CAPACITY, policy, enable_events=True)
    errors = run_shared(manager, SPACES[sharing])
    assert not errors, errors
    every_key = [key(space, i) for space in set(SPACES[sharing]) for i in range(20)]
    check_invariants(manager, every_key)


@pytest.mark.usefixtures("fast_switching")
def test_threads_sharing_a_filter_under_its_lock_keep_every_invariant() -> None:
    backing = CPUOffloadingManager(16, CAPACITY, "lru", enable_events=True)
    manager = FilterReusedOffloadingManager(backing, store_threshold=2, max_tracker_size=16)
    assert manager.lock is backing.lock
    errors = run_shared(manager, SPACES["overlapping"])
    assert not errors, errors
    check_invariants(backing, [key("shared", i) for i in range(20)])


def test_each_manager_has_its_own_real_lock() -> None:
    first = CPUOffloadingManager(16, 4)
    second = CPUOffloadingManager(16, 4, "arc")
    assert isinstance(first.lock, ManagerLock)
    assert first.lock is first.lock
    assert first.lock is not second.lock


def test_a_copied_manager_gets_a_lock_of_its_own() -> None:
    """The kit's prober deep-copies managers: a held lock must not stop it,
    nor be shared with the copy."""
    manager = CPUOffloadingManager(16, 4)
    with manager.lock:
        clone = copy.deepcopy(manager)
        assert clone.lock is not manager.lock
        assert isinstance(clone.lock, ManagerLock)
        assert not clone.lock.locked()
    restored = pickle.loads(pickle.dumps(manager))
    assert isinstance(restored.lock, ManagerLock) and not restored.lock.locked()


def test_methods_never_take_the_lock() -> None:
    """A caller holds the lock across several calls: no method blocks on it
    (a non-reentrant lock taken inside a method would deadlock here)."""
    manager = CPUOffloadingManager(16, 2, enable_events=True)
    ctx = ReqContext(req_id="r")
    a = key("a", 0)
    with manager.lock:
        output = manager.prepare_store([a], ctx)
        assert output is not None and output.keys_to_store == (a,)
        manager.complete_store([a], ctx)
        assert manager.lookup(a, ctx)
        manager.prepare_load([a], ctx)
        manager.complete_load([a], ctx)
        manager.reset_cache()
        assert list(manager.take_events())


def test_the_lock_excludes_another_thread_while_held() -> None:
    manager = CPUOffloadingManager(16, 2)
    lock = manager.lock
    assert isinstance(lock, ManagerLock)
    acquired: list[bool] = []

    def other() -> None:
        acquired.append(lock.acquire(blocking=False))

    with lock:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(10)
    assert not thread.is_alive()
    assert acquired == [False]
    assert lock.acquire(blocking=False)
    lock.release()


def test_an_unlocked_interleaving_breaks_a_lookup_hit_then_load() -> None:
    """The interleaving the lock excludes, replayed in one thread: request A
    finds ``k`` ready, request B's store evicts it before A pins it, and A's
    ``prepare_load`` is then illegal. Holding the lock from the lookup to
    the ``prepare_load`` keeps B out in between."""
    manager = CPUOffloadingManager(16, 2)
    a_ctx, b_ctx = ReqContext(req_id="A"), ReqContext(req_id="B")
    k = key("k", 0)
    manager.prepare_store([k], b_ctx)
    manager.complete_store([k], b_ctx)
    assert manager.lookup_prefix([k], a_ctx) == 1  # A: a hit
    evicting = manager.prepare_store([key("b", 0), key("b", 1)], b_ctx)  # B, in between
    assert evicting is not None and k in evicting.evicted_keys
    with pytest.raises(IllegalTransitionError):
        manager.prepare_load([k], a_ctx)  # A: the hit is gone
