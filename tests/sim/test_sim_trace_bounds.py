"""Trace files are bounded and malformed ones are refused in one line
(issue "hard edges", item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvoffload.workloads import (
    MAX_REQUEST_BLOCKS,
    TraceFormatError,
    load_trace,
)
from tests.test_boundaries import run_cli


def write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"id":"a","segments":[["s",300000000]]}\n', "at most"),
        (b'{"keys":["aa"]}\n\xff\xfe{"id":1}\n', "not UTF-8"),
        (b"[" * 200_000 + b"]" * 200_000 + b"\n", "nested too deeply"),
        (b'{"keys":[5]}\n{"keys":["#5"]}\n', "not a hex string"),
        (b'{"segments":[["a",600000],["b",600000]]}\n', "at most"),
    ],
    ids=["huge-segment", "not-utf8", "deep", "hash-key", "long-request"],
)
def test_a_malformed_or_oversized_trace_is_refused(
    tmp_path: Path, data: bytes, message: str
) -> None:
    path = write(tmp_path, data)
    with pytest.raises(TraceFormatError, match=message):
        load_trace(path)
    status, err = run_cli(["simulate", "--workload", str(path), "--capacity", "4"])
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, err


def test_integer_and_hex_keys_stay_apart(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, b'{"keys":[5]}\n{"keys":["05"]}\n'))
    assert trace.chains[0] != trace.chains[1]


def test_a_request_at_the_bound_is_accepted(tmp_path: Path) -> None:
    data = f'{{"segments":[["s",{MAX_REQUEST_BLOCKS}]]}}\n'.encode()
    assert load_trace(write(tmp_path, data)).num_block_refs == MAX_REQUEST_BLOCKS
