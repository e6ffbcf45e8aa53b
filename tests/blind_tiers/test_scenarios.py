"""One kit-free scenario per defective tier: a short call sequence on which
the defective tier breaks the tier contract while the correct tier of its
design, run through the same sequence, does not.

A scenario is a function ``(factory) -> violations``; the tests assert it
finds nothing on the correct tier and something on the defective one.
Thread interleavings are forced with one-shot gates on the tiers' hook
points, so every scenario is deterministic; the only waits are bounded
(``Driver.wait``, a gate's timeout, the 1 s bound on RETRY, and a 0.4 s
grace in which a helper thread shows whether it is blocked or a worker gets
to publish).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Callable

import pytest

from kvoffload.spec.contract import LookupResult, ReqContext
from kvoffload.spec.keys import OffloadKey, make_offload_key
from tests.blind_tiers._common import TierFactory
from tests.blind_tiers._driver import Driver, EventView, key
from tests.blind_tiers.manifest import BY_NAME, DESIGNS, ENTRIES, correct_entry

Scenario = Callable[[TierFactory], list[str]]

HIT = LookupResult.HIT
GRACE_S = 0.4


# ---------------------------------------------------------------------------
# Scenarios.


def roundtrip(factory: TierFactory) -> list[str]:
    """Store two keys from rows 0 and 1 (every row distinct), load them into
    rows 4 and 5: exact bytes, and no other row written."""
    with Driver(factory, capacity=4) as d:
        content = {r: d.fill(r, f"row{r}") for r in range(8)}
        a, b = key("a"), key("b")
        stored = d.store([a, b], [0, 1])
        if stored != {a, b}:
            d.violate(f"a plain store of two keys into an empty tier failed: {len(stored)} stored")
        before = {r: d.row(r) for r in range(8)}
        job = d.submit_load([a, b], [4, 5])
        d.wait(job)
        if d.ok_keys(job) != {a, b}:
            d.violate("a load of two stored keys failed")
        if d.row(4) != content[0] or d.row(5) != content[1]:
            d.violate("loaded rows differ from the rows stored")
        for r in (0, 1, 2, 3, 6, 7):
            if d.row(r) != before[r]:
                d.violate(f"a load wrote row {r}, which is not in its job")
        return d.violations


def exactly_once(factory: TierFactory) -> list[str]:
    """Three stores, polled repeatedly: each reported exactly once."""
    with Driver(factory, capacity=4) as d:
        for r in range(3):
            d.fill(r, f"row{r}")
            d.submit_store([key(f"k{r}")], [r])
        d.drain()
        d.poll()
        d.poll()
        return d.violations


def drain_reports_all(factory: TierFactory) -> list[str]:
    """A store and a load queued, then ``drain_jobs``: both reported by the
    next poll, and the store's key readable."""
    with Driver(factory, capacity=4) as d:
        a, b = key("a"), key("b")
        pa = d.fill(0, "a")
        pb = d.fill(1, "b")
        d.store([a], [0])
        d.submit_store([b], [1])
        d.submit_load([a], [6])
        d.drain()
        d.verify({a: pa, b: pb}, scratch=10)
        return d.violations


def no_room_fails_cleanly(factory: TierFactory) -> list[str]:
    """Capacity 1, A held and a load of A queued, then a store of B: B either
    fails and reads MISS, or is stored; A's load succeeds."""
    with Driver(factory, capacity=1) as d:
        a, b = key("a"), key("b")
        pa, pb = d.fill(0, "a"), d.fill(1, "b")
        d.store([a], [0])
        load = d.submit_load([a], [6])
        store = d.submit_store([b], [1])
        d.drain()
        if b not in d.ok_keys(store) and d.lookup(b) is HIT:
            d.violate("a store reported failed reads HIT")
        if a not in d.ok_keys(load) or d.row(6) != pa:
            d.violate("the load of a held key failed")
        d.verify({a: pa, b: pb}, scratch=10)
        return d.violations


def load_pins(pause: str | None) -> Scenario:
    """Capacity 2, A and B held, a load of A in flight (paused at ``pause``
    for a threaded tier), then a store of C that needs room: A must not be
    the victim — its load succeeds with A's bytes."""

    def scenario(factory: TierFactory) -> list[str]:
        with Driver(factory, capacity=2) as d:
            a, b, c = key("a"), key("b"), key("c")
            pa, pb, pc = d.fill(0, "a"), d.fill(1, "b"), d.fill(2, "c")
            d.store([a, b], [0, 1])
            gate = d.gate(pause) if pause else None
            load = d.submit_load([a], [6])
            if gate is not None and not gate.reached.wait(5.0):
                d.violate("the load never started")
            store = d.submit_store([c], [2])
            if gate is not None:
                d.wait(store)
                gate.go.set()
            d.drain()
            if a not in d.ok_keys(load) or d.row(6) != pa:
                d.violate("a key being loaded was evicted: its load failed")
            d.verify({a: pa, b: pb, c: pc}, scratch=10)
            return d.violations

    return scenario


def pending_work(factory: TierFactory) -> list[str]:
    """After ``drain_jobs`` and before the results are taken,
    ``has_pending_work`` is True."""
    with Driver(factory, capacity=2) as d:
        d.fill(0, "a")
        d.submit_store([key("a")], [0])
        d.tier.drain_jobs()
        if not d.tier.has_pending_work():
            d.violate("has_pending_work is False with a result not yet taken")
        d.poll()
        if d.tier.has_pending_work():
            d.violate("has_pending_work is True with nothing in flight and every result taken")
        return d.violations


def evict_during_commit(factory: TierFactory) -> list[str]:
    """Capacity 2: A held; B's commit paused on the worker; meanwhile (on
    another thread) a store of C evicts A. Afterwards at most 2 keys HIT,
    each reading back its bytes."""
    with Driver(factory, capacity=2) as d:
        a, b, c = key("a"), key("b"), key("c")
        pa, pb, pc = d.fill(0, "a"), d.fill(1, "b"), d.fill(2, "c")
        d.store([a], [0])
        gate = d.gate("in_commit")
        d.submit_store([b], [1])
        if not gate.reached.wait(5.0):
            d.violate("the worker never reached its commit")
        helper = d.in_thread(lambda: None if d.submit_store([c], [2]) else None)
        helper.join(GRACE_S)
        gate.go.set()
        helper.join(5.0)
        d.drain()
        d.verify({a: pa, b: pb, c: pc}, scratch=10)
        return d.violations


def drain_waits(factory: TierFactory) -> list[str]:
    """A store paused in the worker before its copy: ``drain_jobs`` (on a
    helper thread) may not return before it finishes, and the poll right
    after it must hand out the job."""
    with Driver(factory, capacity=2) as d:
        d.fill(0, "a")
        gate = d.gate("before_copy")
        job = d.submit_store([key("a")], [0])
        if not gate.reached.wait(5.0):
            d.violate("the worker never picked the job")
        taken: list[int] = []

        def drain_then_take() -> None:
            d.tier.drain_jobs()
            results = list(d.tier.get_finished_jobs())
            taken.extend(r.job_id for r in results)
            d.accept(results)

        helper = d.in_thread(drain_then_take)
        helper.join(GRACE_S)
        returned_early = not helper.is_alive()
        gate.go.set()
        helper.join(5.0)
        if returned_early or job not in taken:
            d.violate("drain_jobs returned before the job finished (result not available)")
        d.drain()
        return d.violations


def no_hit_mid_store(point: str) -> Scenario:
    """A store of A paused at ``point`` in the tier's I/O thread: A must not
    read HIT; if it does, a load of A (served by another I/O thread where
    there is one) shows the torn bytes."""

    def scenario(factory: TierFactory) -> list[str]:
        with Driver(factory, capacity=4) as d:
            a = key("a")
            pa = d.fill(0, "a")
            gate = d.gate(point)
            d.submit_store([a], [0])
            if not gate.reached.wait(5.0):
                d.violate(f"the store never reached {point}")
            if d.lookup(a) is HIT:
                d.violate(f"a key reads HIT while its store is paused at {point}")
                load = d.submit_load([a], [6])
                if d.wait(load, timeout=1.0, record=False) is not None:
                    if a not in d.ok_keys(load):
                        d.violate("a HIT key failed to load while its store was under way")
                    elif d.row(6) != pa:
                        d.violate("a load during the store read torn bytes")
            gate.go.set()
            d.drain()
            d.verify({a: pa}, scratch=10)
            return d.violations

    return scenario


def take_race(factory: TierFactory) -> list[str]:
    """The worker finishes a job while a ``get_finished_jobs`` (helper
    thread) is half-way through taking the results: the job is still
    reported, once."""
    with Driver(factory, capacity=2) as d:
        d.fill(0, "a")
        publish = d.gate("before_publish")
        take = d.gate("in_take")
        d.submit_store([key("a")], [0])
        if not publish.reached.wait(5.0):
            d.violate("the worker never finished the copy")
        helper = d.in_thread(lambda: d.accept(list(d.tier.get_finished_jobs())))
        if not take.reached.wait(5.0):
            d.violate("get_finished_jobs never reached its take")
        publish.go.set()
        time.sleep(GRACE_S)  # the worker publishes now if nothing holds it
        take.go.set()
        helper.join(5.0)
        d.drain()
        return d.violations


def write_error_not_hit(factory: TierFactory) -> list[str]:
    """The chunk's write raises OSError (injected): the store fails and the
    key reads MISS."""
    with Driver(factory, capacity=2) as d:
        a = key("a")
        pa = d.fill(0, "a")
        fired: list[bool] = []

        def boom() -> None:
            if not fired:
                fired.append(True)
                raise OSError("injected write error")

        d.hooks().set("before_write", boom)
        stored = d.store([a], [0])
        if not fired:
            d.violate("the injected write error never fired")
        if a not in stored and d.lookup(a) is HIT:
            d.violate("a store reported failed reads HIT")
        d.verify({a: pa}, scratch=10)
        return d.violations


def survivor_after_eviction(factory: TierFactory) -> list[str]:
    """Capacity 2: A, B held; C evicts one of them; every key still HIT
    reads back its own bytes."""
    with Driver(factory, capacity=2) as d:
        keys = [key(n) for n in "abc"]
        data = {k: d.fill(i, n) for i, (k, n) in enumerate(zip(keys, "abc"))}
        d.store(keys[:2], [0, 1])
        d.store(keys[2:], [2])
        hits = d.verify(data, scratch=10)
        if keys[2] not in hits:
            d.violate("the key just stored is not readable")
        return d.violations


def restore_present(factory: TierFactory) -> list[str]:
    """A stored from row 0; row 0 then reused for other bytes and A offered
    again: A is skipped, and reads back its first bytes."""
    with Driver(factory, capacity=4) as d:
        a = key("a")
        pa = d.fill(0, "a")
        d.store([a], [0])
        d.fill(0, "other")
        d.store([a], [0])
        d.verify({a: pa}, scratch=10)
        return d.violations


def capacity(batched: bool) -> Scenario:
    """Capacity 3, five compressible chunks stored one job each (waiting for
    each, or all submitted before one drain): never more than 3 HIT, and
    the HIT ones read back."""

    def scenario(factory: TierFactory) -> list[str]:
        with Driver(factory, capacity=3) as d:
            data = {}
            for i in range(5):
                k = key(f"k{i}")
                data[k] = d.fill(i, f"k{i}", compressible=True)
                if batched:
                    d.submit_store([k], [i])
                else:
                    d.store([k], [i])
            d.drain()
            d.verify(data, scratch=10)
            return d.violations

    return scenario


def skip_keeps_rows(factory: TierFactory) -> list[str]:
    """A held; then a store of [A, B] from rows [0, 1]: B gets row 1."""
    with Driver(factory, capacity=4) as d:
        a, b = key("a"), key("b")
        pa, pb = d.fill(0, "a"), d.fill(1, "b")
        d.store([a], [0])
        stored = d.store([a, b], [0, 1])
        if b not in stored:
            d.violate("B was not stored")
        d.verify({a: pa, b: pb}, scratch=10)
        return d.violations


def touch_absent(factory: TierFactory) -> list[str]:
    """``touch`` of a key never stored: it still reads MISS."""
    with Driver(factory, capacity=2) as d:
        x = key("never-stored")
        d.tier.touch([x], d.ctx)
        if d.lookup(x) is HIT:
            d.violate("a key never stored reads HIT after touch")
        return d.violations


def lru_touch_order(factory: TierFactory) -> list[str]:
    """Capacity 2, A then B stored, ``touch([A])``, then C: under LRU the
    victim is B, so A stays. (Policy-specific: the LRU design only.)"""
    with Driver(factory, capacity=2) as d:
        a, b, c = key("a"), key("b"), key("c")
        d.fill(0, "a"), d.fill(1, "b"), d.fill(2, "c")
        d.store([a], [0])
        d.store([b], [1])
        d.tier.touch([a], d.ctx)
        d.store([c], [2])
        if d.lookup(a) is not HIT or d.lookup(b) is HIT:
            d.violate("after touch([A]) the LRU victim was A, not B")
        return d.violations


def restore_after_evict(factory: TierFactory) -> list[str]:
    """Capacity 2: A, B held, C evicts A, then A is stored again: reported
    stored, with nothing submitted since, A must read HIT (and its bytes)."""
    with Driver(factory, capacity=2) as d:
        a, b, c = key("a"), key("b"), key("c")
        pa, pb, pc = d.fill(0, "a"), d.fill(1, "b"), d.fill(2, "c")
        d.store([a, b], [0, 1])
        d.store([c], [2])
        if d.store([a], [0]) == {a} and d.lookup(a) is not HIT:
            d.violate("a key reported stored by the last job reads MISS")
        d.verify({a: pa, b: pb, c: pc}, scratch=10)
        return d.violations


def no_hit_before_poll(factory: TierFactory) -> list[str]:
    """A store submitted and not yet polled (a poll-time tier has not copied
    it): the key must not read HIT."""
    with Driver(factory, capacity=2) as d:
        a = key("a")
        pa = d.fill(0, "a")
        d.submit_store([a], [0])
        if d.lookup(a) is HIT:
            d.violate("a key reads HIT before its store was copied")
        d.drain()
        d.verify({a: pa}, scratch=10)
        return d.violations


def two_requests_same_key(factory: TierFactory) -> list[str]:
    """Requests r1 and r2 both look up A while r1's index query is in
    flight: both get an answer (HIT) within the bound."""
    with Driver(factory, capacity=2) as d:
        a = key("a")
        d.fill(0, "a")
        d.store([a], [0])
        r1, r2 = ReqContext(req_id="r1"), ReqContext(req_id="r2")
        gate = d.gate("before_resolve")
        first = d.tier.lookup(a, r1)
        if first is LookupResult.RETRY and not gate.reached.wait(5.0):
            d.violate("the index query never started")
        d.tier.lookup(a, r2)
        gate.go.set()
        for ctx in (r1, r2):
            if d.lookup(a, ctx) is not HIT:
                d.violate(f"request {ctx.req_id}: a held key does not read HIT")
        return d.violations


def stale_answer(factory: TierFactory) -> list[str]:
    """In one request: A reads HIT, then A is evicted (C, D stored into a
    tier of capacity 2); a later lookup of A in that request answers MISS,
    or HIT with A loadable."""
    with Driver(factory, capacity=2) as d:
        a, b, c, e = key("a"), key("b"), key("c"), key("e")
        pa = d.fill(0, "a")
        d.fill(1, "b"), d.fill(2, "c"), d.fill(3, "e")
        d.store([a, b], [0, 1])
        if d.lookup(a) is not HIT:
            d.violate("a held key does not read HIT")
        d.store([c, e], [2, 3])
        if d.lookup(a) is HIT:
            d.read_back(a, pa, 10, "A after its eviction")
        return d.violations


def partial(factory: TierFactory) -> list[str]:
    """Two stores of four keys each on the lossy backend: each result names
    only its job's keys, a key reported stored reads HIT with its bytes, a
    key reported failed reads MISS; then one load of every stored key: the
    keys it reports loaded hold their bytes."""
    with Driver(factory, capacity=16) as d:
        data = {}
        jobs = []
        for j in range(2):
            keys = [key(f"j{j}k{i}") for i in range(4)]
            rows = [4 * j + i for i in range(4)]
            for k, r in zip(keys, rows):
                data[k] = d.fill(r, k.hex())
            jobs.append(d.submit_store(keys, rows))
        d.drain()
        stored: set[OffloadKey] = set()
        for job in jobs:
            ok = d.ok_keys(job)
            for k in d.jobs[job].keys:
                hit = d.lookup(k) is HIT
                if k in ok and not hit:
                    d.violate("a key reported stored reads MISS")
                if k not in ok and hit:
                    d.violate("a key reported failed reads HIT")
            stored |= ok & set(d.jobs[job].keys)
        held = sorted(k for k in stored if d.lookup(k) is HIT)
        load = d.submit_load(held, list(range(12, 12 + len(held))))
        d.wait(load)
        for i, k in enumerate(held):
            if k in d.ok_keys(load) and d.row(12 + i) != data[k]:
                d.violate("a key reported loaded holds other bytes")
        return d.violations


def row_reuse(factory: TierFactory) -> list[str]:
    """A stored from row 0; row 0 reused for other bytes afterwards: A still
    reads back its own bytes."""
    with Driver(factory, capacity=2) as d:
        a = key("a")
        pa = d.fill(0, "a")
        d.store([a], [0])
        d.fill(0, "reused")
        d.verify({a: pa}, scratch=10)
        return d.violations


def result_before_copy(factory: TierFactory) -> list[str]:
    """A store paused in the worker before its copy: it must not be reported
    yet (a reported store releases its primary rows, which the engine then
    reuses); A reads back its own bytes in the end."""
    with Driver(factory, capacity=2) as d:
        a = key("a")
        pa = d.fill(0, "a")
        gate = d.gate("before_copy")
        job = d.submit_store([a], [0])
        if not gate.reached.wait(5.0):
            d.violate("the worker never picked the job")
        d.poll()
        if job in d.results:
            d.violate("a store was reported finished before its copy ran")
            d.fill(0, "reused")  # the engine reuses the released row
        gate.go.set()
        d.drain()
        d.verify({a: pa}, scratch=10)
        return d.violations


def load_result_before_rows(factory: TierFactory) -> list[str]:
    """A load paused in the worker at ``before_publish``: if its result is
    already out, its row must already hold the key's bytes (the caller reads
    the row as soon as it sees the result)."""
    with Driver(factory, capacity=2) as d:
        a = key("a")
        pa = d.fill(0, "a")
        d.store([a], [0])
        gate = d.gate("before_publish")
        job = d.submit_load([a], [6])
        if not gate.reached.wait(5.0):
            d.violate("the worker never ran the load")
        d.poll()
        if job in d.results and a in d.ok_keys(job) and d.row(6) != pa:
            d.violate("a load was reported finished before its row was written")
        gate.go.set()
        d.wait(job)
        if a not in d.ok_keys(job) or d.row(6) != pa:
            d.violate("the load of a held key did not deliver its bytes")
        return d.violations


def drain_idle(factory: TierFactory) -> list[str]:
    """``drain_jobs`` on a tier that never ran a job returns at once."""
    with Driver(factory, capacity=2) as d:
        helper = d.in_thread(d.tier.drain_jobs)
        helper.join(GRACE_S)
        if helper.is_alive():
            d.violate("drain_jobs blocks on a tier with nothing in flight")
            d.fill(0, "a")  # unblock it: a job that finishes wakes the drainer
            d.submit_store([key("a")], [0])
            helper.join(5.0)
        return d.violations


def group_keys(factory: TierFactory) -> list[str]:
    """Two keys of one block hash in KV groups 0 and 1: two chunks, each
    reading back its own bytes."""
    with Driver(factory, capacity=4) as d:
        block = hashlib.sha256(b"block").digest()[:8]
        k0, k1 = make_offload_key(block, 0), make_offload_key(block, 1)
        p0, p1 = d.fill(0, "g0"), d.fill(1, "g1")
        if d.store([k0, k1], [0, 1]) != {k0, k1}:
            d.violate("a plain store of two keys into an empty tier failed")
        d.verify({k0: p0, k1: p1}, scratch=10)
        return d.violations


def load_order(factory: TierFactory) -> list[str]:
    """B stored before A, then one load of [A, B] into rows [4, 5]: A lands
    in row 4 and B in row 5."""
    with Driver(factory, capacity=4) as d:
        a, b = key("a"), key("b")
        pa, pb = d.fill(0, "a"), d.fill(1, "b")
        d.store([b], [1])
        d.store([a], [0])
        job = d.submit_load([a, b], [4, 5])
        d.wait(job)
        if d.ok_keys(job) != {a, b}:
            d.violate("a load of two stored keys failed")
        elif d.row(4) != pa or d.row(5) != pb:
            d.violate("a load put the keys' bytes in the wrong rows")
        return d.violations


def numpy_jobs(factory: TierFactory) -> list[str]:
    """Jobs shaped as vLLM's (chunk ids a numpy array): a store of two keys
    and their load back work as with tuples."""
    with Driver(factory, capacity=4, numpy_jobs=True) as d:
        a, b = key("a"), key("b")
        pa, pb = d.fill(0, "a"), d.fill(1, "b")
        d.store([a, b], [0, 1])
        job = d.submit_load([a, b], [4, 5])
        if job in d.jobs:
            d.wait(job)
            if d.ok_keys(job) != {a, b} or d.row(4) != pa or d.row(5) != pb:
                d.violate("a numpy-shaped load did not deliver the stored bytes")
        return d.violations


def shutdown_waits(factory: TierFactory) -> list[str]:
    """A store paused in the worker, then ``shutdown`` (helper thread): it
    may not return while a thread of the tier still runs the job."""
    before = set(threading.enumerate())
    d = Driver(factory, capacity=2)
    try:
        d.fill(0, "a")
        gate = d.gate("before_copy")
        d.submit_store([key("a")], [0])
        if not gate.reached.wait(5.0):
            d.violate("the worker never picked the job")
        helper = threading.Thread(target=d.tier.shutdown, daemon=True)
        helper.start()
        helper.join(GRACE_S)
        if not helper.is_alive():
            d.violate("shutdown returned while the tier's thread was still running a job")
        gate.go.set()
        helper.join(5.0)
    finally:
        for gate_ in d._gates:
            gate_.go.set()
        d.tier.shutdown()
        for thread in set(threading.enumerate()) - before:
            if thread is not threading.current_thread():
                thread.join(5.0)  # a leaked tier thread exits once its job is done
    return d.violations


def shutdown_cleans_files(factory: TierFactory) -> list[str]:
    """Temporary files go under a fresh directory during the tier's life
    (``tempfile.tempdir``): after a store and ``shutdown`` nothing is left."""
    with tempfile.TemporaryDirectory() as root:
        saved = tempfile.tempdir
        tempfile.tempdir = root
        try:
            with Driver(factory, capacity=2) as d:
                d.fill(0, "a")
                d.store([key("a")], [0])
        finally:
            tempfile.tempdir = saved
        left = os.listdir(root)
        if left:
            d.violate(f"shutdown left {len(left)} entries in the temporary directory")
        return d.violations


def double_offer(pause: str | None) -> Scenario:
    """A offered by two stores in flight at once (the first paused at
    ``pause`` in a threaded tier): in the end A reads HIT with its bytes,
    and no job reported it failed."""

    def scenario(factory: TierFactory) -> list[str]:
        with Driver(factory, capacity=2) as d:
            a = key("a")
            pa = d.fill(0, "a")
            d.fill(1, "a")
            gate = d.gate(pause) if pause else None
            first = d.submit_store([a], [0])
            if gate is not None and not gate.reached.wait(5.0):
                d.violate("the first store never started")
            second = d.submit_store([a], [1])
            if gate is not None:
                time.sleep(GRACE_S)  # the second job may finish first, if it does not wait
                d.poll()
                gate.go.set()
            d.drain()
            if d.lookup(a) is not HIT:
                d.violate("a key stored twice does not read HIT")
            for job in (first, second):
                if a not in d.ok_keys(job):
                    d.violate(f"job {job} reported A failed, yet A was stored")
            d.verify({a: pa}, scratch=10)
            return d.violations

    return scenario


def events_track_hits(factory: TierFactory) -> list[str]:
    """Capacity 2: stores with a skip, an eviction, a pinned key and a store
    that finds no room; after every call the events taken so far describe
    exactly the keys that read HIT."""
    with Driver(factory, capacity=2) as d:
        a, b, c, e, f = (key(n) for n in "abcef")
        keys = [a, b, c, e, f]
        for i, n in enumerate("abcef"):
            d.fill(i, n)
        view = EventView(d)
        d.submit_store([a, b], [0, 1])
        view.take(keys, "store [A, B] submitted")
        d.poll()
        view.take(keys, "store [A, B] done")
        d.submit_store([a, c], [0, 2])  # A held and skipped, C evicts B
        view.take(keys, "store [A, C] submitted")
        d.poll()
        view.take(keys, "store [A, C] done")
        d.submit_load([a], [8])  # A pinned until the poll
        d.submit_store([e], [3])  # evicts C
        d.submit_store([f], [4])  # A pinned, E reserved: no room
        view.take(keys, "stores of E and F submitted")
        d.drain()
        view.take(keys, "drained")
        return d.violations


# ---------------------------------------------------------------------------
# Which scenario proves which defect.

SCENARIOS: dict[str, Scenario] = {
    "dict_poll.reports_twice": exactly_once,
    "dict_poll.store_row_off_by_one": roundtrip,
    "dict_poll.drain_drops_queued": drain_reports_all,
    "dict_poll.failed_store_indexed": no_room_fails_cleanly,
    "dict_poll.evicts_pinned": load_pins(None),
    "dict_poll.pending_ignores_results": pending_work,
    "dict_poll.truthiness_on_chunk_ids": numpy_jobs,
    "thread_worker.reports_at_submit": result_before_copy,
    "thread_worker.drain_event_starts_clear": drain_idle,
    "file_chunks.file_name_ignores_group": group_keys,
    "slab_file.sorted_reads_permute_rows": load_order,
    "thread_worker.shutdown_without_join": shutdown_waits,
    "thread_worker.load_reports_before_copy": load_result_before_rows,
    "file_chunks.shutdown_keeps_directory": shutdown_cleans_files,
    "file_chunks.skipped_key_reported_early": double_offer("before_write"),
    "thread_worker.copy_on_write_index_race": evict_during_commit,
    "thread_worker.drain_polls_queue": drain_waits,
    "thread_worker.indexed_at_submit": no_hit_mid_store("before_copy"),
    "thread_worker.load_zero_fills_past_end": roundtrip,
    "thread_worker.takes_results_unlocked": take_race,
    "file_chunks.writes_in_place": no_hit_mid_store("mid_write"),
    "file_chunks.renames_before_writing": no_hit_mid_store("mid_write"),
    "file_chunks.evicts_while_loading": load_pins("before_read"),
    "file_chunks.renames_failed_write": write_error_not_hit,
    "slab_file.bump_allocator": survivor_after_eviction,
    "slab_file.refreshes_present_key": restore_present,
    "slab_file.one_slot_too_many": capacity(batched=False),
    "slab_file.skip_misaligns_rows": skip_keeps_rows,
    "lru_bounded.touch_adds_absent": touch_absent,
    "lru_bounded.touch_demotes": lru_touch_order,
    "lru_bounded.ignores_in_flight": capacity(batched=True),
    "lru_bounded.stale_bytes_cache": restore_after_evict,
    "async_lookup.coalesced_query_starves": two_requests_same_key,
    "async_lookup.caches_answer_for_request": stale_answer,
    "async_lookup.counts_reserved_as_present": no_hit_before_poll,
    "partial_faults.success_set_not_reset": partial,
    "partial_faults.failed_position_off_by_one": partial,
    "partial_faults.index_before_write": partial,
    "partial_faults.success_if_any": partial,
    "zlib_compressed.raw_flag_lost": roundtrip,
    "zlib_compressed.budget_in_bytes": capacity(batched=False),
    "zlib_compressed.lazy_compression": row_reuse,
    "events_dict.announces_failed_keys": events_track_hits,
    "events_dict.silent_eviction": events_track_hits,
    "events_dict.announces_at_submit": events_track_hits,
    "events_dict.announces_skipped": events_track_hits,
}

DEFECTS = [e for e in ENTRIES if not e.correct]


def test_manifest_is_complete() -> None:
    assert len([e for e in ENTRIES if e.correct]) >= 8
    assert len(DEFECTS) >= 30
    assert set(DESIGNS) == {e.design for e in ENTRIES}
    for design in DESIGNS:
        assert correct_entry(design).correct
    assert {e.name for e in DEFECTS} == set(SCENARIOS)
    for entry in DEFECTS:
        assert entry.defect
    for entry in ENTRIES:
        assert entry.factory.startswith(f"tests.blind_tiers.{entry.design}.")
        assert callable(entry.load())


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_separates(name: str) -> None:
    entry = BY_NAME[name]
    scenario = SCENARIOS[name]
    good = scenario(correct_entry(entry.design).load())
    assert good == [], f"the correct {entry.design} tier breaks the scenario: {good}"
    bad = scenario(entry.load())
    assert bad, f"{name}: the scenario does not show the defect ({entry.defect})"


# ---------------------------------------------------------------------------
# The scenarios are contract checks, not fitted to one defect: every correct
# tier passes every scenario that applies to its design.

_GENERIC: dict[str, Scenario] = {
    "roundtrip": roundtrip,
    "exactly_once": exactly_once,
    "drain_reports_all": drain_reports_all,
    "no_room_fails_cleanly": no_room_fails_cleanly,
    "load_pins": load_pins(None),
    "pending_work": pending_work,
    "survivor_after_eviction": survivor_after_eviction,
    "restore_present": restore_present,
    "capacity_sequential": capacity(batched=False),
    "capacity_batched": capacity(batched=True),
    "skip_keeps_rows": skip_keeps_rows,
    "touch_absent": touch_absent,
    "restore_after_evict": restore_after_evict,
    "row_reuse": row_reuse,
    "stale_answer": stale_answer,
    "drain_idle": drain_idle,
    "group_keys": group_keys,
    "load_order": load_order,
    "numpy_jobs": numpy_jobs,
    "shutdown_cleans_files": shutdown_cleans_files,
    "double_offer": double_offer(None),
}
#: The lossy backend fails reads on purpose: only scenarios that do not
#: demand a fault-free read-back apply to it.
_FAULT_TOLERANT = {
    "exactly_once",
    "pending_work",
    "touch_absent",
    "drain_idle",
    "shutdown_cleans_files",
}
_POLL_TIME = {
    "dict_poll",
    "slab_file",
    "lru_bounded",
    "async_lookup",
    "partial_faults",
    "zlib_compressed",
    "events_dict",
}
_BY_DESIGN: dict[str, dict[str, Scenario]] = {
    "thread_worker": {
        "evict_during_commit": evict_during_commit,
        "drain_waits": drain_waits,
        "take_race": take_race,
        "no_hit_mid_store": no_hit_mid_store("before_copy"),
        "result_before_copy": result_before_copy,
        "shutdown_waits": shutdown_waits,
        "load_result_before_rows": load_result_before_rows,
    },
    "file_chunks": {
        "no_hit_mid_store": no_hit_mid_store("mid_write"),
        "load_pins_paused": load_pins("before_read"),
        "write_error_not_hit": write_error_not_hit,
        "shutdown_cleans_files": shutdown_cleans_files,
        "double_offer_paused": double_offer("before_write"),
    },
    "lru_bounded": {"lru_touch_order": lru_touch_order},
    "async_lookup": {"two_requests_same_key": two_requests_same_key},
    "partial_faults": {"partial": partial},
    "events_dict": {"events_track_hits": events_track_hits},
}


def _applicable() -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for design in DESIGNS:
        names = set(_GENERIC) if design != "partial_faults" else set(_FAULT_TOLERANT)
        if design in _POLL_TIME:
            names.add("no_hit_before_poll")
        names |= set(_BY_DESIGN.get(design, {}))
        pairs.extend((design, n) for n in sorted(names))
    return pairs


@pytest.mark.parametrize(("design", "scenario_name"), _applicable())
def test_correct_tier_passes(design: str, scenario_name: str) -> None:
    table = {**_GENERIC, "no_hit_before_poll": no_hit_before_poll, **_BY_DESIGN.get(design, {})}
    found = table[scenario_name](correct_entry(design).load())
    assert found == [], f"the correct {design} tier breaks {scenario_name}: {found}"
