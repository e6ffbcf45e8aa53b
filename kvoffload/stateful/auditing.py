"""``audit()``: hold a manager to the specification and report.

>>> from kvoffload.stateful import audit
>>> report = audit(my_factory, policy="any")      # doctest: +SKIP
>>> print(report.render())                        # doctest: +SKIP
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable

import attrs

from kvoffload.spec.contract import OffloadingManager
from kvoffload.spec.invariants import Invariant
from kvoffload.spec.model import Operation
from kvoffload.spec.profile import DEFAULT, Profile
from kvoffload.stateful.coverage import CoverageSummary
from kvoffload.stateful.drivers import explore, observability_warning
from kvoffload.stateful.harness import (
    ContextFactory,
    Discrepancy,
    KitConfig,
    ReuseFilterParams,
    default_context,
    is_illegal,
    render_script,
)
from kvoffload.stateful.shrink import failure_kind, fewest_blocks, replay, shrink

DEFAULT_EXAMPLES = 500
DEFAULT_STEPS = 40


@attrs.frozen
class AuditReport:
    """What one audit found.

    ``passed`` is False when a violation was found; then ``invariant`` names
    the rule broken, ``key`` the key concerned (if any), ``message`` says
    how, and ``script`` is a short Python script replaying the shrunk
    counterexample (``calls`` manager calls long).

    ``illegal_call_damage``: the failure disappears when the illegal calls
    before it are left out, so an illegal call raised but changed the
    manager (invariant ``errors``). Such a failure hides whatever else is
    wrong, so the audit then runs again with illegal calls set aside, same
    seed and budget: ``without_illegal_calls`` is that second report.
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
    seed: int | None = None
    driver: str | None = None
    coverage: CoverageSummary | None = None
    observability: str = "outputs only"
    warnings: tuple[str, ...] = ()
    illegal_call_damage: bool = False
    without_illegal_calls: AuditReport | None = None

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    def render(self) -> str:
        """A human-readable account: verdict, seed, coverage and warnings;
        the replay script on failure."""
        head = (
            f"{self.target} [{self.policy}]: "
            + ("PASS" if self.passed else f"FAIL: invariant {self.invariant}")
            + f" ({self.examples} runs, {self.steps} calls, {self.seconds:.1f} s, "
            f"seed {self.seed})"
        )
        lines = [head]
        if not self.passed:
            lines.append(f"found by the {self.driver} driver; replay the audit with seed={self.seed}")
        if self.coverage is not None:
            lines.append(self.coverage.line())
        lines += [f"WARNING: {w}" for w in self.warnings]
        if self.passed:
            return "\n".join(lines)
        text = "\n".join(lines)
        text = f"{text}\n{self.message}\n\nReplay ({self.calls} calls):\n{self.script}"
        if self.without_illegal_calls is not None:
            text += (
                "\n\nWith illegal calls set aside (an engine never makes them), "
                "the same audit:\n" + self.without_illegal_calls.render()
            )
        return text

    def verdict(self) -> str:
        """``PASS``, or ``FAIL`` and the invariant; for a failure caused by
        an illegal call, also the verdict with illegal calls set aside."""
        if self.passed:
            return "PASS"
        text = f"FAIL: invariant {self.invariant}"
        if self.illegal_call_damage:
            text += " (an illegal call changed the manager)"
        if self.without_illegal_calls is not None:
            text += f"; without illegal calls: {self.without_illegal_calls.verdict()}"
        return text



SEED_ENV = "KVOFFLOAD_AUDIT_SEED"
"""Environment variable: the seed of every audit not given one."""


def default_seed() -> int:
    """A fresh seed, or ``KVOFFLOAD_AUDIT_SEED``'s when it is set."""
    fixed = os.environ.get(SEED_ENV)
    if fixed is None or not fixed.strip():
        return random.SystemRandom().randrange(2**32)
    try:
        return int(fixed)
    except ValueError:
        raise ValueError(f"{SEED_ENV} must be an integer, got {fixed!r}") from None


def audit(
    factory: Callable[[int], OffloadingManager],
    *,
    policy: str = "any",
    max_examples: int | None = None,
    seed: int | None = None,
    reuse_filter: ReuseFilterParams | None = None,
    profile: Profile = DEFAULT,
    typed_errors: bool | None = None,
    supports_reset: bool | None = None,
    stateful_step_count: int | None = None,
    max_blocks: int = 8,
    num_keys: int = 16,
    name: str | None = None,
    factory_import: str | None = None,
    context_factory: ContextFactory | None = None,
    context_import: str | None = None,
    max_requests: int = 3,
    illegal_calls: bool = True,
) -> AuditReport:
    """Audit the managers ``factory(num_blocks)`` builds against the spec.

    ``policy``: ``"lru"``/``"arc"`` demand exact agreement with that policy's
    model, ``"any"`` accepts any legal victims. ``reuse_filter``: the manager
    is a reuse filter with these parameters. ``profile``: the conventions
    the manager keeps (:class:`~kvoffload.spec.profile.Profile`, e.g.
    ``profile_named("vllm-0.33")``); ``typed_errors``/``supports_reset``, when
    given, override its ``errors``/``has_reset``. ``max_examples``/``stateful_step_count`` default to
    ``DEFAULT_EXAMPLES``/``DEFAULT_STEPS`` whatever the Hypothesis profile:
    an audit's default budget is the same everywhere (``max_examples`` runs
    of about ``stateful_step_count`` calls). ``seed`` fixes the audit; None
    draws a fresh seed (or takes ``KVOFFLOAD_AUDIT_SEED`` from the
    environment, for a CI that must repeat itself), which the report prints
    (``AuditReport.seed``) so the audit replays with ``seed=``. ``max_blocks``/``num_keys``: each run
    draws 1..``max_blocks`` blocks and uses part of a universe of
    ``num_keys`` keys (two KV groups per block hash). ``factory_import`` (``"module:callable"``) lets the
    replay script import the factory. ``context_factory(req_id)`` builds the
    request context the manager takes (default ``ReqContext``; one object
    per request, kept for its lifetime); ``context_import``
    (``"module:callable"``) lets the replay script build it the same way.
    ``max_requests``: how many requests are open at once. ``illegal_calls``:
    make illegal calls (see :class:`AuditReport` for what happens when one
    damages the manager); False leaves them out from the start.
    """
    if reuse_filter is not None and reuse_filter.max_tracker_size <= 16:
        # the filter's protection rule shows only once a stored key's count
        # has left the table: keep more keys than the table holds
        num_keys = max(num_keys, reuse_filter.max_tracker_size + 2)
    config = KitConfig(
        factory,
        policy=policy,
        reuse_filter=reuse_filter,
        profile=profile,
        typed_errors=typed_errors,
        supports_reset=supports_reset,
        max_blocks=max_blocks,
        num_keys=num_keys,
        max_requests=max_requests,
        context_factory=context_factory or default_context,
        illegal_calls=illegal_calls,
    )
    if max_examples is None:
        max_examples = DEFAULT_EXAMPLES
    if stateful_step_count is None:
        stateful_step_count = DEFAULT_STEPS
    if seed is None:
        seed = default_seed()
    target = name or str(getattr(factory, "__qualname__", repr(factory)))
    report = _audit(config, target, seed, max_examples, stateful_step_count, factory_import,
                    context_import)
    if report.illegal_call_damage:
        follow_up = _audit(attrs.evolve(config, illegal_calls=False), target, seed,
                           max_examples, stateful_step_count, factory_import, context_import)
        report = attrs.evolve(report, without_illegal_calls=follow_up)
    return report


def _audit(
    config: KitConfig,
    target: str,
    seed: int,
    max_examples: int,
    stateful_step_count: int,
    factory_import: str | None,
    context_import: str | None,
) -> AuditReport:
    policy, num_keys = config.policy, config.num_keys
    started = time.perf_counter()
    found = explore(config, seed=seed, runs=max_examples, steps=stateful_step_count)
    elapsed = time.perf_counter() - started
    policy_label = policy if config.reuse_filter is None else f"{policy}+filter"
    warnings = tuple(w for w in (observability_warning(found, config),) if w)
    passed = AuditReport(
        target,
        policy_label,
        True,
        found.runs,
        found.steps,
        elapsed,
        seed=seed,
        driver=found.driver,
        coverage=found.coverage,
        observability=found.observability,
        warnings=warnings,
    )
    failure = found.failure
    if failure is None:
        return passed
    harness = found.harness
    num_blocks = harness.num_blocks if harness is not None else 1
    kind = failure_kind(failure)
    if harness is not None and not kind.startswith("protocol"):
        ops = shrink(config, num_blocks, [op for op, _ in harness.trace], kind)
        while (fewer := fewest_blocks(config, num_blocks, ops, kind)) < num_blocks:
            ops, num_blocks = shrink(config, fewer, ops, kind), fewer
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
    culprit = _damaging_illegal_call(config, num_blocks, trace)
    if culprit is not None:
        message = (
            f"[{Invariant.ERRORS}] {culprit} raised but changed the manager: an illegal "
            f"call must change nothing, and without the illegal calls before it the "
            f"same calls pass. What the calls after it show: {message}"
        )
        invariant = Invariant.ERRORS
    script = render_script(
        trace,
        num_blocks=num_blocks,
        num_keys=num_keys,
        factory_import=factory_import,
        failure=message,
        check=check,
        context_import=context_import,
    )
    return attrs.evolve(
        passed,
        passed=False,
        invariant=invariant,
        key=key,
        message=message,
        script=script,
        calls=len(trace),
        illegal_call_damage=culprit is not None
        or (isinstance(failure, Discrepancy) and failure.illegal_call_damage),
    )


def _damaging_illegal_call(
    config: KitConfig, num_blocks: int, trace: list[tuple[Operation, str]]
) -> str | None:
    """The illegal call of a failing ``trace`` that the failure comes from:
    left out, the failure disappears (a call the specification refuses
    changes nothing, so leaving it out changes nothing for a correct
    manager). The call as the replay script writes it, ``"the illegal
    calls"`` when only leaving all of them out helps, or None when the
    failure stays without them (or the trace has none before its last
    call)."""
    ops = [op for op, _ in trace]
    illegal = [i for i, (_, text) in enumerate(trace[:-1]) if is_illegal(text)]
    if not config.illegal_calls or not illegal:
        return None
    if replay(config, num_blocks, [op for i, op in enumerate(ops) if i not in illegal])[1]:
        return None
    for index in illegal:
        if replay(config, num_blocks, ops[:index] + ops[index + 1 :])[1] is None:
            return trace[index][1].split("  #")[0]
    return "the illegal calls"
