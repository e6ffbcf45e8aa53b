"""Faults in the file tier's writes, one item at a time.

A pool thread writes its share of a job's items in one call of
``fs_tier._write_chunks`` (in C, in one go, in the compiled build). A test
that makes some writes fail installs :func:`per_item_writes` in its place:
each item is first offered to a fault, which may fail it (and leave what a
dying write leaves); the items no fault took are written by the real
function, so both I/O paths run under the faults."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvoffload.impl import fs_tier

WriteFault = Callable[[str, str, memoryview, "str | None"], "OSError | None"]
"""``fault(temp, prefix, payload, recycled)``: the error that fails this
item (after doing to the files what the failing write would), or None to
let it be written. ``prefix`` starts with the chunk's final path: its shard
folder, then its key in hex."""

BatchWriter = Callable[..., "list[int | OSError]"]


def per_item_writes(fault: WriteFault, original: BatchWriter | None = None) -> BatchWriter:
    """A stand-in for ``fs_tier._write_chunks`` (``original``, by default
    the one installed now) that offers each item to ``fault`` first."""
    real = fs_tier._write_chunks if original is None else original

    def write(
        temps: Sequence[str],
        prefixes: Sequence[str],
        payloads: Sequence[memoryview],
        recycled: Sequence[str | None],
        *settings: Any,
    ) -> list[int | OSError]:
        outcomes: list[int | OSError | None] = [
            fault(temp, prefix, payload, old)
            for temp, prefix, payload, old in zip(temps, prefixes, payloads, recycled)
        ]
        rest = [i for i, outcome in enumerate(outcomes) if outcome is None]
        if rest:
            written = real(
                [temps[i] for i in rest], [prefixes[i] for i in rest],
                [payloads[i] for i in rest], [recycled[i] for i in rest], *settings,
            )
            for i, outcome in zip(rest, written):
                outcomes[i] = outcome
        return [outcome for outcome in outcomes if outcome is not None]

    return write
