"""``bench transfer`` runs end to end on a tiny configuration (timings are
printed, never asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from kvoffload.__main__ import main
from kvoffload.bench.sizes import parse_size
from kvoffload.bench.transfer import measure, render


def test_parse_size() -> None:
    assert [parse_size(text) for text in ("16K", "2M", "256KiB", "1G", "512")] == [
        16384, 2 << 20, 256 << 10, 1 << 30, 512
    ]


def test_measure_covers_every_case() -> None:
    description, figures = measure([4096, 32768], total_bytes=1 << 16, repeats=1, device="cpu")
    assert "CPU only" in description
    cases = {(f.block_bytes, f.layout, f.direction) for f in figures}
    assert len(cases) == len(figures) == 8
    assert all(f.handler_gbps > 0 and f.ceiling_gbps > 0 and f.naive_gbps > 0 for f in figures)
    table = render(description, figures)
    assert "| 4 KiB | scattered | GPU->CPU |" in table


def test_command_line_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "figures.json"
    status = main(["bench", "transfer", "--sizes", "4K", "--total", "64K",
                   "--repeats", "1", "--device", "cpu", "--json", str(out)])
    assert status == 0
    assert "% of ceiling" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert len(saved["figures"]) == 4
