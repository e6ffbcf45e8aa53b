"""F7 (convention, 0.24-0.30): LRU orders blocks by when they became
evictable, not by when they were stored or touched.

From 0.24 LRUCachePolicy (cpu/policies/lru.py) keeps only evictable blocks
in its order: a block enters it (most recent) when its store completes or its
last load completes, and touch moves only evictable blocks. Here A is
prepared first but completes last, so B is the older one and is evicted.
Before 0.24 (and from 0.31, which ranks a block when it is stored) A is
evicted.

    python docs/findings/F7_lru_orders_by_release.py DIR...
"""

import sys

from release_calls import Calls, for_each_release, key, show

A, B, C = (key(n) for n in "ABC")


def check(release):
    c = Calls(release, 2, "lru")
    c.store(A)
    c.store(B)
    c.complete_store(B)
    c.complete_store(A)
    result = c.store(C)
    print(f"  prepare_store([C]) evicts {show(result[1])}")
    return list(result[1]) == [B]


sys.exit(for_each_release(check))
