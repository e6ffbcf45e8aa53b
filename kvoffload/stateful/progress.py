"""Progress of one audited target on stderr (``audit``'s CLI and the
vLLM release audit share it)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from kvoffload.spec.contract import OffloadingManager


class Progress:
    """Progress of one target on ``stream``: examples run of the budget and
    seconds so far, rewritten in place on a terminal, a line every
    ``every`` seconds otherwise. Counts the managers the factory builds (one
    per example; more once a failure is being shrunk)."""

    def __init__(
        self, name: str, budget: int, stream: TextIO | None = None, every: float = 10.0
    ) -> None:
        self.name = name
        self.budget = budget
        self.stream = stream if stream is not None else sys.stderr
        self.every = every
        self.built = 0
        self.started = time.perf_counter()
        self._last = self.started
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def wrap(self, factory: Callable[[int], OffloadingManager]) -> Callable[[int], OffloadingManager]:
        def counted(num_blocks: int) -> OffloadingManager:
            self.built += 1
            self.tick()
            return factory(num_blocks)

        counted.__qualname__ = getattr(factory, "__qualname__", "factory")
        return counted

    def line(self) -> str:
        elapsed = time.perf_counter() - self.started
        if self.built <= self.budget:
            done = f"{self.built}/{self.budget} examples"
        else:
            done = f"{self.budget}/{self.budget} examples, shrinking ({self.built - self.budget} replays)"
        return f"  {self.name}: {done}, {elapsed:.0f} s"

    def tick(self) -> None:
        now = time.perf_counter()
        if self._tty and now - self._last >= 0.5:
            self.stream.write("\r" + self.line() + "\x1b[K")
            self.stream.flush()
            self._last = now
        elif not self._tty and now - self._last >= self.every:
            self.stream.write(self.line() + "\n")
            self.stream.flush()
            self._last = now

    def done(self, verdict: str) -> None:
        end = "\r" if self._tty else ""
        self.stream.write(f"{end}{self.line()}: {verdict}" + ("\x1b[K\n" if self._tty else "\n"))
        self.stream.flush()


__all__ = ["Progress"]
