"""The generic linearizability checker: a CPUOffloadingManager shared by
threads under a plain lock is linearizable against the manager model, and
histories that are not are rejected."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from kvoffload import CPUOffloadingManager, ReqContext, make_offload_key
from kvoffload.spec.model import ManagerModel, StoreResult
from kvoffload.stateful.linearizability import Event, Recorder, linearize

KEYS = [make_offload_key(b"lin%02d" % i, 0) for i in range(6)]


def model_step(state: ManagerModel, call: str, args: tuple[Any, ...]) -> tuple[ManagerModel, Any]:
    """The manager model as a step function, results normalized."""
    if call == "lookup":
        after, answer = state.lookup(KEYS[args[0]])
        return after, bool(answer)
    if call == "prepare_store":
        after, result = state.prepare_store([KEYS[i] for i in args[0]])
        if not isinstance(result, StoreResult):
            return after, None
        return after, (result.keys_to_store, frozenset(result.evicted))
    if call == "complete_store":
        after, _ = state.complete_store([KEYS[i] for i in args[0]])
        return after, None
    raise ValueError(call)


def normalize(call: str, result: Any) -> Any:
    if call == "lookup":
        return bool(result)
    if call == "prepare_store":
        if result is None:
            return None
        return tuple(result.keys_to_store), frozenset(result.evicted_keys)
    return None


class LockedManager:
    """A CPUOffloadingManager every caller reaches under one threading.Lock."""

    def __init__(self, manager: CPUOffloadingManager) -> None:
        self.manager = manager
        self.lock = threading.Lock()
        self.ctx = ReqContext(req_id="shared")

    def lookup(self, index: int) -> Any:
        with self.lock:
            return self.manager.lookup(KEYS[index], self.ctx)

    def prepare_store(self, indices: list[int]) -> Any:
        with self.lock:
            return self.manager.prepare_store([KEYS[i] for i in indices], self.ctx)

    def complete_store(self, indices: list[int]) -> None:
        with self.lock:
            self.manager.complete_store([KEYS[i] for i in indices], self.ctx)


def _worker(recorder: Recorder, thread: int, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(12):
        indices = sorted(rng.sample(range(len(KEYS)), rng.randint(1, 2)))
        kind = rng.random()
        if kind < 0.4:
            recorder.call(thread, "lookup", indices[0])
        else:
            out = recorder.call(thread, "prepare_store", indices)
            if out is not None and out.keys_to_store:
                mine = [KEYS.index(k) for k in out.keys_to_store]
                recorder.call(thread, "complete_store", mine)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_manager_shared_by_threads_under_a_lock_is_linearizable(seed: int) -> None:
    shared = LockedManager(CPUOffloadingManager(16, 3, "lru"))
    recorder = Recorder(shared, normalize)
    threads = [
        threading.Thread(target=_worker, args=(recorder, t, seed * 10 + t)) for t in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    history = recorder.history
    assert len(history) >= 36
    order = linearize(history, ManagerModel.create(3, "lru"), model_step)
    assert order is not None and sorted(map(id, order)) == sorted(map(id, history))


def test_a_non_atomic_history_is_rejected() -> None:
    # thread 1 sees key 0 readable although its store completes only later:
    # the store was not atomic (its effect leaked before complete_store)
    history = [
        Event("prepare_store", ([0],), 0.0, 1.0, ((KEYS[0],), frozenset()), 0),
        Event("lookup", (0,), 2.0, 3.0, True, 1),
        Event("complete_store", ([0],), 4.0, 5.0, None, 0),
    ]
    assert linearize(history, ManagerModel.create(3, "lru"), model_step) is None


def test_overlapping_calls_may_take_effect_in_either_order() -> None:
    # the lookup overlaps complete_store: it may take effect after it
    history = [
        Event("prepare_store", ([0],), 0.0, 1.0, ((KEYS[0],), frozenset()), 0),
        Event("lookup", (0,), 2.0, 5.0, True, 1),
        Event("complete_store", ([0],), 3.0, 4.0, None, 0),
    ]
    order = linearize(history, ManagerModel.create(3, "lru"), model_step)
    assert order is not None and [e.call for e in order] == [
        "prepare_store", "complete_store", "lookup"]
    # ... but not before prepare_store returned (real time)
    early = [*history[:1], Event("lookup", (0,), -1.0, 0.5, True, 1), history[2]]
    assert linearize(early, ManagerModel.create(3, "lru"), model_step) is None


def test_a_history_whose_calls_race_without_the_lock_can_be_caught() -> None:
    # two offers of the same key overlap; both claim to have stored it:
    # no sequential order gives both the key (the second sees it PENDING)
    both: tuple[tuple[bytes, ...], frozenset[bytes]] = ((KEYS[1],), frozenset())
    history = [
        Event("prepare_store", ([1],), 0.0, 2.0, both, 0),
        Event("prepare_store", ([1],), 1.0, 3.0, both, 1),
    ]
    assert linearize(history, ManagerModel.create(3, "lru"), model_step) is None
