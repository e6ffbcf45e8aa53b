"""``bench tier``: the harness on tiny cases, never its timings."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar, cast

import pytest

from kvoffload.__main__ import main
from kvoffload.bench.sizes import format_size, parse_size
from kvoffload.bench.tier import MEASURED, OPERATIONS
from kvoffload.impl import fs_tier
from kvoffload.impl.fs_tier import COMPILED_IO
from kvoffload.spec.tier_contract import TierJob, TierJobResult

ENV = "KVOFFLOAD_VLLM_DIRS"
T = TypeVar("T")


def test_sizes_parse_and_print() -> None:
    assert parse_size("256K") == 256 << 10
    assert parse_size("4MiB") == 4 << 20
    assert parse_size("1000") == 1000
    assert format_size(256 << 10) == "256 KiB"


def test_bench_tier_runs_and_checks_its_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "figures.json"
    status = main([
        "bench", "tier", "--sizes", "16K", "--total", "64K", "--repeats", "1",
        "--job-chunks", "3", "--dir", str(tmp_path / "work"), "--json", str(out),
    ])
    assert status == 0
    table = capsys.readouterr().out
    for operation in OPERATIONS:
        assert (f"| 16 KiB | {operation} |" in table) is (operation in MEASURED)
    assert ("Python I/O |" in table) is COMPILED_IO  # beside the C I/O where it is built
    assert ("I/O in C (_chunkio)" in table) is COMPILED_IO
    threads = fs_tier.default_num_threads(fs_tier.file_system_type(tmp_path / "work"))
    assert f"kvoffload: {threads} threads (the tier's default here)" in table
    figures = json.loads(out.read_text())["figures"]
    assert len(figures) == len(MEASURED)
    assert all(fig["tier_gbps"] > 0 and fig["ceiling_gbps"] > 0 for fig in figures)
    assert all(fig["vllm_gbps"] is None for fig in figures)
    assert list((tmp_path / "work").iterdir()) == [], "the bench leaves nothing behind"


def _seen_by_measure(monkeypatch: pytest.MonkeyPatch, probe: Callable[[], T]) -> list[T]:
    """What ``probe`` returns when the bench calls ``measure``, call by
    call (the bench's state while it measures)."""
    import kvoffload.bench.tier as bench_tier

    seen: list[T] = []
    measure = bench_tier.measure

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(probe())
        return measure(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(bench_tier, "measure", spy)
    return seen


@pytest.mark.parametrize("frozen", [True, False])
def test_bench_tier_freezes_the_startup_heap_for_its_run_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    frozen: bool,
) -> None:
    """By default the heap alive at start-up is kept out of the garbage
    collector while the bench runs (as vLLM's engine keeps it), and given
    back after: a full collection over it landed in a submit (87-95 ms)."""
    seen = _seen_by_measure(monkeypatch, gc.get_freeze_count)
    before = gc.get_freeze_count()
    argv = ["bench", "tier", "--sizes", "16K", "--total", "32K", "--repeats", "1",
            "--dir", str(tmp_path / "work")]
    assert main(argv if frozen else [*argv, "--no-gc-freeze"]) == 0
    out = capsys.readouterr().out
    assert ("start-up heap frozen" in out) is frozen
    assert ("start-up heap not frozen" in out) is not frozen
    assert (seen[0] > before) is frozen
    assert gc.get_freeze_count() == before


def test_bench_tier_no_gc_turns_the_collector_off_for_its_run_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _seen_by_measure(monkeypatch, gc.isenabled)
    assert gc.isenabled()
    assert main(["bench", "tier", "--sizes", "16K", "--total", "32K", "--repeats", "1",
                 "--dir", str(tmp_path / "work"), "--no-gc"]) == 0
    assert "garbage collector off (--no-gc)" in capsys.readouterr().out
    assert seen == [False] and gc.isenabled()


def test_bench_tier_refuses_bad_sizes(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "tier", "--total", "0", "--dir", str(tmp_path)])


def test_bench_tier_runs_the_crc32_it_is_asked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--crc32`` reaches the tier (the conditions line names it) and one
    that is not there is refused before anything runs."""
    import kvoffload.bench.tier as bench_tier

    seen: list[str] = []
    real = fs_tier.FileSystemTier

    def spy(*args: Any, **kwargs: Any) -> Any:
        tier = real(*args, **kwargs)
        seen.append(tier.crc32_source)
        return tier

    monkeypatch.setattr(bench_tier, "FileSystemTier", spy)
    argv = ["bench", "tier", "--sizes", "16K", "--total", "32K", "--repeats", "1",
            "--dir", str(tmp_path / "work"), "--checksum", "on"]
    assert main([*argv, "--crc32", "zlib"]) == 0
    assert "CRC-32 (zlib) recorded" in capsys.readouterr().out
    assert seen and set(seen) == {"zlib"}
    monkeypatch.setattr("kvoffload.impl.fs_tier._FAST_CRC32", None)
    monkeypatch.setattr("kvoffload.impl.fs_tier._CLMUL_CRC32", None)
    assert main([*argv, "--crc32", "libdeflate"]) == 2
    assert "not available here (available: zlib)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("choice", "in_memory", "recorded"),
    [("auto", False, True), ("auto", True, False), ("on", True, True), ("off", False, False)],
)
def test_bench_tier_runs_the_checksum_it_is_asked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    choice: str, in_memory: bool, recorded: bool,
) -> None:
    """``--checksum`` is the tier's option ("auto": none on tmpfs); the
    conditions line says what the tier did, and on which file system."""
    kind = "tmpfs" if in_memory else "ext4"
    monkeypatch.setattr(fs_tier, "file_system_type", lambda path: kind)
    assert main(["bench", "tier", "--sizes", "16K", "--total", "32K", "--repeats", "1",
                 "--dir", str(tmp_path / "work"), "--checksum", choice]) == 0
    out = capsys.readouterr().out
    assert ("recorded, checked" in out) is recorded
    assert (", no checksum" in out) is not recorded
    assert f"(checksum={choice!r}; file system: {kind})" in out


def test_bench_tier_lets_the_tiers_take_turns_at_going_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With vLLM's tier beside it, kvoffload's runs first in even repeats
    and second in odd ones, and each side's figures are its own times,
    the calls over the submit bound counted on each side."""
    import kvoffload.bench.tier as bench_tier

    order: list[str] = []
    setup = bench_tier.TierSetup(False, False, 2, None)
    ours_seconds = iter([1.0, 3.0, 5.0])
    theirs_seconds = iter([2.0, 4.0, 6.0])

    def ours(*args: object, **kwargs: object) -> object:
        order.append("ours")
        value = next(ours_seconds)
        calls = [(1e-5, 1e-5), (1e-5, 1e-5), (7e-5, 1e-5)]  # one call in three over 50 µs
        return dict.fromkeys(MEASURED, value), {op: calls for op in MEASURED}, setup

    def theirs(*args: object, **kwargs: object) -> object:
        order.append("vllm")
        value = next(theirs_seconds)
        calls = [(2e-5, 2e-5), (2e-5, 2e-5), (4e-5, 2e-5)]  # none over 50 µs
        return dict.fromkeys(MEASURED, value), {op: calls for op in MEASURED}, True

    monkeypatch.setattr(bench_tier, "_kvoffload", ours)
    monkeypatch.setattr(bench_tier, "_vllm", theirs)
    monkeypatch.setattr(
        bench_tier, "_ceiling", lambda primary, directory: dict.fromkeys(MEASURED, 1.0)
    )
    run = bench_tier.measure(
        [4096], total_bytes=16 * 4096, directory=tmp_path, repeats=3,
        vllm=cast(bench_tier.VllmFsTier, object()),
    )
    assert order == ["ours", "vllm", "vllm", "ours", "ours", "vllm"]
    store = next(f for f in run.figures if f.operation == bench_tier.STORE)
    moved = 16 * 4096
    assert store.tier_gbps == pytest.approx(moved / 3.0 / 1e9)  # the median of 1, 3, 5 s
    assert store.vllm_gbps == pytest.approx(moved / 4.0 / 1e9)  # of 2, 4, 6 s
    assert store.submit_us_median == pytest.approx(10.0)
    assert store.vllm_submit_us_median == pytest.approx(20.0)
    assert (store.submit_calls, store.submit_over_bound, store.vllm_submit_over_bound) == (9, 3, 0)
    row = next(
        line for line in bench_tier.render(run.figures, "").splitlines()
        if f"| {bench_tier.STORE} |" in line
    )
    assert "| 10.0 / 70 | 3 of 9 |" in row and "| 20.0 / 40 | 0 of 9 |" in row
    # each run's pair in run order, whichever tier went first in it
    assert store.tier_gbps_runs == pytest.approx([moved / s / 1e9 for s in (1.0, 3.0, 5.0)])
    assert store.vllm_gbps_runs == pytest.approx([moved / s / 1e9 for s in (2.0, 4.0, 6.0)])
    pair = store.paired
    assert pair is not None and pair.pairs == 3 and pair.below_one == 0
    # ratios 2, 4/3, 6/5: their geometric mean, an interval around it
    assert pair.geometric_mean == pytest.approx((2 * 4 / 3 * 6 / 5) ** (1 / 3))
    assert pair.low < pair.geometric_mean < pair.high
    assert f"| {pair.describe()} |" in row


def test_a_row_vllms_tier_does_not_run_has_no_paired_ratio() -> None:
    """Regression: beside vLLM's tier, the rows only kvoffload's tier runs
    (page cache, fsync, full tier) have runs on one side only; the first
    version divided them as pairs and the bench stopped with ValueError."""
    import kvoffload.bench.tier as bench_tier

    common = dict(chunk_bytes=4096, num_chunks=16, ceiling_gbps=1.0, tier_gbps=1.0,
                  submit_us_median=1.0, submit_us_max=1.0, vllm_submit_us_median=None,
                  submit_cpu_us_median=1.0, submit_cpu_us_max=1.0, submit_calls=2,
                  submit_over_bound=0)
    alone = bench_tier.TierFigure(operation=bench_tier.LOAD_CACHED, vllm_gbps=None,
                                  tier_gbps_runs=(1.0, 1.1), **common)  # type: ignore[arg-type]
    both = bench_tier.TierFigure(operation=bench_tier.LOAD, vllm_gbps=1.0,
                                 tier_gbps_runs=(1.0, 1.1), vllm_gbps_runs=(1.0, 1.0),
                                 **common)  # type: ignore[arg-type]
    assert alone.paired is None and both.paired is not None
    table = bench_tier.render([both, alone], "")
    assert f"| {bench_tier.LOAD_CACHED} |" in table and "| — | — | — |" in table


def test_paired_ratio_is_the_geometric_mean_of_the_pairs_with_a_t_interval() -> None:
    import math

    from kvoffload.bench.tier import paired_ratio

    same = paired_ratio([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])  # every pair twice as fast
    assert same is not None
    assert (same.geometric_mean, same.low, same.high) == pytest.approx((2.0, 2.0, 2.0))
    assert same.verdict == "faster" and same.below_one == 0
    slower = paired_ratio([1.0, 2.0], [2.0, 4.0])
    assert slower is not None and slower.verdict == "slower" and slower.below_one == 2
    # ratios e^0.1 and e^-0.1: mean 1, half-width t(1) * 0.1414 / sqrt(2)
    spread = paired_ratio([math.exp(0.1), math.exp(-0.1)], [1.0, 1.0])
    assert spread is not None and spread.verdict == "parity" and spread.below_one == 1
    assert spread.geometric_mean == pytest.approx(1.0)
    assert spread.low == pytest.approx(math.exp(-12.706 * 0.1))
    assert spread.high == pytest.approx(math.exp(12.706 * 0.1))
    assert paired_ratio([1.0], [2.0]) is None  # one pair has no spread
    with pytest.raises(ValueError, match="not pairs"):
        paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="not positive"):
        paired_ratio([1.0, 0.0], [1.0, 1.0])


def test_t975_follows_the_table_and_then_the_expansion() -> None:
    from kvoffload.bench.tier import t975

    assert t975(1) == 12.706 and t975(30) == 2.042
    # exact values: 2.0395 (31), 2.0003 (60), 1.9799 (120), 1.9600 (infinity)
    for degrees, exact in ((31, 2.0395), (60, 2.0003), (120, 1.9799), (10**6, 1.9600)):
        assert t975(degrees) == pytest.approx(exact, abs=1e-3)
    with pytest.raises(ValueError):
        t975(0)


def test_bench_tier_compared_only_measures_the_pairs_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "figures.json"
    assert main(["bench", "tier", "--sizes", "16K", "--total", "64K", "--repeats", "2",
                 "--dir", str(tmp_path / "work"), "--compared-only", "--json", str(out)]) == 0
    assert "store and load only (--compared-only)" in capsys.readouterr().out
    figures = json.loads(out.read_text())["figures"]
    assert [fig["operation"] for fig in figures] == ["store", "load"]
    assert all(len(fig["tier_gbps_runs"]) == 2 for fig in figures)
    assert all(fig["vllm_gbps_runs"] == [] for fig in figures)  # no vLLM tier given


def test_evict_between_runs_before_each_timed_submit_outside_its_timing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import kvoffload.bench.tier as bench_tier

    calls: list[str] = []
    clock = iter(range(100))
    # the bench module's clock ticks once per read
    fake_time = SimpleNamespace(perf_counter=lambda: float(next(clock)), thread_time=time.thread_time)
    monkeypatch.setattr(bench_tier, "time", fake_time)
    elapsed, submits = bench_tier._run_jobs(
        lambda job: calls.append(f"submit {job.job_id}"),
        lambda: calls.append("drain"),
        lambda: [TierJobResult(1, True), TierJobResult(2, True)],
        [TierJob(1, (), (), False), TierJob(2, (), (), False)],
        between=lambda: calls.append("between"),
    )
    assert calls == ["between", "submit 1", "between", "submit 2", "drain"]
    # each submit timed alone: one tick of the fake clock between its two reads
    assert [wall for wall, _ in submits] == [1.0, 1.0]


def test_bench_tier_evict_between_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "tier", "--sizes", "16K", "--total", "32K", "--repeats", "1",
                 "--dir", str(tmp_path / "work"), "--evict-between", "64K"]) == 0
    assert "64 KiB written before each submit, untimed" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--evict-between"):
        main(["bench", "tier", "--sizes", "16K", "--evict-between", "lots"])


def _release_033() -> Path | None:
    for entry in filter(None, os.environ.get(ENV, "").split(os.pathsep)):
        for candidate in (Path(entry), Path(entry) / "0.33.0"):
            if (candidate / "vllm" / "v1" / "kv_offload" / "tiering" / "fs").is_dir():
                return candidate
    return None


RELEASE = _release_033()


@pytest.mark.skipif(RELEASE is None, reason=f"set {ENV} to a directory holding vLLM 0.33")
@pytest.mark.parametrize("python_io", [False, True])
def test_bench_tier_beside_vllms_fs_tier(tmp_path: Path, python_io: bool) -> None:
    """vLLM's tier runs with the C I/O its wheel ships (``vllm.fs_io_C``,
    extracted by scripts/fetch_vllm.py) unless ``--vllm-python-io``."""
    assert RELEASE is not None
    out = tmp_path / "figures.json"
    # a subprocess: a release is loaded once per process
    done = subprocess.run(
        [
            sys.executable, "-m", "kvoffload", "bench", "tier", "--sizes", "64K",
            "--total", "256K", "--repeats", "1", "--dir", str(tmp_path / "work"),
            "--vllm-path", str(RELEASE), "--vllm-threads", "2", "--json", str(out),
            *(["--vllm-python-io"] if python_io else []),
        ],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    assert "vLLM 0.33" in done.stdout
    assert "the two tiers first in turn" in done.stdout
    shipped = any((RELEASE / "vllm").glob("fs_io_C*.so"))
    assert ("C I/O (vllm.fs_io_C" in done.stdout) is (shipped and not python_io), done.stdout
    figures = {fig["operation"]: fig for fig in json.loads(out.read_text())["figures"]}
    assert figures["store"]["vllm_gbps"] > 0 and figures["load"]["vllm_gbps"] > 0


SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pooled_ratio.py"


def _document(file_system: str, ours: list[float], theirs: list[float]) -> dict[str, Any]:
    figure = {"chunk_bytes": 262144, "operation": "load", "tier_gbps_runs": ours,
              "vllm_gbps_runs": theirs}
    return {"conditions": f"x (checksum='auto'; file system: {file_system}); y",
            "figures": [figure]}


def test_pool_runs_pools_the_pairs_of_several_runs_per_row() -> None:
    """Two runs' pairs on one file system make one row; another file
    system is another row; a document from before the pairs were kept is
    named and skipped."""
    from kvoffload.bench.tier import pool_runs, render_pooled

    rows, skipped = pool_runs([
        ("a", _document("ext4", [2.0, 2.2], [1.0, 1.0])),
        ("b", _document("ext4", [2.1], [1.0])),
        ("c", _document("tmpfs", [1.0, 1.1], [1.05, 1.0])),
        ("old", {"conditions": "", "figures": [{"chunk_bytes": 1, "operation": "load"}]}),
    ])
    assert skipped == ["old"]
    assert rows[("ext4", 262144, "load")] == ([2.0, 2.2, 2.1], [1.0, 1.0, 1.0], {"a", "b"})
    lines = {line.split(" | ")[0]: line for line in render_pooled(rows).splitlines()}
    # ext4: three pairs from two files, all faster than vLLM's
    assert lines["| ext4"].startswith("| ext4 | 256 KiB | load | 2 | 3 |")
    assert lines["| ext4"].endswith("| 0 | faster |")
    assert lines["| tmpfs"].endswith("| 1 | parity |")
    lone, _ = pool_runs([("b", _document("ext4", [2.1], [1.0]))])
    assert render_pooled(lone).endswith("| 1 | — | — | one pair: no interval |")


def _pooled(files: list[Path]) -> subprocess.CompletedProcess[str]:
    if not SCRIPT.is_file():
        pytest.skip("no source tree (tests run against an installed package)")
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, files)], capture_output=True, text=True,
        timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def test_pooled_ratio_script_reads_files_and_says_when_none_has_pairs(tmp_path: Path) -> None:
    paired, old, broken = tmp_path / "a.json", tmp_path / "old.json", tmp_path / "bad.json"
    paired.write_text(json.dumps(_document("ext4", [2.0, 2.2], [1.0, 1.0])))
    old.write_text(json.dumps({"conditions": "", "figures": []}))
    broken.write_text("{")
    done = _pooled([paired, old])
    assert done.returncode == 0, done.stderr
    assert "| ext4 | 256 KiB | load | 1 | 2 |" in done.stdout
    assert "old.json: no run-by-run pairs" in done.stderr
    assert _pooled([old]).returncode == 1
    assert _pooled([broken]).returncode == 2


@pytest.mark.skipif(RELEASE is None, reason=f"set {ENV} to a directory holding vLLM 0.33")
def test_bench_tier_pairs_runs_with_vllms_tier(tmp_path: Path) -> None:
    """``--compared-only`` beside vLLM's tier: every run of each tier is
    kept, pair by pair, and the table gives the run-by-run ratio."""
    assert RELEASE is not None
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [
            sys.executable, "-m", "kvoffload", "bench", "tier", "--sizes", "64K",
            "--total", "256K", "--repeats", "2", "--compared-only", "--dir",
            str(tmp_path / "work"), "--vllm-path", str(RELEASE), "--vllm-threads", "2",
            "--json", str(out),
        ],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    assert "run by run: geometric mean (95 % interval)" in done.stdout
    figures = json.loads(out.read_text())["figures"]
    assert [fig["operation"] for fig in figures] == ["store", "load"]
    for fig in figures:
        assert len(fig["tier_gbps_runs"]) == len(fig["vllm_gbps_runs"]) == 2
        assert min(fig["tier_gbps_runs"] + fig["vllm_gbps_runs"]) > 0
    from kvoffload.bench.tier import pool_runs, render_pooled

    rows, _ = pool_runs([("run", json.loads(out.read_text()))])
    assert "| 64 KiB | load | 1 | 2 |" in render_pooled(rows)
