"""Bounded exhaustive checking: every call sequence up to a depth.

Over a small key set and capacity (default 3 keys, 2 blocks), breadth-first
over an alphabet of calls, deduplicating by model state: a sequence is
extended only if it reached a model state no shorter sequence reached. Each
sequence is replayed on a fresh manager through the same
:class:`~kvoffload.stateful.harness.Harness` the state machine uses, so the
same things are checked.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence

import attrs

from kvoffload.spec.contract import OffloadingManager
from kvoffload.spec.invariants import Invariant
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.model import (
    CompleteLoad,
    CompleteStore,
    Lookup,
    LookupPrefix,
    Operation,
    PrepareLoad,
    PrepareStore,
    ResetCache,
    ScheduleEnd,
    TakeEvents,
    Touch,
)
from kvoffload.spec.profile import DEFAULT, Profile
from kvoffload.stateful.harness import (
    Discrepancy,
    KitConfig,
    ReuseFilterParams,
    render_script,
)
from kvoffload.stateful.shrink import replay


@attrs.frozen
class CheckReport:
    """What an exhaustive check reached and found."""

    target: str
    policy: str
    depth: int
    num_keys: int
    num_blocks: int
    states: int
    sequences: int
    steps: int
    seconds: float
    passed: bool
    invariant: Invariant | None = None
    message: str | None = None
    script: str | None = None

    def render(self) -> str:
        head = (
            f"{self.target} [{self.policy}] depth {self.depth}, {self.num_keys} keys, "
            f"{self.num_blocks} blocks: {self.states} states, {self.sequences} sequences, "
            f"{self.steps} steps in {self.seconds:.1f} s: "
            + ("PASS" if self.passed else f"FAIL: invariant {self.invariant}")
        )
        return head if self.passed else f"{head}\n{self.message}\n{self.script}"


def alphabet(keys: Sequence[OffloadKey], supports_reset: bool = True) -> list[Operation]:
    """The calls the checker tries at every depth."""
    ops: list[Operation] = [Lookup(k) for k in keys]
    ops.append(LookupPrefix(tuple(keys)))
    ops += [Touch((k,)) for k in keys]
    ops.append(Touch(tuple(keys)))
    for size in range(1, len(keys) + 1):
        ops += [PrepareStore(combo) for combo in itertools.combinations(keys, size)]
    for key in keys:
        ops += [CompleteStore((key,), True), CompleteStore((key,), False)]
        ops += [PrepareLoad((key,)), CompleteLoad((key,))]
    ops.append(TakeEvents())
    ops.append(ScheduleEnd())
    if supports_reset:
        ops.append(ResetCache())
    return ops


def check_exhaustively(
    factory: Callable[[int], OffloadingManager],
    *,
    policy: str = "any",
    depth: int = 5,
    num_keys: int = 3,
    num_blocks: int = 2,
    reuse_filter: ReuseFilterParams | None = None,
    profile: Profile = DEFAULT,
    typed_errors: bool | None = None,
    supports_reset: bool | None = None,
    name: str | None = None,
    factory_import: str | None = None,
    progress: Callable[[int, int, int, int, float], None] | None = None,
) -> CheckReport:
    """Run every sequence of up to ``depth`` calls (deduplicated by model
    state) against ``factory(num_blocks)``; stop at the first failure.
    ``progress(level, sequences, states, frontier, seconds)`` is called after
    each completed level."""
    if depth < 1 or num_keys < 1 or num_blocks < 1:
        raise ValueError("depth, num_keys and num_blocks must be >= 1")
    config = KitConfig(
        factory,
        policy=policy,
        reuse_filter=reuse_filter,
        profile=profile,
        typed_errors=typed_errors,
        supports_reset=supports_reset,
        min_blocks=num_blocks,
        max_blocks=num_blocks,
        num_keys=num_keys,
    )
    calls = alphabet(config.keys(), config.profile.has_reset)
    started = time.perf_counter()
    initial, _ = replay(config, num_blocks, [])
    seen = {initial.model}
    frontier: list[list[Operation]] = [[]]
    sequences = steps = 0
    target = name or str(getattr(factory, "__qualname__", repr(factory)))
    label = policy if reuse_filter is None else f"{policy}+filter"
    for level in range(1, depth + 1):
        next_frontier: list[list[Operation]] = []
        for prefix in frontier:
            for op in calls:
                sequence = [*prefix, op]
                harness, error = replay(config, num_blocks, sequence)
                sequences += 1
                steps += len(sequence)
                if error is not None:
                    message = str(error) if isinstance(error, Discrepancy) else (
                        f"the manager raised {type(error).__name__}: {error}"
                    )
                    return CheckReport(
                        target, label, depth, num_keys, num_blocks, len(seen), sequences,
                        steps, time.perf_counter() - started, False,
                        invariant=(
                            error.invariant if isinstance(error, Discrepancy) else Invariant.CRASH
                        ),
                        message=message,
                        script=render_script(
                            harness.trace, num_blocks=num_blocks, num_keys=num_keys,
                            factory_import=factory_import, failure=message,
                            check=error.check if isinstance(error, Discrepancy) else None,
                            config=config,
                        ),
                    )
                if harness.model not in seen:
                    seen.add(harness.model)
                    next_frontier.append(sequence)
        frontier = next_frontier
        if progress is not None:
            progress(level, sequences, len(seen), len(frontier), time.perf_counter() - started)
        if not frontier:
            break
    return CheckReport(
        target, label, depth, num_keys, num_blocks, len(seen), sequences, steps,
        time.perf_counter() - started, True,
    )
