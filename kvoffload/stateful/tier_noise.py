"""Noise for threaded tier runs: random delays at lines of the tier's code.

A race window of a few statements (a result list copied, then cleared
without the tier's lock; an index rebuilt outside it; a job taken off a
queue and not yet published) is entered by chance only when a thread
switch lands inside it. :class:`Noise` widens every such window at random,
as ConTest-style noise makers do: a trace function that, at a random
fraction of the lines executed in the tier's code (any file outside the
standard library and the kit's own ``kvoffload/spec`` and
``kvoffload/stateful``), yields the interpreter or sleeps up to
:data:`MAX_SLEEP` seconds, and that *pauses* a thread at the run's hot
lines until the other threads have made progress (:meth:`Noise.pause`).
It never changes what the tier computes, only when; the kit's checks
accept every interleaving the tier model allows, so noise adds no false
alarm, only reach.

Traced are the threads started while the noise is on (``threading.settrace``:
the tier's own threads) and the callers' threads while they are inside a
tier call (:meth:`Noise.wrap`), not the kit's own code between calls, whose
tracing would cost more than the tier's.
"""

from __future__ import annotations

import os
import random
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

YIELD_RATE = 0.05
"""The fraction of traced lines before which the thread yields."""

SLEEP_RATE = 0.01
"""The fraction of traced lines before which the thread sleeps."""

MAX_SLEEP = 0.0002
"""The longest such sleep, in seconds."""

HOT_RATE = 0.05
"""The fraction of the tier's lines (distinct file and line number) that a
run makes *hot*, drawn afresh per run: every time a thread reaches a hot
line it pauses there first (:meth:`Noise.pause`, as probabilistic
concurrency testing picks change points), so a window that follows a hot
line stays open while the other threads run, the first :data:`HOT_REPEATS`
times it is entered in the run (a hot line on a busy path does not use up
the others' turns)."""

HOT_REPEATS = 4

THREAD_HOT_RATE = 0.2
""":data:`HOT_RATE` for the lines that the tier's own threads run (a worker,
an I/O pool): pausing such a thread costs little (the callers go on
meanwhile), and the windows of a race with the callers are on them."""

PAUSE_STEPS = (1, 2)
"""A paused thread waits for the caller to complete this many steps
(drawn per pause; :meth:`Noise.stepped`: a whole call of the caller, e.g. a
cascade that evicts, runs inside the window) ..."""

PAUSE_LINES = 60
"""... or for the other threads to run this many lines of the tier's code
(a worker publishes a result inside a caller's window) ..."""

PAUSE_BOUND = 0.02
"""... or for every other thread to be stalled (sleeping in the kernel, not
in one of the kit's own naps: blocked on a lock the paused thread holds, or
idle), and at most this many seconds. Progress, not time, ends a pause:
on a loaded machine a thread that is runnable but not running makes no
progress, and the window stays open until it has run."""

PAUSE_TICK = 0.0002
"""How often a paused thread looks at the others (seconds)."""

_KIT = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), part) + os.sep
    for part in ("spec", "stateful")
)
_STDLIB = tuple(
    os.path.abspath(p) + os.sep
    for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)

Tracer = Callable[[FrameType, str, Any], Any]

_NAPPING: set[int] = set()
"""Native ids of the kit's threads in one of their deliberate sleeps
(:func:`nap`): they will go on by themselves, so they are not stalled."""


def nap(seconds: float) -> None:
    """``time.sleep(seconds)`` for a kit thread that pauses on purpose (a
    settle, the poll thread's interval): a paused thread then keeps
    waiting for it rather than taking it for stalled."""
    me = threading.get_native_id()
    _NAPPING.add(me)
    try:
        time.sleep(seconds)
    finally:
        _NAPPING.discard(me)


def _thread_state(native_id: int) -> str | None:
    """The kernel's state letter of a thread of this process (``R``
    running or runnable, ``S``/``D`` sleeping, ...), None where unknown."""
    try:
        with open(f"/proc/self/task/{native_id}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    return text[text.rfind(b")") + 2 : text.rfind(b")") + 3].decode("ascii", "replace")


class Noise:
    """A context manager: while active, the tier's code (see the module
    docstring) runs with random delays and pauses, on every thread started
    meanwhile and, through :meth:`wrap`, on the callers' threads inside
    the tier's methods. ``rng``: the run's random source."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = random.Random(rng.random())
        self.traced: dict[str, bool] = {}
        self.hot: dict[tuple[str, int, bool], int] = {}
        self.callers: set[int] = set()
        """Idents of the threads that called the tier (:meth:`wrap`)."""
        self.saved: Any = None
        self.active = False
        self.lines = 0
        """Lines of the tier's code run so far (all threads)."""
        self.bystanders: set[threading.Thread] = set()
        """Threads already running when the noise began (another run's
        leftovers): not part of this run, never waited for."""
        self.steps = 0
        """The caller's steps completed so far (:meth:`stepped`)."""

    def _wanted(self, filename: str) -> bool:
        wanted = self.traced.get(filename)
        if wanted is None:
            path = os.path.abspath(filename)
            wanted = not (
                filename.startswith("<") or path.startswith(_KIT) or path.startswith(_STDLIB)
            )
            self.traced[filename] = wanted
        return wanted

    def _call(self, frame: FrameType, event: str, arg: Any) -> Tracer | None:
        if event == "call" and self.active and self._wanted(frame.f_code.co_filename):
            return self._line
        return None

    def _line(self, frame: FrameType, event: str, arg: Any) -> Tracer:
        if event == "line" and self.active:
            self.lines += 1
            caller = threading.get_ident() in self.callers
            where = (frame.f_code.co_filename, frame.f_lineno, caller)
            turns = self.hot.get(where)
            if turns is None:
                rate = HOT_RATE if caller else THREAD_HOT_RATE
                turns = self.hot[where] = HOT_REPEATS if self.rng.random() < rate else 0
            if turns > 0:
                self.hot[where] = turns - 1
                self.pause()
                return self._line
            roll = self.rng.random()
            if roll < YIELD_RATE:
                time.sleep(0)
            elif roll < YIELD_RATE + SLEEP_RATE:
                time.sleep(self.rng.random() * MAX_SLEEP)
        return self._line

    def pause(self) -> None:
        """Hold the current thread until the others have made progress:
        :data:`PAUSE_STEPS` of the caller's steps completed or :data:`PAUSE_LINES`
        lines of the tier run elsewhere, or every other thread stalled
        (two looks, a yield apart), or :data:`PAUSE_BOUND` seconds."""
        me = threading.get_native_id()
        lines, steps = self.lines, self.steps
        want = self.rng.randint(*PAUSE_STEPS)
        deadline = time.monotonic() + PAUSE_BOUND
        while self.active:
            if self._others_stalled(me):
                time.sleep(0)  # a second look: not a moment between two runs
                if self._others_stalled(me):
                    return
            time.sleep(PAUSE_TICK)
            if self.steps - steps >= want or self.lines - lines >= PAUSE_LINES:
                return
            if time.monotonic() > deadline:
                return

    def _others_stalled(self, me: int) -> bool:
        """Every other live thread of the run sleeps in the kernel, not in
        a kit nap."""
        for thread in threading.enumerate():
            other = thread.native_id
            if other is None or other == me or thread in self.bystanders:
                continue
            if not thread.is_alive():
                continue
            if other in _NAPPING or _thread_state(other) not in ("S", "D"):
                return False
        return True

    def stepped(self) -> None:
        """The caller (the thread making the run's calls) completed a step."""
        self.steps += 1

    def wrap(self, tier: Any) -> Any:
        """``tier`` with its methods traced while they run (on whichever
        thread calls them)."""
        return _NoisyTier(tier, self)

    def __enter__(self) -> Noise:
        self.saved = threading.gettrace()
        here = threading.current_thread()
        self.bystanders = {t for t in threading.enumerate() if t is not here}
        self.active = True
        threading.settrace(self._call)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """No more noise, on any thread."""
        self.active = False
        threading.settrace(self.saved)


class _NoisyTier:
    """A tier whose methods run traced by a :class:`Noise` (see
    :meth:`Noise.wrap`); every other attribute is the tier's own."""

    def __init__(self, tier: Any, noise: Noise) -> None:
        self._tier = tier
        self._noise = noise

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._tier, name)
        if not callable(value):
            return value
        noise = self._noise

        def traced(*args: Any, **kwargs: Any) -> Any:
            noise.callers.add(threading.get_ident())
            saved = sys.gettrace()
            sys.settrace(noise._call)
            try:
                return value(*args, **kwargs)
            finally:
                sys.settrace(saved)

        return traced


__all__ = [
    "HOT_RATE",
    "HOT_REPEATS",
    "MAX_SLEEP",
    "PAUSE_BOUND",
    "PAUSE_STEPS",
    "PAUSE_LINES",
    "SLEEP_RATE",
    "THREAD_HOT_RATE",
    "YIELD_RATE",
    "Noise",
    "nap",
]
