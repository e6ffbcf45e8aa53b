"""The simulator replays through the production managers."""

from __future__ import annotations

import pytest

from kvoffload.impl.manager import CPUOffloadingManager
from kvoffload.impl.policies import ARCCachePolicy, LRUCachePolicy
from kvoffload.impl.reuse import FilterReusedOffloadingManager
from kvoffload.sim.replay import PolicySpec, make_manager, parse_policies, simulate
from kvoffload.spec.errors import ConfigurationError
from kvoffload.workloads import RequestRecord, compile_trace, generate_trace


def test_lru_and_arc_are_the_production_managers() -> None:
    lru = make_manager(PolicySpec("lru"), 8)
    arc = make_manager(PolicySpec("arc"), 8)
    assert type(lru) is CPUOffloadingManager
    assert type(arc) is CPUOffloadingManager
    assert isinstance(lru.policy, LRUCachePolicy)
    assert isinstance(arc.policy, ARCCachePolicy)
    filtered = make_manager(PolicySpec("arc", reuse_threshold=3), 8)
    assert type(filtered) is FilterReusedOffloadingManager
    assert filtered.store_threshold == 3
    assert type(filtered.backing) is CPUOffloadingManager


def test_counters_on_a_hand_made_trace() -> None:
    # capacity 4: r0 stores a0 a1 a2; r1 hits a0 a1 and stores b0 (4 blocks,
    # no eviction); r2 hits a0..a2 and stores a3, evicting b0.
    trace = compile_trace(
        [
            RequestRecord("r0", segments=(("a", 3),)),
            RequestRecord("r1", segments=(("a", 2), ("b", 1))),
            RequestRecord("r2", segments=(("a", 4),)),
        ]
    )
    result = simulate(trace, PolicySpec("lru"), 4)
    assert result.block_refs == 3 + 3 + 4
    assert result.hit_blocks == 0 + 2 + 3
    assert result.blocks_loaded == result.hit_blocks
    assert result.blocks_stored == 3 + 1 + 1
    assert result.blocks_evicted == 1
    assert result.stores_refused == 0
    assert result.hit_ratio == pytest.approx(5 / 10)


def test_arc_beats_lru_on_the_scan_polluted_workload() -> None:
    trace = generate_trace("scan", 1500)
    lru = simulate(trace, PolicySpec("lru"), 1024)
    arc = simulate(trace, PolicySpec("arc"), 1024)
    assert arc.hit_ratio > 1.5 * lru.hit_ratio


def test_reuse_filter_helps_on_the_one_off_heavy_workload() -> None:
    trace = generate_trace("one-off", 1500)
    for name in ("lru", "arc"):
        plain = simulate(trace, PolicySpec(name), 512)
        filtered = simulate(trace, PolicySpec(name, reuse_threshold=2), 512)
        assert filtered.hit_ratio > plain.hit_ratio
        assert filtered.blocks_stored < plain.blocks_stored


def test_parse_policies() -> None:
    assert [p.label for p in parse_policies("lru,arc,opt")] == ["lru", "arc", "opt"]
    assert [p.label for p in parse_policies("lru,arc,opt", reuse_threshold=3)] == [
        "lru+reuse3", "arc+reuse3", "opt",
    ]
    assert [p.label for p in parse_policies("lru,arc+reuse,opt")] == [
        "lru", "arc+reuse2", "opt",
    ]
    assert [p.label for p in parse_policies("lru,lru+reuse", reuse_threshold=4)] == [
        "lru", "lru+reuse4",
    ]
    for bad in ("", "fifo", "opt+reuse", "lru,lru", "lru+x"):
        with pytest.raises(ConfigurationError):
            parse_policies(bad)
    with pytest.raises(ConfigurationError):
        PolicySpec("lru", reuse_threshold=1)


def test_capacity_must_be_positive() -> None:
    trace = generate_trace("scan", 5)
    for spec in (PolicySpec("lru"), PolicySpec("opt")):
        with pytest.raises(ConfigurationError):
            simulate(trace, spec, 0)
