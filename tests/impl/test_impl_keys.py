"""Offload keys: packing, unpacking and rejection of malformed keys."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvoffload.spec.errors import InvalidKeyError, OffloadingError
from kvoffload.spec.keys import (
    OffloadKey,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
    validate_offload_key,
)


@pytest.mark.parametrize(
    ("block_hash", "group_idx"),
    [
        (b"\x01\x02\x03", 0),
        (b"", 7),
        (bytes(range(32)), 1),
        (b"h", 0xFFFF_FFFF),
    ],
)
def test_make_and_split_round_trip(block_hash: bytes, group_idx: int) -> None:
    offload_key = make_offload_key(block_hash, group_idx)
    assert isinstance(offload_key, bytes)
    assert len(offload_key) == len(block_hash) + 4
    assert get_offload_block_hash(offload_key) == block_hash
    assert get_offload_group_idx(offload_key) == group_idx


def test_group_index_is_four_big_endian_bytes_at_the_end() -> None:
    assert make_offload_key(b"ab", 0x01020304) == b"ab\x01\x02\x03\x04"
    assert get_offload_group_idx(OffloadKey(b"xyz\x00\x00\x01\x00")) == 256


def test_same_hash_in_two_groups_gives_two_keys() -> None:
    assert make_offload_key(b"h", 0) != make_offload_key(b"h", 1)


@pytest.mark.parametrize("group_idx", [-1, 1 << 32, 2**40])
def test_group_index_out_of_range_is_rejected(group_idx: int) -> None:
    with pytest.raises(InvalidKeyError) as raised:
        make_offload_key(b"h", group_idx)
    assert raised.value.key == b"h"
    assert isinstance(raised.value, OffloadingError)


@pytest.mark.parametrize("group_idx", [True, 1.0, "1", None])
def test_group_index_of_wrong_type_is_rejected(group_idx: object) -> None:
    with pytest.raises(InvalidKeyError):
        make_offload_key(b"h", group_idx)  # type: ignore[arg-type]


@pytest.mark.parametrize("block_hash", ["abc", bytearray(b"abc"), 5, None])
def test_block_hash_must_be_bytes(block_hash: object) -> None:
    with pytest.raises(InvalidKeyError) as raised:
        make_offload_key(block_hash, 0)  # type: ignore[arg-type]
    assert raised.value.key is block_hash


@pytest.mark.parametrize("bad_key", [b"", b"abc", "abcdef", bytearray(b"abcdef"), 12345, None])
def test_validate_and_split_reject_malformed_keys(bad_key: object) -> None:
    checks: list[Callable[[Any], object]] = [
        validate_offload_key,
        get_offload_block_hash,
        get_offload_group_idx,
    ]
    for check in checks:
        with pytest.raises(InvalidKeyError) as raised:
            check(bad_key)
        assert raised.value.key is bad_key


def test_four_bytes_is_the_shortest_valid_key() -> None:
    shortest = validate_offload_key(b"\x00\x00\x00\x09")
    assert get_offload_block_hash(shortest) == b""
    assert get_offload_group_idx(shortest) == 9
