"""audit_tier and `audit --tier`: correct tiers pass, every planted defect is
caught at the default budget, and the replay script reproduces it."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

from kvoffload.spec.profile import DEFAULT, profile_named
from kvoffload.spec.violations import Invariant
from kvoffload.stateful import audit_cli, audit_tier
from kvoffload.stateful.targets import BuiltinTierTarget
from kvoffload.stateful.tier_harness import TempDirTier, TierHarness, TierOp
from tests.stateful import tier_samples

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = "tests.stateful.tier_samples"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.mark.parametrize("name", sorted(tier_samples.CORRECT))
def test_a_correct_tier_passes_the_default_audit(name: str) -> None:
    report = audit_tier(tier_samples.CORRECT[name], seed=11)
    assert report.passed, report.render()
    assert report.examples == 500 and report.steps > 5000


@pytest.mark.parametrize("name", sorted(tier_samples.PLANTED))
def test_each_planted_defect_is_caught_at_the_default_budget(name: str) -> None:
    factory, invariants = tier_samples.PLANTED[name]
    # the tier's threads make a seed's runs differ between builds (a compiled
    # run of seed 11 missed evict_loading once): caught by one of two seeds
    for seed in (11, 12):
        report = audit_tier(factory, seed=seed, factory_import=f"{SAMPLES}:{name}")
        if not report.passed:
            break
    assert not report.passed, f"{name} passed"
    assert report.invariant in invariants, report.render()
    # a race with the tier's own thread shrinks less: its replays may not repeat it
    limit = 40 if name == "racy_thread" else 12
    assert report.script is not None and report.calls <= limit, report.render()


def test_a_late_read_loaded_back_into_its_own_slot_reads_as_nothing_written() -> None:
    """Regression (CI at 30dbad7, seed 11): a cascade reads its slot only at
    the next poll, after the kit has given that slot to a promotion of the
    same key; the tier stores what the slot then holds and loads it back
    there. The slot ends as it was, which the bytes cannot tell from a
    promotion that wrote nothing: the audit fails (T1), and the planted
    sample lists both readings."""
    from kvoffload.spec.violations import SpecViolation
    from kvoffload.stateful.tier_harness import TierHarness

    harness = TierHarness(
        tier_samples.unpinned_read, capacity=4, rows=12, num_keys=8, row_bytes=64,
        bounded=True, stale_misses=False, pending_work=True, loads_succeed=True,
        evicts_on_store=True, own_temp=True,
    )
    try:
        harness.store([7, 4], 0)
        harness.poll()
        harness.load([4], 0)
        with pytest.raises(SpecViolation) as caught:
            harness.poll()
        assert caught.value.invariant is Invariant.TIER_READABLE
        assert "the promotion wrote nothing there" in str(caught.value)
    finally:
        harness.close()
    assert Invariant.TIER_READABLE in tier_samples.PLANTED["unpinned_read"][1]


@pytest.mark.parametrize("name", ["wrong_slot", "unpinned_read", "lost_job"])
def test_the_replay_script_reproduces_the_failure(name: str, tmp_path: Path) -> None:
    factory, invariants = tier_samples.PLANTED[name]
    report = audit_tier(factory, seed=5, factory_import=f"{SAMPLES}:{name}")
    assert report.script is not None and report.invariant is not None
    script = tmp_path / "replay.py"
    script.write_text(report.script)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=_env(),
        cwd=ROOT, timeout=60,
    )
    assert done.returncode != 0
    assert report.invariant.label in done.stderr, done.stderr


def test_the_harness_refuses_an_object_that_is_not_a_tier() -> None:
    report = audit_tier(lambda capacity, view: object(), seed=1, max_examples=3)
    assert not report.passed and report.invariant is Invariant.CRASH
    assert "not a secondary tier" in (report.message or "")


def test_capacity_is_a_profile_option() -> None:
    assert not audit_tier(tier_samples.overflow, seed=2, max_examples=100).passed
    relaxed = attrs.evolve(DEFAULT, tier_capacity_bounded=False)
    assert audit_tier(tier_samples.overflow, seed=2, max_examples=100, profile=relaxed).passed
    assert profile_named("vllm-0.33").tier_capacity_bounded is False


def test_a_promotion_writing_outside_its_slots_is_caught_at_once() -> None:
    class Scribbler(tier_samples.DictTier):
        def run_load(self, job: Any) -> Any:
            self.write_slot(0, bytes(self.chunk_bytes))
            return super().run_load(job)

    harness = TierHarness(lambda c, v: Scribbler(c, v), capacity=2, rows=4, num_keys=3)
    harness.step(TierOp("store", ([1], 0)))
    harness.step(TierOp("drain"))
    harness.step(TierOp("load", ([1], 0)))
    with pytest.raises(Exception, match="T2 promotion slots"):
        harness.step(TierOp("drain"))


def _audit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvoffload", "audit", *args],
        capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=120,
    )


def test_cli_exit_status_pass_violation_usage() -> None:
    ok = _audit("--tier", f"{SAMPLES}:dict_tier", "--seed", "3", "--examples", "40")
    assert ok.returncode == 0 and "PASS" in ok.stdout, ok.stdout + ok.stderr
    bad = _audit("--tier", f"{SAMPLES}:torn_read", "--seed", "3")
    assert bad.returncode == 1 and "T1 tier readable" in bad.stdout
    assert "t = TierHarness(factory" in bad.stdout
    for usage in (["--tier", "no_such_module:x"], ["--tier", f"{SAMPLES}:CORRECT"],
                  ["--tier", f"{SAMPLES}:not_a_tier"], ["--tier", f"{SAMPLES}:DictTier.lookup"],
                  ["--tier", f"{SAMPLES}:dict_tier", "--target", "m:f"]):
        assert _audit(*usage).returncode == 2


def test_built_in_tiers_join_the_main_job_from_one_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(audit_cli, "BUILTIN_TARGETS", ())
    monkeypatch.setattr(
        audit_cli, "BUILTIN_TIER_TARGETS",
        (BuiltinTierTarget("DictTier", tier_samples.dict_tier),
         BuiltinTierTarget("TornReadTier", tier_samples.torn_read)),
    )
    parser = argparse.ArgumentParser()
    audit_cli.add_arguments(parser)
    status = audit_cli.run(parser.parse_args(["--seed", "1", "--examples", "30"]))
    out = capsys.readouterr().out
    assert status == 1
    assert "DictTier" in out and "TornReadTier" in out and "T1 tier readable" in out


def test_a_temp_dir_tier_forwards_calls_and_removes_its_directory(tmp_path: Path) -> None:
    directory = tmp_path / "tier"
    directory.mkdir()
    (directory / "chunk.bin").write_bytes(b"x")
    inner = tier_samples.dict_tier(1, memoryview(bytearray(64)).cast("B", (1, 64)))
    tier = TempDirTier(inner, str(directory))
    assert tier.lookup(b"abcd\x00\x00\x00\x00", None).name == "MISS"
    tier.shutdown()
    assert not directory.exists()
