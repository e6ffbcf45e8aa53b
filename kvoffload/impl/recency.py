"""A recency order whose victim search never rescans pinned blocks.

Members live in an ``OrderedDict`` (least recent first) together with their
:class:`BlockStatus`. Pinning a block (a load starts, or it is still
PENDING) costs nothing. When a victim search meets a pinned block at the
least-recent end, it *parks* it: the block leaves the ordered dict for a side
table, keeping a park sequence number (``BlockStatus.park_seq``). A parked
block is older than every member still in the ordered dict (only the oldest
end is ever parked, and members only get newer), and parked blocks are
ordered among themselves by park sequence. When a parked block becomes READY
again it enters a small heap that victim searches consult first; a touch
moves it back to the most recent end.

A search takes members off the least-recent end as it goes (one
``popitem``), and puts back what it does not evict, in order, when it ends.
So a search walks each pinned block once per pin period instead of on every
eviction: an eviction costs O(victims) amortized (plus O(log p) per
returning parked block), whatever the number of pinned blocks, and a touch
is one ``move_to_end``.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from collections.abc import Collection, Hashable, Iterable, Iterator, Sequence
from itertools import islice
from typing import Generic, TypeVar

from kvoffload.impl.block import BlockStatus

K = TypeVar("K", bound=Hashable)

# Below this many keys a plain loop beats building a C-level pipeline
# (``deque(map(...))``), which pays off on bulk operations.
BULK_MIN = 32

# Whether this module runs compiled (mypyc): then a plain loop is the
# fastest way to fill an ordered dict; interpreted, ``update`` is.
_COMPILED = not __file__.endswith(".py")


class RecencyQueue(Generic[K]):
    """Members in recency order (see the module docstring)."""

    __slots__ = ("_order", "_parked", "_returned", "_seq")

    def __init__(self) -> None:
        self._order: OrderedDict[K, BlockStatus] = OrderedDict()
        self._parked: dict[K, BlockStatus] = {}
        self._returned: list[tuple[int, K]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._order) + len(self._parked)

    def __contains__(self, key: object) -> bool:
        return key in self._order or key in self._parked

    def __iter__(self) -> Iterator[K]:
        """Members from least to most recent."""
        parked = sorted(self._parked, key=lambda k: self._parked[k].park_seq)
        return iter([*parked, *self._order])

    def add(self, key: K, block: BlockStatus) -> None:
        """Insert ``key`` (not a member) as the most recent member."""
        self._order[key] = block

    def add_many(self, keys: Sequence[K], blocks: Sequence[BlockStatus]) -> None:
        """Insert ``keys`` in order: the last ends most recent."""
        order = self._order
        if _COMPILED:  # a native loop: no pair tuples, no generic update
            for key, block in zip(keys, blocks):
                order[key] = block
        else:
            order.update(zip(keys, blocks))

    def move_to_end(self, key: K) -> None:
        """Make member ``key`` the most recent."""
        if key in self._order:
            self._order.move_to_end(key)
        else:
            self._order[key] = self._parked.pop(key)

    def renew(self, key: K) -> bool:
        """Make ``key`` the most recent member if it is one; whether it is
        (one membership test and one move: the per-key path of a policy)."""
        order = self._order
        if key in order:
            order.move_to_end(key)
            return True
        parked = self._parked
        if parked:
            block = parked.pop(key, None)
            if block is not None:
                order[key] = block
                return True
        return False

    def take(self, key: K) -> BlockStatus | None:
        """Drop ``key`` if it is a member; its block, else None."""
        block = self._order.pop(key, None)
        if block is None and self._parked:
            block = self._parked.pop(key, None)
        return block

    def touch(self, keys_in_order: Iterable[K]) -> None:
        """Make each member of ``keys_in_order`` most recent, in turn (the
        last ends most recent); non-members are ignored."""
        keys = list(keys_in_order)
        parked = self._parked
        order = self._order
        if parked:
            for key in parked.keys() & set(keys):
                order[key] = parked.pop(key)
        deque(map(order.move_to_end, [k for k in keys if k in order]), maxlen=0)

    def remove(self, key: K) -> BlockStatus:
        """Drop member ``key``; its block."""
        block = self._order.pop(key, None)
        if block is None:
            block = self._parked.pop(key)
        return block

    def unpinned(self, key: K) -> None:
        """Member ``key``'s block became READY again."""
        block = self._parked.get(key)
        if block is not None:
            heapq.heappush(self._returned, (block.park_seq, key))
            if len(self._returned) > 2 * len(self._parked) + 64:
                self._returned = [
                    (b.park_seq, k) for k, b in self._parked.items() if b.ref_cnt == 0
                ]
                heapq.heapify(self._returned)

    def num_ordered(self) -> int:
        """Members not parked."""
        return len(self._order)

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

    def peek_oldest(
        self, n: int, protected: Collection[K]
    ) -> tuple[list[K], list[BlockStatus]] | None:
        """The ``n`` least recent members and their blocks, when a victim
        search would take exactly those: no parked block is due back, and
        each is READY and not in ``protected``. Else None. Changes nothing.

        The bulk path of an eviction: one walk, no per-member objects;
        :meth:`drop_oldest` then removes them at C speed.
        """
        order = self._order
        if self._returned or n > len(order):
            return None
        keys: list[K] = []
        blocks: list[BlockStatus] = []
        # one walk over the items: an ordered dict finds each node by key,
        # so keys and values walked apart would cost a third more lookups
        for key, block in islice(order.items(), n):
            if block.ref_cnt != 0:
                return None
            keys.append(key)  # compiled, a list primitive (a bound append is a call)
            blocks.append(block)
        if len(protected) > 0 and any(map(protected.__contains__, keys)):
            return None
        return keys, blocks

    def drop_oldest(self, keys: list[K]) -> None:
        """Remove ``keys``, the least recent members (as
        :meth:`peek_oldest` gave them)."""
        order = self._order
        if len(keys) == len(order):
            order.clear()
        elif len(keys) < BULK_MIN:
            for key in keys:
                del order[key]
        else:
            deque(map(order.__delitem__, keys), maxlen=0)

    def scan(self, protected: Collection[K]) -> RecencyScan[K]:
        """Start choosing victims, least recent first, skipping ``protected``."""
        return RecencyScan(self, protected)


class RecencyScan(Generic[K]):
    """One atomic victim search over a :class:`RecencyQueue`.

    :meth:`next` yields READY, unprotected members, least recent first;
    :meth:`commit` removes the taken ones, :meth:`rollback` keeps them.
    Either way the pinned blocks met at the oldest end before the first
    member taken or kept are parked, which changes no member's recency.
    Until one of the two is called, the members met are off the queue.
    """

    __slots__ = (
        "_from_parked",
        "_kept",
        "_num_kept",
        "_parking",
        "_popped_blocks",
        "_popped_keys",
        "_popped_taken",
        "_protected",
        "_queue",
        "_seen_parked",
    )

    def __init__(self, queue: RecencyQueue[K], protected: Collection[K]) -> None:
        self._queue = queue
        self._protected = protected
        self._from_parked: list[tuple[int, K]] = []
        self._kept: list[tuple[int, K]] = []
        # parked keys already met: the heap may hold one entry per unpin
        self._seen_parked: set[K] = set()
        # members taken off the least-recent end and not parked, in order
        self._popped_keys: list[K] = []
        self._popped_blocks: list[BlockStatus] = []
        self._popped_taken: list[bool] = []
        self._num_kept = 0
        self._parking = True

    def next(self) -> K | None:
        """The least recent READY, unprotected member not yet taken."""
        queue, protected = self._queue, self._protected
        returned, parked = queue._returned, queue._parked
        while returned:
            entry = heapq.heappop(returned)
            seq, key = entry
            found = parked.get(key)
            if found is None or found.park_seq != seq or found.ref_cnt != 0:
                continue  # stale: touched, removed or pinned again
            if key in self._seen_parked:
                continue  # a second entry for one return (unpinned twice)
            self._seen_parked.add(key)
            if key in protected:
                self._kept.append(entry)
                continue
            self._from_parked.append(entry)
            return key
        order = queue._order
        while order:
            key, block = order.popitem(last=False)
            if block.ref_cnt != 0:
                if self._parking:
                    queue._seq += 1
                    block.park_seq = queue._seq
                    parked[key] = block
                    continue
                taken = False
            else:
                taken = key not in protected
            # parking past a member that stays, or that a rollback puts back,
            # would make a younger parked block look older than it
            self._parking = False
            self._popped_keys.append(key)
            self._popped_blocks.append(block)
            self._popped_taken.append(taken)
            if taken:
                return key
            self._num_kept += 1
        return None

    def _put_back(self, keep_taken: bool) -> None:
        """Return the popped members (the taken ones only if ``keep_taken``)
        to the least-recent end, in their order."""
        order = self._queue._order
        keys, blocks, taken = self._popped_keys, self._popped_blocks, self._popped_taken
        for index in range(len(keys) - 1, -1, -1):
            if keep_taken or not taken[index]:
                key = keys[index]
                order[key] = blocks[index]
                order.move_to_end(key, last=False)

    def commit(self) -> None:
        """Remove the members :meth:`next` returned."""
        queue = self._queue
        parked, returned = queue._parked, queue._returned
        for entry in self._kept:
            heapq.heappush(returned, entry)
        for _, key in self._from_parked:
            del parked[key]
        if self._num_kept:
            self._put_back(False)

    def rollback(self) -> None:
        """Keep every member; only park the pinned blocks met first."""
        returned = self._queue._returned
        for entry in self._kept:
            heapq.heappush(returned, entry)
        for entry in self._from_parked:
            heapq.heappush(returned, entry)
        if self._popped_keys:
            self._put_back(True)
