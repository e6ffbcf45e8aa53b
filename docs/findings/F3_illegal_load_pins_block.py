"""F3 (defect, every release): a prepare_load that fails leaves the keys
before the bad one pinned for good.

CPUOffloadingManager.prepare_load (cpu/manager.py) increments each block's
ref_cnt and asserts on the next key; the assert fires after the earlier
keys were pinned, and no complete_load will ever come for them. Here the
only block stays LOADING and a later store is refused: a slot is lost.
With ``python -O`` the asserts vanish: a PENDING key passes (its ref_cnt
goes from -1 to 0: READY while its store is still in flight).

    python docs/findings/F3_illegal_load_pins_block.py DIR...
    python -O docs/findings/F3_illegal_load_pins_block.py DIR...
"""

import sys

from release_calls import Calls, for_each_release, key, show

A, B, C = (key(n) for n in "ABC")


def check(release):
    c = Calls(release, 1, "lru")
    if sys.flags.optimize:
        c2 = Calls(release, 2, "lru")
        c2.store(B)                  # B PENDING: store in flight
        c2.load(B)                   # illegal: asserts are gone
        answer = c2.lookup(B)
        print(f"  python -O: prepare_load([B]) on a PENDING key accepted; lookup(B) -> {answer}")
        return answer is True
    c.store_and_complete(A)
    try:
        c.load(A, B)                 # B was never stored: illegal
    except Exception as error:       # noqa: BLE001 - the release asserts
        print(f"  prepare_load([A, B]) raised {type(error).__name__}")
    result = c.store(C)              # A is READY again? then it is evicted
    print(f"  prepare_store([C]) -> {None if result is None else (show(result[0]), show(result[1]))}")
    return result is None


sys.exit(for_each_release(check))
