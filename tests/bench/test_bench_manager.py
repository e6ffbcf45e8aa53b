"""``bench manager``: correctness of the harness only, never timings."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvoffload.__main__ import main
from kvoffload.bench.manager import (
    KvoffloadDriver,
    ThroughputResult,
    bulk_eviction,
    contenders,
    eviction_cost_ns,
    key_check_cost,
    pin_then_evict,
    replay_throughput,
)
from kvoffload.spec.keys import make_offload_key
from kvoffload.vllm_release import NoReleaseError, load_release, unload_release
from kvoffload.workloads import RequestRecord, compile_trace, generate_trace

FAKE_VLLM_ABSTRACT = textwrap.dedent(
    '''
    """Stand-in with vLLM 0.19's contract types (block-hash lists, no context)."""
    from dataclasses import dataclass


    @dataclass
    class PrepareStoreOutput:
        block_hashes_to_store: list
        store_spec: object
        block_hashes_evicted: list


    @dataclass
    class OffloadingEvent:
        block_hashes: list
        block_size: int
        medium: str
        removed: bool


    class OffloadingManager:
        def touch(self, block_hashes):
            raise NotImplementedError

        def complete_load(self, block_hashes):
            raise NotImplementedError
    '''
)

FAKE_VLLM_MANAGER = textwrap.dedent(
    '''
    """Stand-in with vLLM 0.19's manager API, over kvoffload's manager."""
    from vllm.v1.core.kv_cache_utils import BlockHash
    from vllm.v1.kv_offload.abstract import OffloadingManager, PrepareStoreOutput

    from kvoffload.impl.manager import CPUOffloadingManager as _Ours
    from kvoffload.spec.contract import ReqContext

    _CTX = ReqContext("fake")


    class CPUOffloadingManager(OffloadingManager):
        def __init__(self, block_size, num_blocks, cache_policy="lru", enable_events=False):
            self._m = _Ours(block_size, num_blocks, cache_policy, enable_events)

        def lookup(self, block_hashes):
            return self._m.lookup_prefix(list(block_hashes), _CTX)

        def prepare_load(self, block_hashes):
            return self._m.prepare_load(list(block_hashes), _CTX)

        def complete_load(self, block_hashes):
            self._m.complete_load(list(block_hashes), _CTX)

        def touch(self, block_hashes):
            self._m.touch(list(block_hashes), _CTX)

        def prepare_store(self, block_hashes):
            out = self._m.prepare_store(list(block_hashes), _CTX)
            if out is None:
                return None
            return PrepareStoreOutput(
                list(out.keys_to_store), out.store_spec, list(out.evicted_keys)
            )

        def complete_store(self, block_hashes, success=True):
            self._m.complete_store(list(block_hashes), _CTX, success)

        def take_events(self):
            yield from self._m.take_events()
    '''
)


@pytest.fixture(autouse=True)
def forget_vllm_modules() -> Iterator[None]:
    """Loading a release registers vllm.* modules; drop them after each test."""
    yield
    unload_release()


@pytest.fixture
def fake_vllm(tmp_path: Path) -> Iterator[Path]:
    package = tmp_path / "vllm" / "v1" / "kv_offload"
    (package / "cpu" / "policies").mkdir(parents=True)
    for init in (package, package / "cpu", package / "cpu" / "policies"):
        (init / "__init__.py").write_text("")
    (package / "abstract.py").write_text(FAKE_VLLM_ABSTRACT)
    (package / "cpu" / "manager.py").write_text(FAKE_VLLM_MANAGER)
    (package / "cpu" / "policies" / "lru.py").write_text("class LRUCachePolicy:\n    pass\n")
    info = tmp_path / "vllm-9.9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Name: vllm\nVersion: 9.9.9\n")
    yield tmp_path


def test_block_operations_are_counted_per_key() -> None:
    trace = compile_trace(
        [
            RequestRecord("r0", segments=(("a", 3),)),
            RequestRecord("r1", segments=(("a", 2), ("b", 1))),
        ]
    )
    result = replay_throughput(KvoffloadDriver(8, "lru"), trace.key_chains(), trace.req_ids)
    # r0: lookup 3 + touch 3 + store 3 + complete_store 3 = 12
    # r1: lookup 3 + touch 3 + load 2 + complete_load 2 + store 1 + complete 1 = 12
    assert result.block_ops == 24
    assert result.hit_blocks == 2
    assert result.events == 2  # two "stored" events


def test_a_replay_is_timed_by_both_clocks() -> None:
    trace = generate_trace("multi-turn", 100)
    result = replay_throughput(KvoffloadDriver(64, "arc"), trace.key_chains(), trace.req_ids)
    assert 0 < result.cpu_seconds and 0 < result.seconds
    assert result.timed("cpu") == result.cpu_seconds
    assert result.timed("wall") == result.seconds
    # the rate follows the clock asked for
    made = ThroughputResult(100, 10, 0, 0, 0, seconds=2.0, cpu_seconds=0.5)
    assert (made.rate("cpu"), made.rate("wall")) == (200.0, 50.0)


def test_throughput_ranks_rounds_by_the_clock_asked_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["bench", "manager", "--requests", "50", "--rounds", "2", "--policy", "lru",
            "--skip-eviction"]
    assert main([*args, "--clock", "wall"]) == 0
    assert "best of 2 rounds by wall-clock time" in capsys.readouterr().out
    assert main(args) == 0
    assert "best of 2 rounds by thread CPU time" in capsys.readouterr().out


def test_two_equal_managers_give_identical_hits() -> None:
    trace = generate_trace("multi-turn", 300)
    chains = trace.key_chains()
    for policy in ("lru", "arc"):
        first = replay_throughput(KvoffloadDriver(256, policy), chains, trace.req_ids)
        second = replay_throughput(KvoffloadDriver(256, policy), chains, trace.req_ids)
        assert (first.hit_blocks, first.blocks_evicted) == (
            second.hit_blocks, second.blocks_evicted,
        )
        assert first.blocks_evicted > 0


def test_eviction_scenario_evicts_exactly_one_block_per_store() -> None:
    for policy in ("lru", "arc"):
        assert eviction_cost_ns(KvoffloadDriver, policy, pinned=50, unpinned=4, repeats=5) > 0


def test_vllm_tree_is_loaded_behind_shims(fake_vllm: Path) -> None:
    release = load_release(fake_vllm)
    assert release.version == "9.9.9" and release.features.block_hash_api
    runners = contenders(fake_vllm)
    assert [r.label for r in runners] == ["kvoffload", "vllm-9.9.9"]
    trace = generate_trace("multi-turn", 200)
    chains = trace.key_chains()
    ours = replay_throughput(runners[0].make_driver(128, "lru"), chains, trace.req_ids)
    theirs = replay_throughput(runners[1].make_driver(128, "lru"), chains, trace.req_ids)
    assert (ours.hit_blocks, ours.block_ops) == (theirs.hit_blocks, theirs.block_ops)
    assert eviction_cost_ns(runners[1].make_driver, "lru", 20, 4, 3) > 0


def test_missing_vllm_tree_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(NoReleaseError, match="no vllm/v1/kv_offload"):
        load_release(tmp_path)
    assert main(["bench", "manager", "--vllm-path", str(tmp_path)]) == 2
    assert "fetch_vllm.py" in capsys.readouterr().err


def test_bench_manager_command_runs_side_by_side(
    fake_vllm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        ["bench", "manager", "--requests", "60", "--capacity", "64", "--rounds", "1",
         "--pinned", "10,20", "--unpinned", "4", "--repeats", "3",
         "--vllm-path", str(fake_vllm)]
    )
    out = capsys.readouterr().out
    assert status == 0
    assert "lru    speedup" in out and "hit ratios identical" in out
    assert "arc    speedup" in out
    assert out.count("vllm-9.9.9") >= 3
    assert "kvoffload build: " in out and "key checks" in out


def test_worst_cases_evict_what_they_say(capsys: pytest.CaptureFixture[str]) -> None:
    for policy in ("lru", "arc"):
        case = pin_then_evict(KvoffloadDriver, policy, pinned=300, unpinned=5)
        assert case.pinned == 300 and case.pin_seconds > 0
        bulk = bulk_eviction(KvoffloadDriver, policy, 500)
        assert bulk.blocks == 500 and bulk.evict_seconds > 0
    check = key_check_cost([[make_offload_key(b"k", 0)] * 3, []])
    assert (check.keys, check.calls) == (3, 2)
    status = main(["bench", "manager", "--skip-throughput", "--skip-eviction",
                   "--worst-case", "--pin", "200", "--bulk", "300", "--policy", "arc"])
    out = capsys.readouterr().out
    assert status == 0
    assert "first eviction after a big pin" in out and "bulk eviction" in out
    assert "throughput" not in out


@pytest.mark.skipif(
    not os.environ.get("KVOFFLOAD_VLLM_PATH"),
    reason="set KVOFFLOAD_VLLM_PATH to an unpacked vllm/v1/kv_offload tree",
)
def test_lru_hit_ratios_match_real_vllm() -> None:
    # A release before 0.33 keeps the 0.21 contract, which kvoffload's own
    # face speaks; 0.33 commits recency per request, as its face does.
    runners = contenders(Path(os.environ["KVOFFLOAD_VLLM_PATH"]))
    ours_runner = runners[2] if len(runners) > 2 else runners[0]
    trace = generate_trace("multi-turn", 1000)
    chains = trace.key_chains()
    ours = replay_throughput(ours_runner.make_driver(2048, "lru"), chains, trace.req_ids)
    theirs = replay_throughput(runners[1].make_driver(2048, "lru"), chains, trace.req_ids)
    assert (ours.hit_blocks, ours.blocks_evicted) == (theirs.hit_blocks, theirs.blocks_evicted)
