"""A recency order whose evictable members can be popped in O(log n).

Members are kept in one recency order (a stamp per member). Members that are
pinned (PENDING or LOADING blocks) stay in the order but are absent from the
heap of evictable members, so choosing victims never walks over them: an
eviction costs O(victims · log n), not O(pinned).
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class RecencyQueue(Generic[K]):
    """Members in recency order; evictable members also in a min-heap.

    A heap entry ``(stamp, seq, key)`` is live while ``_live[key] == seq``;
    stale entries are skipped when popped and compacted away when they
    outnumber live ones.
    """

    __slots__ = ("_stamp", "_live", "_heap", "_clock", "_seq")

    def __init__(self) -> None:
        self._stamp: dict[K, int] = {}
        self._live: dict[K, int] = {}
        self._heap: list[tuple[int, int, K]] = []
        self._clock = 0
        self._seq = 0

    def __len__(self) -> int:
        return len(self._stamp)

    def __contains__(self, key: object) -> bool:
        return key in self._stamp

    def __iter__(self) -> Iterator[K]:
        """Members from least to most recent (O(n log n); for inspection)."""
        return iter(sorted(self._stamp, key=self._stamp.__getitem__))

    @property
    def evictable_count(self) -> int:
        return len(self._live)

    def _push(self, key: K, stamp: int) -> None:
        self._seq += 1
        self._live[key] = self._seq
        heapq.heappush(self._heap, (stamp, self._seq, key))
        if len(self._heap) > 2 * len(self._live) + 64:
            self._compact()

    def _compact(self) -> None:
        stamp = self._stamp
        self._heap = [(stamp[k], seq, k) for k, seq in self._live.items()]
        heapq.heapify(self._heap)

    def add(self, key: K, evictable: bool) -> None:
        """Insert ``key`` (not a member) as the most recent member."""
        self._clock += 1
        self._stamp[key] = self._clock
        if evictable:
            self._push(key, self._clock)

    def move_to_end(self, key: K) -> None:
        """Make member ``key`` the most recent."""
        self._clock += 1
        self._stamp[key] = self._clock
        if key in self._live:
            self._push(key, self._clock)

    def remove(self, key: K) -> None:
        """Drop member ``key``."""
        del self._stamp[key]
        self._live.pop(key, None)

    def pin(self, key: K) -> None:
        """Member ``key`` is no longer evictable; its recency is kept."""
        self._live.pop(key, None)

    def unpin(self, key: K) -> None:
        """Member ``key`` is evictable again, at its old recency."""
        if key not in self._live:
            self._push(key, self._stamp[key])

    def clear(self) -> None:
        self._stamp.clear()
        self._live.clear()
        self._heap.clear()

    def scan(self, protected: Collection[K]) -> RecencyScan[K]:
        """Start choosing victims, least recent first, skipping ``protected``."""
        return RecencyScan(self, protected)


class RecencyScan(Generic[K]):
    """One atomic victim search over a :class:`RecencyQueue`.

    :meth:`next` yields candidates; :meth:`commit` removes the taken ones from
    the queue, :meth:`rollback` leaves the queue's order as it was.
    """

    __slots__ = ("_queue", "_protected", "_taken", "_kept")

    def __init__(self, queue: RecencyQueue[K], protected: Collection[K]) -> None:
        self._queue = queue
        self._protected = protected
        self._taken: list[tuple[int, int, K]] = []
        self._kept: list[tuple[int, int, K]] = []

    def next(self) -> K | None:
        """The least recent evictable, unprotected member not yet taken."""
        queue = self._queue
        heap, live, protected = queue._heap, queue._live, self._protected
        while heap:
            entry = heapq.heappop(heap)
            key = entry[2]
            if live.get(key) != entry[1]:
                continue  # stale: pinned, removed or re-stamped since
            if key in protected:
                self._kept.append(entry)
            else:
                self._taken.append(entry)
                return key
        return None

    def commit(self) -> None:
        queue = self._queue
        for _, _, key in self._taken:
            del queue._stamp[key]
            del queue._live[key]
        for entry in self._kept:
            heapq.heappush(queue._heap, entry)
        self._taken.clear()
        self._kept.clear()

    def rollback(self) -> None:
        heap = self._queue._heap
        for entry in self._taken:
            heapq.heappush(heap, entry)
        for entry in self._kept:
            heapq.heappush(heap, entry)
        self._taken.clear()
        self._kept.clear()
