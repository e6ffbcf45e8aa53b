"""The kit audits ``TieredOffloadingManager`` as an ``OffloadingManager``.

Its answers are profile options of the one manager model
(``Profile.secondary_tiers``, ``cascade``, ``max_promotions_in_flight``;
presets ``kvoffload-tiered`` and ``kvoffload-tiered-write-back``): the
built-in tiered targets pass ``audit`` at the default budget in several
seeds, and tiered managers with one planted slip each are caught, each
failure naming the rule it breaks and replaying from its script.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from kvoffload.impl.manager import CPUOffloadingManager
from kvoffload.impl.memtier import MemoryTier
from kvoffload.impl.tiered import TieredOffloadingManager
from kvoffload.spec.contract import LookupResult, OffloadingManager, ReqContext
from kvoffload.spec.errors import ConfigurationError, IllegalTransitionError
from kvoffload.spec.invariants import Invariant, Step, check_step, table_calls
from kvoffload.spec.keys import OffloadKey, make_offload_key
from kvoffload.spec.lifecycle import ABSENT, PENDING, READY, Call, Phase
from kvoffload.spec.model import Lookup, LookupPrefix, ManagerModel
from kvoffload.spec.profile import (
    TIERED,
    TIERED_WRITE_BACK,
    LookupAnswer,
    Profile,
    profile_named,
)
from kvoffload.stateful import audit
from kvoffload.stateful.auditing import DEFAULT_EXAMPLES
from kvoffload.stateful.harness import KitConfig
from kvoffload.stateful.swarm import observe_runs
from kvoffload.stateful.targets import (
    BUILTIN_TARGETS,
    BUILTIN_TIER_TARGETS,
    FILE_TIER_EXAMPLES,
    MAX_PROMOTIONS,
    SCRATCH,
    TIER_CAPACITY,
    tiered_fs,
    tiered_fs_write_back,
    tiered_memory,
    tiered_memory_write_back,
)

Factory = Callable[[int], OffloadingManager]

K = [make_offload_key(b"blk%02d" % i, 0) for i in range(8)]


# --- the model alone ------------------------------------------------------------


def _stored(model: ManagerModel, key: OffloadKey, request: int = 0) -> ManagerModel:
    model, result = model.prepare_store([key], request=request)
    assert result is not None and result.keys_to_store == (key,)
    return model.complete_store([key], True, request=request)[0]


def test_model_promotes_a_key_only_the_tier_holds() -> None:
    model = ManagerModel.create(1, "lru", enable_events=True, profile=TIERED)
    model = _stored(model, K[0])
    assert model.phase(K[0]) == Phase.from_ref_cnt(1)  # the cascade's pin
    assert model.prepare_store([K[1]])[1] is None  # pinned: no victim
    model = model.schedule_end()[0]  # the cascade's result is taken
    assert model.phase(K[0]) == READY
    model = _stored(model, K[1])  # evicts K[0]; the tier keeps it
    assert model.phase(K[0]) == ABSENT and K[0] in model.below
    model = model.schedule_end()[0]
    model, answer = model.lookup(K[0], request=0)
    assert answer is None and model.phase(K[0]) == PENDING  # a promotion started
    assert model.phase(K[1]) == ABSENT  # its victim
    assert model.lookup(K[0])[1] is None  # still running: ask again
    model = model.take_events()[0]
    model, _ = model.schedule_end()
    assert model.phase(K[0]) == READY
    assert [(e.keys, e.removed) for e in model.take_events()[1]] == [((K[0],), False)]
    assert model.lookup(K[0])[1] is True


def test_model_bound_makes_a_miss_and_a_promoting_key_is_not_the_callers() -> None:
    profile = Profile(name="t", secondary_tiers=1, max_promotions_in_flight=1)
    model = ManagerModel.create(2, "lru", profile=profile)
    for key in K[:4]:
        model = _stored(model, key).schedule_end()[0]
    assert model.below >= set(K[:4]) and model.phase(K[0]) == ABSENT
    model, answer = model.lookup_prefix([K[0], K[1]])
    assert answer is None and model.promoting_keys() == {K[0]}  # one, the bound
    assert model.lookup(K[1])[1] is False  # beyond the bound: a miss
    with pytest.raises(IllegalTransitionError):
        model.complete_store([K[0]])


def test_model_result_answers_and_write_back_reset() -> None:
    profile = Profile(
        name="t", lookup_answer=LookupAnswer.RESULT, secondary_tiers=1,
        cascade=TIERED_WRITE_BACK.cascade,
    )
    model = _stored(ManagerModel.create(1, "lru", profile=profile), K[0])
    model = model.reset_cache()[0]  # the batched copy is dropped
    assert K[0] not in model.below
    assert model.lookup(K[0])[1] is LookupResult.MISS
    model = _stored(model, K[0]).schedule_end()[0]  # submitted at the step's end
    model = _stored(model, K[1]).schedule_end()[0]
    assert model.lookup(K[0])[1] is LookupResult.HIT_PENDING


@pytest.mark.parametrize(
    "profile",
    [Profile(name="t", secondary_tiers=-1), Profile(name="t", max_promotions_in_flight=-1)],
    ids=["secondary_tiers", "max_promotions_in_flight"],
)
def test_negative_tier_options_are_refused(profile: Profile) -> None:
    with pytest.raises(ConfigurationError):
        ManagerModel.create(2, "lru", profile=profile)


def test_presets_are_named() -> None:
    assert profile_named("kvoffload-tiered") is TIERED
    assert profile_named("kvoffload-tiered-write-back") is TIERED_WRITE_BACK
    assert TIERED.max_promotions_in_flight == MAX_PROMOTIONS


# --- the built-in targets pass ----------------------------------------------------

TIERED_TARGETS = [t for t in BUILTIN_TARGETS if t.profile is not None]


def test_builtin_rows() -> None:
    assert {t.factory for t in TIERED_TARGETS} == {tiered_memory, tiered_memory_write_back,
                                                    tiered_fs}
    assert [t.name for t in BUILTIN_TIER_TARGETS] == ["FileSystemTier"]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    ("factory", "profile"),
    [(tiered_memory, TIERED), (tiered_memory_write_back, TIERED_WRITE_BACK)],
    ids=["write-through", "write-back"],
)
def test_memory_tier_targets_pass_at_the_default_budget(
    factory: Factory, profile: Profile, seed: int
) -> None:
    made: list[Any] = []

    def counted(num_blocks: int) -> OffloadingManager:
        manager = factory(num_blocks)
        made.append(manager)
        return manager

    report = audit(counted, policy="lru", profile=profile, seed=seed)
    assert report.passed, report.render()
    assert report.examples == DEFAULT_EXAMPLES
    assert report.coverage is not None and report.coverage.missing == (), report.render()
    # the audit reached promotions, and completed them
    assert sum(sum(m.stats.promotions_done) for m in made) > 20
    assert sum(m.stats.promotions_refused for m in made) > 0


@pytest.mark.parametrize(
    ("factory", "profile", "seed"),
    [(tiered_fs, TIERED, 0), (tiered_fs_write_back, TIERED_WRITE_BACK, 1)],
    ids=["write-through", "write-back"],
)
def test_file_tier_targets_pass_at_the_default_budget(
    factory: Factory, profile: Profile, seed: int
) -> None:
    directories: list[str] = []

    def recorded(num_blocks: int) -> OffloadingManager:
        manager = factory(num_blocks)
        assert isinstance(manager, TieredOffloadingManager)
        tier: Any = manager.tiers[0]
        directory = tier._tier._directory  # PolledTier -> TempDirTier
        assert SCRATCH is None or directory.startswith(SCRATCH)
        directories.append(directory)
        return manager

    report = audit(recorded, policy="lru", profile=profile, seed=seed)
    assert report.passed, report.render()
    assert len(directories) >= DEFAULT_EXAMPLES
    assert not [d for d in directories if os.path.exists(d)]  # each run's was removed


@pytest.mark.parametrize("seed", [2, 3, 5])
def test_the_file_tier_row_reaches_every_lifecycle_row_in_its_budget(seed: int) -> None:
    """Regression: a cascade pins a stored block until the step's end, so
    the READY rows of ``reset_cache`` and ``complete_store`` needed a step
    boundary first; at the row's 150 examples seeds 2, 3 and 5 never
    reached one or more of them before the swarm ended a step there."""
    report = audit(tiered_fs, policy="lru", profile=TIERED, seed=seed,
                   max_examples=FILE_TIER_EXAMPLES)
    assert report.passed, report.render()
    assert report.coverage is not None and report.coverage.missing == (), report.render()


# --- planted defects -------------------------------------------------------------


def _primary(num_blocks: int) -> CPUOffloadingManager:
    return CPUOffloadingManager(16, num_blocks, "lru", enable_events=True)


def _tier() -> MemoryTier:
    return MemoryTier(TIER_CAPACITY, enable_events=False)


class HitBeforeLanding(TieredOffloadingManager):
    """Answers True for a key whose promotion it just started: the GPU would
    read a slot the tier has not written yet."""

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        answer = super().lookup(key, req_context)
        return True if answer is None and self.is_promoting(key) else answer


class ChainNotProtected(TieredOffloadingManager):
    """Allocates a promotion's slots offering only the promoted keys: the
    chain's READY blocks looked up with them may be its victims."""

    def _start_promotions(
        self, prefix: list[OffloadKey], wanted: dict[OffloadKey, int], req_context: ReqContext
    ) -> int:
        return super()._start_promotions(list(wanted), wanted, req_context)


class PinReleasedEarly(TieredOffloadingManager):
    """Releases a write-through cascade's pin right after submitting it: the
    block may be evicted (its slot rewritten) while the tier still reads it."""

    def _cascade(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        super()._cascade(keys, req_context)
        for _ in self.tiers:
            self.primary.complete_load(keys, req_context)
        self._cascade_pins.subtract(keys)
        for key in keys:
            if self._cascade_pins[key] <= 0:
                del self._cascade_pins[key]

    def _finish(self, tier_index: int, job: Any, made: frozenset[OffloadKey]) -> None:
        if job.is_promotion:
            super()._finish(tier_index, job, made)


class BoundPerCall(TieredOffloadingManager):
    """Counts the promotion bound per lookup, not over the promotions in
    flight: waiting requests flood the CPU tier with promotions."""

    def _promote_run(
        self, keys: list[OffloadKey], start: int, req_context: ReqContext
    ) -> int | None:
        running, self._promoting = self._promoting, {}
        try:
            return super()._promote_run(keys, start, req_context)
        finally:
            self._promoting = {**running, **self._promoting}


class NoPollAtStepEnd(TieredOffloadingManager):
    """Submits the step's promotions but takes no result at the step's end
    (only at reset): promoted blocks stay PENDING and cascades pinned."""

    def on_schedule_end(self) -> None:
        self._flush_batches()


def hit_before_landing(num_blocks: int) -> OffloadingManager:
    return HitBeforeLanding(_primary(num_blocks), [_tier()], max_promotions_in_flight=2)


def chain_not_protected(num_blocks: int) -> OffloadingManager:
    return ChainNotProtected(_primary(num_blocks), [_tier()], max_promotions_in_flight=2)


def pin_released_early(num_blocks: int) -> OffloadingManager:
    return PinReleasedEarly(_primary(num_blocks), [_tier()], max_promotions_in_flight=2)


def bound_per_call(num_blocks: int) -> OffloadingManager:
    return BoundPerCall(_primary(num_blocks), [_tier()], max_promotions_in_flight=2)


def no_poll_at_step_end(num_blocks: int) -> OffloadingManager:
    return NoPollAtStepEnd(_primary(num_blocks), [_tier()], max_promotions_in_flight=2)


@pytest.mark.parametrize(
    ("factory", "invariants"),
    [
        (hit_before_landing, {Invariant.LOOKUP}),
        # an unprotected chain key may also be evicted and promoted again in the
        # same call: its slot moves under the caller (1 capacity)
        (chain_not_protected, {Invariant.EVICTION, Invariant.LOOKUP, Invariant.LIFECYCLE,
                               Invariant.CAPACITY}),
        (pin_released_early, {Invariant.LIFECYCLE}),
        (bound_per_call, {Invariant.LOOKUP, Invariant.LIFECYCLE}),
        (no_poll_at_step_end, {Invariant.LIFECYCLE}),
    ],
    ids=lambda value: getattr(value, "__name__", None) or "",
)
def test_planted_tiered_defects_are_caught(factory: Factory, invariants: set[Invariant]) -> None:
    report = audit(factory, policy="lru", profile=TIERED, seed=0,
                   factory_import=f"{__name__}:{factory.__name__}")
    assert not report.passed, f"{factory.__name__} passed"
    assert report.invariant in invariants, report.render()
    assert report.calls is not None and report.calls <= 20, report.render()
    script = report.script or ""
    namespace: dict[str, Any] = {"__name__": "replay"}
    with pytest.raises(AssertionError):  # the script replays the failure
        exec(compile(script, "<replay>", "exec"), namespace)  # noqa: S102


def test_correct_manager_passes_where_the_defects_fail() -> None:
    def correct(num_blocks: int) -> OffloadingManager:
        return TieredOffloadingManager(_primary(num_blocks), [_tier()], max_promotions_in_flight=2)

    report = audit(correct, policy="lru", profile=TIERED, seed=0)
    assert report.passed, report.render()


# --- the options beyond the presets ------------------------------------------------


class ResultAnswers(TieredOffloadingManager):
    """Answers ``lookup`` in vLLM 0.33's words (``lookup_result``)."""

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> Any:
        return self.lookup_result(key, req_context)


def _over(cls: type[TieredOffloadingManager], policy: str, tiers: int,
          bound: int | None) -> Factory:
    def factory(num_blocks: int) -> OffloadingManager:
        primary = CPUOffloadingManager(16, num_blocks, policy, enable_events=True)
        return cls(primary, [_tier() for _ in range(tiers)], max_promotions_in_flight=bound)

    return factory


@pytest.mark.parametrize(
    ("factory", "policy", "profile"),
    [
        (_over(TieredOffloadingManager, "arc", 1, 2), "arc", TIERED),
        (_over(ResultAnswers, "lru", 1, 2), "lru",
         Profile(name="t", lookup_answer=LookupAnswer.RESULT, secondary_tiers=1,
                 max_promotions_in_flight=2)),
        (_over(TieredOffloadingManager, "lru", 2, 3), "lru",
         Profile(name="t", secondary_tiers=2, max_promotions_in_flight=3)),
        (_over(TieredOffloadingManager, "lru", 1, None), "lru",
         Profile(name="t", secondary_tiers=1)),
    ],
    ids=["arc", "result-answers", "two-tiers", "default-bound"],
)
def test_tiered_options_pass(factory: Factory, policy: str, profile: Profile) -> None:
    report = audit(factory, policy=policy, profile=profile, seed=1, max_examples=200)
    assert report.passed, report.render()


def test_a_write_through_manager_under_the_write_back_profile_is_caught() -> None:
    """The cascade mode shows at a reset (write-back batches are dropped)."""
    report = audit(tiered_memory, policy="lru", profile=TIERED_WRITE_BACK, seed=0)
    assert not report.passed
    assert report.invariant in {Invariant.LOOKUP, Invariant.LIFECYCLE}, report.render()
    assert "reset_cache" in (report.script or "")


def test_a_wrong_bound_in_the_profile_is_caught() -> None:
    """The bound is part of the answers: a profile naming another one fails."""
    profile = Profile(name="t", secondary_tiers=1, max_promotions_in_flight=3)
    report = audit(tiered_memory, policy="lru", profile=profile, seed=0)
    assert not report.passed
    assert report.invariant in {Invariant.LOOKUP, Invariant.LIFECYCLE}, report.render()


@pytest.mark.parametrize(
    ("factory", "profile"),
    [(tiered_memory, TIERED), (tiered_memory_write_back, TIERED_WRITE_BACK)],
    ids=["write-through", "write-back"],
)
def test_tiered_steps_keep_the_step_invariants(factory: Factory, profile: Profile) -> None:
    """Every step of tiered runs follows the lifecycle table (a promotion is
    a PREPARE_STORE, its victims EVICTs, a cascade one PREPARE_LOAD per
    tier, the step's end their completions) and the other step invariants."""
    config = KitConfig(factory, policy="lru", profile=profile, max_blocks=6, num_keys=12)
    found: list[str] = []
    promotions = 0

    def observe(before: Any, op: Any, after: Any) -> None:
        nonlocal promotions
        result = op.apply_to(before)[1]
        step = Step(before, op, after, result)
        found.extend(f"{op!r}: {v}" for v in check_step(step))
        promotions += sum(Call.PREPARE_STORE in table_calls(step, k) and
                          isinstance(op, (Lookup, LookupPrefix)) for k in after.blocks)

    observe_runs(config, 150, observe)
    assert found == []
    assert promotions >= 5
