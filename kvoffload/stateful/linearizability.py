"""Is a concurrent history linearizable against a sequential model?

A history is what threads observed: each :class:`Event` is one call with
its arguments, the instant it started, the instant it returned, and the
result it returned. The history is *linearizable* when some total order of
its calls (a) respects real time — a call that returned before another
started comes first — and (b) replayed through the model's ``step``
function, gives every call the result it returned (Herlihy and Wing). The
search (:func:`linearize`) is Wing and Gong's: repeatedly pick a call that
no pending call must precede, apply it to the model, backtrack on a
mismatch; visited ``(calls done, model state)`` pairs are memoised
(Lowe's refinement), so the model state must be hashable.

Generic: a model is any ``step(state, call, args) -> (state, result)``.
It serves a manager shared by threads under a lock
(:func:`record` wraps the calls), and a tier whose completions run on its
own threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import attrs

S = TypeVar("S", bound=Hashable)

Step = Callable[[S, str, tuple[Any, ...]], tuple[S, Any]]
"""``step(state, call, args) -> (next state, result)``: the sequential model."""


@attrs.frozen
class Event:
    """One call as a thread observed it: it took effect, if the history is
    linearizable, at one instant in ``[start, end]``."""

    call: str
    args: tuple[Any, ...]
    start: float
    end: float
    result: Any
    thread: int = 0


def linearize(
    history: Sequence[Event], initial: S, step: Step[S], *, max_states: int = 200_000
) -> list[Event] | None:
    """An order of ``history`` that is legal for the model and respects real
    time, or None when none exists (the history is not linearizable).
    ``ValueError`` when the search visits more than ``max_states`` states
    (the answer is then unknown)."""
    events = sorted(history, key=lambda e: e.start)
    count = len(events)
    seen: set[tuple[frozenset[int], S]] = set()
    order: list[int] = []

    def candidates(done: frozenset[int]) -> list[int]:
        pending = [i for i in range(count) if i not in done]
        if not pending:
            return []
        earliest_end = min(events[i].end for i in pending)
        # a call may go next unless some pending call returned before it started
        return [i for i in pending if events[i].start <= earliest_end]

    def search(done: frozenset[int], state: S) -> bool:
        if len(done) == count:
            return True
        if (done, state) in seen:
            return False
        if len(seen) >= max_states:
            raise ValueError(f"linearizability search exceeded {max_states} states")
        seen.add((done, state))
        for index in candidates(done):
            event = events[index]
            try:
                after, result = step(state, event.call, event.args)
            except Exception:  # noqa: BLE001 - the model refuses the call here
                continue
            if result != event.result:
                continue
            order.append(index)
            if search(done | {index}, after):
                return True
            order.pop()
        return False

    if search(frozenset(), initial):
        return [events[i] for i in order]
    return None


class Recorder:
    """Record the calls several threads make on one object (a manager, a
    tier): ``recorder.call(thread, name, *args)`` calls ``target.name(*args)``
    (through ``convert`` for the arguments and ``normalize`` for the result)
    and appends the :class:`Event`. The list append is atomic; start and end
    are ``time.perf_counter()`` just before and after the call."""

    def __init__(
        self,
        target: Any,
        normalize: Callable[[str, Any], Any] = lambda call, result: result,
        convert: Callable[[str, tuple[Any, ...]], tuple[Any, ...]] = lambda call, args: args,
    ) -> None:
        self.target = target
        self.normalize = normalize
        self.convert = convert
        self.history: list[Event] = []
        self._lock = threading.Lock()

    def call(self, thread: int, name: str, *args: Any) -> Any:
        start = time.perf_counter()
        result = getattr(self.target, name)(*self.convert(name, args))
        end = time.perf_counter()
        value = self.normalize(name, result)
        with self._lock:
            self.history.append(Event(name, args, start, end, value, thread))
        return result


__all__ = ["Event", "Recorder", "Step", "linearize"]
