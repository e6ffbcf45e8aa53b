"""Run the kit's drivers against a manager until the budget is spent.

An audit is a sequence of *runs*, each on a fresh manager and model. Most
runs are the swarm driver's (:mod:`kvoffload.stateful.swarm`: random calls,
a random mix per run); every few runs is the engine-protocol driver's
(:mod:`kvoffload.stateful.engine`: requests as a scheduler makes them,
protocol properties on top). Both ask the prober
(:mod:`kvoffload.stateful.probe`) to drain a deep copy of the manager now
and then. Every run draws from its own :class:`random.Random`, seeded from
the audit's seed and the run's index, so one seed replays the whole audit.

:func:`explore` returns an :class:`Exploration`: the first failure (with the
harness that holds its call sequence, and which driver found it), how much
was run, and the coverage reached (:mod:`kvoffload.stateful.coverage`).
"""

from __future__ import annotations

import os
import random
import time
import traceback

import attrs

from kvoffload.spec.errors import OffloadingError
from kvoffload.stateful.coverage import Coverage, CoverageSummary
from kvoffload.stateful.engine import run_engine
from kvoffload.stateful.harness import Discrepancy, Harness, KitConfig
from kvoffload.stateful.probe import ProbeFailure, Prober
from kvoffload.stateful.swarm import draw_plan, run_plan

SWARM = "swarm"
ENGINE = "engine"
PROBE = "probe"

ENGINE_EVERY = 5
"""One run in this many is the engine driver's."""


@attrs.define
class Exploration:
    """What :func:`explore` ran and found.

    ``failure`` is None when every run passed; else the exception, with
    ``harness`` holding the calls that led to it and ``driver`` naming the
    driver that made them (``swarm``, ``engine``, or ``probe`` when a
    drained copy broke). ``observability`` says how the manager's hidden
    state was seen: ``introspection``, ``copy`` (drained copies), or
    ``outputs only``. ``steps`` counts every checked call, on the manager
    and on its copies.
    """

    seed: int
    runs: int = 0
    steps: int = 0
    probes: int = 0
    failure: BaseException | None = None
    harness: Harness | None = None
    driver: str | None = None
    coverage: CoverageSummary | None = None
    observability: str = "outputs only"
    copy_error: str | None = None


def run_seed(seed: int, index: int) -> random.Random:
    """The random source of run ``index`` of an audit seeded ``seed``."""
    return random.Random(seed * 1_000_003 + index)


def explore(
    config: KitConfig,
    *,
    seed: int,
    runs: int,
    steps: int,
    time_limit: float | None = None,
    probe: bool = True,
) -> Exploration:
    """Make ``runs`` runs of about ``steps`` calls each (see the module
    docstring); stop at the first failure or after ``time_limit`` seconds."""
    found = Exploration(seed)
    coverage = Coverage(arc=config.policy == "arc")
    prober = Prober(seed) if probe else None
    deadline = None if time_limit is None else time.perf_counter() + time_limit
    for index in range(runs):
        if deadline is not None and time.perf_counter() > deadline:
            break
        rng = run_seed(seed, index)
        plan = draw_plan(rng, config, steps)
        harness = Harness(config, plan.num_blocks)
        harness.observer = coverage.observe
        engine = index % ENGINE_EVERY == ENGINE_EVERY - 1
        found.runs += 1
        try:
            if index == 0:
                found.observability = "introspection" if harness.inspectable else ""
                if prober is not None:
                    prober(harness)  # drains the empty manager: learns whether copying works
            if engine:
                run_engine(harness, rng, max(4, plan.steps // 3), probe=prober)
            else:
                every = rng.choice((0, 10, 20))
                run_plan(harness, plan, rng, probe=prober, probe_every=every)
        except ProbeFailure as failure:
            _raise_if_kit_bug(failure.error)
            found.failure, found.harness, found.driver = failure.error, failure.harness, PROBE
        except Exception as error:
            _raise_if_kit_bug(error)
            found.failure, found.harness = error, harness
            found.driver = ENGINE if engine else SWARM
        finally:
            harness.close()
        found.steps += len(harness.trace)
        if found.failure is not None:
            break
    if prober is not None:
        found.probes = prober.probes
        found.steps += prober.calls
        found.copy_error = prober.copy_error
    if not found.observability:
        found.observability = "copy" if prober is not None and prober.copyable else "outputs only"
    found.coverage = coverage.summary()
    return found


_KIT_DIR = os.path.dirname(os.path.abspath(__file__))


def _raise_if_kit_bug(error: BaseException) -> None:
    """An exception raised by the kit's own code (not a discrepancy, not the
    manager's) is a bug of the kit, not a finding: let it propagate."""
    if isinstance(error, (Discrepancy, OffloadingError)):
        return
    frames = traceback.extract_tb(error.__traceback__)
    if frames and os.path.dirname(os.path.abspath(frames[-1].filename)) == _KIT_DIR:
        raise error


def observability_warning(found: Exploration, config: KitConfig) -> str | None:
    """A warning when the manager's hidden state could only be judged by
    its outputs (no introspection, no working ``copy.deepcopy``)."""
    if found.observability != "outputs only":
        return None
    why = f" (copy.deepcopy failed: {found.copy_error})" if found.copy_error else ""
    return (
        "outputs only: the manager offers neither introspection (phase/slot_of, "
        f"policy_state) nor copying{why}; a wrong recency order or a block wrongly "
        "believed pinned shows only when a store happens to need that victim, so "
        "this audit is much weaker. Implement InspectableManager/InspectablePolicy, "
        "or make the manager deep-copyable."
    )


__all__ = [
    "ENGINE",
    "PROBE",
    "SWARM",
    "Exploration",
    "explore",
    "observability_warning",
    "run_seed",
]
