"""The tier kit's options and faults of the tiercatch work (docs/SPEC.md §10,
"Profile options for tiers"; docs/KIT.md, "Auditing a secondary tier"):
each is caught under the default profile and allowed by the profile that
says otherwise, on small variants of the correct sample ``DictTier``."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Collection
from pathlib import Path

import attrs
import pytest

from kvoffload.spec.contract import LookupResult, ReqContext
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.profile import DEFAULT, LOSSY_TIER, profile_named
from kvoffload.spec.tier_contract import TierJobLike, TierJobResult
from kvoffload.spec.violations import Invariant
from kvoffload.stateful import audit_tier
from kvoffload.stateful.tier_harness import TierHarness
from tests.stateful.tier_samples import DictTier

SEED = 5
BUDGET = 120


class FlakyLoadTier(DictTier):
    """Every third key a promotion reads fails (a lossy backend)."""

    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        super().__init__(capacity_blocks, primary_kv_view)
        self.reads = 0

    def run_load(self, job: TierJobLike) -> TierJobResult:
        made: list[OffloadKey] = []
        for key, slot in zip(job.keys, job.chunk_ids):
            if key in self.chunks and self.loading[key] > 0:
                self.loading[key] -= 1
                self.reads += 1
                if self.reads % 3:
                    self.write_slot(int(slot), self.chunks[key])
                    made.append(key)
        return self.result(job, made)


class ForgetfulTier(DictTier):
    """Drops its oldest key whenever a lookup finds the tier full (a tier
    that evicts on its own, outside ``submit_store``)."""

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if len(self.chunks) >= self.capacity:
            for victim in self.chunks:
                if self.evictable(victim):
                    del self.chunks[victim]
                    break
        return super().lookup(key, req_context)


class TempFileTier(DictTier):
    """Keeps each chunk in a file of a temporary directory of its own."""

    CLEANS_UP = True
    CHECKS_WRITES = True

    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        super().__init__(capacity_blocks, primary_kv_view)
        self.root = tempfile.mkdtemp(prefix="sample-tier-")

    def path(self, key: OffloadKey) -> str:
        return os.path.join(self.root, bytes(key).hex())

    def run_store(self, job: TierJobLike) -> TierJobResult:
        made: list[OffloadKey] = []
        for key, slot in zip(job.keys, job.chunk_ids):
            if key in self.chunks:
                self.chunks.move_to_end(key)
                made.append(key)
            elif self.make_room(job.keys):
                try:
                    with open(self.path(key), "wb") as f:
                        f.write(self.read_slot(int(slot)))
                except OSError:
                    if self.CHECKS_WRITES:
                        continue
                self.chunks[key] = b""
                made.append(key)
        return self.result(job, made)

    def run_load(self, job: TierJobLike) -> TierJobResult:
        made: list[OffloadKey] = []
        for key, slot in zip(job.keys, job.chunk_ids):
            if key in self.chunks and self.loading[key] > 0:
                self.loading[key] -= 1
                with open(self.path(key), "rb") as f:
                    data = f.read()
                if len(data) == self.chunk_bytes:
                    self.write_slot(int(slot), data)
                    made.append(key)
        return self.result(job, made)

    def make_room(self, protected: Collection[OffloadKey]) -> bool:
        before = set(self.chunks)
        room = super().make_room(protected)
        for gone in before - set(self.chunks):
            os.remove(self.path(gone))
        return room

    def shutdown(self) -> None:
        if self.CLEANS_UP:
            shutil.rmtree(self.root, ignore_errors=True)


class KeepsFilesTier(TempFileTier):
    CLEANS_UP = False


class IgnoresWriteErrorsTier(TempFileTier):
    CHECKS_WRITES = False


def test_a_correct_file_tier_survives_disk_faults_and_cleans_up() -> None:
    report = audit_tier(TempFileTier, seed=SEED, max_examples=BUDGET)
    assert report.passed, report.render()


def test_a_failed_load_of_a_pinned_key_is_a_breach_unless_the_tier_is_lossy() -> None:
    report = audit_tier(FlakyLoadTier, seed=SEED, max_examples=BUDGET)
    assert report.invariant is Invariant.TIER_LIFECYCLE, report.render()
    assert "tier_loads_succeed" in (report.message or "")
    lossy = audit_tier(FlakyLoadTier, profile=LOSSY_TIER, seed=SEED, max_examples=BUDGET)
    assert lossy.passed, lossy.render()
    assert not profile_named("vllm-0.33").tier_loads_succeed


def test_an_eviction_outside_submit_store_is_a_breach_unless_the_profile_allows_it() -> None:
    report = audit_tier(ForgetfulTier, seed=SEED, max_examples=BUDGET)
    assert report.invariant is Invariant.TIER_LIFECYCLE, report.render()
    assert "tier_evicts_on_store" in (report.message or "")
    lax = attrs.evolve(DEFAULT, tier_evicts_on_store=False)
    assert audit_tier(ForgetfulTier, profile=lax, seed=SEED, max_examples=BUDGET).passed


def test_temporary_files_left_by_shutdown_are_a_breach_unless_the_profile_allows_it() -> None:
    report = audit_tier(KeepsFilesTier, seed=SEED, max_examples=BUDGET)
    assert report.invariant is Invariant.TIER_PROGRESS, report.render()
    assert "tier_shutdown_removes_temp" in (report.message or "")
    lax = attrs.evolve(DEFAULT, tier_shutdown_removes_temp=False)
    assert audit_tier(KeepsFilesTier, profile=lax, seed=SEED, max_examples=BUDGET).passed
    # the kit's per-run directory is gone and tempfile points back where it did
    assert not tempfile.tempdir or "kvoffload-tier-run-" not in tempfile.tempdir


def test_a_store_that_ignores_a_failing_disk_is_caught_unless_faults_are_off() -> None:
    report = audit_tier(IgnoresWriteErrorsTier, seed=SEED, max_examples=BUDGET)
    assert not report.passed and report.invariant in (
        Invariant.TIER_READABLE, Invariant.TIER_LIFECYCLE
    ), report.render()
    off = attrs.evolve(DEFAULT, tier_disk_faults=False)
    assert audit_tier(IgnoresWriteErrorsTier, profile=off, seed=SEED, max_examples=BUDGET).passed


def test_disk_full_fails_every_file_write_and_is_lifted(tmp_path: Path) -> None:
    harness = TierHarness(DictTier, 2)
    try:
        harness.disk_full(True)
        failed = False
        try:
            with open(os.path.join(str(tmp_path), "x"), "wb") as f:
                f.write(b"data")
        except OSError:
            failed = True
        harness.disk_full(False)
        assert failed
        with open(os.path.join(str(tmp_path), "y"), "wb") as f:
            f.write(b"data")
    finally:
        harness.close()


def test_a_factory_that_returns_no_tier_leaves_tempfile_as_it_was() -> None:
    before = tempfile.tempdir
    with pytest.raises(TypeError, match="not a secondary tier"):
        TierHarness(lambda capacity, view: object(), 2, own_temp=True)
    assert tempfile.tempdir == before
