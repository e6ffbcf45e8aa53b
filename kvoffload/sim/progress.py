"""A dependency-free progress bar on stderr."""

from __future__ import annotations

import sys
import time
from typing import IO


class ProgressBar:
    """A one-line bar redrawn at most every ``interval`` seconds.

    Disabled (every call a no-op) when ``enabled`` is False; by default it
    is enabled only when ``stream`` is a terminal.
    """

    def __init__(
        self,
        total: int,
        label: str = "",
        stream: IO[str] | None = None,
        enabled: bool | None = None,
        interval: float = 0.1,
        width: int = 30,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.total = max(1, total)
        self.label = label
        self.interval = interval
        self.width = width
        self._start = time.perf_counter()
        self._last_draw = 0.0
        self._drawn = False

    def update(self, done: int) -> None:
        """Report ``done`` units finished (redraws if the interval passed)."""
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last_draw < self.interval and done < self.total:
            return
        self._last_draw = now
        fraction = min(1.0, done / self.total)
        filled = int(fraction * self.width)
        elapsed = now - self._start
        eta = elapsed / fraction - elapsed if fraction > 0 else 0.0
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(
            f"\r{self.label} [{bar}] {fraction:6.1%} {elapsed:5.1f}s eta {eta:5.1f}s"
        )
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Erase the bar (if one was drawn)."""
        if self.enabled and self._drawn:
            self.stream.write("\r" + " " * (len(self.label) + self.width + 40) + "\r")
            self.stream.flush()
            self._drawn = False
