"""F4 (convention, every release): an offer that names a key twice takes
two slots for it, and one is never freed.

cpu/manager.py prepare_store keeps every offered key it does not track,
repeats included, allocates one slot each and inserts the key twice (the
second insert replaces the first, whose slot is lost). vLLM's scheduler
offers each new block once, so the profiles say offers_repeat_keys=False.

    python docs/findings/F4_repeated_key_offer_leaks_slot.py DIR...
"""

import sys

from release_calls import Calls, for_each_release, key, show

A, B = (key(n) for n in "AB")


def check(release):
    c = Calls(release, 2, "lru")
    result = c.store_and_complete(A, A)
    print(f"  prepare_store([A, A]) -> stores {show(result[0])}; free slots after: {c.free_slots()} (expected 1)")
    result = c.store(B)
    print(f"  prepare_store([B]) -> {None if result is None else (show(result[0]), 'evicts ' + show(result[1]))}")
    return c.free_slots() == 0 and result is not None and len(result[1]) == 1


sys.exit(for_each_release(check))
