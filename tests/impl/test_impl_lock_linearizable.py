"""The lock contract meets the kit's linearizability checker
(``kvoffload.stateful.linearizability``): threads that share a built-in
manager and hold the manager's *own* ``lock`` around every call produce a
history that is linearizable against the manager model, LRU and ARC.

The checker, the model step and the thread workload are the ones of
``tests/stateful/test_linearizability.py``; only the lock differs (there a
caller-made ``threading.Lock``, here ``manager.lock``)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from kvoffload import CPUOffloadingManager, ReqContext
from kvoffload.spec.model import ManagerModel
from kvoffload.stateful.linearizability import Recorder, linearize
from tests.stateful.test_linearizability import KEYS, _worker, model_step, normalize


class OwnLocked:
    """Every call made under the manager's own lock, as the contract says."""

    def __init__(self, manager: CPUOffloadingManager) -> None:
        self.manager = manager
        self.ctx = ReqContext(req_id="shared")

    def lookup(self, index: int) -> Any:
        with self.manager.lock:
            return self.manager.lookup(KEYS[index], self.ctx)

    def prepare_store(self, indices: list[int]) -> Any:
        with self.manager.lock:
            return self.manager.prepare_store([KEYS[i] for i in indices], self.ctx)

    def complete_store(self, indices: list[int]) -> None:
        with self.manager.lock:
            self.manager.complete_store([KEYS[i] for i in indices], self.ctx)


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_threads_under_the_managers_own_lock_are_linearizable(policy: str, seed: int) -> None:
    shared = OwnLocked(CPUOffloadingManager(16, 3, policy))
    recorder = Recorder(shared, normalize)
    threads = [
        threading.Thread(target=_worker, args=(recorder, t, seed * 10 + t), daemon=True)
        for t in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    history = recorder.history
    assert len(history) >= 36
    order = linearize(history, ManagerModel.create(3, policy), model_step)
    assert order is not None and sorted(map(id, order)) == sorted(map(id, history))
