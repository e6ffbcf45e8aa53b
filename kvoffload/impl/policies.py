"""Replacement policies: which READY blocks a store evicts.

A policy owns the key → :class:`BlockStatus` map (:attr:`CachePolicy.blocks`)
and the order victims are chosen in. The manager core tells it when a block
becomes READY again (:meth:`CachePolicy.blocks_unpinned`), so a policy can
keep pinned blocks out of its victim searches.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Collection, Iterator, Sequence
from itertools import islice
from typing import Final

from mypy_extensions import mypyc_attr

from kvoffload.impl.backend import require_positive_int
from kvoffload.impl.block import BlockStatus
from kvoffload.impl.build import IntArg, StrArg
from kvoffload.impl.recency import BULK_MIN, RecencyQueue
from kvoffload.spec.errors import ConfigurationError
from kvoffload.spec.keys import OffloadKey

USE_INSERTED: Final = 1
"""Request-scoped recency: the request stored the key (see :meth:`CachePolicy.commit_request`)."""
USE_REUSED: Final = 2
"""The request used the key stored, not having stored it itself."""
USE_STORE_MISSED: Final = 4
"""The request offered the key while untracked (the policy has seen that miss)."""

Victims = list[tuple[OffloadKey, BlockStatus]]
"""What :meth:`CachePolicy.evict` may return: (key, block) pairs in eviction
order (or an :class:`EvictedBlocks`)."""


class EvictedBlocks:
    """Victims of one eviction as two parallel lists, in eviction order:
    ``blocks[i]`` is the block of ``keys[i]``.

    What the built-in policies' :meth:`~CachePolicy.evict` returns: it holds
    no per-victim pair objects (a bulk eviction of a million blocks would
    otherwise allocate a million tuples, and wake the garbage collector), yet
    iterates, indexes and counts like the equivalent :data:`Victims` list.
    """

    __slots__ = ("blocks", "keys")

    def __init__(self, keys: list[OffloadKey], blocks: list[BlockStatus]) -> None:
        self.keys: list[OffloadKey] = keys
        self.blocks: list[BlockStatus] = blocks

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[tuple[OffloadKey, BlockStatus]]:
        return zip(self.keys, self.blocks)

    def __getitem__(self, index: int) -> tuple[OffloadKey, BlockStatus]:
        return self.keys[index], self.blocks[index]

    def __repr__(self) -> str:
        return f"EvictedBlocks({list(self)!r})"


def split_victims(
    victims: Victims | EvictedBlocks,
) -> tuple[list[OffloadKey], list[BlockStatus]]:
    """The keys and the blocks of ``victims``, in eviction order."""
    if isinstance(victims, EvictedBlocks):
        return victims.keys, victims.blocks
    return [key for key, _ in victims], [block for _, block in victims]


def _drop_keys(mapping: dict[OffloadKey, BlockStatus], keys: list[OffloadKey]) -> None:
    """Delete ``keys`` (distinct, all present) from ``mapping``, at C speed."""
    if len(keys) == len(mapping):
        mapping.clear()
    elif len(keys) < BULK_MIN:
        for key in keys:
            del mapping[key]
    else:
        deque(map(mapping.__delitem__, keys), maxlen=0)


@mypyc_attr(allow_interpreted_subclasses=True)
class CachePolicy(ABC):
    """Block organisation and replacement decisions of one manager.

    Contract: only READY blocks (``ref_cnt == 0``) outside ``protected`` are
    ever returned by :meth:`evict`, and :meth:`evict` is atomic.
    """

    def __init__(self, cache_capacity: IntArg) -> None:
        self.cache_capacity: int = require_positive_int("cache_capacity", cache_capacity)
        # Every tracked key and its block. The manager core reads it directly
        # (the hot path); a policy mutates it but never rebinds it.
        self.blocks: dict[OffloadKey, BlockStatus] = {}

    def get(self, key: OffloadKey) -> BlockStatus | None:
        """The block tracked under ``key``, or None."""
        return self.blocks.get(key)

    @abstractmethod
    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        """Track a newly allocated (PENDING) block as most recent."""

    def insert_many(
        self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]
    ) -> None:
        """:meth:`insert` each key in order (the last ends most recent)."""
        for key, block in zip(keys, blocks):
            self.insert(key, block)

    @abstractmethod
    def remove(self, key: OffloadKey) -> None:
        """Stop tracking ``key`` (a failed store); no history is kept."""

    @abstractmethod
    def touch(self, keys: Sequence[OffloadKey]) -> None:
        """Mark ``keys`` recently used; the first key ends most recent."""

    @abstractmethod
    def evict(
        self, n: int, protected: Collection[OffloadKey]
    ) -> Victims | EvictedBlocks | None:
        """Remove exactly ``n`` READY blocks not in ``protected`` and return
        them (keys and blocks) in eviction order, or return None and change
        nothing."""

    def items(self) -> Iterator[tuple[OffloadKey, BlockStatus]]:
        """Every tracked (key, block), in no particular order."""
        return iter(list(self.blocks.items()))

    @abstractmethod
    def clear(self) -> None:
        """Forget every block and all history."""

    def blocks_unpinned(self, keys: Sequence[OffloadKey]) -> None:
        """``keys``' blocks became READY (store done, last load done).
        Default: nothing."""
        return None

    def store_missed(self, keys: Sequence[OffloadKey]) -> None:
        """Request-scoped recency: a request offered ``keys`` (untracked)
        for the first time; the policy sees them as a :meth:`touch` would
        (untracked keys: nothing for LRU, a ghost moves ARC's target).
        Default: nothing."""
        return None

    def commit_request(self, order: list[OffloadKey], uses: list[int]) -> None:
        """A finished request's uses, under request-scoped recency
        (``RecencyCommit.REQUEST_END``, docs/SPEC.md §4): ``order`` is every
        key it used (KV group by KV group, first use first) and ``uses[i]``
        the flags of ``order[i]``: :data:`USE_INSERTED` (it stored the key),
        :data:`USE_REUSED` (it used the stored key again without having
        stored it), :data:`USE_STORE_MISSED`. Default: :meth:`touch` of
        ``order`` (the first key ends most recent)."""
        self.touch(order)

    def tracks_unpinning(self) -> bool:
        """Whether :meth:`blocks_unpinned` must be called now (a policy
        that has set no pinned block aside says no). Default: True."""
        return True

    def state(self) -> dict[str, object]:
        """The replacement state, for inspection (see
        :class:`~kvoffload.spec.contract.InspectablePolicy`). Default: none."""
        return {}


@mypyc_attr(allow_interpreted_subclasses=True)
class LRUCachePolicy(CachePolicy):
    """Least recently used: one recency order over all tracked blocks."""

    def __init__(self, cache_capacity: IntArg) -> None:
        super().__init__(cache_capacity)
        self._order: RecencyQueue[OffloadKey] = RecencyQueue()

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.blocks[key] = block
        self._order.add(key, block)

    def insert_many(
        self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]
    ) -> None:
        self.blocks.update(zip(keys, blocks))
        self._order.add_many(keys, blocks)

    def remove(self, key: OffloadKey) -> None:
        del self.blocks[key]
        self._order.remove(key)

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        self._order.touch(reversed(keys))

    def evict(
        self, n: int, protected: Collection[OffloadKey]
    ) -> Victims | EvictedBlocks | None:
        if n <= 0:
            return []
        bulk = self._evict_oldest(n, protected)
        if bulk is not None:
            return bulk
        scan = self._order.scan(protected)
        keys: list[OffloadKey] = []
        while len(keys) < n:
            key = scan.next()
            if key is None:
                scan.rollback()
                return None
            keys.append(key)
        scan.commit()
        blocks = list(map(self.blocks.__getitem__, keys))
        _drop_keys(self.blocks, keys)
        return EvictedBlocks(keys, blocks)

    def _evict_oldest(
        self, n: int, protected: Collection[OffloadKey]
    ) -> EvictedBlocks | None:
        """:meth:`evict`'s bulk path: the ``n`` least recent members when
        the search would take exactly those (each READY and unprotected, no
        parked block due back), taken in one pass; else None, changing
        nothing."""
        order = self._order
        oldest = order.peek_oldest(n, protected)
        if oldest is None:
            return None
        keys, blocks = oldest
        order.drop_oldest(keys)
        _drop_keys(self.blocks, keys)
        return EvictedBlocks(keys, blocks)

    def clear(self) -> None:
        self.blocks.clear()
        self._order.clear()

    def blocks_unpinned(self, keys: Sequence[OffloadKey]) -> None:
        self._order.unpinned_many(keys)

    def tracks_unpinning(self) -> bool:
        return self._order.has_parked()

    def recency_order(self) -> list[OffloadKey]:
        """Tracked keys, least recent first (for inspection and tests)."""
        return list(self._order)

    def state(self) -> dict[str, object]:
        return {"order": tuple(self._order)}


@mypyc_attr(allow_interpreted_subclasses=True)
class ARCCachePolicy(CachePolicy):
    """Adaptive Replacement Cache, with a liveness rule.

    T1 holds blocks seen once, T2 blocks touched again; B1/B2 remember keys
    recently evicted from each. ``target_t1_size`` moves towards T1 on a B1
    ghost hit and towards T2 on a B2 ghost hit. Victims come from T1 while
    its (shrinking) size is at least the target, else from T2; when the
    preferred list has no eligible victim the other list is used, so a store
    is refused only when no eligible victim exists at all.
    """

    def __init__(self, cache_capacity: IntArg) -> None:
        super().__init__(cache_capacity)
        self.target_t1_size: float = 0.0
        self.t1: RecencyQueue[OffloadKey] = RecencyQueue()
        self.t2: RecencyQueue[OffloadKey] = RecencyQueue()
        self.b1: OrderedDict[OffloadKey, None] = OrderedDict()
        self.b2: OrderedDict[OffloadKey, None] = OrderedDict()

    def insert(self, key: OffloadKey, block: BlockStatus) -> None:
        self.blocks[key] = block
        self.t1.add(key, block)
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def insert_many(
        self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]
    ) -> None:
        self.blocks.update(zip(keys, blocks))
        self.t1.add_many(keys, blocks)
        b1, b2 = self.b1, self.b2
        if b1 or b2:
            for key in keys:  # membership tests; a ghost is rare
                if key in b1:
                    del b1[key]
                if key in b2:
                    del b2[key]

    def remove(self, key: OffloadKey) -> None:
        del self.blocks[key]
        if key in self.t1:
            self.t1.remove(key)
        else:
            self.t2.remove(key)

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        t1, t2, b1, b2, blocks = self.t1, self.t2, self.b1, self.b2, self.blocks
        for key in reversed(keys):
            # a tracked key is in exactly one of T1 and T2, a ghost in neither
            block = blocks.get(key)
            if block is None:
                if key in b1 or key in b2:
                    self._ghost_hit(key)
            elif t2.renew(key):
                pass
            elif block.ref_cnt < 0:
                # a store in flight is not a second use: stay in T1
                t1.renew(key)
            else:
                t1.take(key)
                t2.add(key, block)

    def _ghost_hit(self, key: OffloadKey) -> None:
        """A use of ghost ``key`` (in B1 or B2): the target moves towards
        the list it is in, and the ghost becomes that list's most recent."""
        b1, b2 = self.b1, self.b2
        if key in b1:
            delta = max(1, len(b2) / len(b1))
            self.target_t1_size = min(self.target_t1_size + delta, self.cache_capacity)
            b1.move_to_end(key)
        else:
            delta = max(1, len(b1) / len(b2))
            self.target_t1_size = max(self.target_t1_size - delta, 0)
            b2.move_to_end(key)

    def store_missed(self, keys: Sequence[OffloadKey]) -> None:
        """As :meth:`touch` of untracked keys: only ghosts count."""
        b1, b2 = self.b1, self.b2
        if b1 or b2:
            for key in reversed(keys):
                if key in b1 or key in b2:
                    self._ghost_hit(key)

    def commit_request(self, order: list[OffloadKey], uses: list[int]) -> None:
        """Walking ``order`` in reverse: a key the request reused moves from
        T1, or within T2, to T2's most recent end; a key it only inserted
        moves to the most recent end of its list (T1 or T2, no promotion);
        other keys (untracked, ghosts) are left."""
        t1, t2 = self.t1, self.t2
        # a key is in at most one of T1 and T2: each test below settles
        # where the key is at once
        index = len(order)
        while index > 0:
            index -= 1
            flags = uses[index]
            if flags & USE_REUSED:
                key = order[index]
                if not t2.renew(key):
                    block = t1.take(key)
                    if block is not None:
                        t2.add(key, block)
            elif flags & USE_INSERTED:
                key = order[index]
                if not t1.renew(key):
                    t2.renew(key)

    def evict(
        self, n: int, protected: Collection[OffloadKey]
    ) -> Victims | EvictedBlocks | None:
        if n <= 0:
            return []
        bulk = self._evict_oldest(n, protected)
        if bulk is not None:
            return bulk
        scan_t1, scan_t2 = self.t1.scan(protected), self.t2.scan(protected)
        virtual_t1_size = len(self.t1)
        target = int(self.target_t1_size)
        keys: list[OffloadKey] = []
        from_t1s: list[bool] = []
        while len(keys) < n:
            prefer_t1 = virtual_t1_size >= target
            key = (scan_t1 if prefer_t1 else scan_t2).next()
            from_t1 = prefer_t1
            if key is None:
                key = (scan_t2 if prefer_t1 else scan_t1).next()
                from_t1 = not prefer_t1
            if key is None:
                scan_t1.rollback()
                scan_t2.rollback()
                return None
            if from_t1:
                virtual_t1_size -= 1
            keys.append(key)
            from_t1s.append(from_t1)
        scan_t1.commit()
        scan_t2.commit()
        blocks = list(map(self.blocks.__getitem__, keys))
        _drop_keys(self.blocks, keys)
        b1, b2 = self.b1, self.b2
        for key, from_t1 in zip(keys, from_t1s):
            (b1 if from_t1 else b2)[key] = None
        self._trim_ghosts()
        return EvictedBlocks(keys, blocks)

    def _evict_oldest(
        self, n: int, protected: Collection[OffloadKey]
    ) -> EvictedBlocks | None:
        """:meth:`evict`'s bulk path: when the victims the search would take
        are the least recent members of T1 and T2 (no parked block due back,
        each READY and unprotected), find how many come from each list and
        take them in one pass each; else None, changing nothing.

        With every member eligible the search takes, in order: T1's oldest
        while T1's (shrinking) size is at least the target, then T2's oldest,
        then T1's again once T2 runs dry; or, when T1 runs dry while still
        preferred, T1's then T2's.
        """
        t1, t2 = self.t1, self.t2
        virtual_t1_size = len(t1)
        target = int(self.target_t1_size)
        in_t1, in_t2 = t1.num_ordered(), t2.num_ordered()
        first = min(n, virtual_t1_size - target + 1) if virtual_t1_size >= target else 0
        if first > in_t1:  # T1 runs dry while preferred: the rest from T2
            first = from_t1 = in_t1
            from_t2 = n - in_t1
            t1_dry, t2_dry = True, False
        else:
            from_t2 = min(n - first, in_t2)
            from_t1 = n - from_t2
            t1_dry, t2_dry = False, from_t2 < n - first
        if from_t1 > in_t1 or from_t2 > in_t2:
            return None
        none: tuple[list[OffloadKey], list[BlockStatus]] = ([], [])
        oldest1 = t1.peek_oldest(from_t1, protected) if from_t1 or t1_dry else none
        if oldest1 is None:
            return None
        oldest2 = t2.peek_oldest(from_t2, protected) if from_t2 or t2_dry else none
        if oldest2 is None:
            return None
        keys1, blocks1 = oldest1
        keys2, blocks2 = oldest2
        t1.drop_oldest(keys1)
        t2.drop_oldest(keys2)
        if not keys2:
            keys, blocks = keys1, blocks1
        elif not keys1:
            keys, blocks = keys2, blocks2
        else:
            keys = keys1[:first] + keys2 + keys1[first:]
            blocks = blocks1[:first] + blocks2 + blocks1[first:]
        _drop_keys(self.blocks, keys)
        b1, b2 = self.b1, self.b2
        for key in keys1:
            b1[key] = None
        for key in keys2:
            b2[key] = None
        self._trim_ghosts()
        return EvictedBlocks(keys, blocks)

    def _trim_ghosts(self) -> None:
        """Forget the oldest ghosts beyond the capacity, in each list."""
        capacity = self.cache_capacity
        for ghost in (self.b1, self.b2):
            excess = len(ghost) - capacity
            if excess > 0:
                # the oldest first; one pass, then one deletion each
                for key in list(islice(ghost, excess)):
                    del ghost[key]

    def clear(self) -> None:
        self.blocks.clear()
        self.t1.clear()
        self.t2.clear()
        self.b1.clear()
        self.b2.clear()
        self.target_t1_size = 0.0

    def blocks_unpinned(self, keys: Sequence[OffloadKey]) -> None:
        self.t1.unpinned_many(keys)
        self.t2.unpinned_many(keys)

    def tracks_unpinning(self) -> bool:
        return self.t1.has_parked() or self.t2.has_parked()

    def state(self) -> dict[str, object]:
        return {
            "t1": tuple(self.t1),
            "t2": tuple(self.t2),
            "b1": tuple(self.b1),
            "b2": tuple(self.b2),
            "target": self.target_t1_size,
        }


CACHE_POLICIES: dict[str, type[CachePolicy]] = {
    "lru": LRUCachePolicy,
    "arc": ARCCachePolicy,
}


def require_policy_name(name: object) -> str:
    """``name`` if a policy is registered under it, else :class:`ConfigurationError`."""
    if not isinstance(name, str) or name not in CACHE_POLICIES:
        raise ConfigurationError(
            f"unknown cache policy {name!r}; supported: {sorted(CACHE_POLICIES)}"
        )
    return name


def make_cache_policy(name: StrArg, cache_capacity: IntArg) -> CachePolicy:
    """Build the policy registered under ``name`` ("lru" or "arc").

    Raises :class:`ConfigurationError` for an unknown name or a capacity that
    is not a positive int.
    """
    return CACHE_POLICIES[require_policy_name(name)](cache_capacity)
