"""F6 (defect at the engine's level, 0.20-0.28): a prompt repeated
store_threshold times is not offloaded; one block is, per two requests.

From 0.20 the manager has no list lookup: the engine looks keys up one by
one and stops at the first miss, and the reuse filter counts lookups
(reuse_manager.py lookup; cpu/manager.py lookup from 0.22). Keys past the
first miss are never counted, so each pair of requests admits one more
block. 0.19 counts the whole list; 0.29 counts offers: the second request
stores the whole prompt. This script plays the scheduler: per request,
look up to the first miss, then offer the blocks that missed.

    python docs/findings/F6_filter_counts_first_miss.py DIR...
"""

import sys

from release_calls import Calls, for_each_release, key

PROMPT = [key(f"P{i}") for i in range(4)]


def request(c):
    if c.old:
        hits = c.m.lookup(PROMPT)
    else:
        hits = 0
        while hits < len(PROMPT) and c.lookup(PROMPT[hits]) is True:
            hits += 1
    if hits < len(PROMPT):
        c.store_and_complete(*PROMPT[hits:])
    return hits


def check(release):
    c = Calls(release, 8, "lru", store_threshold=2)
    seen = []
    for _ in range(8):
        seen.append(request(c))
    print(f"  blocks already offloaded at each of 8 requests: {seen}")
    # threshold 2: the third request must find the whole prompt offloaded
    return seen[2] < len(PROMPT)


sys.exit(for_each_release(check))
