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


_BYTES_ONLY = frozenset({bytes})
_BARE_KEY_TYPES = (bytes, bytearray, memoryview, str)


def validate_offload_keys(keys: object) -> list[OffloadKey]:
    """``keys`` as a list of :data:`OffloadKey`, every one checked first.

    Returns ``keys`` itself when it is a list. Raises
    :class:`InvalidKeyError` if ``keys`` is a single key, a string or not
    iterable, or if any key fails :func:`validate_offload_key`. The whole list is
    checked before the caller acts on any key, so a call that raises has
    counted, touched or changed nothing.
    """
    if isinstance(keys, _BARE_KEY_TYPES):
        raise InvalidKeyError(keys, "expected a sequence of keys, got a single key")
    try:
        listed: list[OffloadKey] = (
            keys if type(keys) is list else list(keys)  # type: ignore[call-overload]
        )
    except TypeError:
        raise InvalidKeyError(
            keys, f"expected a sequence of keys, got {type(keys).__name__}"
        ) from None
    # C-speed pass for the common case: exact bytes, long enough.
    if set(map(type, listed)) <= _BYTES_ONLY and (
        not listed or min(map(len, listed)) >= GROUP_IDX_BYTES
    ):
        return listed
    for key in listed:
        validate_offload_key(key)
    return listed


def get_offload_block_hash(key: OffloadKey) -> bytes:
    """The block-hash part of ``key`` (everything before the group index)."""
    return bytes(validate_offload_key(key)[:-GROUP_IDX_BYTES])


def get_offload_group_idx(key: OffloadKey) -> int:
    """The KV-group index carried by the last 4 bytes of ``key``."""
    return int.from_bytes(validate_offload_key(key)[-GROUP_IDX_BYTES:], "big")
