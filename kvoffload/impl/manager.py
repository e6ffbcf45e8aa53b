"""The manager core and its two faces.

:class:`OffloadingManagerCore` owns ref-counting, events and the
prepare/complete skeletons over a :class:`Backend` (slots) and a
:class:`CachePolicy` (order and victims). :class:`CPUOffloadingManager` and
:class:`LRUOffloadingManager` only choose how those two are built.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from itertools import takewhile
from operator import attrgetter
from typing import cast

from kvoffload.impl.backend import Backend, CPUBackend, require_positive_int
from kvoffload.impl.block import BlockStatus
from kvoffload.impl.policies import CachePolicy, LRUCachePolicy, make_cache_policy
from kvoffload.spec.contract import (
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
)
from kvoffload.spec.errors import IllegalTransitionError, OffloadingError
from kvoffload.spec.keys import GROUP_IDX_BYTES, OffloadKey, validate_offload_key
from kvoffload.spec.lifecycle import Call, Phase


_REF_CNT = attrgetter("ref_cnt")


def check_offered_keys(offered: Sequence[object]) -> None:
    """Raise :class:`InvalidKeyError` for the first offered key that is not
    ``bytes`` of at least the group-index length (a C-speed check first)."""
    try:
        if set(map(type, offered)) <= {bytes} and min(
            map(len, cast(Sequence[bytes], offered)), default=GROUP_IDX_BYTES
        ) >= GROUP_IDX_BYTES:
            return
    except TypeError:
        pass
    for key in offered:
        validate_offload_key(key)


class OffloadingManagerCore(OffloadingManager):
    """An :class:`OffloadingManager` over a backend and a cache policy.

    Follows the lifecycle table of :mod:`kvoffload.spec.lifecycle`: illegal
    calls raise :class:`IllegalTransitionError` and change nothing; a
    ``prepare_store`` that returns None changes nothing.
    """

    def __init__(
        self, backend: Backend, policy: CachePolicy, enable_events: bool = False
    ) -> None:
        self.backend = backend
        self.policy = policy
        self._blocks = policy.blocks  # the policy's key -> block map (hot path)
        # Keys READY or LOADING: what lookup answers True for (hot path).
        self._readable: set[OffloadKey] = set()
        self.block_size = backend.block_size
        self.medium = backend.medium
        self.events: list[OffloadingEvent] | None = [] if enable_events else None

    # --- reads -----------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool:
        return key in self._readable

    def lookup_prefix(
        self, keys: Iterable[OffloadKey], req_context: ReqContext
    ) -> int:
        return len(list(takewhile(self._readable.__contains__, keys)))

    def phase(self, key: OffloadKey) -> Phase:
        """The lifecycle phase of ``key`` (no side effects)."""
        block = self._blocks.get(key)
        return Phase.from_ref_cnt(None if block is None else block.ref_cnt)

    def slot_of(self, key: OffloadKey) -> int | None:
        """The slot of ``key``'s block, or None when untracked."""
        block = self._blocks.get(key)
        return None if block is None else block.block_id

    def policy_state(self) -> dict[str, object]:
        """The replacement policy's state (no side effects)."""
        return self.policy.state()

    # --- loads -----------------------------------------------------------

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> LoadStoreSpec:
        keys = list(keys)
        get = self._blocks.get
        blocks = [get(key) for key in keys]
        if None in blocks or min(map(_REF_CNT, blocks), default=0) < 0:
            for key, block in zip(keys, blocks):
                if block is None or block.ref_cnt < 0:
                    raise IllegalTransitionError(key, self.phase(key), Call.PREPARE_LOAD)
        loaded = cast(list[BlockStatus], blocks)
        for block in loaded:
            block.ref_cnt += 1
        return self.backend.get_load_store_spec(keys, loaded)

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> None:
        keys = list(keys)
        get = self._blocks.get
        blocks = [get(key) for key in keys]
        if (
            None in blocks
            or min(map(_REF_CNT, blocks), default=1) < 1
            or len(set(keys)) != len(keys)
        ):
            self._check_complete_load(keys)
        loaded = cast(list[BlockStatus], blocks)
        for block in loaded:
            block.ref_cnt -= 1
        if self.policy.tracks_unpinning():
            unpinned = [key for key, block in zip(keys, loaded) if not block.ref_cnt]
            if unpinned:
                self.policy.blocks_unpinned(unpinned)

    def _check_complete_load(self, keys: list[OffloadKey]) -> None:
        """Raise for the first occurrence with no load in flight, if any."""
        remaining: dict[OffloadKey, int] = {}
        for key in keys:
            block = self._blocks.get(key)
            left = remaining.get(key, 0 if block is None else block.ref_cnt)
            if left <= 0:
                found = Phase.from_ref_cnt(
                    None if block is None else (0 if block.ref_cnt > 0 else block.ref_cnt)
                )
                raise IllegalTransitionError(key, found, Call.COMPLETE_LOAD)
            remaining[key] = left - 1

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.policy.touch(keys if type(keys) is list else list(keys))

    # --- stores ----------------------------------------------------------

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        offered = list(keys)
        check_offered_keys(offered)
        tracked = self._blocks
        to_store = [key for key in dict.fromkeys(offered) if key not in tracked]
        backend = self.backend
        if not to_store:
            return PrepareStoreOutput((), backend.get_load_store_spec([], []), ())

        evicted: tuple[OffloadKey, ...] = ()
        shortfall = len(to_store) - backend.get_num_free_blocks()
        if shortfall > 0:
            victims = self.policy.evict(shortfall, set(offered))
            if victims is None:
                return None
            free = backend.free
            for _, block in victims:
                free(block)
            evicted = tuple(key for key, _ in victims)
            self._readable.difference_update(evicted)
            if self.events is not None:
                self.events.append(
                    OffloadingEvent(evicted, self.block_size, self.medium, True)
                )

        blocks = backend.allocate_blocks(to_store)
        if len(blocks) != len(to_store):
            raise OffloadingError(
                f"backend allocated {len(blocks)} blocks for {len(to_store)} keys"
            )
        self.policy.insert_many(to_store, blocks)
        return PrepareStoreOutput(
            tuple(to_store), backend.get_load_store_spec(to_store, blocks), evicted
        )

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        success: bool = True,
    ) -> None:
        get = self._blocks.get
        unique = list(dict.fromkeys(keys))
        blocks = [get(key) for key in unique]
        if None in blocks:
            missing = unique[blocks.index(None)]
            call = Call.COMPLETE_STORE_OK if success else Call.COMPLETE_STORE_FAILED
            raise IllegalTransitionError(missing, self.phase(missing), call)
        if success:
            stored: list[OffloadKey] = []
            for key, block in zip(unique, blocks):
                if block is not None and block.ref_cnt < 0:
                    block.ref_cnt = 0
                    stored.append(key)
            if stored:
                self._readable.update(stored)
                if self.policy.tracks_unpinning():
                    self.policy.blocks_unpinned(stored)
            if stored and self.events is not None:
                self.events.append(
                    OffloadingEvent(tuple(stored), self.block_size, self.medium, False)
                )
        else:
            remove, free = self.policy.remove, self.backend.free
            for key, block in zip(unique, blocks):
                if block is not None and block.ref_cnt < 0:
                    remove(key)
                    free(block)

    # --- housekeeping ----------------------------------------------------

    def take_events(self) -> list[OffloadingEvent]:
        if self.events is None:
            return []
        taken, self.events = self.events, []
        return taken

    def reset_cache(self) -> None:
        tracked = list(self.policy.items())
        announced = sorted(
            ((block.block_id, key) for key, block in tracked if block.ref_cnt >= 0)
        )
        self.policy.clear()
        self._readable.clear()
        self.backend.reset([block for _, block in tracked])
        if announced and self.events is not None:
            self.events.append(
                OffloadingEvent(
                    tuple(key for _, key in announced), self.block_size, self.medium, True
                )
            )


class CPUOffloadingManager(OffloadingManagerCore):
    """``num_blocks`` CPU slots evicted by ``cache_policy`` ("lru" or "arc").

    Raises :class:`~kvoffload.spec.errors.ConfigurationError` for sizes that
    are not positive ints and for unknown policy names.
    """

    def __init__(
        self,
        block_size: int,
        num_blocks: int,
        cache_policy: str = "lru",
        enable_events: bool = False,
    ) -> None:
        require_positive_int("block_size", block_size)
        require_positive_int("num_blocks", num_blocks)
        policy = make_cache_policy(cache_policy, num_blocks)
        super().__init__(CPUBackend(block_size, num_blocks), policy, enable_events)
        self.cache_policy = cache_policy


class LRUOffloadingManager(OffloadingManagerCore):
    """LRU eviction over any :class:`Backend` (reference 002's face)."""

    def __init__(self, backend: Backend, enable_events: bool = False) -> None:
        capacity = max(1, backend.get_num_free_blocks())
        super().__init__(backend, LRUCachePolicy(capacity), enable_events)
