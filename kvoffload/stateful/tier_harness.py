"""The kit's side of a secondary tier: primary memory, jobs, and checks.

A :class:`TierHarness` owns the primary tier's memory (a page-aligned
anonymous mapping, one row of ``row_bytes`` per primary slot, handed to the tier as a 2-D
``memoryview``), builds jobs as a tiering manager does, calls the tier, and
after every step holds what it observed to the model
(:class:`~kvoffload.spec.tier_model.TierModel`), bytes included:

- a cascade's slots are filled with :func:`~kvoffload.spec.tier_model.chunk_pattern`
  of (key, version) and left untouched while the job is in flight; once the
  job is reported they are *released*: the kit overwrites them at once
  with a filler, as a primary that reuses its slots would, so a tier that
  reads a slot after its cascade completed stores the filler (``T3``);
- a promotion's slots are allocated from free rows; when its result comes,
  each key that made it must hold exactly a pattern the model accepts for
  that key (``T1``; another key's chunk there is ``T2``);
- every row outside the promotions in flight must hold what the kit last
  wrote there (``T2``).

Each public method is one step of a replay script (:meth:`TierHarness.script`
renders the trace as calls of these methods).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import attrs

from kvoffload.spec.contract import LookupResult, ReqContext
from kvoffload.spec.keys import OffloadKey, make_offload_key
from kvoffload.spec.tier_contract import TierJob
from kvoffload.spec.tier_model import (
    TierModel,
    TierPhaseKind,
    check_capacity,
    check_drained,
    chunk_pattern,
)
from kvoffload.spec.violations import Invariant, SpecViolation
from kvoffload.stateful.tier_noise import Pause, nap

TierFactory = Callable[[int, memoryview], Any]
"""``factory(capacity_blocks, primary_kv_view) -> tier`` (taken structurally)."""

ROW_BYTES = 64
"""Bytes per primary slot (one chunk) in the kit's primary memory."""

REQUIRED_METHODS = ("lookup", "submit_store", "submit_load", "get_finished_jobs", "drain_jobs")
"""What every tier has; the other methods of the contract are optional."""

RETRY_BOUND_S = 1.0
"""A census asks a key answering RETRY again (calling the tier's
``on_schedule_end`` and pausing 0.2 ms between rounds) for this many seconds;
a key still answering RETRY then breaks ``T7 tier progress``."""

DRAIN_BOUND_S = 2.0
"""``drain_jobs()`` returns within this many seconds (the kit's jobs are of
at most 3 chunks of a few bytes), else ``T7 tier progress``."""

SHUTDOWN_BOUND_S = 5.0
"""``shutdown()`` returns within this many seconds, else ``T7``."""

POLL_CENSUS_REQUEST = 999
"""The request the lookups after a poll (:meth:`TierHarness.poll`) ask for."""

KIT_THREAD_PREFIX = "kvoffload-kit-"
"""The names of the kit's own threads (not counted as the tier's; a tier's
threads may be named after its package, e.g. ``kvoffload-fs-tier-0``)."""


class TempDirTier:
    """A tier that lives in a temporary directory, removed when the tier is
    shut down; every other attribute is the tier's own. What a factory of a
    file tier returns, e.g. ``TempDirTier(FileSystemTier(d, capacity_blocks,
    primary_kv_view), d)`` with ``d = tempfile.mkdtemp()``."""

    def __init__(self, tier: Any, directory: str) -> None:
        self._tier = tier
        self._directory = directory

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tier, name)

    def shutdown(self) -> None:
        try:
            hook = getattr(self._tier, "shutdown", None)
            if callable(hook):
                hook()
        finally:
            shutil.rmtree(self._directory, ignore_errors=True)


class PolledTier:
    """A tier whose jobs are all finished when its results are taken:
    ``get_finished_jobs`` drains the tier first and reports in submission
    (job id) order. Every other attribute is the tier's own.

    What the tiered profiles (``Profile.secondary_tiers``) assume of a tier,
    so the manager kit can follow a tiered manager over a tier that copies
    on its own threads (the tier's own races are the tier kit's:
    ``audit_tier``)."""

    def __init__(self, tier: Any) -> None:
        self._tier = tier

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tier, name)

    def get_finished_jobs(self) -> list[Any]:
        self._tier.drain_jobs()
        return sorted(self._tier.get_finished_jobs(), key=lambda result: result.job_id)


def tier_keys(count: int) -> list[OffloadKey]:
    """The kit's key universe: ``K[i]`` of a replay script. Keys come in
    pairs of one block hash with KV-group indices 0 and 1 (a hybrid model's
    groups): two keys that differ only in their group index are two keys."""
    return [make_offload_key(b"tier%03d" % (i // 2), i % 2) for i in range(count)]


@attrs.frozen(eq=False)
class SubmittedJob:
    """A job as vLLM 0.33's tiering manager hands it to a tier
    (``TransferJob``): ``keys`` a list, ``chunk_ids`` a numpy ``int32``
    array (whose truth value is an error for two slots or more)."""

    job_id: int
    keys: list[OffloadKey]
    chunk_ids: Any
    is_promotion: bool
    req_context: ReqContext
    submit_time: float = attrs.field(factory=time.monotonic)


def submitted(job: TierJob) -> SubmittedJob:
    """``job`` in the shape vLLM's tiering manager submits it."""
    import numpy as np  # a dependency of kvoffload; imported when a tier is audited

    return SubmittedJob(
        job.job_id,
        list(job.keys),
        np.array(job.chunk_ids, dtype=np.int32),
        job.is_promotion,
        job.req_context,
    )


def lookup_answer(raw: object) -> LookupResult:
    """A tier's ``lookup`` answer as a :class:`LookupResult`, read by name
    (vLLM's enum or ours), or from a bool (``None``: RETRY); HIT_PENDING
    counts as RETRY for a tier."""
    if raw is None:
        return LookupResult.RETRY
    if isinstance(raw, bool):
        return LookupResult.HIT if raw else LookupResult.MISS
    name = getattr(raw, "name", None)
    if name in ("HIT", "MISS", "RETRY"):
        return LookupResult[name]
    if name == "HIT_PENDING":
        return LookupResult.RETRY
    raise SpecViolation(Invariant.CRASH, f"lookup answered {raw!r}, not a LookupResult")


@attrs.frozen
class TierOp:
    """One step: a :class:`TierHarness` method and its arguments."""

    method: str
    args: tuple[Any, ...] = ()

    def render(self) -> str:
        return f"t.{self.method}({', '.join(repr(a) for a in self.args)})"

    @property
    def key_list(self) -> list[int] | None:
        """The key indices of a store/load/touch (the shrinker drops keys)."""
        if self.args and isinstance(self.args[0], list):
            return list(self.args[0])
        return None


@attrs.define
class TierHarness:
    """One tier, its primary memory and its model (see the module docstring).

    ``capacity``: the tier's ``capacity_blocks``; ``rows``: primary slots;
    ``num_keys``: the key universe (``K``).
    """

    factory: TierFactory
    capacity: int
    rows: int = 16
    num_keys: int = 8
    row_bytes: int = ROW_BYTES
    bounded: bool = True
    stale_misses: bool = False
    pending_work: bool = True
    loads_succeed: bool = False
    evicts_on_store: bool = False
    own_temp: bool = False
    disk_limit: tuple[int, int] | None = attrs.field(init=False, default=None)
    disk_signal: Any = attrs.field(init=False, default=None)
    temp_root: str | None = attrs.field(init=False, default=None)
    temp_before: str | None = attrs.field(init=False, default=None)
    keys: list[OffloadKey] = attrs.field(init=False)
    memory: mmap.mmap = attrs.field(init=False)
    view: memoryview = attrs.field(init=False)
    tier: Any = attrs.field(init=False)
    model: TierModel = attrs.field(init=False)
    expected: list[bytes] = attrs.field(init=False)
    owner: list[int | None] = attrs.field(init=False)
    fillers: dict[bytes, int] = attrs.field(init=False, factory=dict)
    copied: dict[bytes, tuple[int, OffloadKey]] = attrs.field(init=False, factory=dict)
    """The fillers written into a cascade's slot once its key read HIT
    (:meth:`_landed`): slot and key."""
    trace: list[str] = attrs.field(init=False, factory=list)
    ops: list[TierOp] = attrs.field(init=False, factory=list)
    done: int = attrs.field(init=False, default=0)
    """Steps completed (``ops`` are those started)."""
    on_step: Callable[[int], None] | None = attrs.field(init=False, default=None)
    """Called as each step begins, with the number of steps begun before it
    (the noise notes where the tier's threads are then)."""
    quietly: Callable[[], AbstractContextManager[object]] = attrs.field(
        init=False, default=contextlib.nullcontext
    )
    """Around the census's lookups asked again while RETRY: polls, whose
    lines the noise counts but neither delays nor pauses
    (:meth:`~kvoffload.stateful.tier_noise.Noise.quiet`)."""
    threads_idle: Callable[[], bool] | None = attrs.field(init=False, default=None)
    """Whether every thread the tier started sleeps in the kernel (two
    looks: :meth:`~kvoffload.stateful.tier_noise.Noise.others_idle`); None
    when no noise watches the threads (:meth:`settle` then always naps)."""
    next_job: int = 0
    versions: dict[OffloadKey, int] = attrs.field(init=False, factory=dict)
    stored_ever: set[OffloadKey] = attrs.field(init=False, factory=set)
    announced: set[OffloadKey] = attrs.field(init=False, factory=set)
    census_count: int = 0
    threads_before: set[threading.Thread] = attrs.field(init=False, factory=set)
    closed: bool = False
    count_due: bool = False
    retrying: dict[tuple[str, OffloadKey], int] = attrs.field(init=False, factory=dict)
    landings: dict[OffloadKey, int] = attrs.field(init=False, factory=dict)
    missing_announced: set[OffloadKey] = attrs.field(init=False, factory=set)

    def __attrs_post_init__(self) -> None:
        self.keys = tier_keys(self.num_keys)
        # page-aligned (an anonymous mapping), as a tier writing with O_DIRECT needs
        self.memory = mmap.mmap(-1, self.rows * self.row_bytes)
        self.view = memoryview(self.memory).cast("B", (self.rows, self.row_bytes))
        self.expected = [bytes(self.row_bytes)] * self.rows
        self.owner = [None] * self.rows
        for row in range(self.rows):
            self._fill(row)
        self.model = TierModel(
            self.capacity, loads_succeed=self.loads_succeed, evicts_on_store=self.evicts_on_store
        )
        self.threads_before = set(threading.enumerate())
        if self.own_temp:  # the tier's temporary files go to a directory of the run
            self.temp_root = tempfile.mkdtemp(prefix="kvoffload-tier-run-")
            self.temp_before, tempfile.tempdir = tempfile.tempdir, self.temp_root
        try:
            self.tier = self.factory(self.capacity, self.view)
        except BaseException:
            self._release_temp()
            raise
        missing = [m for m in REQUIRED_METHODS if not callable(getattr(self.tier, m, None))]
        if missing:
            self._release_temp()
            raise TypeError(
                f"the factory returned {type(self.tier).__name__}, not a secondary tier "
                f"(no {', '.join(missing)})"
            )

    # --- primary memory -------------------------------------------------

    def _row(self, row: int) -> bytes:
        start = row * self.row_bytes
        return bytes(self.memory[start : start + self.row_bytes])

    def _write(self, row: int, data: bytes) -> None:
        start = row * self.row_bytes
        self.memory[start : start + self.row_bytes] = data
        self.expected[row] = data

    def _fill(self, row: int) -> None:
        """Overwrite a released row with a filler unique to this moment."""
        data = chunk_pattern(b"filler%04d" % row, len(self.fillers), self.row_bytes)
        self.fillers[data] = row
        self._write(row, data)

    def _free_rows(self, count: int) -> list[int] | None:
        """``count`` free rows, in an order that is not the rows' order (a
        tier that sorts or shifts slots is caught), or None."""
        free = [r for r in range(self.rows) if self.owner[r] is None]
        if count == 0 or len(free) < count:
            return None
        turn = self.next_job % len(free)
        free = free[turn:] + free[:turn]
        return free[:count][::-1] if self.next_job % 2 else free[:count]

    def check_rows(self) -> None:
        """``T2``: every row outside the promotions in flight holds what the
        kit last wrote there."""
        for row in range(self.rows):
            owner = self.owner[row]
            if owner is not None and self.model.jobs[owner].job.is_promotion:
                continue
            if self._row(row) != self.expected[row]:
                what = f"pinned for cascade {owner}" if owner is not None else "not in any job"
                raise SpecViolation(
                    Invariant.TIER_PROMOTION_SLOTS,
                    f"primary slot {row} ({what}) was written by the tier",
                )

    def _describe(
        self, data: bytes, key: OffloadKey, job_keys: Iterable[OffloadKey]
    ) -> tuple[Invariant, str]:
        """Why ``data`` is not an acceptable chunk of ``key``."""
        if data in self.copied:
            slot, landed = self.copied[data]
            return (
                Invariant.TIER_CASCADE_PINS,
                f"it holds the filler the kit wrote into primary slot {slot} once key "
                f"{landed!r} read HIT while its cascade was in flight (a HIT says the copy "
                "landed): the tier copied that slot after answering HIT",
            )
        if data in self.fillers:
            return (
                Invariant.TIER_CASCADE_PINS,
                f"it holds the filler the kit wrote into primary slot {self.fillers[data]} "
                "after a cascade released it: the tier read that slot after its job completed",
            )
        for other in self.keys:
            for version in range(1, self.versions.get(other, 0) + 1):
                if data == chunk_pattern(other, version, self.row_bytes):
                    if other == key:
                        return (
                            Invariant.TIER_READABLE,
                            f"it holds version {version} of the key, not a version stored "
                            "since the key was last seen absent (stale)",
                        )
                    if other in job_keys:
                        return (
                            Invariant.TIER_PROMOTION_SLOTS,
                            f"it holds the chunk of key {other!r} (version {version}), also "
                            "in this promotion: a chunk went to the wrong slot",
                        )
                    return (
                        Invariant.TIER_CASCADE_PINS,
                        f"it holds the chunk of key {other!r} (version {version}): the "
                        "cascade of this key read a primary slot not pinned for it (or "
                        "after its job completed, once the slot held that chunk)",
                    )
        return Invariant.TIER_READABLE, "it matches no chunk ever stored (a torn or partial read)"

    # --- calls ------------------------------------------------------------

    def _lookup(self, key: OffloadKey, context: ReqContext) -> tuple[LookupResult, LookupResult]:
        """``lookup(key)``, unchecked: the answer, and what it shows the
        model (RETRY, nothing, for a MISS that may be stale). A MISS is
        stale when the profile says so (``tier_stale_misses``) or when it
        ends an asynchronous lookup that a store of the key completed
        during: an answer given after RETRY takes effect at some instant
        since the first RETRY of that request for that key, so it may
        predate a store reported since."""
        answer = lookup_answer(self.tier.lookup(key, context))
        asked = (context.req_id, key)
        stale = self.stale_misses
        if answer is LookupResult.RETRY:
            self.retrying.setdefault(asked, self.landings.get(key, 0))
        elif asked in self.retrying:
            stale = stale or self.retrying.pop(asked) != self.landings.get(key, 0)
        if answer is LookupResult.MISS and stale:
            return answer, LookupResult.RETRY
        return answer, answer

    def _ask(self, key: OffloadKey, req: int | ReqContext) -> LookupResult:
        """``lookup(key)``, checked against the model: the answer (a MISS
        that may be stale, see :meth:`_lookup`, is not held against the
        tier)."""
        context = req if isinstance(req, ReqContext) else self._context(req)
        answer, shown = self._lookup(key, context)
        before = self.model
        self.model = self.model.observe(key, shown)
        self._landed(before, key)
        self._seen_missing(key, shown)
        return answer

    def _landed(self, before: TierModel, key: OffloadKey) -> None:
        """When an answer just showed a cascade's copy of ``key`` landed
        (:meth:`TierModel.landed_slot`), the tier reads that slot no more:
        the kit overwrites it with a filler (a tier that copies it later,
        having answered HIT before its copy, stores the filler: ``T3``)."""
        slot = self.model.landed_slot(before, key)
        if slot is None:
            return
        self._fill(slot)
        data = self.expected[slot]
        del self.fillers[data]
        self.copied[data] = (slot, key)

    def _seen_missing(self, key: OffloadKey, shown: LookupResult) -> None:
        """A MISS for a key the tier's events announced stored: the next
        take of events must remove it (``6 events``)."""
        if shown is LookupResult.MISS and key in self.announced:
            self.missing_announced.add(key)

    def _record(self, text: str) -> None:
        """Note what the current step observed (a comment on its script line)."""
        comment = text.partition("#")[2].strip()
        if comment and self.trace:
            call = self.trace[-1].partition("  #")[0]
            self.trace[-1] = f"{call}  # {comment}"

    def step(self, op: TierOp) -> None:
        """Run ``op`` (one method call), recording it first, then check the
        rows (``T2``). Callers on several threads hold one lock around
        ``step`` (as vLLM's callers hold the manager's lock): ``ops`` is then
        the calls in the order they took effect."""
        if self.on_step is not None:
            self.on_step(len(self.ops))
        self.ops.append(op)
        self.trace.append(op.render())
        getattr(self, op.method)(*op.args)
        self.check_rows()
        self.check_pending_work()
        self.done += 1

    def drive_step(self, method: str, args: tuple[Any, ...]) -> None:
        """One call made as :meth:`step` makes it (the checks after it
        included): how a replay script's calls run under a
        :class:`~kvoffload.stateful.tier_noise.Schedule` (``Schedule.drive``)."""
        self.step(TierOp(method, args))

    def check_pending_work(self) -> None:
        """``T6``: while a job is unreported (in flight, or its result not
        yet taken), ``has_pending_work()`` (when the tier has it) is True
        (profile option ``tier_pending_work``)."""
        pending = getattr(self.tier, "has_pending_work", None)
        if self.closed or not self.pending_work or not self.model.jobs or not callable(pending):
            return
        if not pending():
            raise SpecViolation(
                Invariant.TIER_DRAIN,
                f"has_pending_work() is False while jobs {list(self.model.in_flight())} "
                "are unreported",
            )

    def _bounded(self, what: str, call: Callable[[], object], seconds: float) -> None:
        """``call()`` on a helper thread; ``T7 tier progress`` when it has
        not returned within ``seconds`` (the helper is left blocked: a
        daemon thread). What it raised is raised here."""
        done = threading.Event()
        raised: list[BaseException] = []

        def run() -> None:
            try:
                call()
            except BaseException as error:  # noqa: BLE001 - re-raised on the caller's thread
                raised.append(error)
            finally:
                done.set()

        helper = threading.Thread(target=run, daemon=True, name=f"{KIT_THREAD_PREFIX}tier-{what}")
        helper.start()
        if not done.wait(seconds):
            raise SpecViolation(
                Invariant.TIER_PROGRESS, f"{what}() did not return within {seconds:g} s"
            )
        if raised:
            raise raised[0]

    def _spell(self, keys: Iterable[OffloadKey]) -> str:
        return "[" + ", ".join(f"K[{self.keys.index(k)}]" for k in keys) + "]"

    def _context(self, req: int) -> ReqContext:
        return ReqContext(req_id=f"req-{req}")

    def lookup(self, index: int, req: int = 0) -> LookupResult:
        """``lookup(K[index])`` for request ``req``; checked against the model."""
        answer = self._ask(self.keys[index], req)
        self._record(f"t.lookup({index}, req={req})  # {answer.name}")
        return answer

    def store(self, indices: list[int], req: int = 0) -> int | None:
        """A cascade of ``K[i]`` for ``i`` in ``indices``: looks each key up
        first (checked), fills free rows with each key's next version, pins
        them, submits. None when the
        primary has no free rows for it (nothing is done)."""
        if self.count_due and not any(not r.job.is_promotion for r in self.model.jobs.values()):
            self._count_readable()  # before this cascade may evict
        rows = self._free_rows(len(indices))
        if rows is None or not indices:
            return None
        keys = tuple(self.keys[i] for i in indices)
        before = []
        for key in keys:  # what the tier holds now: a key it evicted is re-stored fresh
            before.append(self._ask(key, req).name)
        versions = []
        for key, row in zip(keys, rows):
            version = self.versions.get(key, 0) + 1
            self.versions[key] = version
            versions.append(version)
            self._write(row, chunk_pattern(key, version, self.row_bytes))
        job = TierJob(self.next_job, keys, tuple(rows), False, self._context(req))
        self.next_job += 1
        for row in rows:
            self.owner[row] = job.job_id
        self.stored_ever.update(keys)
        self.model = self.model.submit_store(job, versions)
        self._record(
            f"t.store({list(indices)}, req={req})  # lookup first: {before}; job {job.job_id}: "
            f"versions {versions} from slots {list(rows)}"
        )
        self.tier.submit_store(submitted(job))
        self._check_pins()  # a cascade may evict: not a key a promotion pins
        return job.job_id

    def load(self, indices: list[int], req: int = 0, absent: bool = False) -> int | None:
        """A promotion of those ``K[i]`` the model holds present (a tiering
        manager promotes only keys the tier answered HIT for; one the tier
        evicted since is promoted all the same, and must fail) into free
        rows, allocated for it; with ``absent``, of every ``K[i]`` named, the
        absent ones standing for keys evicted since their HIT (the tier
        table's ABSENT submit_load row: the load must fail for them). None
        when no key is left or the primary has no free rows for it."""
        indices = [
            i for i in indices
            if self.model.key(self.keys[i]).present
            or (absent and self.model.key(self.keys[i]).kind is TierPhaseKind.ABSENT)
        ]
        rows = self._free_rows(len(indices))
        if rows is None or not indices:
            return None
        keys = tuple(self.keys[i] for i in indices)
        job = TierJob(self.next_job, keys, tuple(rows), True, self._context(req))
        self.next_job += 1
        for row in rows:
            self.owner[row] = job.job_id
        self.model = self.model.submit_load(job)
        self.tier.submit_load(submitted(job))
        answers = []
        for key in keys:
            answer, shown = self._lookup(key, self._context(req))
            answers.append(answer.name)
            before = self.model
            self.model = self.model.confirm_load(job.job_id, key, shown)
            self._landed(before, key)
            self._seen_missing(key, shown)
        self._record(
            f"t.load({list(indices)}, req={req}{', absent=True' if absent else ''})  # job {job.job_id} into slots {list(rows)}; "
            f"then lookup: {answers}"
        )
        return job.job_id

    def lookup_load(self, indices: list[int], req: int = 0) -> int | None:
        """Look ``K[i]`` up (checked) and promote at once those that read
        HIT: a HIT while a store of the key is in flight says the copy
        landed, so its bytes must load back (a file made visible before its
        contents are written fails here). None when none reads HIT."""
        answers = [self._ask(self.keys[i], req) for i in indices]
        self._record(f"t.lookup_load({list(indices)}, req={req})  # {[a.name for a in answers]}")
        hits = [i for i, a in zip(indices, answers) if a is LookupResult.HIT]
        if not hits:
            return None
        return self.load(hits, req)

    def poll(self, count: bool = True) -> list[int]:
        """``get_finished_jobs()``: each result checked (job reported once,
        keys a subset, bytes of every key that made it); the job's rows are
        released; when that reported the last cascade in flight, every key
        is looked up once (``T4``; not when ``count`` is False, as for the
        tier-poll thread's frequent polls). The ids reported."""
        results = list(self.tier.get_finished_jobs())
        ids = []
        notes = []
        stored = False
        for result in results:
            job_id = int(result.job_id)
            ids.append(job_id)
            keys = getattr(result, "successful_keys", None)
            before = self.model
            self.model, record, made_it = self.model.report(job_id, bool(result.success), keys)
            notes.append(f"{job_id}:{'ok' if len(made_it) == len(record.job.keys) else len(made_it)}")
            job = record.job
            if not job.is_promotion:
                for key in made_it:
                    self.landings[key] = self.landings.get(key, 0) + 1
            for key, row in zip(job.keys, job.chunk_ids):
                if job.is_promotion:
                    data = self._row(row)
                    accepted = before.acceptable_chunks(key, self.row_bytes, record)
                    if key in made_it and data not in accepted:
                        invariant, why = self._describe(data, key, job.keys)
                        elsewhere = [
                            other for other in job.chunk_ids
                            if other != row and self._row(other) in accepted
                        ]
                        if elsewhere:
                            invariant, why = (
                                Invariant.TIER_PROMOTION_SLOTS,
                                f"the key's chunk went to slot {elsewhere[0]}, another key's "
                                "slot of this promotion",
                            )
                        elif data == self.expected[row]:
                            invariant, why = (
                                Invariant.TIER_READABLE,
                                "the slot still holds what it held before: the promotion "
                                "wrote nothing there",
                            )
                        raise SpecViolation(
                            invariant,
                            f"promotion {job_id} reported key {key!r} loaded into slot {row}, "
                            f"but {why}",
                        )
                    self.expected[row] = data
                    self.owner[row] = None
                else:
                    self.owner[row] = None
                    self._fill(row)
                    stored = True
        self._record(f"t.poll({'' if count else 'False'})  # reported {notes}")
        self._check_pins()
        cascades = any(not r.job.is_promotion for r in self.model.jobs.values())
        if self.bounded and stored and not cascades:
            if count:
                self._count_readable()
            else:  # the tier-poll thread's: the next cascade counts first
                self.count_due = True
        return ids

    def _count_readable(self) -> None:
        """Once the last cascade in flight is reported, look every key up
        once (a RETRY counts as no HIT): ``T4``. With no cascade in flight
        no key can land, so the HITs describe one instant."""
        self.count_due = False
        hits = [
            key for key in self.keys
            if self._ask(key, POLL_CENSUS_REQUEST) is LookupResult.HIT
        ]
        check_capacity(self.model, hits)

    def _check_pins(self) -> None:
        """Look up the keys pinned by promotions still in flight (``T0``:
        one seen evicted must then be loaded by its promotion)."""
        for key in sorted({k for r in self.model.jobs.values() for k in r.pinned}):
            self._ask(key, 0)

    def drain(self) -> None:
        """``drain_jobs()``, then ``get_finished_jobs()``: nothing may remain
        in flight (``T6``); a job still missing after a further 20 ms is
        lost (``T5``)."""
        self._bounded("drain_jobs", self.tier.drain_jobs, DRAIN_BOUND_S)
        self._record("t.drain()")
        try:  # results not yet taken are pending work (raised once none is lost)
            self.check_pending_work()
            idle: SpecViolation | None = None
        except SpecViolation as error:
            idle = error
        self.poll()
        if self.model.jobs:
            nap(0.02)
            self.poll()
            if self.model.jobs:
                raise SpecViolation(
                    Invariant.TIER_JOBS,
                    f"jobs {list(self.model.in_flight())} were never reported (lost)",
                )
            raise SpecViolation(
                Invariant.TIER_DRAIN, "drain_jobs returned while jobs were still in flight"
            )
        if idle is not None:
            raise idle
        pending = getattr(self.tier, "has_pending_work", None)
        check_drained(self.model, bool(pending()) if callable(pending) else None)

    def disk_full(self, on: bool) -> None:
        """A failing disk, for every file the process writes: while ``on``,
        every write of a byte to a file fails whole (``EFBIG``:
        ``RLIMIT_FSIZE`` 0, ``SIGXFSZ`` ignored; nothing is written, so a
        preallocated slab fails as a chunk file does). A store then may
        fail, and must say so:
        a key whose write failed is not readable, and no torn chunk loads
        back (``T1``). Only on the main thread of a platform with
        ``resource`` (elsewhere nothing happens)."""
        self._record(f"t.disk_full({on})")
        if on and self.disk_limit is None:
            try:
                import resource
                import signal
            except ImportError:  # pragma: no cover - not POSIX
                return
            if threading.current_thread() is not threading.main_thread():
                return
            self.disk_signal = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            self.disk_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE, (0, self.disk_limit[1]))
        elif not on:
            self._disk_restored()

    def _disk_restored(self) -> None:
        """End :meth:`disk_full`'s fault, if on."""
        if self.disk_limit is None:
            return
        import resource
        import signal

        resource.setrlimit(resource.RLIMIT_FSIZE, self.disk_limit)
        signal.signal(signal.SIGXFSZ, self.disk_signal)
        self.disk_limit = None

    def settle(self) -> None:
        """Let the tier's own threads run for a millisecond. Nothing to wait
        for, no nap: the tier started no thread, or no job is in flight and
        every thread it started sleeps in the kernel (:attr:`threads_idle`)."""
        idle = not self.tier_threads() or (
            not self.model.jobs and self.threads_idle is not None and self.threads_idle()
        )
        if not idle:
            nap(0.001)
        self._record("t.settle()")

    def new_request(self, req: int) -> None:
        hook = getattr(self.tier, "on_new_request", None)
        if callable(hook):
            hook(self._context(req))
        self._record(f"t.new_request({req})")

    def finish_request(self, req: int) -> None:
        """``on_request_finished``: jobs of the request may still be in flight."""
        hook = getattr(self.tier, "on_request_finished", None)
        if callable(hook):
            hook(self._context(req))
        self._forget(self._context(req))
        self._record(f"t.finish_request({req})")

    def _forget(self, context: ReqContext) -> None:
        """A finished request's lookups answering RETRY are over."""
        self.retrying = {a: n for a, n in self.retrying.items() if a[0] != context.req_id}

    def schedule_end(self) -> None:
        hook = getattr(self.tier, "on_schedule_end", None)
        if callable(hook):
            hook(None)
        self._record("t.schedule_end()")

    def touch(self, indices: list[int], req: int = 0) -> None:
        hook = getattr(self.tier, "touch", None)
        if callable(hook):
            hook([self.keys[i] for i in indices], self._context(req))
        self._record(f"t.touch({list(indices)}, req={req})")

    def reset(self) -> None:
        """What the tiering manager's ``reset_cache`` does to a tier: drain
        it, take every result, and release every primary slot (the kit
        overwrites them all)."""
        self._record("t.reset()")
        self.drain()
        for row in range(self.rows):
            self._fill(row)

    def take_events(self) -> None:
        """``take_events()``: a stored event names a key stored before
        (``T1``); per key, stored and removed alternate, and a key announced
        stored that read MISS before this take is removed by it or earlier
        (``6 events``: a consumer holds the readable keys)."""
        hook = getattr(self.tier, "take_events", None)
        if not callable(hook):
            return
        events = list(hook())
        self._record(f"t.take_events()  # {len(events)} events")
        for event in events:
            removed = bool(getattr(event, "removed", False))
            for raw in getattr(event, "keys", ()):
                key = OffloadKey(bytes(raw))
                if not removed and key not in self.stored_ever:
                    raise SpecViolation(
                        Invariant.TIER_READABLE, f"a stored event for {key!r}, never stored"
                    )
                if removed != (key in self.announced):
                    word = "removed without being stored" if removed else "stored twice"
                    raise SpecViolation(Invariant.EVENTS, f"tier event: {key!r} {word}")
                (self.announced.discard if removed else self.announced.add)(key)
                if removed:
                    self.missing_announced.discard(key)
        # a consumer that applied every event holds the readable keys: one
        # it holds that read MISS before this take must have been removed
        unremoved = sorted(self.missing_announced & self.announced)
        self.missing_announced.clear()
        if unremoved:
            raise SpecViolation(
                Invariant.EVENTS,
                f"tier events: {unremoved[0]!r} read MISS while announced stored, and the "
                "events taken since hold no removed event for it",
            )

    def lookup_loading(self, req: int = 0) -> int:
        """Look up every key a promotion in flight pins: each must still be
        readable, or its promotion must make it (``T0``). How many keys."""
        pinned = sorted({k for r in self.model.jobs.values() for k in r.pinned})
        answers = []
        for key in pinned:
            answers.append(self._ask(key, req).name)
        self._record(f"t.lookup_loading()  # {answers}")
        return len(pinned)

    def census(self) -> int:
        """Look up every key for two requests at once, as two waiting
        requests sharing a prefix ask (asking again while RETRY, for at most
        :data:`RETRY_BOUND_S`: ``T7``); every answer is checked against the
        model, and, when no cascade is in flight, the HITs number at most
        ``capacity`` (``T4``). The number of keys that answered HIT."""
        req = 1000 + 2 * self.census_count
        self.census_count += 1
        # The lookups follow one another while the tier's threads run: the
        # HITs describe one instant only when no key can land meanwhile, i.e.
        # no cascade is in flight (every HIT key was then held at the first HIT)
        atomic = not any(not r.job.is_promotion for r in self.model.jobs.values())
        contexts = (self._context(req), self._context(req + 1))
        hits: set[OffloadKey] = set()
        waiting = [(index, context) for index in range(self.num_keys) for context in contexts]
        deadline = time.perf_counter() + RETRY_BOUND_S
        asking: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext
        while waiting:
            retry = []
            with asking():
                for index, context in waiting:
                    key = self.keys[index]
                    answer = self._ask(key, context)
                    if answer is LookupResult.HIT:
                        hits.add(key)
                    elif answer is LookupResult.RETRY:
                        retry.append((index, context))
            waiting = retry
            asking = self.quietly  # asking again is polling
            if not waiting:
                break
            if time.perf_counter() > deadline:
                stuck = sorted({f"K[{index}] for {context.req_id}" for index, context in waiting})
                raise SpecViolation(
                    Invariant.TIER_PROGRESS,
                    f"lookup answered RETRY for {RETRY_BOUND_S:g} s of asking again: "
                    + ", ".join(stuck),
                )
            hook = getattr(self.tier, "on_schedule_end", None)
            if callable(hook):
                hook(None)
            nap(0.0002)
        finish = getattr(self.tier, "on_request_finished", None)
        if callable(finish):
            for context in contexts:
                finish(context)
                self._forget(context)
        self._record(f"t.census()  # {len(hits)} HIT")
        if self.bounded and atomic:
            check_capacity(self.model, hits)
        return len(hits)

    def tier_threads(self) -> list[str]:
        """The names of the threads alive that the tier started."""
        return sorted(
            thread.name
            for thread in threading.enumerate()
            if thread not in self.threads_before
            and thread.is_alive()
            and not thread.name.startswith(KIT_THREAD_PREFIX)
        )

    def close(self) -> None:
        """``shutdown()`` (when the tier has it): it returns within
        :data:`SHUTDOWN_BOUND_S`, and then no thread the tier started still
        runs (``T7``: "release threads")."""
        hook = getattr(self.tier, "shutdown", None)
        self._disk_restored()
        if self.closed:
            return
        self.closed = True
        try:
            if not callable(hook):
                return
            self._bounded("shutdown", hook, SHUTDOWN_BOUND_S)
            left = self.tier_threads()
            if left:
                raise SpecViolation(
                    Invariant.TIER_PROGRESS,
                    f"shutdown() returned while the tier's threads {left} still run",
                )
        finally:
            kept = self._release_temp()
        if kept:
            raise SpecViolation(
                Invariant.TIER_PROGRESS,
                f"shutdown() left the temporary files {kept} the tier made (profile option "
                "tier_shutdown_removes_temp)",
            )

    def _release_temp(self) -> list[str]:
        """Restore ``tempfile.tempdir``, remove the run's temporary
        directory; what the tier had left in it (``own_temp``)."""
        root = self.temp_root
        if root is None:
            return []
        self.temp_root = None
        tempfile.tempdir = self.temp_before
        kept = sorted(os.listdir(root))
        shutil.rmtree(root, ignore_errors=True)
        return kept

    def shutdown(self) -> None:
        """End the run: ``shutdown()``, maybe with jobs in flight (see
        :meth:`close`)."""
        self._record("t.shutdown()")
        self.close()

    # --- the replay script --------------------------------------------------

    def script(
        self, factory_import: str | None, failure: str, schedule: Sequence[Pause] | None = None
    ) -> str:
        """The trace as a Python script: each step a call of this class's
        method; the last one raises the violation. With ``schedule`` (a race
        with the tier's own threads, directed: :class:`~kvoffload.stateful.tier_noise.Schedule`)
        the calls run as the steps of that schedule, so that the script
        replays the run's interleaving, not only its calls."""
        if factory_import:
            module, _, name = factory_import.partition(":")
            head = f"from {module} import {name} as factory"
        else:
            head = "from your_module import factory  # the audited factory"
        build = (
            f"TierHarness(factory, capacity={self.capacity}, rows={self.rows}, "
            f"num_keys={self.num_keys}, row_bytes={self.row_bytes}, bounded={self.bounded}, "
            f"stale_misses={self.stale_misses}, pending_work={self.pending_work}, "
            f"loads_succeed={self.loads_succeed}, evicts_on_store={self.evicts_on_store}, "
            f"own_temp={self.own_temp})"
        )
        lines = ["# Replays a secondary-tier failure found by `kvoffload audit --tier`.", head]
        lines.append("from kvoffload.stateful.tier_harness import TierHarness")
        if schedule is None:
            lines += [
                "",
                f"t = {build}",
                "try:",
                *[f"    {line}" for line in self.trace],
                "    t.check_rows()",
                "    raise SystemExit('the failure did not recur (a race: run the script again)')",
                "finally:",
                "    t.close()",
            ]
        else:
            lines += [
                "from kvoffload.stateful.tier_noise import Pause, Schedule",
                "",
                "# A race with the tier's own threads, replayed deterministically: the",
                "# thread that reaches a listed line for the listed time (hit) pauses",
                "# there until the call numbered `until` below has returned (counting",
                "# from 1), and the call after `after` waits until it is paused. No other",
                "# delays: the failure recurs on every run.",
                "schedule = Schedule([",
                *[f"    {pause.render()}," for pause in schedule],
                "])",
                "with schedule:",
                f"    h = {build}",
                "    t = schedule.drive(h)  # each call of t is one step of the schedule",
                "    try:",
                *[f"        {line}" for line in self.trace],
                "        h.check_rows()",
                "        raise SystemExit('the failure did not recur: ' + schedule.verdict())",
                "    finally:",
                "        h.close()",
            ]
        lines.append(f"# expected: {failure}")
        return "\n".join(lines) + "\n"


__all__ = [
    "REQUIRED_METHODS",
    "ROW_BYTES",
    "TierFactory",
    "TierHarness",
    "SubmittedJob",
    "TempDirTier",
    "TierOp",
    "lookup_answer",
    "tier_keys",
]
