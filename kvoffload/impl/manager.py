"""The manager core and its two faces.

:class:`OffloadingManagerCore` owns ref-counting, events and the
prepare/complete skeletons over a :class:`Backend` (slots) and a
:class:`CachePolicy` (order and victims). :class:`CPUOffloadingManager` and
:class:`LRUOffloadingManager` only choose how those two are built.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable
from itertools import takewhile
from typing import Any, cast

from mypy_extensions import mypyc_attr

from kvoffload.impl.backend import Backend, CPUBackend, require_positive_int
from kvoffload.impl.block import BlockStatus
from kvoffload.impl.build import BoolArg, IntArg, KeyArg, StrArg
from kvoffload.impl.policies import (
    CachePolicy,
    LRUCachePolicy,
    make_cache_policy,
    require_policy_name,
    split_victims,
)
from kvoffload.spec.contract import (
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
    require_context,
    require_success,
)
from kvoffload.spec.errors import ConfigurationError, IllegalTransitionError, OffloadingError
from kvoffload.spec.keys import (
    GROUP_IDX_BYTES,
    OffloadKey,
    validate_offload_key,
    validate_offload_keys,
)
from kvoffload.spec.lifecycle import Call, Phase

_BARE_KEY_TYPES = (bytes, bytearray, memoryview, str)


def listed_keys(keys: object) -> list[OffloadKey]:
    """``keys`` as a list (itself when it is one), the keys not yet checked.

    Raises :class:`InvalidKeyError` when ``keys`` is a single key or a
    string, or is not iterable.
    """
    if type(keys) is list:
        return cast(list[OffloadKey], keys)
    if isinstance(keys, _BARE_KEY_TYPES):
        validate_offload_keys(keys)  # raises
    try:
        return list(cast(Iterable[OffloadKey], keys))
    except TypeError:
        return validate_offload_keys(keys)  # raises


# Whether this module runs compiled (mypyc): then a plain loop is the fastest
# key check; interpreted, the spec's C-speed validator is.
_COMPILED = not __file__.endswith(".py")


def check_keys(keys: list[OffloadKey]) -> None:
    """Raise :class:`InvalidKeyError` for the first key of ``keys`` that is
    not ``bytes`` of at least the group-index length."""
    if _COMPILED:
        # a native loop (each item is checked as bytes on the way)
        try:
            for key in keys:
                if len(key) < GROUP_IDX_BYTES:
                    break
            else:
                return
        except TypeError:
            pass
    validate_offload_keys(keys)


def keys_of(keys: object, req_context: object) -> list[OffloadKey]:
    """The one argument check of every keyed call: ``keys`` as a checked
    list, after ``req_context`` is checked.

    Raises :class:`InvalidKeyError` for a bare key, a string, a non-iterable
    or any key that is not ``bytes`` of at least the group-index length (a
    ``memoryview`` or ``bytearray`` key included, though one may hash equal
    to a tracked key), and :class:`InvalidArgumentError` for a context
    without a ``str`` ``req_id``. Nothing is acted on before both pass.
    """
    if type(req_context) is not ReqContext:
        require_context(req_context)
    listed = listed_keys(keys)
    check_keys(listed)
    return listed


def check_success(success: object) -> bool:
    """``success`` when it is a ``bool``, else :class:`InvalidArgumentError`."""
    if success is True or success is False:
        return success is True
    require_success(success)  # raises
    return False


def _block_of(blocks: dict[OffloadKey, BlockStatus], key: object) -> BlockStatus | None:
    """``key``'s block, None when untracked or unhashable (a query never
    raises for its key)."""
    try:
        # not cast to OffloadKey: compiled, that cast would check the type
        return blocks.get(cast(Any, key))
    except TypeError:
        return None


def _ref_cnt_of(blocks: dict[OffloadKey, BlockStatus], key: object) -> int | None:
    block = _block_of(blocks, key)
    return None if block is None else block.ref_cnt


@mypyc_attr(allow_interpreted_subclasses=True)
class OffloadingManagerCore(OffloadingManager):
    """An :class:`OffloadingManager` over a backend and a cache policy.

    Follows the lifecycle table of :mod:`kvoffload.spec.lifecycle`: illegal
    calls raise :class:`IllegalTransitionError` and change nothing; a
    ``prepare_store`` that returns None changes nothing.
    """

    def __init__(
        self, backend: Backend, policy: CachePolicy, enable_events: BoolArg = False
    ) -> None:
        if enable_events is not True and enable_events is not False:
            raise ConfigurationError(f"enable_events must be a bool, got {enable_events!r}")
        self.backend = backend
        self.policy = policy
        self._blocks = policy.blocks  # the policy's key -> block map (hot path)
        # Keys READY or LOADING: what lookup answers True for (hot path).
        self._readable: set[OffloadKey] = set()
        self.block_size = backend.block_size
        self.medium = backend.medium
        self.events: list[OffloadingEvent] | None = [] if enable_events else None

    # --- reads -----------------------------------------------------------

    def lookup(self, key: KeyArg, req_context: ReqContext) -> bool:
        if type(req_context) is not ReqContext:
            require_context(req_context)
        if isinstance(key, bytes) and len(key) >= GROUP_IDX_BYTES:
            return key in self._readable
        validate_offload_key(key)  # raises: a memoryview may hash as a tracked key
        return False

    def lookup_prefix(
        self, keys: Iterable[OffloadKey], req_context: ReqContext
    ) -> int:
        listed = keys_of(keys, req_context)
        return len(list(takewhile(self._readable.__contains__, listed)))

    def phase(self, key: KeyArg) -> Phase:
        """The lifecycle phase of ``key`` (no side effects); ABSENT for
        anything untracked, a malformed or unhashable key included."""
        return Phase.from_ref_cnt(_ref_cnt_of(self._blocks, key))

    def slot_of(self, key: KeyArg) -> int | None:
        """The slot of ``key``'s block; None when untracked (a malformed or
        unhashable key included)."""
        block = _block_of(self._blocks, key)
        return None if block is None else block.block_id

    def policy_state(self) -> dict[str, object]:
        """The replacement policy's state (no side effects)."""
        return self.policy.state()

    # --- loads -----------------------------------------------------------

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> LoadStoreSpec:
        listed = keys_of(keys, req_context)
        loaded = self._blocks_of(listed)
        for block in loaded:
            if block.ref_cnt < 0:
                self._raise_illegal(listed, Call.PREPARE_LOAD)
        for block in loaded:
            block.ref_cnt += 1
        return self.backend.get_load_store_spec(listed, loaded)

    def _blocks_of(self, keys: list[OffloadKey]) -> list[BlockStatus]:
        """The blocks of the checked ``keys``, in order;
        :class:`IllegalTransitionError` (as ``prepare_load``) for the first
        untracked one."""
        get = self._blocks.get
        blocks = [get(key) for key in keys]
        if None in blocks:
            self._raise_illegal(keys, Call.PREPARE_LOAD)
        return cast(list[BlockStatus], blocks)

    def _raise_illegal(self, keys: list[OffloadKey], call: Call) -> None:
        """Raise for the first key of ``keys`` that ``call`` may not take
        (untracked or PENDING)."""
        for key in keys:
            block = self._blocks.get(key)
            if block is None or block.ref_cnt < 0:
                raise IllegalTransitionError(key, self.phase(key), call)
        raise OffloadingError(f"{call.value}: no illegal key found in {keys!r}")

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> None:
        listed = keys_of(keys, req_context)
        get = self._blocks.get
        blocks = [get(key) for key in listed]
        if None in blocks:
            self._check_complete_load(listed)
        loaded = cast(list[BlockStatus], blocks)
        done = 0
        for block in loaded:
            if block.ref_cnt < 1:  # no load left (a repeated key counts twice)
                break
            block.ref_cnt -= 1
            done += 1
        if done < len(loaded):
            for block in loaded[:done]:
                block.ref_cnt += 1
            self._check_complete_load(listed)
        policy = self.policy
        if policy.tracks_unpinning():
            unpinned = [key for key, block in zip(listed, loaded) if not block.ref_cnt]
            if unpinned:
                policy.blocks_unpinned(unpinned)

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
        self.policy.touch(keys_of(keys, req_context))

    # --- stores ----------------------------------------------------------

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        offered = keys_of(keys, req_context)
        offered_set = set(offered)
        # offer order, no repeats (a set is the cheaper test for repeats)
        unique = offered if len(offered_set) == len(offered) else list(dict.fromkeys(offered))
        tracked = self._blocks
        # Victims are tracked keys: only the tracked offered keys need
        # protecting, and when none is (the common case) nothing does.
        protected: Collection[OffloadKey] = ()
        if tracked.keys().isdisjoint(offered_set):
            to_store = list(unique)
        else:
            to_store = [key for key in unique if key not in tracked]
            protected = offered_set
        backend = self.backend
        if not to_store:
            return PrepareStoreOutput((), backend.get_load_store_spec([], []), ())

        evicted: tuple[OffloadKey, ...] = ()
        shortfall = len(to_store) - backend.get_num_free_blocks()
        if shortfall > 0:
            victims = self.policy.evict(shortfall, protected)
            if victims is None:
                return None
            evicted_keys, evicted_blocks = split_victims(victims)
            if _COMPILED:  # a native loop
                for block in evicted_blocks:
                    backend.free(block)
            else:  # no interpreted loop
                deque(map(backend.free, evicted_blocks), maxlen=0)
            evicted = tuple(evicted_keys)
            self._readable.difference_update(evicted_keys)
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
        success: BoolArg = True,
    ) -> None:
        listed = keys_of(keys, req_context)
        success = check_success(success)
        get = self._blocks.get
        unique = list(dict.fromkeys(listed))
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
        """Drop every tracked block and free every slot.

        Refused while a load is in flight: the slot it reads would be handed
        to the next ``prepare_store`` and overwritten under the reader (on a
        GPU the copy is asynchronous). Raises :class:`IllegalTransitionError`
        naming the loading key of the lowest slot, and changes nothing;
        ``complete_load`` the loads first.
        """
        tracked = list(self.policy.items())
        loading = [(block.block_id, key) for key, block in tracked if block.ref_cnt > 0]
        if loading:
            _, key = min(loading)
            raise IllegalTransitionError(key, self.phase(key), Call.RESET)
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


@mypyc_attr(allow_interpreted_subclasses=True)
class CPUOffloadingManager(OffloadingManagerCore):
    """``num_blocks`` CPU slots evicted by ``cache_policy`` ("lru" or "arc").

    Raises :class:`~kvoffload.spec.errors.ConfigurationError` for sizes that
    are not positive ints and for unknown policy names.
    """

    def __init__(
        self,
        block_size: IntArg,
        num_blocks: IntArg,
        cache_policy: StrArg = "lru",
        enable_events: BoolArg = False,
    ) -> None:
        size = require_positive_int("block_size", block_size)
        capacity = require_positive_int("num_blocks", num_blocks)
        policy_name = require_policy_name(cache_policy)
        policy = make_cache_policy(policy_name, capacity)
        super().__init__(CPUBackend(size, capacity), policy, enable_events)
        self.cache_policy: str = policy_name


@mypyc_attr(allow_interpreted_subclasses=True)
class LRUOffloadingManager(OffloadingManagerCore):
    """LRU eviction over any :class:`Backend`."""

    def __init__(self, backend: Backend, enable_events: BoolArg = False) -> None:
        capacity = max(1, backend.get_num_free_blocks())
        super().__init__(backend, LRUCachePolicy(capacity), enable_events)
