"""The manager core and its two faces.

:class:`OffloadingManagerCore` owns ref-counting, events and the
prepare/complete skeletons over a :class:`Backend` (slots) and a
:class:`CachePolicy` (order and victims). :class:`CPUOffloadingManager` and
:class:`LRUOffloadingManager` only choose how those two are built.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable
from contextlib import AbstractContextManager
from itertools import takewhile
from operator import itemgetter
from typing import Any, NoReturn, cast, final

from mypy_extensions import mypyc_attr

from kvoffload.impl.backend import Backend, CPUBackend, require_positive_int
from kvoffload.impl.block import BlockStatus
from kvoffload.impl.build import BoolArg, IntArg, KeyArg, StrArg
from kvoffload.impl.lock import ManagerLock
from kvoffload.impl.policies import (
    USE_INSERTED,
    USE_REUSED,
    USE_STORE_MISSED,
    CachePolicy,
    LRUCachePolicy,
    make_cache_policy,
    require_policy_name,
    split_victims,
)
from kvoffload.impl.stats import ManagerStats
from kvoffload.spec.contract import (
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
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
from kvoffload.spec.profile import RecencyCommit, ResetAnnounce

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


_GROUP_OF = itemgetter(slice(-GROUP_IDX_BYTES, None))
"""A key's group-index bytes: big-endian, so they sort as the index does."""


@final
class RequestUse:
    """What one open request used, kept under request-scoped recency until
    it finishes (the model's ``RequestRecord``), in one dict: each key the
    request loaded or offered (first use first, the record's ``seen``) and
    its flags: :data:`USE_INSERTED` (it stored the key), :data:`USE_REUSED`
    (it used the stored key again without having stored it) and
    :data:`USE_STORE_MISSED` (the policy has seen its store miss). Every key
    recorded has at least one flag set. One dict operation or two per key
    and call, where a dict and three sets cost up to five."""

    __slots__ = ("flags",)

    def __init__(self) -> None:
        self.flags: dict[OffloadKey, int] = {}  # insertion order: first use first

    def reuse(self, keys: list[OffloadKey]) -> None:
        """``keys`` were used stored (loaded, or offered while readable):
        seen, and reused unless this request stored them."""
        flags = self.flags
        for key in keys:
            # one operation for a key new to the record or already counted
            flag = flags.setdefault(key, USE_REUSED)
            if not flag & (USE_INSERTED | USE_REUSED):
                flags[key] = flag | USE_REUSED

    def reuse_one(self, key: OffloadKey) -> None:
        """:meth:`reuse` of one key."""
        flags = self.flags
        flag = flags.setdefault(key, USE_REUSED)
        if not flag & (USE_INSERTED | USE_REUSED):
            flags[key] = flag | USE_REUSED

    def miss(self, key: OffloadKey) -> bool:
        """``key`` was offered untracked: seen; whether that is its first
        store miss in this request (the policy must then see it)."""
        flags = self.flags
        size = len(flags)
        flag = flags.setdefault(key, USE_STORE_MISSED)
        if len(flags) > size:  # new to the record
            return True
        if flag & USE_STORE_MISSED:
            return False
        flags[key] = flag | USE_STORE_MISSED
        return True

    def insert(self, keys: list[OffloadKey]) -> None:
        """``keys`` (recorded already, as store misses) were stored."""
        flags = self.flags
        for key in keys:
            flags[key] = flags[key] | USE_INSERTED

    def commit_order(self) -> tuple[list[OffloadKey], list[int]]:
        """The keys used, KV group by KV group, first use first, and their
        flags (what :meth:`CachePolicy.commit_request` takes)."""
        flags = self.flags
        used = list(flags)
        if used:
            group = used[0][-GROUP_IDX_BYTES:]
            for key in used:
                if not key.endswith(group):  # several groups: sort (stable)
                    used = sorted(used, key=_GROUP_OF)
                    return used, [flags[key] for key in used]
        return used, list(flags.values())


@mypyc_attr(allow_interpreted_subclasses=True)
class OffloadingManagerCore(OffloadingManager):
    """An :class:`OffloadingManager` over a backend and a cache policy.

    Follows the lifecycle table of :mod:`kvoffload.spec.lifecycle`: illegal
    calls raise :class:`IllegalTransitionError` and change nothing; a
    ``prepare_store`` that returns None changes nothing.

    Options named after the :class:`~kvoffload.spec.profile.Profile` options
    they implement (docs/SPEC.md §8; the defaults are kvoffload's contract):
    ``recency_commit=REQUEST_END`` keeps each open request's uses and
    commits them to the policy in ``on_request_finished``;
    ``reset_announce=ENGINE`` makes ``reset_cache`` emit no event;
    ``complete_store_ignores_absent`` makes ``complete_store`` skip keys
    that are not tracked instead of raising; ``reset_with_loads`` makes
    ``reset_cache`` legal while loads are in flight (it frees their slots at
    once: the engine must flush those loads first, as vLLM does before
    ``on_reset_flushed``).
    """

    def __init__(
        self,
        backend: Backend,
        policy: CachePolicy,
        enable_events: BoolArg = False,
        recency_commit: RecencyCommit = RecencyCommit.TOUCH,
        reset_announce: ResetAnnounce = ResetAnnounce.MANAGER,
        complete_store_ignores_absent: BoolArg = False,
        reset_with_loads: BoolArg = False,
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
        self._lock = ManagerLock()
        self.request_scoped: bool = recency_commit is RecencyCommit.REQUEST_END
        self.reset_announced: bool = reset_announce is ResetAnnounce.MANAGER
        self.complete_store_ignores_absent: bool = bool(complete_store_ignores_absent)
        self.reset_with_loads: bool = bool(reset_with_loads)
        # open requests' uses, by req_id (request-scoped recency only)
        self._requests: dict[str, RequestUse] = {}
        # occupancy and counters read by stats() (updated once per call)
        self._num_pending = 0
        self._num_loading = 0
        self._blocks_stored = 0
        self._store_failures = 0
        self._blocks_evicted = 0
        self._stores_refused = 0

    @property
    def lock(self) -> AbstractContextManager[object]:
        """This manager's own lock (a :class:`ManagerLock`, one per
        manager, non-reentrant): callers sharing the manager between threads
        hold it around every call; no method takes it."""
        return self._lock

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
        tracked = self._blocks
        loaded: list[BlockStatus] = []
        pinned = 0
        for key in listed:
            block = tracked.get(key)
            if block is None or block.ref_cnt < 0:
                for taken in loaded:  # change nothing: undo the pins so far
                    taken.ref_cnt -= 1
                self._raise_illegal(listed, Call.PREPARE_LOAD)
            block.ref_cnt += 1
            if block.ref_cnt == 1:
                pinned += 1
            loaded.append(block)
        self._num_loading += pinned
        if self.request_scoped:
            self._use_of(req_context).reuse(listed)
        return self.backend.get_load_store_spec(listed, loaded)

    def _use_of(self, req_context: ReqContext) -> RequestUse:
        """The open record of ``req_context``'s request (opened if none)."""
        use = self._requests.get(req_context.req_id)
        if use is None:
            use = self._requests[req_context.req_id] = RequestUse()
        return use

    def _raise_illegal(self, keys: list[OffloadKey], call: Call) -> NoReturn:
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
        tracked = self._blocks
        loaded: list[BlockStatus] = []
        for key in listed:
            block = tracked.get(key)
            if block is None:
                self._check_complete_load(listed)
            loaded.append(block)
        done = released = 0
        for block in loaded:
            if block.ref_cnt < 1:  # no load left (a repeated key counts twice)
                break
            block.ref_cnt -= 1
            done += 1
            if not block.ref_cnt:
                released += 1
        if done < len(loaded):
            for block in loaded[:done]:
                block.ref_cnt += 1
            self._check_complete_load(listed)
        self._num_loading -= released
        policy = self.policy
        if policy.tracks_unpinning():
            unpinned = [key for key, block in zip(listed, loaded) if not block.ref_cnt]
            if unpinned:
                policy.blocks_unpinned(unpinned)

    def _check_complete_load(self, keys: list[OffloadKey]) -> NoReturn:
        """Raise for the first occurrence with no load in flight (the caller
        found one)."""
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
        raise OffloadingError(f"complete_load: no illegal key found in {keys!r}")

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
        if self.request_scoped:
            self._note_offer(req_context, unique, to_store)
        backend = self.backend
        if not to_store:
            return PrepareStoreOutput((), backend.get_load_store_spec([], []), ())

        evicted: tuple[OffloadKey, ...] = ()
        shortfall = len(to_store) - backend.get_num_free_blocks()
        if shortfall > 0:
            victims = self.policy.evict(shortfall, protected)
            if victims is None:
                self._stores_refused += 1
                return None
            evicted_keys, evicted_blocks = split_victims(victims)
            if _COMPILED:  # a native loop
                for block in evicted_blocks:
                    backend.free(block)
            else:  # no interpreted loop
                deque(map(backend.free, evicted_blocks), maxlen=0)
            evicted = tuple(evicted_keys)
            self._blocks_evicted += len(evicted)
            if _COMPILED:  # a native loop, no method call
                readable = self._readable
                for key in evicted_keys:
                    readable.discard(key)
            else:
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
        self._num_pending += len(to_store)
        if self.request_scoped:
            self._use_of(req_context).insert(to_store)
        return PrepareStoreOutput(
            tuple(to_store), backend.get_load_store_spec(to_store, blocks), evicted
        )

    def _note_offer(
        self, req_context: ReqContext, unique: list[OffloadKey], new: list[OffloadKey]
    ) -> None:
        """Request-scoped recency: what an offer records before room is
        sought (also when the store is then refused): the new keys and the
        readable offered ones are used, in offer order, the readable ones
        reused; the new keys this request has not offered before are store
        misses, which the policy sees as a ``touch`` (ARC adapts its target
        for a ghost)."""
        use = self._use_of(req_context)
        misses: list[OffloadKey] = []
        if len(new) == len(unique):  # every offered key is new
            for key in new:
                if use.miss(key):
                    misses.append(key)
        else:
            readable = self._readable
            fresh = set(new)
            for key in unique:
                if key in fresh:
                    if use.miss(key):
                        misses.append(key)
                elif key in readable:
                    use.reuse_one(key)
        if misses:
            self.policy.store_missed(misses)

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        success: BoolArg = True,
    ) -> None:
        listed = keys_of(keys, req_context)
        success = check_success(success)
        tracked = self._blocks
        ignore_absent = self.complete_store_ignores_absent
        # the PENDING keys and their blocks, once every key is checked
        pending_keys: list[OffloadKey] = []
        pending_blocks: list[BlockStatus] = []
        for key in listed:
            block = tracked.get(key)
            if block is None:
                if ignore_absent:
                    continue
                call = Call.COMPLETE_STORE_OK if success else Call.COMPLETE_STORE_FAILED
                raise IllegalTransitionError(key, self.phase(key), call)
            if block.ref_cnt < 0:
                pending_keys.append(key)
                pending_blocks.append(block)
        if not pending_keys:
            return
        if success:
            stored: list[OffloadKey] = []
            for index, block in enumerate(pending_blocks):
                if block.ref_cnt < 0:  # a repeated key is stored once
                    block.ref_cnt = 0
                    stored.append(pending_keys[index])
            self._num_pending -= len(stored)
            self._blocks_stored += len(stored)
            self._readable.update(stored)
            if self.policy.tracks_unpinning():
                self.policy.blocks_unpinned(stored)
            if self.events is not None:
                self.events.append(
                    OffloadingEvent(tuple(stored), self.block_size, self.medium, False)
                )
        else:
            remove, free = self.policy.remove, self.backend.free
            failed = 0
            unique = dict(zip(pending_keys, pending_blocks))  # a repeated key fails once
            for key, block in unique.items():
                remove(key)
                free(block)
                failed += 1
            self._num_pending -= failed
            self._store_failures += failed

    # --- housekeeping ----------------------------------------------------

    # --- requests --------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        if type(req_context) is not ReqContext:
            require_context(req_context)
        if self.request_scoped and req_context.req_id not in self._requests:
            self._requests[req_context.req_id] = RequestUse()
        return RequestOffloadingContext(req_id=req_context.req_id)

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Under request-scoped recency, the request's uses reach the policy
        now (:meth:`CachePolicy.commit_request`) and its record is dropped;
        otherwise nothing."""
        if type(req_context) is not ReqContext:
            require_context(req_context)
        if not self.request_scoped:
            return
        use = self._requests.pop(req_context.req_id, None)
        if use is not None and use.flags:
            order, uses = use.commit_order()
            self.policy.commit_request(order, uses)

    def stats(self) -> ManagerStats:
        """A snapshot of the occupancy and counters (:class:`ManagerStats`):
        O(1), read from counters the calls keep (one addition per call, so
        nothing is computed on the hot path for it)."""
        capacity = self.backend.get_num_free_blocks() + len(self._blocks)
        pending, loading = self._num_pending, self._num_loading
        return ManagerStats(
            capacity=capacity,
            free=self.backend.get_num_free_blocks(),
            pending=pending,
            loading=loading,
            ready=len(self._blocks) - pending - loading,
            blocks_stored=self._blocks_stored,
            store_failures=self._store_failures,
            blocks_evicted=self._blocks_evicted,
            stores_refused=self._stores_refused,
        )

    def open_requests(self) -> int:
        """How many requests have an open record (request-scoped recency)."""
        return len(self._requests)

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
        ``complete_load`` the loads first. With ``reset_with_loads`` (vLLM
        0.33's contract) the reset frees those slots too, and the caller
        guarantees no load in flight still reads them.
        """
        tracked = list(self.policy.items())
        loading = [(block.block_id, key) for key, block in tracked if block.ref_cnt > 0]
        if loading and not self.reset_with_loads:
            _, key = min(loading)
            raise IllegalTransitionError(key, self.phase(key), Call.RESET)
        announced = sorted(
            ((block.block_id, key) for key, block in tracked if block.ref_cnt >= 0)
        )
        self.policy.clear()
        self._readable.clear()
        self.backend.reset([block for _, block in tracked])
        for req_id in self._requests:  # the requests stay open, their uses forgotten
            self._requests[req_id] = RequestUse()
        self._num_pending = self._num_loading = 0
        if announced and self.events is not None and self.reset_announced:
            self.events.append(
                OffloadingEvent(
                    tuple(key for _, key in announced), self.block_size, self.medium, True
                )
            )


_NO_REQUEST = ReqContext(req_id="")


@final
class KeyAnswers:
    """A face's per-key lookup over a core, answering with the face's own
    values: ``hit`` for a readable key (READY or LOADING), ``pending`` for
    a key whose store is in flight, ``miss`` for an untracked one. One native
    call per key (the scheduler asks key by key); a face binds
    :meth:`lookup` as its own. Raises what the core's ``lookup`` raises for
    a malformed key; ``req_context`` is not read (no request records a
    lookup)."""

    def __init__(
        self, core: OffloadingManagerCore, hit: object, pending: object, miss: object
    ) -> None:
        self.core = core
        self.readable: set[OffloadKey] = core._readable  # never rebound by the core
        self.hit = hit
        self.pending = pending
        self.miss = miss

    def lookup(self, key: KeyArg, req_context: object) -> object:
        if key in self.readable:
            return self.hit
        core = self.core
        core.lookup(key, _NO_REQUEST)  # raises InvalidKeyError if malformed
        return self.miss if core.slot_of(key) is None else self.pending


@mypyc_attr(allow_interpreted_subclasses=True)
class CPUOffloadingManager(OffloadingManagerCore):
    """``num_blocks`` CPU slots evicted by ``cache_policy`` ("lru" or "arc").

    The keyword options are :class:`OffloadingManagerCore`'s. With
    ``allow_empty``, ``num_blocks=0`` is accepted: a manager with no slot,
    which refuses every store that has a new key (what vLLM's spec builds
    from a ``cpu_bytes_to_use`` smaller than one chunk).

    Raises :class:`~kvoffload.spec.errors.ConfigurationError` for sizes that
    are not positive ints (``num_blocks`` may be 0 with ``allow_empty``) and
    for unknown policy names.
    """

    def __init__(
        self,
        block_size: IntArg,
        num_blocks: IntArg,
        cache_policy: StrArg = "lru",
        enable_events: BoolArg = False,
        *,
        recency_commit: RecencyCommit = RecencyCommit.TOUCH,
        reset_announce: ResetAnnounce = ResetAnnounce.MANAGER,
        complete_store_ignores_absent: BoolArg = False,
        allow_empty: BoolArg = False,
        reset_with_loads: BoolArg = False,
    ) -> None:
        size = require_positive_int("block_size", block_size)
        if allow_empty and num_blocks == 0 and type(num_blocks) is int:
            capacity = 0
        else:
            capacity = require_positive_int("num_blocks", num_blocks)
        policy_name = require_policy_name(cache_policy)
        # a policy needs a positive capacity; with no slot it never holds a block
        policy = make_cache_policy(policy_name, max(1, capacity))
        super().__init__(
            CPUBackend(size, capacity, allow_empty=bool(allow_empty)),
            policy,
            enable_events,
            recency_commit,
            reset_announce,
            complete_store_ignores_absent,
            reset_with_loads,
        )
        self.cache_policy: str = policy_name


@mypyc_attr(allow_interpreted_subclasses=True)
class LRUOffloadingManager(OffloadingManagerCore):
    """LRU eviction over any :class:`Backend`."""

    def __init__(self, backend: Backend, enable_events: BoolArg = False) -> None:
        capacity = max(1, backend.get_num_free_blocks())
        super().__init__(backend, LRUCachePolicy(capacity), enable_events)
