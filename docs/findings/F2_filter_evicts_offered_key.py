"""F2 (defect, 0.19-0.30): behind the reuse filter, a stored key that is
offered again can be evicted by that very offer.

The filter drops offered keys whose count is below the threshold before the
manager sees them (reuse_manager.py up to 0.21; cpu/manager.py prepare_store
from 0.22, which reassigns ``keys`` before ``protected = set(keys)``). A key
already stored whose count has left the bounded table is dropped too, so it
is no longer protected, and the same call evicts it to make room for the
keys that passed. cpu/manager.py's own comment says "a block that was
already stored must remain in the cache after this call". 0.31 protects the
whole offer (here: it refuses the store, as nothing else can go).

    python docs/findings/F2_filter_evicts_offered_key.py DIR...
"""

import sys

from release_calls import Calls, for_each_release, key, show

A, B, C, D = (key(n) for n in "ABCD")


def check(release):
    if release.features.counts_offers:  # 0.29 on: offers are counted
        c = Calls(release, 1, "lru", store_threshold=2, max_tracker_size=3)
        c.store(A)
        c.store_and_complete(A)  # second offer: count 2, stored
        c.store(B); c.store(C); c.store(D)  # table {B, C, D}: A's count left it
        offered = (A, D)         # A counted again (1), D reaches 2
    else:                        # lookups are counted
        c = Calls(release, 1, "lru", store_threshold=2, max_tracker_size=1)
        c.lookup(A); c.lookup(A)
        c.store_and_complete(A)  # count 2: stored
        c.lookup(B); c.lookup(B) # table {B: 2}: A's count left it
        offered = (A, B)
    result = c.store(*offered)
    evicted = [] if result is None else list(result[1])
    print(f"  prepare_store({show(offered)}) -> "
          f"{None if result is None else (show(result[0]), show(evicted))}")
    return A in evicted


sys.exit(for_each_release(check))
