"""A small kit-free driver for the scenario tests: a primary view, job
bookkeeping, result checks that hold for every tier (each job reported
once, ``successful_keys`` within the job, ``success`` consistent), and
bounded waits. Contract breaches are collected as strings in
``violations`` rather than raised, so a scenario can run a correct and a
defective tier alike and compare."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import cast

import attrs
import numpy as np
import numpy.typing as npt

from kvoffload.spec.contract import LookupResult, ReqContext
from kvoffload.spec.keys import OffloadKey, make_offload_key
from kvoffload.spec.tier_contract import TierJob, TierJobLike, TierJobResult
from tests.blind_tiers._common import Hooks, TierFactory

CHUNK = 32
ROWS = 24
WAIT_S = 5.0
RETRY_BOUND_S = 1.0


def key(name: str) -> OffloadKey:
    return make_offload_key(hashlib.sha256(name.encode()).digest()[:8], 0)


def pattern(tag: str, compressible: bool = False) -> bytes:
    digest = hashlib.shake_256(tag.encode()).digest(CHUNK)
    if compressible:
        return digest[:2] * (CHUNK // 2)
    return digest


@attrs.define
class VllmShapedJob:
    """A job shaped as vLLM 0.33's ``TransferJob``: keys a list, chunk ids a
    numpy array."""

    job_id: int
    keys: list[OffloadKey]
    chunk_ids: npt.NDArray[np.int64]
    is_promotion: bool
    req_context: ReqContext


class Gate:
    """A one-shot pause for a hook point: the first thread to reach it sets
    ``reached`` and waits for ``go`` (bounded, so nothing hangs)."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()
        self._armed = True
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            if not self._armed:
                return
            self._armed = False
        self.reached.set()
        self.go.wait(WAIT_S)


class Driver:
    def __init__(
        self, factory: TierFactory, capacity: int, rows: int = ROWS, numpy_jobs: bool = False
    ) -> None:
        self.numpy_jobs = numpy_jobs
        self.buf = bytearray(rows * CHUNK)
        self.view = memoryview(self.buf).cast("B", (rows, CHUNK))
        self.capacity = capacity
        self.tier = factory(capacity, self.view)
        self.ctx = ReqContext(req_id="r0")
        self.jobs: dict[int, TierJob] = {}
        self.results: dict[int, TierJobResult] = {}
        self.violations: list[str] = []
        self._next_id = 0
        self._threads: list[threading.Thread] = []
        self._gates: list[Gate] = []

    # -- context management ------------------------------------------------------
    def __enter__(self) -> Driver:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for gate in self._gates:
            gate.go.set()
        for thread in self._threads:
            thread.join(timeout=WAIT_S)
        self.tier.shutdown()

    def violate(self, text: str) -> None:
        self.violations.append(text)

    # -- primary rows ------------------------------------------------------------------
    def fill(self, row: int, tag: str, compressible: bool = False) -> bytes:
        data = pattern(tag, compressible)
        self.buf[row * CHUNK : (row + 1) * CHUNK] = data
        return data

    def row(self, row: int) -> bytes:
        return bytes(self.buf[row * CHUNK : (row + 1) * CHUNK])

    # -- hooks and threads ---------------------------------------------------------------
    def hooks(self) -> Hooks:
        hooks = getattr(self.tier, "hooks", None)
        if not isinstance(hooks, Hooks):
            raise TypeError(f"{type(self.tier).__name__} has no hook points")
        return hooks

    def gate(self, point: str) -> Gate:
        gate = Gate()
        self._gates.append(gate)
        self.hooks().set(point, gate)
        return gate

    def in_thread(self, fn: Callable[[], None]) -> threading.Thread:
        thread = threading.Thread(target=fn, daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    # -- jobs ------------------------------------------------------------------------------
    def _submit(self, keys: Sequence[OffloadKey], rows: Sequence[int], load: bool) -> int:
        self._next_id += 1
        job = TierJob(self._next_id, tuple(keys), tuple(rows), load, self.ctx)
        self.jobs[job.job_id] = job
        sent: TierJobLike = job
        if self.numpy_jobs:
            # vLLM's chunk_ids is an ndarray, which typing does not call a Sequence.
            sent = cast(
                TierJobLike,
                VllmShapedJob(
                    job.job_id, list(keys), np.asarray(rows, dtype=np.int64), load, self.ctx
                ),
            )
        try:
            if load:
                self.tier.submit_load(sent)
            else:
                self.tier.submit_store(sent)
        except Exception as exc:  # a legal submit must not raise
            del self.jobs[job.job_id]
            self.violate(f"submit_{'load' if load else 'store'} raised {type(exc).__name__}: {exc}")
        return job.job_id

    def submit_store(self, keys: Sequence[OffloadKey], rows: Sequence[int]) -> int:
        return self._submit(keys, rows, False)

    def submit_load(self, keys: Sequence[OffloadKey], rows: Sequence[int]) -> int:
        return self._submit(keys, rows, True)

    def accept(self, results: Sequence[TierJobResult]) -> None:
        """Check and record results handed out by ``get_finished_jobs``."""
        for res in results:
            job = self.jobs.get(res.job_id)
            if job is None:
                self.violate(f"result for unknown job {res.job_id}")
                continue
            if res.job_id in self.results:
                self.violate(f"job {res.job_id} reported twice")
                continue
            self.results[res.job_id] = res
            if res.successful_keys is not None:
                extra = set(res.successful_keys) - set(job.keys)
                if extra:
                    self.violate(f"job {res.job_id}: successful_keys not in the job: {len(extra)}")
                if res.success and set(res.successful_keys) != set(job.keys):
                    self.violate(f"job {res.job_id}: success=True with a partial successful_keys")

    def poll(self) -> None:
        self.accept(list(self.tier.get_finished_jobs()))

    def wait(self, job_id: int, timeout: float = WAIT_S, record: bool = True) -> TierJobResult | None:
        if job_id not in self.jobs:  # its submit raised
            return None
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            if job_id in self.results:
                return self.results[job_id]
            if time.monotonic() > deadline:
                if record:
                    self.violate(f"job {job_id} not reported within {timeout} s")
                return None
            time.sleep(0.001)

    def drain(self) -> None:
        """``drain_jobs`` then one poll: every job must be reported by then."""
        self.tier.drain_jobs()
        self.poll()
        missing = sorted(set(self.jobs) - set(self.results))
        if missing:
            self.violate(f"after drain_jobs and a poll, jobs not reported: {missing}")

    def ok_keys(self, job_id: int) -> set[OffloadKey]:
        res = self.results.get(job_id)
        if res is None:
            return set()
        if res.successful_keys is not None:
            return set(res.successful_keys)
        return set(self.jobs[job_id].keys) if res.success else set()

    def store(self, keys: Sequence[OffloadKey], rows: Sequence[int]) -> set[OffloadKey]:
        """Submit a store, wait for it, return the keys it reports stored."""
        job_id = self.submit_store(keys, rows)
        self.wait(job_id)
        return self.ok_keys(job_id)

    # -- lookups and read-back ----------------------------------------------------------
    def lookup(self, k: OffloadKey, ctx: ReqContext | None = None) -> LookupResult:
        """Ask until the answer is not RETRY; a RETRY that lasts past
        ``RETRY_BOUND_S`` is a violation ("RETRY forever")."""
        deadline = time.monotonic() + RETRY_BOUND_S
        tries = 0
        while True:
            res = self.tier.lookup(k, ctx or self.ctx)
            if res is not LookupResult.RETRY:
                return res
            if time.monotonic() > deadline:
                self.violate(f"lookup kept answering RETRY for {RETRY_BOUND_S} s")
                return res
            tries += 1
            time.sleep(0 if tries < 20 else 0.001)

    def read_back(self, k: OffloadKey, expected: bytes, scratch: int, what: str) -> None:
        """Load ``k`` into row ``scratch``: it must succeed with ``expected``."""
        self.buf[scratch * CHUNK : (scratch + 1) * CHUNK] = bytes(CHUNK)
        job_id = self.submit_load([k], [scratch])
        self.wait(job_id)
        if k not in self.ok_keys(job_id):
            self.violate(f"{what}: load of a HIT key failed")
        elif self.row(scratch) != expected:
            self.violate(f"{what}: loaded bytes differ from the bytes stored")

    def verify(self, expected: dict[OffloadKey, bytes], scratch: int) -> list[OffloadKey]:
        """Every HIT among ``expected`` reads back its bytes; no more HITs
        than the capacity. Returns the HIT keys."""
        hits = [k for k in expected if self.lookup(k) is LookupResult.HIT]
        if len(hits) > self.capacity:
            self.violate(f"{len(hits)} keys HIT in a tier of capacity {self.capacity}")
        for k in hits:
            self.read_back(k, expected[k], scratch, f"key {k.hex()[:8]}")
        return hits


class EventView:
    """A consumer of ``take_events``: applies each event, checks that per key
    they alternate stored, removed, stored... (starting with stored) and that
    every event carries the same positive ``block_size`` and ``medium``."""

    def __init__(self, d: Driver) -> None:
        self.d = d
        self.held: set[OffloadKey] = set()
        self.shape: tuple[object, object] | None = None

    def take(self, keys: list[OffloadKey], when: str) -> None:
        for ev in self.d.tier.take_events():
            keys_, block_size, medium, removed = (
                getattr(ev, "keys"),
                getattr(ev, "block_size"),
                getattr(ev, "medium"),
                getattr(ev, "removed"),
            )
            if not isinstance(block_size, int) or block_size <= 0:
                self.d.violate(f"{when}: an event's block_size is {block_size!r}")
            if self.shape is None:
                self.shape = (block_size, medium)
            elif self.shape != (block_size, medium):
                self.d.violate(f"{when}: events disagree on block_size/medium")
            for k in keys_:
                if removed and k not in self.held:
                    self.d.violate(f"{when}: removed event for a key not announced stored")
                if not removed and k in self.held:
                    self.d.violate(f"{when}: stored event for a key already announced")
                (self.held.discard if removed else self.held.add)(k)
        hits = {k for k in keys if self.d.lookup(k) is LookupResult.HIT}
        if hits != self.held:
            self.d.violate(
                f"{when}: events say {len(self.held)} keys are held, {len(hits)} read HIT"
                f" ({len(self.held - hits)} announced but MISS, {len(hits - self.held)} HIT"
                " but not announced)"
            )
