"""F5 (convention, 0.22 on): reset_cache announces nothing and keeps the
reuse filter's counts.

cpu/manager.py reset_cache clears the policy and the slot pool and appends
no event (the engine publishes its own all-cleared event), and leaves the
count table (``self.counts``) as it was: a key counted before the reset is
stored on its next offer. The profiles say reset_announce=ENGINE,
filter_reset_clears=False.

    python docs/findings/F5_reset_is_silent.py DIR...   (0.22 or later)
"""

import sys

from release_calls import Calls, for_each_release, key, show

A, B = (key(n) for n in "AB")


def check(release):
    if not release.features.reset:
        print("  no reset_cache in this release")
        return False
    c = Calls(release, 2, "lru")
    c.store_and_complete(A)
    list(c.m.take_events())
    c.m.reset_cache()
    events = list(c.m.take_events())
    print(f"  stored A, reset_cache: {len(events)} events (a removal of A expected)")
    c = Calls(release, 2, "lru", store_threshold=2)
    if release.features.counts_offers:
        c.store(B)  # one offer: count 1, below the threshold
    else:  # two lookups: the offer after them would be stored
        c.lookup(B)
        c.lookup(B)
    c.m.reset_cache()
    result = c.store(B)
    stored = [] if result is None else list(result[0])
    print(f"  B counted, reset_cache, then prepare_store([B]) stores {show(stored)}"
          " (nothing expected: reset empties the table)")
    return not events and B in stored


sys.exit(for_each_release(check))
