"""Replacement policies: which READY blocks a store evicts.

A policy owns the key → :class:`BlockStatus` map (:attr:`CachePolicy.blocks`)
and the order victims are chosen in. The manager core tells it when a block
becomes READY again (:meth:`CachePolicy.blocks_unpinned`), so a policy can
keep pinned blocks out of its victim searches.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Collection, Iterator, Sequence

from mypy_extensions import mypyc_attr

from kvoffload.impl.backend import require_positive_int
from kvoffload.impl.block import BlockStatus
from kvoffload.impl.build import IntArg, StrArg
from kvoffload.impl.recency import RecencyQueue
from kvoffload.spec.errors import ConfigurationError
from kvoffload.spec.keys import OffloadKey

Victims = list[tuple[OffloadKey, BlockStatus]]


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
    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        """Remove exactly ``n`` READY blocks not in ``protected`` and return
        them in eviction order, or return None and change nothing."""

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

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        if n <= 0:
            return []
        scan = self._order.scan(protected)
        chosen: list[OffloadKey] = []
        while len(chosen) < n:
            key = scan.next()
            if key is None:
                scan.rollback()
                return None
            chosen.append(key)
        scan.commit()
        pop = self.blocks.pop
        return [(key, pop(key)) for key in chosen]

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
        for ghost in (self.b1, self.b2):
            if ghost:
                for key in keys:
                    ghost.pop(key, None)

    def remove(self, key: OffloadKey) -> None:
        del self.blocks[key]
        if key in self.t1:
            self.t1.remove(key)
        else:
            self.t2.remove(key)

    def touch(self, keys: Sequence[OffloadKey]) -> None:
        t1, t2, b1, b2, blocks = self.t1, self.t2, self.b1, self.b2, self.blocks
        for key in reversed(keys):
            if key in t1:
                block = blocks[key]
                if block.ref_cnt < 0:
                    # a store in flight is not a second use: stay in T1
                    t1.move_to_end(key)
                else:
                    t1.remove(key)
                    t2.add(key, block)
            elif key in t2:
                t2.move_to_end(key)
            elif key in b1:
                delta = max(1, len(b2) / len(b1))
                self.target_t1_size = min(self.target_t1_size + delta, self.cache_capacity)
                b1.move_to_end(key)
            elif key in b2:
                delta = max(1, len(b1) / len(b2))
                self.target_t1_size = max(self.target_t1_size - delta, 0)
                b2.move_to_end(key)

    def evict(self, n: int, protected: Collection[OffloadKey]) -> Victims | None:
        if n <= 0:
            return []
        scan_t1, scan_t2 = self.t1.scan(protected), self.t2.scan(protected)
        virtual_t1_size = len(self.t1)
        target = int(self.target_t1_size)
        chosen: list[tuple[OffloadKey, bool]] = []
        while len(chosen) < n:
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
            chosen.append((key, from_t1))
        scan_t1.commit()
        scan_t2.commit()
        victims: Victims = []
        for key, from_t1 in chosen:
            victims.append((key, self.blocks.pop(key)))
            (self.b1 if from_t1 else self.b2)[key] = None
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - self.cache_capacity):
                ghost.popitem(last=False)
        return victims

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
