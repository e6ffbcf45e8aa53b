"""``simulate --tiers``: the tiered manager replayed, hits per tier, OPT."""

from __future__ import annotations

import json

import pytest

from kvoffload.__main__ import main
from kvoffload.sim.tiers import TierSpec, parse_tiers, simulate_tiers
from kvoffload.spec.errors import ConfigurationError
from kvoffload.workloads import RequestRecord, compile_trace


def test_parse_tiers() -> None:
    assert parse_tiers("cpu=4, fs=16") == [TierSpec("cpu", 4), TierSpec("fs", 16)]
    for bad in ("cpu=4", "fs=16,cpu=4", "cpu=4,fs=0", "cpu=4,fs", "cpu=4,fs=x",
                "cpu=4,fs=2,fs=3"):
        with pytest.raises(ConfigurationError):
            parse_tiers(bad)


def test_a_block_evicted_from_the_cpu_tier_is_a_hit_of_the_next_tier() -> None:
    # A B, then C D push them out of a 2-slot CPU tier, then A B again
    records = [
        RequestRecord("r0", segments=(("ab", 2),)),
        RequestRecord("r1", segments=(("cd", 2),)),
        RequestRecord("r2", segments=(("ab", 2),)),
    ]
    trace = compile_trace(records)
    tiers = [TierSpec("cpu", 2), TierSpec("fs", 8)]
    result = simulate_tiers(trace, tiers, "lru", max_promotions_in_flight=2)
    assert result.tier_hits == (0, 2)
    assert result.hit_blocks == 2 and result.block_refs == 6
    assert result.steps_waited == 1  # one step for the promotion of A B

    bounded = simulate_tiers(trace, tiers, "lru", max_promotions_in_flight=1)
    assert bounded.tier_hits == (0, 2) and bounded.steps_waited == 2


def test_simulate_tiers_reports_each_tier_and_opt(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["simulate", "--workload", "multi-turn", "--requests", "300",
                   "--tiers", "cpu=64,fs=512", "--policy", "lru,arc", "--quiet",
                   "--format", "json"])
    assert status == 0
    rows = {row["label"].split(" (")[0]: row for row in json.loads(capsys.readouterr().out)}
    assert set(rows) == {
        "lru tiered", "lru, cpu tier alone", "arc tiered", "arc, cpu tier alone",
        "opt, cpu tier alone", "opt at the total",
    }
    bound = rows["opt at the total"]
    assert bound["capacities"] == [576]
    for name in ("lru tiered", "arc tiered"):
        row = rows[name]
        assert sum(row["tier_hits"]) == row["hit_blocks"]
        assert row["hit_blocks"] <= bound["hit_blocks"]
        assert row["tier_hits"][1] > 0
    assert rows["lru, cpu tier alone"]["hit_blocks"] <= rows["opt, cpu tier alone"]["hit_blocks"]


def test_simulate_tiers_table_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--workload", "scan", "--requests", "100",
                 "--tiers", "cpu=32,fs=128", "--policy", "lru", "--cascade",
                 "write-back", "--max-promotions", "4", "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:5] == ["row", "capacity", "hit", "ratio", "cpu"]
    assert lines[2].startswith("lru tiered (write-back, ≤4 promoting)")
    assert main(["simulate", "--workload", "scan", "--requests", "10",
                 "--tiers", "cpu=32,fs=128", "--capacity", "5", "--quiet"]) == 2
    assert "drop --capacity" in capsys.readouterr().err
    assert main(["simulate", "--workload", "scan", "--requests", "10",
                 "--tiers", "fs=32", "--quiet"]) == 2
