"""A tiny script language and runner for the corpus' own sanity tests.

A script is a list of steps; each step is an op name and a key-index list.
The trace of a manager on a script is every call's observable output
(results, typed errors with key and phase, events), so two managers can be
compared through the documented contract only.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from kvoffload import (
    BlockIDsLoadStoreSpec,
    IllegalTransitionError,
    LoadStoreSpec,
    OffloadingManager,
    OffloadKey,
    ReqContext,
    make_offload_key,
)

Step = tuple[str, Sequence[int]]
Script = Sequence[Step]
Factory = Callable[[int], OffloadingManager]

CTX = ReqContext(req_id="blind")
OPS = ("store", "ok", "fail", "load", "done", "touch", "lookup", "reset", "events")


def K(i: int) -> OffloadKey:
    return make_offload_key(b"blk%03d" % i, i % 3)


def _slots(spec: LoadStoreSpec) -> tuple[int, ...]:
    assert isinstance(spec, BlockIDsLoadStoreSpec)
    assert spec.medium() == "CPU"
    return tuple(int(b) for b in spec.block_ids)


def _name(key: OffloadKey) -> str:
    return f"K{int(key[3:6])}"


def run_step(m: OffloadingManager, op: str, idx: Sequence[int]) -> object:
    keys = [K(i) for i in idx]
    try:
        if op == "store":
            out = m.prepare_store(keys, CTX)
            if out is None:
                return None
            return (
                tuple(map(_name, out.keys_to_store)),
                _slots(out.store_spec),
                tuple(map(_name, out.evicted_keys)),
            )
        if op == "ok":
            m.complete_store(keys, CTX, success=True)
            return None
        if op == "fail":
            m.complete_store(keys, CTX, success=False)
            return None
        if op == "load":
            return _slots(m.prepare_load(keys, CTX))
        if op == "done":
            m.complete_load(keys, CTX)
            return None
        if op == "touch":
            m.touch(keys, CTX)
            return None
        if op == "lookup":
            return (m.lookup_prefix(keys, CTX), tuple(m.lookup(k, CTX) for k in keys))
        if op == "reset":
            m.reset_cache()
            return None
        if op == "events":
            return tuple(
                (tuple(map(_name, e.keys)), e.removed, e.medium, e.block_size)
                for e in m.take_events()
            )
        raise ValueError(op)
    except IllegalTransitionError as err:
        return ("IllegalTransitionError", _name(OffloadKey(err.key)), str(err.phase))
    except Exception as err:  # noqa: BLE001 - the trace records any error
        return ("error", type(err).__name__)


def trace(factory: Factory, num_blocks: int, script: Script) -> list[object]:
    m = factory(num_blocks)
    out = [run_step(m, op, idx) for op, idx in script]
    out.append(run_step(m, "events", ()))
    return out


def random_script(rng: random.Random, n_keys: int, length: int) -> list[Step]:
    steps: list[Step] = []
    weights = (6, 4, 1, 3, 3, 3, 2, 0.3, 2)
    for _ in range(length):
        op = rng.choices(OPS, weights)[0]
        k = rng.randint(1, 3)
        steps.append((op, [rng.randrange(n_keys) for _ in range(k)]))
    return steps
