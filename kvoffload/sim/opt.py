"""Belady's clairvoyant optimum for the scheduler protocol.

The game
========

A cache holds at most ``capacity`` blocks. Request ``r`` brings its chain
``k_0 … k_{n-1}``. Its hits are the longest prefix of the chain that is
cached (what ``lookup_prefix`` counts). Then the rest of the chain,
``k_h …``, is offered for storage: each offered block that is not cached may
be admitted or bypassed, and admitting one into a full cache evicts a cached
block that is not offered in this request. Nothing else changes the cache.
The score is the total number of hits; a policy, LRU or ARC behind a reuse
filter or not, is one way of playing this game, so no policy scores more
than the optimum.

The strategy
============

Let ``next(b)`` be the index of the next request after the current one whose
chain contains ``b`` (infinity when none). For each offered block ``m`` not
cached, in chain order:

- if ``next(m)`` is infinite, bypass it;
- else if the cache has room, admit it;
- else, with ``v`` the cached, non-offered block of farthest ``next``
  (ties: the deepest in its chain), admit ``m`` and evict ``v`` when
  ``next(v) > next(m)``, otherwise bypass ``m``.

Why this is optimal: chain hashing makes every chain a path in a prefix
tree, so a block's next use is never later than its child's. Evicting the
farthest (deepest on ties) therefore never evicts a parent before its child,
and bypassing is monotone along a chain: the cache stays closed under
prefixes, so its prefix hits equal its plain hits. Plain hits are bounded
by Belady's optimum with bypass (the classic result), and prefix hits never
exceed plain hits for any strategy. ``tests/sim`` checks the result against
an exhaustive search over every admission and eviction choice on small
traces.

Cost: O(log n) per block reference (a lazily cleaned max-heap on ``next``).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable

from kvoffload.sim.result import SimResult
from kvoffload.spec.errors import ConfigurationError
from kvoffload.workloads import Trace


def next_uses(trace: Trace) -> list[list[int]]:
    """For each request and chain position, the index of the next request
    that references the same block (``trace.num_requests`` when none)."""
    never = trace.num_requests
    upcoming: dict[int, int] = {}
    result: list[list[int]] = [[] for _ in trace.chains]
    for index in range(trace.num_requests - 1, -1, -1):
        chain = trace.chains[index]
        get = upcoming.get
        result[index] = [get(block, never) for block in chain]
        for block in chain:
            upcoming[block] = index
    return result


def simulate_opt(
    trace: Trace,
    capacity: int,
    progress: Callable[[int], None] | None = None,
) -> SimResult:
    """Replay ``trace`` under the optimal strategy (see the module doc).

    Raises :class:`ConfigurationError` if ``capacity`` is not a positive int.
    """
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        raise ConfigurationError(f"capacity must be a positive int, got {capacity!r}")
    started = time.perf_counter()
    never = trace.num_requests
    uses = next_uses(trace)
    # cached block -> its next use; heap of (-next use, -depth, block), lazy:
    # an entry is live while the block is cached with that next use.
    cached: dict[int, int] = {}
    heap: list[tuple[int, int, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    hit_blocks = stored = evicted = refs = 0
    report_every = 512

    for index, chain in enumerate(trace.chains):
        nexts = uses[index]
        length = len(chain)
        refs += length
        hits = 0
        while hits < length and chain[hits] in cached:
            hits += 1
        hit_blocks += hits
        for depth in range(hits):
            block, nxt = chain[depth], nexts[depth]
            cached[block] = nxt
            push(heap, (-nxt, -depth, block))
        offered = chain[hits:]
        protected: set[int] | None = None
        for depth in range(hits, length):
            block, nxt = chain[depth], nexts[depth]
            if block in cached:
                # cached behind a miss (not possible for a prefix-closed
                # cache; kept for generality): it is referenced again
                cached[block] = nxt
                push(heap, (-nxt, -depth, block))
                continue
            if nxt == never:
                continue
            if len(cached) < capacity:
                cached[block] = nxt
                push(heap, (-nxt, -depth, block))
                stored += 1
                continue
            if protected is None:
                protected = set(offered)
            set_aside: list[tuple[int, int, int]] = []
            victim: tuple[int, int, int] | None = None
            while heap:
                entry = heap[0]
                if cached.get(entry[2]) != -entry[0]:
                    pop(heap)  # stale
                elif entry[2] in protected:
                    set_aside.append(pop(heap))
                else:
                    victim = entry
                    break
            for entry in set_aside:
                push(heap, entry)
            if victim is None or -victim[0] <= nxt:
                continue  # bypass: nothing cached is needed later than m
            pop(heap)
            del cached[victim[2]]
            evicted += 1
            cached[block] = nxt
            push(heap, (-nxt, -depth, block))
            stored += 1
        if len(heap) > 4 * len(cached) + 1024:
            heap = [entry for entry in heap if cached.get(entry[2]) == -entry[0]]
            heapq.heapify(heap)
        if progress is not None and index % report_every == 0:
            progress(index)

    if progress is not None:
        progress(trace.num_requests)
    return SimResult(
        policy="opt",
        capacity=capacity,
        requests=trace.num_requests,
        block_refs=refs,
        hit_blocks=hit_blocks,
        blocks_stored=stored,
        blocks_evicted=evicted,
        blocks_loaded=hit_blocks,
        stores_refused=0,
        seconds=time.perf_counter() - started,
    )
