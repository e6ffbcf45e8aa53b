"""A recency order whose victim search never rescans pinned blocks.

Members live in an ``OrderedDict`` (least recent first) together with their
:class:`BlockStatus`. Pinning a block (a load starts, or it is still
PENDING) costs nothing. When a victim search meets a pinned block at the
least-recent end, it *parks* it: the block leaves the ordered dict for a side
table, keeping a park sequence number. A parked block is older than every
member still in the ordered dict (only the oldest end is ever parked, and
members only get newer), and parked blocks are ordered among themselves by
park sequence. When a parked block becomes READY again it enters a small
heap that victim searches consult first; a touch moves it back to the most
recent end.

So a search walks each pinned block once per pin period instead of on
every eviction: an eviction costs O(victims) amortized (plus O(log p) per
returning parked block), whatever the number of pinned blocks, and a touch
is one ``move_to_end``.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Collection, Hashable, Iterable, Iterator, Sequence
from typing import Generic, TypeVar

from kvoffload.impl.block import BlockStatus

K = TypeVar("K", bound=Hashable)


class RecencyQueue(Generic[K]):
    """Members in recency order (see the module docstring)."""

    __slots__ = ("_order", "_parked", "_returned", "_seq")

    def __init__(self) -> None:
        self._order: OrderedDict[K, BlockStatus] = OrderedDict()
        self._parked: dict[K, tuple[int, BlockStatus]] = {}
        self._returned: list[tuple[int, K]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._order) + len(self._parked)

    def __contains__(self, key: object) -> bool:
        return key in self._order or key in self._parked

    def __iter__(self) -> Iterator[K]:
        """Members from least to most recent."""
        parked = sorted(self._parked, key=lambda k: self._parked[k][0])
        return iter([*parked, *self._order])

    def add(self, key: K, block: BlockStatus) -> None:
        """Insert ``key`` (not a member) as the most recent member."""
        self._order[key] = block

    def add_many(self, keys: Sequence[K], blocks: Sequence[BlockStatus]) -> None:
        """Insert ``keys`` in order: the last ends most recent."""
        self._order.update(zip(keys, blocks))

    def move_to_end(self, key: K) -> None:
        """Make member ``key`` the most recent."""
        if key in self._order:
            self._order.move_to_end(key)
        else:
            self._order[key] = self._parked.pop(key)[1]

    def touch(self, keys_in_order: Iterable[K]) -> None:
        """Make each member of ``keys_in_order`` most recent, in turn (the
        last ends most recent); non-members are ignored."""
        keys = list(keys_in_order)
        parked = self._parked
        if parked:
            order = self._order
            for key in parked.keys() & set(keys):
                order[key] = parked.pop(key)[1]
        order = self._order
        deque(map(order.move_to_end, [k for k in keys if k in order]), maxlen=0)

    def remove(self, key: K) -> BlockStatus:
        """Drop member ``key``; its block."""
        block = self._order.pop(key, None)
        if block is None:
            block = self._parked.pop(key)[1]
        return block

    def unpinned(self, key: K) -> None:
        """Member ``key``'s block became READY again."""
        entry = self._parked.get(key)
        if entry is not None:
            heapq.heappush(self._returned, (entry[0], key))
            if len(self._returned) > 2 * len(self._parked) + 64:
                self._returned = [(s, k) for k, (s, b) in self._parked.items() if b.ref_cnt == 0]
                heapq.heapify(self._returned)

    def has_parked(self) -> bool:
        """Whether any member is parked (only then does unpinning matter)."""
        return bool(self._parked)

    def unpinned_many(self, keys: Iterable[K]) -> None:
        """The blocks of ``keys`` became READY again (non-members ignored)."""
        parked = self._parked
        if parked:
            for key in parked.keys() & set(keys):
                self.unpinned(key)

    def clear(self) -> None:
        self._order.clear()
        self._parked.clear()
        self._returned.clear()

    def scan(self, protected: Collection[K]) -> RecencyScan[K]:
        """Start choosing victims, least recent first, skipping ``protected``."""
        return RecencyScan(self, protected)


class RecencyScan(Generic[K]):
    """One atomic victim search over a :class:`RecencyQueue`.

    :meth:`next` yields READY, unprotected members, least recent first;
    :meth:`commit` removes the taken ones, :meth:`rollback` keeps them.
    Either way the pinned blocks met at the oldest end are parked, which
    changes no member's recency.
    """

    __slots__ = ("_queue", "_protected", "_from_parked", "_kept", "_iter",
                 "_from_order", "_to_park", "_parking", "_rollback_parks")

    def __init__(self, queue: RecencyQueue[K], protected: Collection[K]) -> None:
        self._queue = queue
        self._protected = protected
        self._from_parked: list[tuple[int, K]] = []
        self._kept: list[tuple[int, K]] = []
        self._iter: Iterator[tuple[K, BlockStatus]] | None = None
        self._from_order: list[K] = []
        self._to_park: list[K] = []
        self._parking = True
        self._rollback_parks: int | None = None

    def next(self) -> K | None:
        """The least recent READY, unprotected member not yet taken."""
        queue, protected = self._queue, self._protected
        returned, parked = queue._returned, queue._parked
        while returned:
            entry = heapq.heappop(returned)
            seq, key = entry
            found = parked.get(key)
            if found is None or found[0] != seq or found[1].ref_cnt != 0:
                continue  # stale: touched, removed or pinned again
            if key in protected:
                self._kept.append(entry)
                continue
            self._from_parked.append(entry)
            return key
        if self._iter is None:
            self._iter = iter(queue._order.items())
        for key, block in self._iter:
            if block.ref_cnt != 0:
                if self._parking:
                    self._to_park.append(key)
                continue
            if key in protected:
                # parking past a member that stays would make a younger
                # parked block look older than it: stop parking here
                self._parking = False
                continue
            if self._rollback_parks is None:
                # a rollback keeps this member: only blocks parked before it
                # may stay parked then
                self._rollback_parks = len(self._to_park)
            self._from_order.append(key)
            return key
        return None

    def _finish(self, commit: bool) -> None:
        queue = self._queue
        order, parked, returned = queue._order, queue._parked, queue._returned
        for entry in self._kept:
            heapq.heappush(returned, entry)
        if commit:
            for _, key in self._from_parked:
                del parked[key]
            for key in self._from_order:
                del order[key]
        else:
            for entry in self._from_parked:
                heapq.heappush(returned, entry)
        to_park = self._to_park
        if not commit and self._rollback_parks is not None:
            to_park = to_park[: self._rollback_parks]
        for key in to_park:
            queue._seq += 1
            parked[key] = (queue._seq, order.pop(key))
        self._iter = None

    def commit(self) -> None:
        """Remove the members :meth:`next` returned."""
        self._finish(True)

    def rollback(self) -> None:
        """Keep every member; only park the pinned blocks met."""
        self._finish(False)
