"""Offload keys: a block hash followed by a 4-byte big-endian KV-group index."""

from __future__ import annotations

from typing import NewType

from kvoffload.spec.errors import InvalidKeyError

OffloadKey = NewType("OffloadKey", bytes)

GROUP_IDX_BYTES = 4
"""Length of the big-endian KV-group index that ends every key."""

_MAX_GROUP_IDX = (1 << (8 * GROUP_IDX_BYTES)) - 1


def make_offload_key(block_hash: bytes, group_idx: int) -> OffloadKey:
    """Pack ``block_hash`` and ``group_idx`` into an :data:`OffloadKey`.

    Raises :class:`InvalidKeyError` if ``block_hash`` is not ``bytes`` or
    ``group_idx`` does not fit in 4 unsigned bytes.
    """
    if not isinstance(block_hash, bytes):
        raise InvalidKeyError(
            block_hash, f"block hash must be bytes, got {type(block_hash).__name__}"
        )
    if isinstance(group_idx, bool) or not isinstance(group_idx, int):
        raise InvalidKeyError(
            block_hash, f"group index must be an int, got {type(group_idx).__name__}"
        )
    if not 0 <= group_idx <= _MAX_GROUP_IDX:
        raise InvalidKeyError(
            block_hash, f"group index {group_idx} is outside [0, {_MAX_GROUP_IDX}]"
        )
    return OffloadKey(block_hash + group_idx.to_bytes(GROUP_IDX_BYTES, "big"))


def validate_offload_key(key: object) -> OffloadKey:
    """Return ``key`` as an :data:`OffloadKey` or raise :class:`InvalidKeyError`.

    A valid key is ``bytes`` at least :data:`GROUP_IDX_BYTES` long.
    """
    if not isinstance(key, bytes):
        raise InvalidKeyError(key, f"key must be bytes, got {type(key).__name__}")
    if len(key) < GROUP_IDX_BYTES:
        raise InvalidKeyError(
            key,
            f"key is {len(key)} bytes, too short to carry the "
            f"{GROUP_IDX_BYTES}-byte group index",
        )
    return OffloadKey(key)


def get_offload_block_hash(key: OffloadKey) -> bytes:
    """The block-hash part of ``key`` (everything before the group index)."""
    return bytes(validate_offload_key(key)[:-GROUP_IDX_BYTES])


def get_offload_group_idx(key: OffloadKey) -> int:
    """The KV-group index carried by the last 4 bytes of ``key``."""
    return int.from_bytes(validate_offload_key(key)[-GROUP_IDX_BYTES:], "big")
