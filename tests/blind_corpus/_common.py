"""Small helpers shared by the blind-corpus managers (no policy logic here)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from kvoffload import (
    Call,
    ConfigurationError,
    CPULoadStoreSpec,
    IllegalTransitionError,
    OffloadingEvent,
    OffloadKey,
    Phase,
    PhaseKind,
    validate_offload_key,
)

BLOCK_SIZE = 16
MEDIUM = "CPU"

ABSENT = Phase(PhaseKind.ABSENT)
PENDING = Phase(PhaseKind.PENDING)
READY = Phase(PhaseKind.READY)


def loading(n: int) -> Phase:
    return Phase(PhaseKind.LOADING, n)


def phase_of_ref(ref: int | None) -> Phase:
    """Map a ref count (-1 pending, 0 ready, n loading, None absent)."""
    if ref is None:
        return ABSENT
    if ref < 0:
        return PENDING
    if ref == 0:
        return READY
    return loading(ref)


def dedup(keys: Iterable[OffloadKey]) -> list[OffloadKey]:
    seen: set[OffloadKey] = set()
    out: list[OffloadKey] = []
    for key in keys:
        if key not in seen:
            seen.add(key)
            out.append(key)
    return out


def validated(keys: Iterable[object]) -> list[OffloadKey]:
    """Every key checked (InvalidKeyError on the first bad one)."""
    return [validate_offload_key(key) for key in keys]


def as_key(key: object) -> OffloadKey:
    """A key as given to a phase lookup. Anything that is not a tracked key
    (a malformed one included) is simply ABSENT there, as docs/SPEC.md §4
    words the pre-conditions ("every key is tracked, else
    IllegalTransitionError(key, ABSENT, ...)")."""
    return cast(OffloadKey, key)


def store_call(success: bool) -> Call:
    return Call.COMPLETE_STORE_OK if success else Call.COMPLETE_STORE_FAILED


def illegal(key: bytes, phase: Phase, call: Call) -> IllegalTransitionError:
    return IllegalTransitionError(key, phase, call)


def refuse_reset_with_loads(refs: Iterable[tuple[OffloadKey, int]]) -> None:
    """SPEC §4 reset_cache: illegal while a load is in flight."""
    for key, ref in refs:
        if ref > 0:
            raise illegal(key, phase_of_ref(ref), Call.RESET)


def event(keys: Iterable[OffloadKey], removed: bool) -> OffloadingEvent:
    return OffloadingEvent(tuple(keys), BLOCK_SIZE, MEDIUM, removed)


def cpu_spec(slots: Iterable[int]) -> CPULoadStoreSpec:
    return CPULoadStoreSpec(list(slots))


class SlotPool:
    """Never-used slots ascending first, then freed slots last-freed first."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.fresh = 0
        self.freed: list[int] = []

    def free_count(self) -> int:
        return self.num_blocks - self.fresh + len(self.freed)

    def take(self) -> int:
        if self.fresh < self.num_blocks:
            self.fresh += 1
            return self.fresh - 1
        return self.freed.pop()

    def give(self, slot: int) -> None:
        self.freed.append(slot)

    def reset(self) -> None:
        self.fresh = 0
        self.freed = []


def check_size(num_blocks: object) -> int:
    """``num_blocks`` as a positive int, else ConfigurationError."""
    if (
        not isinstance(num_blocks, int)
        or isinstance(num_blocks, bool)
        or num_blocks < 1
    ):
        raise ConfigurationError(
            f"num_blocks must be a positive int, not {num_blocks!r}"
        )
    return num_blocks
