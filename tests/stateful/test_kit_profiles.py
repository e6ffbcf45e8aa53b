"""The kit under each profile option: a manager keeping a convention passes
under the profile that names it and is found under the default, and the
kit's rules for illegal calls bind every backend."""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping

import attrs
import pytest

from kvoffload import CPUOffloadingManager, FilterReusedOffloadingManager
from kvoffload.spec.contract import (
    LoadStoreSpec,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
)
from kvoffload.spec.errors import OffloadingError
from kvoffload.spec.invariants import Invariant
from kvoffload.spec.keys import OffloadKey, validate_offload_key
from kvoffload.spec.lifecycle import Phase
from kvoffload.spec.profile import (
    DEFAULT,
    ErrorStyle,
    FilterCounts,
    LookupAnswer,
    LRURank,
    Profile,
    ResetAnnounce,
)
from kvoffload.stateful import AuditReport, ReuseFilterParams, audit
from tests.stateful.thirdparty import DictLRUManager

EXAMPLES = 80
"""Budget of the passing audits (the default budget for findings)."""


class Delegating(OffloadingManager):
    """Every call passed to ``inner`` (a built-in manager), introspection too."""

    def __init__(self, inner: CPUOffloadingManager) -> None:
        self.inner = inner

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> object:  # type: ignore[override]
        return self.inner.lookup(key, req_context)

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        return self.inner.prepare_load(keys, req_context)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.inner.touch(keys, req_context)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.inner.complete_load(keys, req_context)

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        return self.inner.prepare_store(keys, req_context)

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        self.inner.complete_store(keys, req_context, success)

    def take_events(self) -> Iterable[object]:  # type: ignore[override]
        return self.inner.take_events()

    def reset_cache(self) -> None:
        self.inner.reset_cache()

    def phase(self, key: OffloadKey) -> Phase:
        return self.inner.phase(key)

    def slot_of(self, key: OffloadKey) -> int | None:
        return self.inner.slot_of(key)

    def policy_state(self) -> Mapping[str, object]:
        return self.inner.policy_state()


def lru(num_blocks: int) -> CPUOffloadingManager:
    return CPUOffloadingManager(16, num_blocks, "lru", enable_events=True)


def run(factory: object, profile: Profile, *, found: bool, **kwargs: object) -> AuditReport:
    report = audit(
        factory,  # type: ignore[arg-type]
        policy="lru",
        profile=profile,
        max_examples=None if found else EXAMPLES,
        **kwargs,  # type: ignore[arg-type]
    )
    assert report.passed is not found, report.render()
    return report


ANY_ERRORS = attrs.evolve(DEFAULT, name="any-errors", errors=ErrorStyle.ANY)


# --- errors ----------------------------------------------------------------------


class BareErrors(Delegating):
    """Illegal calls raise ``KeyError``, as an assert-based backend would."""

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        try:
            return super().prepare_load(keys, req_context)
        except OffloadingError as error:
            raise KeyError(str(error)) from None

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        try:
            super().complete_load(keys, req_context)
        except OffloadingError as error:
            raise KeyError(str(error)) from None


def bare_errors(num_blocks: int) -> OffloadingManager:
    return BareErrors(lru(num_blocks))


def test_any_exception_will_do_under_errors_any() -> None:
    report = run(bare_errors, DEFAULT, found=True)
    assert report.invariant is Invariant.ERRORS
    run(bare_errors, ANY_ERRORS, found=False)


@attrs.frozen
class Slots(LoadStoreSpec):
    block_ids: tuple[int, ...]

    @staticmethod
    def medium() -> str:
        return "CPU"


class PinsBeforeAsserting(BareErrors):
    """Like vLLM's assert-based loop: pins each key in turn and asserts on
    the first bad one, leaving the earlier keys pinned."""

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        for key in keys:
            if not self.inner.phase(key).readable:
                raise AssertionError(f"{key!r} is not ready")
            self.inner.prepare_load([key], req_context)
        return Slots(tuple(int(self.inner.slot_of(k) or 0) for k in keys))


def pins_before_asserting(num_blocks: int) -> OffloadingManager:
    return PinsBeforeAsserting(lru(num_blocks))


def test_an_illegal_call_that_raises_after_a_change_is_found_under_errors_any() -> None:
    report = run(pins_before_asserting, ANY_ERRORS, found=True)
    assert report.invariant is Invariant.ERRORS and report.illegal_call_damage, report.render()
    # under errors=any the illegal call may raise any exception
    assert report.script is not None and "# illegal: must raise an exception" in report.script
    assert "errors='any'" in report.script.split("replay = Replay(")[1].split("\n")[0]


class SwallowsIllegalLoads(Delegating):
    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        try:
            super().complete_load(keys, req_context)
        except OffloadingError:
            pass


def swallows_illegal_loads(num_blocks: int) -> OffloadingManager:
    return SwallowsIllegalLoads(lru(num_blocks))


def test_an_accepted_illegal_call_is_found_under_errors_any() -> None:
    report = run(swallows_illegal_loads, ANY_ERRORS, found=True)
    assert report.invariant is Invariant.ERRORS
    assert "was accepted" in (report.message or "")


# --- lookup_answer ---------------------------------------------------------------


class Answer(enum.Enum):
    MISS = enum.auto()
    HIT = enum.auto()
    HIT_PENDING = enum.auto()
    RETRY = enum.auto()


class ResultLookups(Delegating):
    """Answers its own result enum, as vLLM 0.25 on does."""

    pending_is_hit = False

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> object:  # type: ignore[override]
        phase = self.inner.phase(key)
        if phase.readable:
            return Answer.HIT
        if phase.kind.value == "PENDING":
            return Answer.HIT if self.pending_is_hit else Answer.HIT_PENDING
        return Answer.MISS

    def lookup_prefix(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> int | None:
        return self.inner.lookup_prefix(keys, req_context)


class PendingHits(ResultLookups):
    pending_is_hit = True


RESULTS = attrs.evolve(DEFAULT, name="results", lookup_answer=LookupAnswer.RESULT)


def result_lookups(num_blocks: int) -> OffloadingManager:
    return ResultLookups(lru(num_blocks))


def pending_hits(num_blocks: int) -> OffloadingManager:
    return PendingHits(lru(num_blocks))


def test_lookup_results_are_compared_by_name() -> None:
    run(result_lookups, RESULTS, found=False)
    report = run(pending_hits, RESULTS, found=True)
    assert report.invariant is Invariant.LOOKUP
    assert "HIT_PENDING" in (report.message or "")


# --- reset_announce, private_events, offers_repeat_keys --------------------------


class SilentReset(Delegating):
    """``reset_cache`` publishes nothing: the engine announces it."""

    def __init__(self, inner: CPUOffloadingManager) -> None:
        super().__init__(inner)
        self.queued: list[object] = []

    def reset_cache(self) -> None:
        self.queued += self.inner.take_events()  # what was queued stays queued
        self.inner.reset_cache()
        list(self.inner.take_events())  # the manager's own announcement: dropped

    def take_events(self) -> Iterable[object]:  # type: ignore[override]
        events = [*self.queued, *self.inner.take_events()]
        self.queued.clear()
        return events


def silent_reset(num_blocks: int) -> OffloadingManager:
    return SilentReset(lru(num_blocks))


def test_an_engine_announced_reset() -> None:
    engine = attrs.evolve(DEFAULT, name="engine", reset_announce=ResetAnnounce.ENGINE)
    run(silent_reset, engine, found=False)
    report = run(silent_reset, DEFAULT, found=True)
    assert report.invariant is Invariant.EVENTS


@attrs.frozen
class PrivateEvent:
    keys: tuple[OffloadKey, ...]
    removed: bool = True
    medium: str = "CPU"
    block_size: int = 16
    metadata_only: bool = True


class AnnouncesCleanUp(Delegating):
    """A failed store queues a private ``metadata_only`` removal, as vLLM
    0.33 does."""

    def __init__(self, inner: CPUOffloadingManager) -> None:
        super().__init__(inner)
        self.private: list[object] = []

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        pending = [k for k in keys if self.inner.phase(k).kind.value == "PENDING"]
        super().complete_store(keys, req_context, success)
        if not success and pending:
            self.private.append(PrivateEvent(tuple(pending)))

    def take_events(self) -> Iterable[object]:  # type: ignore[override]
        events = [*self.private, *self.inner.take_events()]
        self.private.clear()
        return events


def announces_clean_up(num_blocks: int) -> OffloadingManager:
    return AnnouncesCleanUp(lru(num_blocks))


def test_private_events_are_dropped_under_their_profile() -> None:
    private = attrs.evolve(DEFAULT, name="private", private_events=True)
    run(announces_clean_up, private, found=False)
    report = run(announces_clean_up, DEFAULT, found=True)
    assert report.invariant is Invariant.EVENTS


class DistinctOffersOnly(Delegating):
    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        if len(set(keys)) != len(list(keys)):
            raise RuntimeError("an offer repeats a key")
        return super().prepare_store(keys, req_context)


def distinct_offers_only(num_blocks: int) -> OffloadingManager:
    return DistinctOffersOnly(lru(num_blocks))


def test_offers_repeat_keys_only_where_the_profile_allows() -> None:
    distinct = attrs.evolve(DEFAULT, name="distinct", offers_repeat_keys=False)
    run(distinct_offers_only, distinct, found=False)
    report = run(distinct_offers_only, DEFAULT, found=True)
    assert report.invariant in (Invariant.CRASH, Invariant.ERRORS)
    assert "an offer repeats a key" in (report.message or "")


# --- filter_counts ----------------------------------------------------------------


class OffersCountingFilter(Delegating):
    """A reuse filter that counts offers (vLLM 0.29's admission rule): every
    offered key is recorded, then the keys counted at least ``threshold``
    times, and those already stored, are passed on."""

    def __init__(self, inner: CPUOffloadingManager, threshold: int, tracker: int) -> None:
        super().__init__(inner)
        self.threshold, self.tracker = threshold, tracker
        self.counts: OrderedDict[OffloadKey, int] = OrderedDict()

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        keys = [validate_offload_key(k) for k in keys]
        for key in keys:
            if key in self.counts:
                self.counts.move_to_end(key)
                self.counts[key] += 1
            else:
                if len(self.counts) >= self.tracker:
                    self.counts.popitem(last=False)
                self.counts[key] = 1
        passed = [
            k for k in keys
            if self.counts.get(k, 0) >= self.threshold or self.inner.phase(k).readable
        ]
        return super().prepare_store(passed, req_context)

    def reset_cache(self) -> None:
        super().reset_cache()
        self.counts.clear()


OFFER_FILTER = ReuseFilterParams(store_threshold=2, max_tracker_size=4)


def offers_counting_filter(num_blocks: int) -> OffloadingManager:
    return OffersCountingFilter(lru(num_blocks), 2, 4)


def lookups_counting_filter(num_blocks: int) -> OffloadingManager:
    return FilterReusedOffloadingManager(lru(num_blocks), 2, 4)


def test_the_filter_counts_what_the_profile_says() -> None:
    offers = attrs.evolve(DEFAULT, name="offers", filter_counts=FilterCounts.OFFERS)
    run(offers_counting_filter, offers, found=False, reuse_filter=OFFER_FILTER)
    # a store the other counting rule would not make (or miss) shows at once
    wrong_store = (Invariant.STORE_SPEC, Invariant.PROTECTION, Invariant.LIFECYCLE)
    report = run(offers_counting_filter, DEFAULT, found=True, reuse_filter=OFFER_FILTER)
    assert report.invariant in wrong_store, report.render()
    report = run(lookups_counting_filter, offers, found=True, reuse_filter=OFFER_FILTER)
    assert report.invariant in wrong_store, report.render()


@pytest.mark.parametrize("style", list(ErrorStyle))
def test_the_kit_still_passes_the_built_in_manager_under_each_error_style(
    style: ErrorStyle,
) -> None:
    run(lru, attrs.evolve(DEFAULT, name=style.value, errors=style), found=False)


# --- the command line -------------------------------------------------------------


def test_the_command_line_takes_a_profile_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    from kvoffload.stateful.audit_cli import main

    target = ["--target", "tests.stateful.test_kit_profiles:bare_errors", "--policy", "lru", "--examples", "30"]
    assert main([*target, "--profile", "legacy", "--no-reset"]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(target) == 1  # kvoffload's own profile demands typed errors
    assert "FAIL (errors)" in capsys.readouterr().out
    assert main([*target, "--profile", "vllm-0.0"]) == 2
    assert "no profile named 'vllm-0.0'; known: kvoffload, legacy" in capsys.readouterr().err


class RanksWhenEvictable(DictLRUManager):
    """LRU over evictable blocks only (vLLM 0.24 - 0.30's LRU): a block
    becomes most recent when its store or its last load completes, and
    ``touch`` moves only blocks no load pins."""

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        pending = [k for k in dict.fromkeys(keys) if k in self.blocks and self.blocks[k].ref_cnt < 0]
        super().complete_store(keys, req_context, success)
        if success:
            for key in pending:
                self.blocks.move_to_end(key)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        keys = list(keys)
        super().complete_load(keys, req_context)
        for key in dict.fromkeys(reversed(keys)).__reversed__():
            if self.blocks[key].ref_cnt == 0:
                self.blocks.move_to_end(key)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in reversed(list(keys)):
            if key in self.blocks and self.blocks[key].ref_cnt == 0:
                self.blocks.move_to_end(key)


def test_lru_rank_when_evictable() -> None:
    evictable = attrs.evolve(DEFAULT, name="evictable", lru_rank=LRURank.EVICTABLE)
    report = run(RanksWhenEvictable, evictable, found=False)
    assert report.coverage is not None and not report.coverage.missing, report.render()
    for factory, profile in ((RanksWhenEvictable, DEFAULT), (DictLRUManager, evictable)):
        report = run(factory, profile, found=True)
        assert report.invariant is Invariant.EVICTION, report.render()
