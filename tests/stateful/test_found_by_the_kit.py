"""Defects the kit found in the library itself, kept as regression tests.

``CPUOffloadingManager`` (LRU and ARC) and ``LRUOffloadingManager`` raised
``KeyError`` from their lazy parking of pinned blocks (``RecencyQueue``):
a refused store parks a PENDING block; the block is completed, then loaded
twice and unloaded, which queued its return to the evictable set twice, and
the next store that needed two victims took the same parked block twice.
The swarm driver found it within a few hundred runs; the calls below are its
shrunk counterexample. Fixed in ``RecencyScan.next`` (a parked block is met
at most once per search).
"""

from __future__ import annotations

import pytest

from kvoffload import ReqContext, make_offload_key
from kvoffload.spec.contract import OffloadingManager
from kvoffload.stateful.targets import backend_lru, cpu_arc, cpu_lru

K = [make_offload_key(b"blk%02d" % i, i % 2) for i in range(4)]
CTX = ReqContext(req_id="kit")


@pytest.mark.parametrize("factory", [cpu_lru, cpu_arc, backend_lru], ids=lambda f: f.__name__)
def test_a_block_parked_by_a_refused_store_is_evicted_once(factory: object) -> None:
    manager: OffloadingManager = factory(2)  # type: ignore[operator]
    manager.prepare_store([K[3]], CTX)
    manager.prepare_store([K[1]], CTX)
    assert manager.prepare_store([K[0]], CTX) is None  # both slots PENDING: parked
    manager.complete_store([K[3]], CTX)
    manager.prepare_load([K[3], K[3]], CTX)
    manager.complete_load([K[3], K[3]], CTX)
    # two new keys, no free slot, one eligible victim (K[1] is PENDING): refused
    assert manager.prepare_store([K[2], K[0]], CTX) is None
    # one new key: the block loaded twice is the one victim, taken once
    out = manager.prepare_store([K[2]], CTX)
    assert out is not None
    assert list(out.keys_to_store) == [K[2]]
    assert list(out.evicted_keys) == [K[3]]
    assert manager.lookup(K[3], CTX) is False
    manager.complete_store([K[2]], CTX)
    assert manager.lookup(K[2], CTX) is True
