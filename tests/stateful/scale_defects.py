"""Defects that only a run at scale shows (issue 18, item 10): a bitmap
allocator whose word offset is wrong past the first word of slots, a
KV-group index truncated to its low byte, a prefix match capped at 32 keys.
Each is a correct LRU (``DictLRUManager``) but for the one slip."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from kvoffload.spec.contract import (
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
)
from kvoffload.spec.keys import OffloadKey
from tests.stateful.thirdparty import DictLRUManager

WORD = 8


class BitmapWordOffset(DictLRUManager):
    """Slots from a bitmap of 8-slot words; the slot number of bit ``b`` of
    word ``w`` is computed as ``7 * w + b``: right for the first word only."""

    def take_free_slot(self) -> int:
        index = min(self.free_slots)
        self.free_slots.remove(index)
        word, bit = divmod(index, WORD)
        return (WORD - 1) * word + bit


class LowByteGroups(DictLRUManager):
    """Keys are stored by block hash and the low byte of the KV-group index
    (a group decoded into one byte): groups 0 and 256 are one key."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.shown: dict[OffloadKey, OffloadKey] = {}

    def canon(self, key: OffloadKey) -> OffloadKey:
        if not isinstance(key, bytes) or len(key) < 4:
            return key  # not a key: the manager rejects it as it should
        inner = OffloadKey(bytes(key[:-4]) + b"\x00\x00\x00" + bytes(key[-1:]))
        self.shown.setdefault(inner, key)
        return inner

    def back(self, keys: Iterable[OffloadKey]) -> tuple[OffloadKey, ...]:
        return tuple(self.shown.get(k, k) for k in keys)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool:
        return super().lookup(self.canon(key), req_context)

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        return super().prepare_load([self.canon(k) for k in keys], req_context)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        super().complete_load([self.canon(k) for k in keys], req_context)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        super().touch([self.canon(k) for k in keys], req_context)

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        out = super().prepare_store([self.canon(k) for k in keys], req_context)
        if out is None:
            return None
        return PrepareStoreOutput(self.back(out.keys_to_store), out.store_spec,
                                  self.back(out.evicted_keys))

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        super().complete_store([self.canon(k) for k in keys], req_context, success)

    def take_events(self) -> list[OffloadingEvent]:
        return [
            OffloadingEvent(self.back(e.keys), e.block_size, e.medium, e.removed)
            for e in super().take_events()
        ]


class CappedPrefix(DictLRUManager):
    """``lookup_prefix`` stops counting at 32 keys."""

    def lookup_prefix(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> int | None:
        hits = super().lookup_prefix(keys, req_context)
        return None if hits is None else min(hits, 32)


def bitmap_word_offset(num_blocks: int) -> OffloadingManager:
    return BitmapWordOffset(num_blocks)


def low_byte_groups(num_blocks: int) -> OffloadingManager:
    return LowByteGroups(num_blocks)


def capped_prefix(num_blocks: int) -> OffloadingManager:
    return CappedPrefix(num_blocks)
