"""F1 (defect, 0.19-0.32): ARC refuses a store although a READY block could
be evicted.

ARCCachePolicy.evict (cpu/policies/arc.py) tries T2 when T1 is below the
adaptive target; when T2 has no evictable block (here: its only block is
offered again) it returns None without trying T1, whose READY block D could
go. The store is refused with room. 0.33 tries T1 again and stores.

    python docs/findings/F1_arc_refuses_store_with_room.py DIR...
"""

import sys

from release_calls import Calls, for_each_release, key, show

A, B, C, D, E = (key(n) for n in "ABCDE")


def check(release):
    c = Calls(release, 2, "arc")
    c.store_and_complete(A)
    c.touch(A)               # A READY in T1 -> T2
    c.store_and_complete(B)  # T1 = [B]
    c.store_and_complete(C)  # evicts B (T1 >= target 0): B1 = [B]
    c.touch(B)               # ghost hit in B1: target 1
    c.store_and_complete(D)  # evicts C: B1 = [B, C]
    c.touch(C)               # ghost hit in B1: target 2 > |T1| = 1
    result = c.store(A, E)   # E needs one slot; D (T1, READY) may go
    print(f"  prepare_store([A, E]) -> {None if result is None else (show(result[0]), show(result[1]))}")
    return result is None


sys.exit(for_each_release(check))
