"""Command-line usage errors: exit status 2 and one line on stderr.

Status 1 means "a violation was found"; a bad argument is never that. Every
command checks its arguments before it starts work and raises
:class:`UsageError` (or lets argparse refuse the value through one of the
``type=`` helpers below); ``python -m kvoffload`` prints
``python -m kvoffload COMMAND: error: MESSAGE`` and exits 2, no traceback.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn


class UsageError(Exception):
    """A command-line argument is out of its domain (exit status 2)."""


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr (status 2),
    without the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an int in ``[low, high]`` (no upper bound when
    ``high`` is None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    parse.__name__ = "int"
    return parse


def writable_file(text: str) -> str:
    """An argparse ``type``: a path whose folder exists (checked before any
    work, so a report is not lost after a long run)."""
    import os

    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"folder {folder!r} does not exist")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder")
    return text


__all__ = ["OneLineParser", "UsageError", "int_in", "writable_file"]
