"""Trace format and seeded generators."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from kvoffload.spec.errors import ConfigurationError
from kvoffload.workloads import (
    WORKLOADS,
    RequestRecord,
    TraceFormatError,
    compile_trace,
    generate_records,
    generate_trace,
    load_trace,
    parse_trace_lines,
    write_trace,
)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_generators_are_deterministic_per_seed(name: str) -> None:
    first = list(generate_records(name, 200, seed=7))
    again = list(generate_records(name, 200, seed=7))
    other = list(generate_records(name, 200, seed=8))
    assert first == again
    assert first != other
    assert len(first) == 200


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_write_then_load_gives_the_same_trace(name: str, tmp_path: Path) -> None:
    records = list(generate_records(name, 150, seed=1))
    path = tmp_path / "trace.jsonl"
    with path.open("w") as stream:
        assert write_trace(records, stream, {"workload": name}) == 150
    loaded = load_trace(path)
    direct = compile_trace(records)
    assert loaded.chains == direct.chains
    assert loaded.block_keys == direct.block_keys
    assert loaded.req_ids == direct.req_ids


def test_multi_turn_chains_extend_the_previous_turn() -> None:
    records = list(generate_records("multi-turn", 400, seed=3))
    trace = compile_trace(records)
    last_chain: dict[str, tuple[int, ...]] = {}
    extended = 0
    for record, chain in zip(records, trace.chains):
        conversation = record.segments[1][0]
        previous = last_chain.get(conversation)
        if previous is not None:
            assert chain[: len(previous)] == previous
            assert len(chain) > len(previous)
            extended += 1
        last_chain[conversation] = chain
    assert extended > 100


def test_segments_share_blocks_only_under_the_same_prefix() -> None:
    trace = compile_trace(
        [
            RequestRecord("a", segments=(("sys", 2), ("conv", 2))),
            RequestRecord("b", segments=(("sys", 2), ("conv", 3))),
            RequestRecord("c", segments=(("other", 2), ("conv", 2))),
        ]
    )
    a, b, c = trace.chains
    assert b[:4] == a
    assert not set(c) & set(a)
    assert trace.num_blocks == 5 + 4
    assert trace.num_block_refs == 4 + 5 + 4


def test_explicit_keys_and_integer_ids() -> None:
    lines = [
        '{"kvoffload_trace": 1}',
        "# a comment",
        '{"id": "x", "keys": ["aa01", "bb02"]}',
        '{"keys": ["AA01", "bb02", "cc03"]}',
        '{"id": 3, "keys": [1, 2]}',
    ]
    trace = compile_trace(parse_trace_lines(lines))
    assert trace.chains == ((0, 1), (0, 1, 2), (3, 4))
    assert trace.req_ids == ("x", "line-4", "3")
    assert trace.block_keys[0] == bytes.fromhex("aa01") + b"\0\0\0\0"


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        ('{"keys": []}', "no blocks"),
        ('{"keys": ["zz"]}', "not a hex"),
        ('{"keys": [true]}', "hex string or an integer"),
        ('{"segments": [["a", 0]]}', "at least 1"),
        ('{"segments": [["a"]]}', "stream name, block count"),
        ('{"keys": ["aa"], "segments": []}', "exactly one"),
        ('{"kvoffload_trace": 9}', "unsupported trace version"),
        ('{"keys": ["aa", "aa"]}', "chain hashes"),
    ],
)
def test_malformed_lines_raise_trace_format_error(line: str, message: str) -> None:
    with pytest.raises(TraceFormatError, match=message) as info:
        compile_trace(parse_trace_lines(["", line]))
    assert info.value.line == 2


def test_a_key_under_two_prefixes_is_rejected() -> None:
    lines = ['{"keys": ["aa", "bb"]}', '{"keys": ["cc", "bb"]}']
    with pytest.raises(TraceFormatError, match="line 2"):
        compile_trace(parse_trace_lines(lines))


def test_empty_trace_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text('{"kvoffload_trace": 1}\n')
    with pytest.raises(TraceFormatError, match="no request"):
        load_trace(path)


def test_unknown_workload_and_bad_count() -> None:
    with pytest.raises(ConfigurationError, match="unknown workload"):
        generate_trace("nope")
    with pytest.raises(ConfigurationError, match=">= 1"):
        generate_trace("scan", 0)


def test_record_json_round_trip() -> None:
    record = RequestRecord("r", segments=(("s", 3),))
    assert json.loads(record.to_json()) == {"id": "r", "segments": [["s", 3]]}
    stream = io.StringIO()
    write_trace([RequestRecord("k", keys=("ab",))], stream)
    assert stream.getvalue().splitlines()[1] == '{"id": "k", "keys": ["ab"]}'
