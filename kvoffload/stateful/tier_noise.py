"""Noise for threaded tier runs: random delays at lines of the tier's code.

A race window of a few statements (a result list copied, then cleared
without the tier's lock; an index rebuilt outside it; a job taken off a
queue and not yet published) is entered by chance only when a thread
switch lands inside it. :class:`Noise` widens every such window at random,
as ConTest-style noise makers do: a trace function (``sys.settrace`` and
``threading.settrace``, so the tier's own threads too) that, at a random
fraction of the lines executed in the tier's code (any file outside the
standard library and the kit's own ``kvoffload/spec`` and
``kvoffload/stateful``), yields the interpreter or sleeps up to
:data:`MAX_SLEEP` seconds. It never changes what the tier computes, only
when; the kit's checks accept every interleaving the tier model allows, so
noise adds no false alarm, only reach.
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
line it sleeps :data:`HOT_SLEEP` first (as probabilistic concurrency
testing picks change points), so a window that follows a hot line is open
for that long each time it is entered, its first :data:`HOT_REPEATS` times
in the run (a hot line on a busy path does not use up the others' turns)."""

HOT_SLEEP = 0.0005
HOT_REPEATS = 4

_KIT = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), part) + os.sep
    for part in ("spec", "stateful")
)
_STDLIB = tuple(
    os.path.abspath(p) + os.sep
    for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)

Tracer = Callable[[FrameType, str, Any], Any]


class Noise:
    """A context manager: while active, the tier's code (see the module
    docstring) runs with random delays, on every thread started meanwhile
    and on the current one. ``rng``: the run's random source."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = random.Random(rng.random())
        self.traced: dict[str, bool] = {}
        self.hot: dict[tuple[str, int], int] = {}
        self.saved: tuple[Any, Any] = (None, None)

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
        if event == "call" and self._wanted(frame.f_code.co_filename):
            return self._line
        return None

    def _line(self, frame: FrameType, event: str, arg: Any) -> Tracer:
        if event == "line":
            where = (frame.f_code.co_filename, frame.f_lineno)
            turns = self.hot.get(where)
            if turns is None:
                turns = self.hot[where] = HOT_REPEATS if self.rng.random() < HOT_RATE else 0
            if turns > 0:
                self.hot[where] = turns - 1
                time.sleep(HOT_SLEEP)
                return self._line
            roll = self.rng.random()
            if roll < YIELD_RATE:
                time.sleep(0)
            elif roll < YIELD_RATE + SLEEP_RATE:
                time.sleep(self.rng.random() * MAX_SLEEP)
        return self._line

    def __enter__(self) -> Noise:
        self.saved = (sys.gettrace(), threading.gettrace())
        threading.settrace(self._call)
        sys.settrace(self._call)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """No more noise on this thread and on threads started from now."""
        sys.settrace(self.saved[0])
        threading.settrace(self.saved[1])


__all__ = ["HOT_RATE", "HOT_REPEATS", "HOT_SLEEP", "MAX_SLEEP", "SLEEP_RATE", "YIELD_RATE", "Noise"]
