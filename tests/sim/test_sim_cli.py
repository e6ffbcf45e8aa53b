"""``python -m kvoffload simulate``."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import pytest

from kvoffload.__main__ import main
from kvoffload.sim.progress import ProgressBar


def test_simulate_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        ["simulate", "--workload", "scan", "--requests", "120", "--capacity",
         "64,128", "--policy", "lru,arc+reuse,opt", "--quiet"]
    )
    out = capsys.readouterr().out
    assert status == 0
    assert out.startswith("workload scan (seed 0): 120 requests")
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [(row[0], row[1]) for row in rows] == [
        ("lru", "64"), ("lru", "128"), ("arc+reuse2", "64"), ("arc+reuse2", "128"),
        ("opt", "64"), ("opt", "128"),
    ]


def test_simulate_json_and_percent_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        ["simulate", "--workload", "one-off", "--requests", "100", "--capacity",
         "10%", "--policy", "lru,opt", "--reuse-threshold", "3", "--format", "json"]
    )
    assert status == 0
    rows = json.loads(capsys.readouterr().out)
    assert [row["policy"] for row in rows] == ["lru+reuse3", "opt"]
    assert rows[1]["hit_blocks"] >= rows[0]["hit_blocks"]
    assert rows[0]["block_refs"] == rows[1]["block_refs"]


def test_export_then_replay_a_trace_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mt.jsonl"
    assert main(["simulate", "--workload", "multi-turn", "--requests", "80",
                 "--export-trace", str(path)]) == 0
    capsys.readouterr()
    assert main(["simulate", "--workload", "multi-turn", "--requests", "80",
                 "--capacity", "100", "--format", "csv", "--policy", "arc"]) == 0
    generated = capsys.readouterr().out.splitlines()[1].split(",")
    assert main(["simulate", "--workload", str(path), "--capacity", "100",
                 "--format", "csv", "--policy", "arc"]) == 0
    replayed = capsys.readouterr().out.splitlines()[1].split(",")
    assert generated[:9] == replayed[:9]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--workload", "nowhere", "--capacity", "8"], "neither a built-in"),
        (["--workload", "scan"], "--capacity is required"),
        (["--workload", "scan", "--capacity", "8", "--policy", "fifo"], "unknown policy"),
    ],
)
def test_bad_input_is_a_clear_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("capacity", ["0", "x", "-5%", ""])
def test_bad_capacity_is_an_argparse_error(capacity: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(["simulate", "--workload", "scan", "--capacity", capacity])
    assert info.value.code == 2


def test_plot_without_matplotlib_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    real_find_spec = importlib.util.find_spec

    def no_matplotlib(name: str, package: str | None = None) -> object:
        return None if name == "matplotlib" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", no_matplotlib)
    status = main(["simulate", "--workload", "scan", "--requests", "10",
                   "--capacity", "8", "--plot", str(tmp_path / "p.png")])
    assert status == 2
    assert "pip install 'kvoffload[plot]'" in capsys.readouterr().err


def test_plot_draws_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "p.png"
    status = main(["simulate", "--workload", "scan", "--requests", "40", "--quiet",
                   "--capacity", "16,32", "--plot", str(path)])
    assert status == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_bar_draws_only_when_enabled() -> None:
    stream = io.StringIO()
    bar = ProgressBar(10, "x", stream=stream)  # StringIO is not a terminal
    bar.update(10)
    bar.close()
    assert stream.getvalue() == ""
    bar = ProgressBar(10, "run", stream=stream, enabled=True, interval=0.0)
    bar.update(5)
    assert "50.0%" in stream.getvalue()
    bar.close()
    assert stream.getvalue().endswith("\r")
