"""The kit's reach: what it checks, what it covers, what it does not judge.

- The model takes the slots a manager shows (spec ``block_ids`` or
  ``slot_of``) and gives no verdict on what nobody showed: a manager that
  hands out the highest free slot first and names byte offsets passes.
- Contract details: event metadata, empty offers, repeated completions,
  several KV groups per block hash.
- Drivers: the engine-protocol driver finds a filter that counts lookups
  behind ``lookup_prefix``; the probe finds an outputs-only manager's
  hidden slip; a manager that can be neither inspected nor copied is
  audited with a warning.
- Coverage counters and seeds.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Collection, Iterable

import attrs
import pytest

from kvoffload.spec.contract import (
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
)
from kvoffload.spec.invariants import Invariant
from kvoffload.spec.keys import OffloadKey, get_offload_block_hash
from kvoffload.spec.profile import DEFAULT, FilterCounts
from kvoffload.stateful import KitConfig, ReuseFilterParams, audit
from kvoffload.stateful.coverage import ARC_BRANCHES, LIFECYCLE_ROWS
from kvoffload.stateful.drivers import ENGINE, explore, run_seed
from kvoffload.stateful.engine import run_engine
from kvoffload.stateful.harness import Discrepancy, Harness
from tests.stateful.thirdparty import (
    BLOCK_SIZE,
    MEDIUM,
    CountingReuseFilter,
    DictLRUManager,
    dict_lru,
)

BUDGET = 80  # runs per audit in these tests (the default is 500)
BYTES_PER_BLOCK = 4096


class ByteOffsetSpec(LoadStoreSpec):
    """A file-backed tier's spec: byte offsets, no ``block_ids``."""

    def __init__(self, offsets: Iterable[int]) -> None:
        self.offsets = tuple(offsets)

    @staticmethod
    def medium() -> str:
        return MEDIUM


class HighSlotManager(DictLRUManager):
    """Correct, but hands out the highest free slot first and names byte
    offsets in its specs."""

    def take_free_slot(self) -> int:
        slot = max(self.free_slots)
        self.free_slots.remove(slot)
        return slot

    def spec_of(self, slots: list[int]) -> LoadStoreSpec:
        return ByteOffsetSpec(s * BYTES_PER_BLOCK for s in slots)


class OutputsOnly(OffloadingManager):
    """The contract's calls of ``inner`` and nothing else (no introspection)."""

    def __init__(self, inner: OffloadingManager) -> None:
        self.inner = inner

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        return self.inner.lookup(key, req_context)

    def lookup_prefix(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> int | None:
        return self.inner.lookup_prefix(keys, req_context)

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

    def take_events(self) -> Iterable[OffloadingEvent]:
        return self.inner.take_events()

    def reset_cache(self) -> None:
        self.inner.reset_cache()


class Uncopyable(OutputsOnly):
    """Holds a lock: ``copy.deepcopy`` fails."""

    def __init__(self, inner: OffloadingManager) -> None:
        super().__init__(inner)
        self.guard = threading.Lock()


def high_slots(num_blocks: int) -> OffloadingManager:
    return HighSlotManager(num_blocks)


def opaque_high_slots(num_blocks: int) -> OffloadingManager:
    return OutputsOnly(HighSlotManager(num_blocks))


@pytest.mark.parametrize("factory", [high_slots, opaque_high_slots])
@pytest.mark.parametrize("policy", ["lru", "any"])
def test_any_free_slot_and_byte_offset_specs_pass(
    factory: object, policy: str
) -> None:
    report = audit(factory, policy=policy, max_examples=BUDGET, seed=3)  # type: ignore[arg-type]
    assert report.passed, report.render()


# --- contract details ---------------------------------------------------------


class WrongBlockSizeEvents(DictLRUManager):
    """Announces stores with a block size of 0."""

    def _event(self, keys: object, removed: bool) -> None:
        size = BLOCK_SIZE if removed else 0
        self.events.append(OffloadingEvent(tuple(keys), size, MEDIUM, removed))  # type: ignore[arg-type]


class WrongMediumEvents(DictLRUManager):
    """Announces removals in the wrong medium."""

    def _event(self, keys: object, removed: bool) -> None:
        medium = "GPU" if removed else MEDIUM
        self.events.append(OffloadingEvent(tuple(keys), BLOCK_SIZE, medium, removed))  # type: ignore[arg-type]


class CrashesOnEmptyOffer(DictLRUManager):
    """``prepare_store([])`` indexes the first key."""

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        _ = list(keys)[0]
        return super().prepare_store(keys, req_context)


class ReannouncesCompletions(DictLRUManager):
    """``complete_store`` of a READY key announces it again."""

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        ready = [k for k in dict.fromkeys(keys) if k in self.blocks and self.blocks[k].ref_cnt == 0]
        super().complete_store(keys, req_context, success)
        if success and ready:
            self._event(ready, removed=False)


class HashOnlyManager(DictLRUManager):
    """Looks keys up by block hash, ignoring the KV group."""

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool:
        block_hash = get_offload_block_hash(key)
        return any(
            get_offload_block_hash(k) == block_hash and e.ref_cnt >= 0
            for k, e in self.blocks.items()
        )


@pytest.mark.parametrize(
    ("cls", "invariants"),
    [
        (WrongBlockSizeEvents, {"6 events"}),
        (WrongMediumEvents, {"6 events"}),
        (CrashesOnEmptyOffer, {"no crash"}),
        (ReannouncesCompletions, {"6 events"}),
        (HashOnlyManager, {"lookup", "errors"}),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_contract_details_are_checked(cls: type, invariants: set[str]) -> None:
    report = audit(cls, policy="lru", max_examples=BUDGET, seed=5)
    assert not report.passed
    assert report.invariant is not None and report.invariant.label in invariants, report.render()
    assert report.calls <= 10


# --- drivers ------------------------------------------------------------------

FILTER = ReuseFilterParams(store_threshold=2, max_tracker_size=8)


class LookupCountingFilter(CountingReuseFilter):
    """Counts ``lookup`` calls only: ``lookup_prefix`` is the contract's
    default, which stops at the first miss, so a repeated prompt is
    offloaded one block per two requests."""

    def lookup_prefix(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> int | None:
        return OffloadingManager.lookup_prefix(self, keys, req_context)


def lookup_counting_filter(num_blocks: int) -> OffloadingManager:
    return LookupCountingFilter(
        DictLRUManager(num_blocks), FILTER.store_threshold, FILTER.max_tracker_size
    )


def counting_filter(num_blocks: int) -> OffloadingManager:
    return CountingReuseFilter(
        DictLRUManager(num_blocks), FILTER.store_threshold, FILTER.max_tracker_size
    )


def test_engine_driver_finds_a_filter_that_counts_lookups_behind_a_prefix_lookup() -> None:
    config = KitConfig(lookup_counting_filter, policy="lru", reuse_filter=FILTER, num_keys=12)
    harness = Harness(config, 8)
    with pytest.raises(Discrepancy):
        run_engine(harness, random.Random(0), 200)
    # and the correct filter passes the same requests
    correct = Harness(KitConfig(counting_filter, policy="lru", reuse_filter=FILTER, num_keys=12), 8)
    run_engine(correct, random.Random(0), 200)


def test_engine_driver_runs_in_the_audit_and_is_named() -> None:
    report = audit(lookup_counting_filter, policy="lru", reuse_filter=FILTER, seed=1)
    assert not report.passed
    assert report.driver in {"swarm", ENGINE, "probe"}
    config = KitConfig(lookup_counting_filter, policy="lru", reuse_filter=FILTER, num_keys=12)
    # engine runs alone (every run the engine's) find it too
    found = explore(config, seed=1, runs=50, steps=40, probe=False)
    assert found.failure is not None


class StaleLoadRecency(DictLRUManager):
    """Outputs-only slip: ``touch`` skips blocks being loaded, so their
    recency is stale; only a store that needs that exact victim shows it."""

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in reversed(list(keys)):
            entry = self.blocks.get(key)
            if entry is not None and entry.ref_cnt <= 0:
                self.blocks.move_to_end(key)


def opaque_stale_load_recency(num_blocks: int) -> OffloadingManager:
    return OutputsOnly(StaleLoadRecency(num_blocks))


def test_probe_drains_a_copy_and_finds_an_outputs_only_slip() -> None:
    report = audit(opaque_stale_load_recency, policy="lru", seed=2, max_examples=BUDGET)
    assert not report.passed, report.render()
    assert report.observability == "copy"
    assert report.warnings == ()


def test_neither_introspection_nor_copying_is_warned_about() -> None:
    report = audit(
        lambda n: Uncopyable(DictLRUManager(n)), policy="lru", seed=1, max_examples=20
    )
    assert report.passed, report.render()
    assert report.observability == "outputs only"
    assert report.warnings and "neither introspection" in report.warnings[0]
    assert "WARNING" in report.render()


# --- coverage and seeds -------------------------------------------------------


def test_coverage_counts_every_lifecycle_row() -> None:
    report = audit(dict_lru, policy="lru", seed=4, max_examples=200)
    assert report.passed
    assert report.coverage is not None
    assert [name for name, _ in report.coverage.lifecycle] == list(LIFECYCLE_ROWS)
    assert report.coverage.missing == ()
    assert report.coverage.arc == ()
    assert "23/23 lifecycle rows" in report.render()


def test_arc_branches_are_named() -> None:
    assert len(set(ARC_BRANCHES)) == len(ARC_BRANCHES) == 8


def test_an_unseeded_audit_prints_its_seed_and_replays_from_it() -> None:
    first = audit(CrashesOnEmptyOffer, policy="lru", max_examples=BUDGET)
    assert first.seed is not None and not first.passed
    again = audit(CrashesOnEmptyOffer, policy="lru", max_examples=BUDGET, seed=first.seed)
    assert (again.examples, again.script) == (first.examples, first.script)
    assert f"seed {first.seed}" in first.render()
    assert run_seed(1, 2).random() == run_seed(1, 2).random() != run_seed(1, 3).random()


def test_counting_lookups_to_the_first_miss_fails_the_engine_property_even_as_a_convention() -> None:
    """Under ``filter_counts=LOOKUPS_TO_FIRST_MISS`` every call of this filter
    is what the model says, yet a prompt requested ``store_threshold`` times
    is not offloaded whole (vLLM 0.20-0.28, F6 in docs/FINDINGS.md): the
    engine-level property rejects the convention itself."""
    profile = attrs.evolve(DEFAULT, name="first-miss", filter_counts=FilterCounts.LOOKUPS_TO_FIRST_MISS)
    config = KitConfig(
        lookup_counting_filter, policy="lru", reuse_filter=FILTER, num_keys=12, profile=profile
    )
    with pytest.raises(Discrepancy) as found:
        run_engine(Harness(config, 8), random.Random(0), 200)
    assert found.value.invariant is Invariant.REPEATED_PROMPT, found.value
    report = audit(lookup_counting_filter, policy="lru", reuse_filter=FILTER, profile=profile, seed=1)
    assert report.invariant is Invariant.REPEATED_PROMPT, report.render()
