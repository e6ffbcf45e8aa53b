"""``audit()``: hold a manager to the specification and report.

>>> from kvoffload.stateful import audit
>>> report = audit(my_factory, policy="any")      # doctest: +SKIP
>>> print(report.render())                        # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Callable

from typing import cast

import attrs
from hypothesis import HealthCheck, Phase, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.reporting import with_reporter
from hypothesis.stateful import run_state_machine_as_test

from kvoffload.spec.contract import OffloadingManager
from kvoffload.spec.invariants import Invariant
from kvoffload.stateful.harness import (
    Discrepancy,
    KitConfig,
    ReuseFilterParams,
    render_script,
)
from kvoffload.stateful.machine import TraceSink, make_manager_machine
from kvoffload.stateful.shrink import failure_kind, replay, shrink

DEFAULT_EXAMPLES = 500
DEFAULT_STEPS = 40


@attrs.frozen
class AuditReport:
    """What one audit found.

    ``passed`` is False when a violation was found; then ``invariant`` names
    the rule broken, ``key`` the key concerned (if any), ``message`` says
    how, and ``script`` is a short Python script replaying the shrunk
    counterexample (``calls`` manager calls long).
    """

    target: str
    policy: str
    passed: bool
    examples: int
    steps: int
    seconds: float
    invariant: Invariant | None = None
    key: object = None
    message: str | None = None
    script: str | None = None
    calls: int = 0

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    def render(self) -> str:
        """A human-readable account, with the replay script on failure."""
        head = (
            f"{self.target} [{self.policy}]: "
            + ("PASS" if self.passed else f"FAIL: invariant {self.invariant}")
            + f" ({self.examples} examples, {self.steps} steps, {self.seconds:.1f} s)"
        )
        if self.passed:
            return head
        return f"{head}\n{self.message}\n\nReplay ({self.calls} calls):\n{self.script}"


def audit(
    factory: Callable[[int], OffloadingManager],
    *,
    policy: str = "any",
    max_examples: int | None = None,
    seed: int | None = None,
    reuse_filter: ReuseFilterParams | None = None,
    typed_errors: bool = True,
    supports_reset: bool = True,
    stateful_step_count: int | None = None,
    max_blocks: int = 4,
    num_keys: int = 6,
    name: str | None = None,
    factory_import: str | None = None,
) -> AuditReport:
    """Audit the managers ``factory(num_blocks)`` builds against the spec.

    ``policy``: ``"lru"``/``"arc"`` demand exact agreement with that policy's
    model, ``"any"`` accepts any legal victims. ``reuse_filter``: the manager
    is a reuse filter with these parameters. ``typed_errors``: the manager
    promises an ``OffloadingError`` for illegal calls (the kit then makes
    them). ``max_examples``/``stateful_step_count`` default to
    ``DEFAULT_EXAMPLES``/``DEFAULT_STEPS`` whatever the Hypothesis profile:
    an audit's default budget is the same everywhere. ``seed`` fixes the run; None derandomizes it
    (same run every time). ``factory_import`` (``"module:callable"``) lets the
    replay script import the factory.
    """
    if reuse_filter is not None and reuse_filter.max_tracker_size <= 16:
        # the filter's protection rule shows only once a stored key's count
        # has left the table: keep more keys than the table holds
        num_keys = max(num_keys, reuse_filter.max_tracker_size + 2)
    config = KitConfig(
        factory,
        policy=policy,
        reuse_filter=reuse_filter,
        typed_errors=typed_errors,
        supports_reset=supports_reset,
        max_blocks=max_blocks,
        num_keys=num_keys,
    )
    if max_examples is None:
        max_examples = DEFAULT_EXAMPLES
    if stateful_step_count is None:
        stateful_step_count = DEFAULT_STEPS
    run_settings = settings(
        # The kit shrinks by replaying the recorded calls (kvoffload.stateful.
        # shrink): far cheaper than Hypothesis re-generating whole runs.
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
        max_examples=max_examples,
        stateful_step_count=stateful_step_count,
        deadline=None,
        database=None,
        derandomize=seed is None,
        print_blob=False,
        report_multiple_bugs=False,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )
    sink = TraceSink()
    machine = make_manager_machine(config, sink)
    if seed is not None:
        machine = hypothesis_seed(seed)(machine)
    target = name or str(getattr(factory, "__qualname__", repr(factory)))
    started = time.perf_counter()
    failure: BaseException | None = None
    with with_reporter(lambda message: None):
        try:
            # cast: older Hypothesis releases leave this function untyped
            run_machine = cast(Callable[..., None], run_state_machine_as_test)
            run_machine(machine, settings=run_settings)
        except Exception as error:  # noqa: BLE001 - every failure is a finding
            failure = error
    elapsed = time.perf_counter() - started
    policy_label = policy if reuse_filter is None else f"{policy}+filter"
    if failure is None:
        return AuditReport(
            target, policy_label, True, sink.runs, sink.steps, elapsed
        )
    harness = sink.harness
    num_blocks = harness.num_blocks if harness is not None else 1
    if harness is not None:
        kind = failure_kind(failure)
        ops = shrink(config, num_blocks, [op for op, _ in harness.trace], kind)
        replayed, shrunk_failure = replay(config, num_blocks, ops)
        if shrunk_failure is not None and failure_kind(shrunk_failure) == kind:
            harness, failure = replayed, shrunk_failure
    check: str | None = None
    if isinstance(failure, Discrepancy):
        invariant, key, message = failure.invariant, failure.key, str(failure)
        check = failure.check
    else:
        invariant, key = Invariant.CRASH, None
        message = f"the manager raised {type(failure).__name__}: {failure}"
    trace = harness.trace if harness is not None else []
    script = render_script(
        trace,
        num_blocks=num_blocks,
        num_keys=num_keys,
        factory_import=factory_import,
        failure=message,
        check=check,
    )
    return AuditReport(
        target,
        policy_label,
        False,
        sink.runs,
        sink.steps,
        elapsed,
        invariant=invariant,
        key=key,
        message=message,
        script=script,
        calls=len(trace),
    )
