"""Seeded random call sequences, the way an engine makes them, on every
correct tier: keys are content-addressed (a key's bytes are a function of
the key), so at any time every HIT key must load back its own bytes, no more
keys HIT than the capacity, every job is reported exactly once, and a load
of a key that read HIT succeeds (the lossy design excepted), a key a store
reports failed reads MISS unless another store of it is in flight, after a
drain with every result taken nothing is pending, and a tier's events (where
it emits any) describe exactly the keys that read HIT. A check that the
correct tiers are correct beyond the hand-written scenarios."""

from __future__ import annotations

import random

import pytest

from kvoffload.spec.contract import LookupResult
from kvoffload.spec.keys import OffloadKey
from tests.blind_tiers._driver import ROWS, Driver, EventView, key, pattern
from tests.blind_tiers.manifest import DESIGNS, correct_entry

SEEDS = range(12)
STEPS = 40
POOL = [key(f"p{i}") for i in range(8)]


def _bytes_of(k: OffloadKey) -> bytes:
    return pattern(k.hex())


def _run(design: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    lossy = design == "partial_faults"
    capacity = rng.randint(1, 4)
    with Driver(correct_entry(design).load(), capacity=capacity) as d:
        free_rows = list(range(ROWS))
        rows_of: dict[int, list[int]] = {}  # job -> primary rows it holds
        settled: set[int] = set()
        events = EventView(d)

        def settle() -> None:
            for job_id in list(rows_of):
                if job_id not in d.results or job_id in settled:
                    continue
                settled.add(job_id)
                job = d.jobs[job_id]
                if job.is_promotion:
                    ok = d.ok_keys(job_id)
                    for k, row in zip(job.keys, job.chunk_ids):
                        if k in ok and d.row(row) != _bytes_of(k):
                            d.violate(f"seed {seed}: a loaded row holds other bytes")
                    if not lossy and ok != set(job.keys):
                        d.violate(f"seed {seed}: a load of keys that read HIT failed")
                else:
                    ok = d.ok_keys(job_id)
                    # Keys another store may have made readable since: one
                    # not reported yet, or one submitted after this job.
                    others = {
                        k
                        for other, o_job in d.jobs.items()
                        if other != job_id
                        and not o_job.is_promotion
                        and (other not in d.results or other > job_id)
                        for k in o_job.keys
                    }
                    for k in set(job.keys) - ok - others:
                        if d.lookup(k) is LookupResult.HIT:
                            d.violate(f"seed {seed}: a key its store reported failed reads HIT")
                free_rows.extend(rows_of.pop(job_id))

        for _ in range(STEPS):
            op = rng.random()
            if op < 0.35 and len(free_rows) >= 3:
                keys = rng.sample(POOL, rng.randint(1, 3))
                rows = [free_rows.pop(rng.randrange(len(free_rows))) for _ in keys]
                for k, row in zip(keys, rows):
                    d.buf[row * 32 : (row + 1) * 32] = _bytes_of(k)
                rows_of[d.submit_store(keys, rows)] = rows
            elif op < 0.6 and len(free_rows) >= 2:
                hits = [k for k in POOL if d.lookup(k) is LookupResult.HIT]
                if hits:
                    keys = rng.sample(hits, min(len(hits), rng.randint(1, 2)))
                    rows = [free_rows.pop(rng.randrange(len(free_rows))) for _ in keys]
                    for row in rows:
                        d.buf[row * 32 : (row + 1) * 32] = bytes(32)
                    rows_of[d.submit_load(keys, rows)] = rows
            elif op < 0.8:
                d.poll()
            elif op < 0.9:
                d.drain()
                settle()
                if d.tier.has_pending_work():
                    d.violate(f"seed {seed}: pending work after a drain and every result taken")
            else:
                d.tier.touch(rng.sample(POOL, 2), d.ctx)
            settle()
            if design == "events_dict":  # the one design that emits events
                events.take(POOL, f"seed {seed}")
            held = sum(1 for k in POOL if d.lookup(k) is LookupResult.HIT)
            if held > capacity:
                d.violate(f"seed {seed}: {held} keys HIT in a tier of capacity {capacity}")
        d.drain()
        settle()
        if not lossy:
            d.verify({k: _bytes_of(k) for k in POOL}, scratch=ROWS - 1)
        return d.violations


@pytest.mark.parametrize("design", sorted(DESIGNS))
def test_random_sequences_on_correct_tier(design: str) -> None:
    found = [v for seed in SEEDS for v in _run(design, seed)]
    assert found == [], found[:5]
