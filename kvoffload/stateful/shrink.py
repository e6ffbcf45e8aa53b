"""Shrink a failing call sequence by replaying it (delta debugging).

Hypothesis finds a failing run; the kit then minimises the recorded call
sequence itself, replaying candidates through a fresh
:class:`~kvoffload.stateful.harness.Harness`: a candidate is kept when it
still breaks the same invariant. Replays are cheap (no generation), so a
40-call failure shrinks to a few calls in well under a second.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from typing import TypeVar

import attrs

from kvoffload.spec.model import (
    KeyListOperation,
    Operation,
    ResetCache,
    StartRequest,
    TakeEvents,
)
from kvoffload.spec.profile import ResetAnnounce
from kvoffload.stateful.harness import Discrepancy, Harness, KitConfig


def replay(
    config: KitConfig, num_blocks: int, ops: Sequence[Operation]
) -> tuple[Harness, BaseException | None]:
    """Run ``ops`` through a fresh harness; the harness and the failure."""
    harness = Harness(config, num_blocks)
    try:
        for op in ops:
            harness.step(op)
    except Exception as error:
        return harness, error
    finally:
        harness.close()
    return harness, None


def failure_kind(error: BaseException) -> str:
    """What a failure is about: the invariant's label; for a crash, ``crash:``,
    the exception's type and where it was raised (the innermost frame's file
    and line), so that a crash never shrinks into a different crash."""
    if isinstance(error, Discrepancy):
        return error.invariant.label
    frames = traceback.extract_tb(error.__traceback__)
    where = f"@{frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"crash:{type(error).__name__}{where}"


MAX_KEYS_SHRUNK = 64
"""Calls with more keys (a probe's flood of a reuse filter's table) are
kept whole."""


def _smaller_ops(op: Operation) -> list[Operation]:
    """``op`` with one key fewer, each way (for key-list calls)."""
    if not isinstance(op, KeyListOperation) or not 1 < len(op.keys) <= MAX_KEYS_SHRUNK:
        return []
    return [
        attrs.evolve(op, keys=op.keys[:i] + op.keys[i + 1 :])
        for i in range(len(op.keys))
    ]


T = TypeVar("T")


def shrink_sequence(
    ops: Sequence[T],
    fails: Callable[[list[T]], list[T] | None],
    smaller: Callable[[T], list[T]],
    *,
    time_budget: float = 10.0,
) -> list[T]:
    """Delta debugging over any call sequence: the shortest sequence found
    for which ``fails(candidate)`` returns the calls it kept (those up to the
    failing one), dropping chunks of calls, then, call by call, the
    ``smaller(call)`` variants (one key fewer). The manager kit and the tier
    kit (:mod:`kvoffload.stateful.tier_audit`) both shrink with it."""
    deadline = time.perf_counter() + time_budget
    current = list(ops)
    chunk = max(1, len(current) // 2)
    while chunk >= 1 and time.perf_counter() < deadline:
        start, progressed = 0, False
        while start < len(current) and time.perf_counter() < deadline:
            candidate = current[:start] + current[start + chunk :]
            kept = fails(candidate) if candidate else None
            if kept is not None and len(kept) < len(current):
                current, progressed = kept, True
            else:
                start += chunk
        if not progressed:
            chunk //= 2
    index = 0
    while index < len(current) and time.perf_counter() < deadline:
        for variant in smaller(current[index]):
            candidate = current[:index] + [variant] + current[index + 1 :]
            kept = fails(candidate)
            if kept is not None and len(kept) <= len(current):
                current = kept
                break
        else:
            index += 1
    return current


def engine_protocol(config: KitConfig, ops: Sequence[Operation]) -> bool:
    """Whether ``ops`` keeps the engine's order the drivers keep: under
    ``ResetAnnounce.ENGINE`` the engine takes the queued events right
    before each ``reset_cache`` (its all-cleared event follows), so a
    shrunk sequence may not drop that ``take_events`` (the model's consumer
    would then miss events it was owed: a violation of no manager's)."""
    if config.profile.reset_announce is not ResetAnnounce.ENGINE:
        return True
    return all(
        index > 0 and isinstance(ops[index - 1], TakeEvents)
        for index, op in enumerate(ops)
        if isinstance(op, ResetCache)
    )


def announced_first(ops: Sequence[Operation], announced: frozenset[int]) -> bool:
    """Whether every call of a request in ``announced`` comes after that
    request's ``on_new_request``. The drivers announce every request they
    use, and a backend may key per-request state on the announcement
    (vLLM 0.33's tiering manager raises ``KeyError`` without it), so a
    shrunk sequence may not drop an announcement whose request it still
    uses: the failure would become the kit's own protocol slip, and a
    replay without an illegal call would crash where the real trace does
    not. Requests the original sequence never announced are not held to
    it."""
    seen: set[int] = set()
    for op in ops:
        request = op.context_of
        if isinstance(op, StartRequest):
            seen.add(op.request)
        elif request is not None and request in announced and request not in seen:
            return False
    return True


def shrink(
    config: KitConfig,
    num_blocks: int,
    ops: Sequence[Operation],
    kind: str,
    *,
    time_budget: float = 10.0,
) -> list[Operation]:
    """The shortest sequence found that still fails with ``kind``."""

    announced = frozenset(op.request for op in ops if isinstance(op, StartRequest))

    def still_fails(candidate: list[Operation]) -> list[Operation] | None:
        if not engine_protocol(config, candidate) or not announced_first(candidate, announced):
            return None
        harness, error = replay(config, num_blocks, candidate)
        if error is None or failure_kind(error) != kind:
            return None
        # keep only the calls up to the failing one
        return [op for op, _ in harness.trace] or candidate

    return shrink_sequence(ops, still_fails, _smaller_ops, time_budget=time_budget)


def _fewer_blocks(num_blocks: int) -> list[int]:
    """The capacities tried below ``num_blocks``, fewest first: every one up
    to 9, then doublings (a run at scale has up to a few hundred blocks)."""
    tried = list(range(1, min(num_blocks, 10)))
    size = 16
    while size < num_blocks:
        tried.append(size)
        size *= 2
    return tried


def fewest_blocks(
    config: KitConfig, num_blocks: int, ops: Sequence[Operation], kind: str
) -> int:
    """The fewest blocks (at most ``num_blocks``) with which ``ops`` still
    fail with ``kind``: a smaller manager makes a shorter counterexample
    (fewer calls to fill it)."""
    for smaller in _fewer_blocks(num_blocks):
        _, error = replay(config, smaller, ops)
        if error is not None and failure_kind(error) == kind:
            return smaller
    return num_blocks
