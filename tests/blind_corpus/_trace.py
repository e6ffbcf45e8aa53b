"""A tiny script language and runner for the corpus' own sanity tests.

A script is a list of steps; each step is an op name and a key-index list.
The trace of a manager on a script is every call's observable output
(results, typed errors with key and phase, events), so two managers can be
compared through the documented contract only.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import cast

from kvoffload import (
    BlockIDsLoadStoreSpec,
    IllegalTransitionError,
    LoadStoreSpec,
    OffloadingError,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    ReqContext,
    make_offload_key,
)
from kvoffload.spec.model import ManagerModel

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
    except Exception as err:
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


def model_check(
    factory: Factory, num_blocks: int, script: Script, policy: str = "any"
) -> str | None:
    """Drive ``kvoffload.spec.model.ManagerModel`` (docs/SPEC.md §8) in
    lockstep with a manager; the manager's victims and slots are handed to
    the model, which checks them. The first disagreement, or None."""
    model = ManagerModel.create(num_blocks, policy, enable_events=True)
    m = factory(num_blocks)
    for n, (op, idx) in enumerate(script):
        keys = [K(i) for i in idx]
        where = f"step {n} {op}{list(idx)}"
        try:
            if op == "store":
                out = m.prepare_store(keys, CTX)
                if out is None:
                    model, res = model.prepare_store(keys)
                    if res is not None:
                        return f"{where}: refused, model stores {res}"
                    continue
                if out.keys_to_store or out.evicted_keys or _slots(out.store_spec):
                    model, res = model.prepare_store(
                        keys,
                        victims=list(out.evicted_keys),
                        slots=_slots(out.store_spec),
                    )
                else:
                    model, res = model.prepare_store(keys)
                if res is None or tuple(res.keys_to_store) != tuple(out.keys_to_store):
                    return f"{where}: model {res}, manager {out}"
                continue
            exp_exc = _model_call(model, op, keys)
            m_res = _manager_call(m, op, keys)
            if isinstance(exp_exc, tuple) and exp_exc and exp_exc[0] == "raise":
                if m_res != exp_exc:
                    return f"{where}: model {exp_exc}, manager {m_res}"
                continue
            model, expected = cast("tuple[ManagerModel, object]", exp_exc)
            if op == "events":
                events = cast("tuple[OffloadingEvent, ...]", expected)
                expected = tuple((tuple(e.keys), e.removed) for e in events)
            if m_res != expected:
                return f"{where}: model {expected}, manager {m_res}"
        except Exception as err:
            return f"{where}: {type(err).__name__}: {err}"
    return None


def _raised(err: OffloadingError) -> tuple[str, str, object]:
    return ("raise", type(err).__name__, getattr(err, "key", None))


def _model_call(model: ManagerModel, op: str, keys: list[OffloadKey]) -> object:
    try:
        if op in ("ok", "fail"):
            return model.complete_store(keys, success=op == "ok")
        if op == "load":
            return model.prepare_load(keys)
        if op == "done":
            return model.complete_load(keys)
        if op == "touch":
            return model.touch(keys)
        if op == "lookup":
            return model.lookup_prefix(keys)
        if op == "reset":
            return model.reset_cache()
        return model.take_events()
    except OffloadingError as err:
        return _raised(err)


def _manager_call(m: OffloadingManager, op: str, keys: list[OffloadKey]) -> object:
    try:
        if op in ("ok", "fail"):
            m.complete_store(keys, CTX, success=op == "ok")
        elif op == "load":
            return _slots(m.prepare_load(keys, CTX))
        elif op == "done":
            m.complete_load(keys, CTX)
        elif op == "touch":
            m.touch(keys, CTX)
        elif op == "lookup":
            return m.lookup_prefix(keys, CTX)
        elif op == "reset":
            m.reset_cache()
        else:
            return tuple((tuple(e.keys), e.removed) for e in m.take_events())
    except OffloadingError as err:
        return _raised(err)
    return None
