"""A secondary tier as data: per-key phases, the tier table, jobs and bytes.

A tier (:class:`~kvoffload.spec.tier_contract.SecondaryTier`) holds chunks
behind the primary (CPU) tier. The tier decides when a copy lands, which
keys it evicts and whether a job fails; the model cannot know those choices
in advance, so it is stated over what a caller *observes*: the jobs it
submits, the results ``get_finished_jobs`` reports, the answers of
``lookup`` (and the tier's events), and the bytes a promotion writes. Each
observation moves a key along a row of :data:`TIER_TRANSITIONS`; an
observation the table forbids breaks a named
:class:`~kvoffload.spec.violations.Invariant` (``T0``..``T6``).

Per key the model keeps (:class:`TierKey`): whether the tier is known to
hold it (``present``), the versions of the bytes a load may read back
(``versions``: every store of the key that completed since the key was last
seen absent), the stores of it in flight and the loads of it in flight. The
phase (:class:`TierPhaseKind`) is derived from those: LOADING while a load
is in flight, else PRESENT, else STORING while a store is in flight, else
ABSENT.

Bytes: the primary tier's chunk of ``key`` stored at version ``v`` holds
:func:`chunk_pattern(key, v, size) <chunk_pattern>`, unique to ``(key, v)``;
a promotion that succeeds for ``key`` must leave in the job's slot for
``key`` exactly ``chunk_pattern(key, v)`` for some ``v`` in the key's
``versions`` (:meth:`TierModel.acceptable_chunks`).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from types import MappingProxyType

import attrs

from kvoffload.spec.contract import LookupResult
from kvoffload.spec.errors import OffloadingError
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.model import FrozenMap
from kvoffload.spec.tier_contract import JobId, TierJob
from kvoffload.spec.violations import Invariant, SpecViolation


class TierPhaseKind(enum.Enum):
    """A tier key's phase (counts of jobs in flight aside)."""

    ABSENT = "ABSENT"
    STORING = "STORING"
    PRESENT = "PRESENT"
    LOADING = "LOADING"


class TierCall(enum.Enum):
    """Everything a caller observes that moves a tier key's phase."""

    SUBMIT_STORE = "submit_store"
    STORE_OK = "store reported, key made it"
    STORE_FAILED = "store reported, key failed"
    SUBMIT_LOAD = "submit_load"
    LOAD_UNPINNED = "no HIT right after submit_load"
    LOAD_REPORTED = "load reported"
    LOOKUP_HIT = "lookup HIT (or a stored event)"
    LOOKUP_MISS = "lookup MISS (or a removed event)"


@attrs.frozen
class TierTransition:
    """One row of the tier table: the phases the key may move to (several
    when a count in flight decides), the event a tier may announce, and a
    note."""

    targets: tuple[TierPhaseKind, ...]
    event: str | None = None
    note: str = ""


_A, _S, _P, _L = (
    TierPhaseKind.ABSENT,
    TierPhaseKind.STORING,
    TierPhaseKind.PRESENT,
    TierPhaseKind.LOADING,
)

TIER_TRANSITIONS: Mapping[tuple[TierPhaseKind, TierCall], TierTransition] = MappingProxyType(
    {
        # cascades (stores)
        (_A, TierCall.SUBMIT_STORE): TierTransition((_S,)),
        (_S, TierCall.SUBMIT_STORE): TierTransition((_S,), note="another store in flight"),
        (_P, TierCall.SUBMIT_STORE): TierTransition((_P,), note="re-store: skipped or rewritten"),
        (_L, TierCall.SUBMIT_STORE): TierTransition((_L,), note="re-store: skipped or rewritten"),
        (_S, TierCall.STORE_OK): TierTransition((_P,), event="stored"),
        (_P, TierCall.STORE_OK): TierTransition((_P,)),
        (_L, TierCall.STORE_OK): TierTransition((_L,)),
        (_S, TierCall.STORE_FAILED): TierTransition(
            (_S, _A), note="ABSENT when no store of it remains in flight"
        ),
        (_P, TierCall.STORE_FAILED): TierTransition((_P,), note="the stored copy stays"),
        (_L, TierCall.STORE_FAILED): TierTransition((_L,), note="the stored copy stays"),
        # promotions (loads)
        (_P, TierCall.SUBMIT_LOAD): TierTransition((_L,)),
        (_L, TierCall.SUBMIT_LOAD): TierTransition((_L,), note="n+1 loads"),
        (_A, TierCall.SUBMIT_LOAD): TierTransition((_A,), note="the load must fail for this key"),
        (_L, TierCall.LOAD_UNPINNED): TierTransition(
            (_L, _P, _S, _A),
            note="the tier may have evicted it before the load: the load does not pin it "
            "(ABSENT on MISS)",
        ),
        (_L, TierCall.LOAD_REPORTED): TierTransition(
            (_L, _P, _S, _A),
            note="after the last load: PRESENT, or as the tier was seen to leave it; bytes "
            "checked if it made it; failing after the key was seen evicted is T0",
        ),
        # observations of the tier's own choices
        (_A, TierCall.LOOKUP_MISS): TierTransition((_A,)),
        (_S, TierCall.LOOKUP_MISS): TierTransition((_S,), note="the copy has not landed"),
        (_P, TierCall.LOOKUP_MISS): TierTransition(
            (_A, _S), event="removed", note="evicted by the tier (STORING if a store remains)"
        ),
        (_L, TierCall.LOOKUP_MISS): TierTransition(
            (_L,),
            event="removed",
            note="evicted while loading: legal only if the load's copy had finished, so the "
            "load must make it",
        ),
        (_S, TierCall.LOOKUP_HIT): TierTransition((_P,), note="a store in flight landed"),
        (_P, TierCall.LOOKUP_HIT): TierTransition((_P,)),
        (_L, TierCall.LOOKUP_HIT): TierTransition((_L,)),
    }
)
"""Every legal ``(phase, observation)`` pair. ``RETRY`` moves nothing and is
always legal."""

FORBIDDEN: Mapping[tuple[TierPhaseKind, TierCall], tuple[Invariant, str]] = MappingProxyType(
    {
        (_A, TierCall.LOOKUP_HIT): (
            Invariant.TIER_READABLE,
            "readable though no store of it completed (or it was seen evicted since)",
        ),
    }
)
"""The pairs missing from the table that a *tier* can cause, and the rule
each breaks. Every other missing pair is a call no caller makes
(:class:`IllegalTierCallError`)."""


class IllegalTierCallError(OffloadingError):
    """A caller's call that the tier table has no row for (a kit or caller
    bug, not a finding about the tier): e.g. a store report for a key with
    no store in flight."""

    def __init__(self, key: bytes, phase: TierPhaseKind, call: TierCall) -> None:
        super().__init__(f"{call.value} is illegal for tier key {key!r} in phase {phase.value}")
        self.key = key
        self.phase = phase
        self.call = call


class InvalidTierJobError(OffloadingError):
    """A job the model cannot take: an id already used, keys repeated, a
    slot count that differs from the key count, a store without versions."""


@attrs.frozen
class TierKey:
    """What the model knows of one key in a tier (see the module docstring)."""

    present: bool = False
    versions: frozenset[int] = frozenset()
    storing: tuple[int, ...] = ()
    loads: int = 0
    evicted_under_load: bool = False
    room_made: bool = False
    """A cascade was submitted since the key was last seen held (a HIT) or
    absent: the tier may have evicted it to make room (profile option
    ``tier_evicts_on_store``)."""
    unlanded: int = 0
    """How many of the stores in flight (``storing``) may still land: a HIT
    of a key that was STORING shows one of them landed."""

    @property
    def kind(self) -> TierPhaseKind:
        if self.loads > 0:
            return TierPhaseKind.LOADING
        if self.present:
            return TierPhaseKind.PRESENT
        if self.storing:
            return TierPhaseKind.STORING
        return TierPhaseKind.ABSENT

    def __str__(self) -> str:
        counts = {TierPhaseKind.LOADING: self.loads, TierPhaseKind.STORING: len(self.storing)}
        kind = self.kind
        return f"{kind.value}({counts[kind]})" if kind in counts else kind.value


def _without_one(values: tuple[int, ...], value: int) -> tuple[int, ...]:
    index = values.index(value)
    return values[:index] + values[index + 1 :]


def tier_apply(key: bytes, state: TierKey, call: TierCall, version: int | None = None) -> TierKey:
    """The state ``key`` moves to under ``call`` (``version``: the store's,
    for the store calls).

    Raises :class:`~kvoffload.spec.violations.SpecViolation` for a pair in
    :data:`FORBIDDEN` (the tier broke a rule) and
    :class:`IllegalTierCallError` for any other pair missing from
    :data:`TIER_TRANSITIONS`.
    """
    kind = state.kind
    row = TIER_TRANSITIONS.get((kind, call))
    if row is None:
        broken = FORBIDDEN.get((kind, call))
        if broken is not None:
            raise SpecViolation(broken[0], f"key {key!r} ({state}): {broken[1]}")
        raise IllegalTierCallError(key, kind, call)
    if call is TierCall.SUBMIT_STORE:
        if version is None:
            raise InvalidTierJobError("a store needs the version it writes")
        after = attrs.evolve(
            state, storing=state.storing + (version,), unlanded=state.unlanded + 1
        )
    elif call in (TierCall.STORE_OK, TierCall.STORE_FAILED):
        if version is None or version not in state.storing:
            raise IllegalTierCallError(key, kind, call)
        storing = _without_one(state.storing, version)
        unlanded = min(state.unlanded, len(storing))
        if call is TierCall.STORE_OK:
            after = TierKey(
                True,
                state.versions | {version},
                storing,
                state.loads,
                room_made=state.room_made,
                unlanded=unlanded,
            )
        else:
            after = attrs.evolve(state, storing=storing, unlanded=unlanded)
    elif call is TierCall.SUBMIT_LOAD:
        after = attrs.evolve(state, loads=state.loads + 1) if state.present else state
    elif call in (TierCall.LOAD_REPORTED, TierCall.LOAD_UNPINNED):
        after = attrs.evolve(state, loads=state.loads - 1)
        if call is TierCall.LOAD_UNPINNED and version == 0:  # MISS: evicted before the load
            after = attrs.evolve(
                after,
                present=False,
                versions=frozenset(),
                room_made=after.room_made and bool(after.storing),
            )
        if after.loads == 0:
            after = attrs.evolve(after, evicted_under_load=False)
    elif call is TierCall.LOOKUP_HIT:
        if state.present:
            after = attrs.evolve(state, room_made=False)
        else:  # one of the stores in flight landed: any of their versions may be read
            after = attrs.evolve(
                state,
                present=True,
                versions=frozenset(state.storing),
                room_made=False,
                unlanded=min(state.unlanded, len(state.storing) - 1),
            )
    else:  # LOOKUP_MISS
        after = state if state.storing else attrs.evolve(state, room_made=False)
        if state.present:
            after = attrs.evolve(
                after, present=False, versions=frozenset(), evicted_under_load=state.loads > 0
            )
    if after.kind not in row.targets:  # pragma: no cover - the table and this code agree
        raise AssertionError(f"tier_apply left {key!r} {after}, the table says {row.targets}")
    return after


# --- bytes ------------------------------------------------------------------


def chunk_pattern(key: bytes, version: int, size: int) -> bytes:
    """The ``size`` bytes a primary chunk of ``key`` holds when stored at
    ``version``: unique to ``(key, version)``, so a torn, stale or
    misplaced chunk never passes for another. Odd versions are a BLAKE2b
    digest repeated (compressible), even versions a SHAKE-256 stream
    (incompressible): a tier that compresses chunks takes both paths."""
    tag = key + version.to_bytes(8, "big", signed=True)
    if version % 2 == 0:
        return hashlib.shake_256(b"chunk" + tag).digest(size)
    seed = hashlib.blake2b(tag, digest_size=32).digest()
    whole, rest = divmod(size, len(seed))
    return seed * whole + seed[:rest]


# --- jobs and the whole tier -------------------------------------------------


@attrs.frozen
class JobRecord:
    """A job in flight: the job, the version written in each slot of a
    store (empty for a load); of a load, the keys that were PRESENT at
    submission, or that a store in flight may serve (``counted``: they may
    make it, the others must fail), and
    those of them it still pins (``pinned``: counted as LOADING until the
    report; see :meth:`TierModel.confirm_load`)."""

    job: TierJob
    versions: tuple[int, ...] = ()
    counted: frozenset[OffloadKey] = frozenset()
    pinned: frozenset[OffloadKey] = frozenset()
    readable: FrozenMap[OffloadKey, frozenset[int]] = attrs.field(factory=FrozenMap)


def job_outcome(
    job: TierJob, success: bool, successful_keys: Collection[OffloadKey] | None
) -> frozenset[OffloadKey]:
    """The keys a result says made it; :class:`SpecViolation` (``T5 tier
    jobs``) when ``successful_keys`` is not a subset of the job's keys or
    contradicts ``success=True``."""
    keys = frozenset(job.keys)
    if successful_keys is None:
        return keys if success else frozenset()
    named = frozenset(OffloadKey(bytes(k)) for k in successful_keys)
    if not named <= keys:
        raise SpecViolation(
            Invariant.TIER_JOBS,
            f"job {job.job_id} reports successful keys {sorted(named - keys)!r} it does not hold",
        )
    if success and named != keys:
        raise SpecViolation(
            Invariant.TIER_JOBS,
            f"job {job.job_id} reports success=True but only {len(named)} of "
            f"{len(keys)} keys as successful",
        )
    return named


@attrs.frozen
class TierModel:
    """The observed state of one tier (see the module docstring).

    ``capacity``: the tier's ``capacity_blocks``. ``jobs``: the jobs in
    flight. ``reported``: the ids of jobs whose result was reported.
    Methods return the next state and raise
    :class:`~kvoffload.spec.violations.SpecViolation` when an observation
    breaks a rule.
    """

    capacity: int
    keys: FrozenMap[OffloadKey, TierKey] = attrs.field(factory=FrozenMap)
    jobs: FrozenMap[JobId, JobRecord] = attrs.field(factory=FrozenMap)
    reported: frozenset[JobId] = frozenset()
    loads_succeed: bool = False
    """Profile option ``tier_loads_succeed``: a promotion makes it for every
    key it pins (False: only §10's base rules, any promotion may fail)."""
    evicts_on_store: bool = False
    """Profile option ``tier_evicts_on_store``: a key held leaves the tier
    only to make room for a cascade submitted since it was last seen held."""

    def key(self, key: OffloadKey) -> TierKey:
        return self.keys.get(key, TierKey())

    def phase(self, key: OffloadKey) -> TierPhaseKind:
        return self.key(key).kind

    def _moved(self, key: OffloadKey, call: TierCall, version: int | None = None) -> TierModel:
        after = tier_apply(key, self.key(key), call, version)
        keys = self.keys.without([key]) if after == TierKey() else self.keys.set(key, after)
        return attrs.evolve(self, keys=keys)

    def _check_new_job(self, job: TierJob) -> None:
        if job.job_id in self.jobs or job.job_id in self.reported:
            raise InvalidTierJobError(f"job id {job.job_id} was already used")
        if len(job.keys) != len(job.chunk_ids) or len(set(job.keys)) != len(job.keys):
            raise InvalidTierJobError("a job names each key once, with one slot per key")

    def submit_store(self, job: TierJob, versions: Sequence[int]) -> TierModel:
        """A cascade of ``job.keys``, ``versions[i]`` being the version in
        the pinned slot ``job.chunk_ids[i]``."""
        self._check_new_job(job)
        model = self
        if self.evicts_on_store:  # this cascade may evict any other key to make room
            stored = set(job.keys)
            marked = {
                k: attrs.evolve(state, room_made=True)
                for k, state in self.keys.items()
                if k not in stored and not state.room_made and (state.present or state.storing)
            }
            if marked:
                model = attrs.evolve(model, keys=FrozenMap([*model.keys.items(), *marked.items()]))
        for key, version in zip(job.keys, versions):
            model = model._moved(key, TierCall.SUBMIT_STORE, version)
        jobs = model.jobs
        for job_id, load in model.jobs.items():
            # a store submitted while a promotion of the key is in flight may serve it
            if not load.job.is_promotion:
                continue
            shared = {k: v for k, v in zip(job.keys, versions) if k in load.job.keys}
            if shared:
                readable = load.readable
                for key, version in shared.items():
                    readable = readable.set(key, readable.get(key, frozenset()) | {version})
                jobs = jobs.set(
                    job_id,
                    attrs.evolve(load, counted=load.counted | set(shared), readable=readable),
                )
        record = JobRecord(job, tuple(versions))
        return attrs.evolve(model, jobs=jobs.set(job.job_id, record))

    def submit_load(self, job: TierJob) -> TierModel:
        """A promotion of ``job.keys`` into the allocated slots
        ``job.chunk_ids``. It pins the PRESENT (or LOADING) keys; a key
        neither present nor being stored (now or by a store submitted
        before the report) must fail."""
        self._check_new_job(job)
        pinned = frozenset(k for k in job.keys if self.key(k).present)
        counted = pinned | {k for k in job.keys if self.key(k).storing}
        model = self
        for key in job.keys:
            model = model._moved(key, TierCall.SUBMIT_LOAD)
        readable = FrozenMap(
            (k, self.key(k).versions | frozenset(self.key(k).storing)) for k in counted
        )
        record = JobRecord(job, (), counted, pinned, readable)
        return attrs.evolve(model, jobs=model.jobs.set(job.job_id, record))

    def confirm_load(self, job_id: int, key: OffloadKey, answer: LookupResult) -> TierModel:
        """``lookup(key)`` answered ``answer`` right after promotion
        ``job_id`` was submitted. HIT: the load pins the key until its
        report (a MISS before then is ``T0``), unless the tier may have
        evicted it before the load (a cascade since it was last seen held)
        and a store of it in flight may have landed since, which the HIT
        may be. MISS: the tier had evicted
        it before the load, which must fail for it. RETRY: the load does
        not pin it (it may still make it)."""
        record = self.jobs[job_id]
        state = self.key(key)
        if (
            answer is LookupResult.HIT
            and key in record.pinned
            and state.unlanded > 0
            and (state.room_made or not self.evicts_on_store)
        ):
            # the tier may have evicted the key before the load and a store
            # of it landed since: the HIT does not show it held throughout
            model = self._moved(key, TierCall.LOAD_UNPINNED)
            record = attrs.evolve(record, pinned=record.pinned - {key})
            model = attrs.evolve(model, jobs=model.jobs.set(job_id, record))
            return model.observe(key, answer)
        if answer is LookupResult.HIT or key not in record.pinned:
            return self.observe(key, answer) if answer is not LookupResult.RETRY else self
        miss = answer is LookupResult.MISS
        if miss:
            self._check_eviction(key)
        model = self._moved(key, TierCall.LOAD_UNPINNED, 0 if miss else None)
        record = attrs.evolve(
            record,
            pinned=record.pinned - {key},
            counted=record.counted - {key} if miss and not model.key(key).storing else record.counted,
        )
        return attrs.evolve(model, jobs=model.jobs.set(job_id, record))

    def report(
        self, job_id: int, success: bool, successful_keys: Collection[OffloadKey] | None
    ) -> tuple[TierModel, JobRecord, frozenset[OffloadKey]]:
        """A result ``get_finished_jobs`` reported: the next state, the job's
        record and the keys that made it. ``T5 tier jobs`` when the job is
        unknown, already reported, or its keys are misreported; ``T1 tier
        readable`` when a load made it for a key that was not PRESENT."""
        record = self.jobs.get(job_id)
        if record is None:
            why = "a second time" if job_id in self.reported else "though it was never submitted"
            raise SpecViolation(Invariant.TIER_JOBS, f"job {job_id} reported {why}")
        job = record.job
        made_it = job_outcome(job, success, successful_keys)
        model = self
        if job.is_promotion:
            phantom = made_it - record.counted
            if phantom:
                raise SpecViolation(
                    Invariant.TIER_READABLE,
                    f"promotion {job_id} loaded {sorted(phantom)!r}, which the tier did not "
                    "hold when the load was submitted",
                )
            for key in job.keys:
                if key not in record.pinned:
                    continue
                if key not in made_it and model.key(key).evicted_under_load:
                    raise SpecViolation(
                        Invariant.TIER_LIFECYCLE,
                        f"key {key!r} was evicted while promotion {job_id} of it was in "
                        "flight, and the promotion failed for it",
                    )
                if key not in made_it and self.loads_succeed:
                    raise SpecViolation(
                        Invariant.TIER_LIFECYCLE,
                        f"promotion {job_id} failed for key {key!r}, which it pinned (the "
                        "key read HIT right after the load was submitted): a HIT key must "
                        "load (profile option tier_loads_succeed)",
                    )
                model = model._moved(key, TierCall.LOAD_REPORTED)
        else:
            for key, version in zip(job.keys, record.versions):
                call = TierCall.STORE_OK if key in made_it else TierCall.STORE_FAILED
                model = model._moved(key, call, version)
        model = attrs.evolve(
            model, jobs=model.jobs.without([job_id]), reported=model.reported | {job_id}
        )
        if not job.is_promotion:
            for key in made_it:
                model = model._room_in_flight(key)
        return model, record, made_it

    def _room_in_flight(self, key: OffloadKey) -> TierModel:
        """``key`` was just seen held: with ``evicts_on_store``, a cascade
        still in flight may yet make room by evicting it (a tier may
        allocate when a copy lands, not only at ``submit_store``)."""
        state = self.key(key)
        if not self.evicts_on_store or state.room_made or not state.present:
            return self
        if not any(not r.job.is_promotion for r in self.jobs.values()):
            return self
        return attrs.evolve(self, keys=self.keys.set(key, attrs.evolve(state, room_made=True)))

    def observe(self, key: OffloadKey, answer: LookupResult) -> TierModel:
        """``lookup(key)`` answered ``answer`` (HIT_PENDING counts as RETRY:
        a tier has no pending answer of its own)."""
        if answer is LookupResult.HIT:
            return self._moved(key, TierCall.LOOKUP_HIT)._room_in_flight(key)
        if answer is LookupResult.MISS:
            self._check_eviction(key)
            return self._moved(key, TierCall.LOOKUP_MISS)
        return self

    def _check_eviction(self, key: OffloadKey) -> None:
        """``key`` read MISS. With ``evicts_on_store``, a key held (seen
        HIT, or its store reported) may have left only to make room for a
        cascade submitted since (``T0``): vLLM's ``base.py`` makes eviction
        part of ``submit_store``."""
        state = self.key(key)
        if self.evicts_on_store and state.present and not state.room_made:
            raise SpecViolation(
                Invariant.TIER_LIFECYCLE,
                f"key {key!r} ({state}) read MISS though no cascade was submitted since it "
                "was last seen held: a tier evicts only to make room for a store (profile "
                "option tier_evicts_on_store)",
            )

    def landed_slot(self, before: TierModel, key: OffloadKey) -> int | None:
        """The primary slot the tier may no longer read for ``key``, when
        the observation that led from ``before`` to this state showed the
        copy of the key's only cascade in flight landed (a HIT of a key
        that was STORING with one store): HIT is "present and ready"
        (vLLM's ``base.py``; a chunk still "being transferred" answers
        RETRY), so the tier holds the key's bytes and has done with the
        slot, though the primary keeps it pinned until the job's report
        (``T3``). None otherwise (with several stores of the key in flight
        the others may still copy it)."""
        was, now = before.key(key), self.key(key)
        if was.present or not now.present or len(was.storing) != 1:
            return None
        for record in self.jobs.values():
            job = record.job
            if job.is_promotion or key not in job.keys:
                continue
            index = list(job.keys).index(key)
            if record.versions[index] == was.storing[0]:
                return int(job.chunk_ids[index])
        return None

    def in_flight(self) -> tuple[JobId, ...]:
        """The jobs submitted and not yet reported, in id order."""
        return tuple(sorted(self.jobs))

    def acceptable_chunks(
        self, key: OffloadKey, size: int, record: JobRecord | None = None
    ) -> frozenset[bytes]:
        """The chunks a promotion of ``key`` that made it may leave in its
        slot: the pattern of each version in the key's ``versions`` now or,
        given the promotion's ``record``, when it was submitted."""
        versions = self.key(key).versions
        if record is not None:
            versions = versions | record.readable.get(key, frozenset())
        return frozenset(chunk_pattern(key, v, size) for v in versions)


def check_capacity(model: TierModel, readable: Iterable[OffloadKey]) -> None:
    """``T4 tier capacity``: the keys a census found readable (``lookup``
    HIT) number at most ``capacity``."""
    found = sorted(set(readable))
    if len(found) > model.capacity:
        raise SpecViolation(
            Invariant.TIER_CAPACITY,
            f"{len(found)} keys readable in a tier of capacity {model.capacity}",
        )


def check_drained(model: TierModel, pending_work: bool | None) -> None:
    """``T6 tier drain``: after ``drain_jobs`` and one ``get_finished_jobs``
    nothing is in flight; ``has_pending_work()`` (when the tier has it,
    else ``None``) answers False."""
    if model.jobs:
        raise SpecViolation(
            Invariant.TIER_DRAIN,
            f"after drain_jobs, jobs {list(model.in_flight())} are still unreported",
        )
    if pending_work:
        raise SpecViolation(
            Invariant.TIER_DRAIN, "has_pending_work() is True after drain_jobs and every result"
        )


# --- the diagram -------------------------------------------------------------


def render_tier_mermaid() -> str:
    """Render :data:`TIER_TRANSITIONS` as a Mermaid ``stateDiagram-v2``: one
    arrow per ``(from, to)`` pair, labelled with every observation (and
    event) that takes a key along it, in table order. What docs/SPEC.md
    shows under "Secondary tiers" (a test keeps the two equal)."""
    edges: dict[tuple[TierPhaseKind, TierPhaseKind], list[str]] = {}
    for (source, call), row in TIER_TRANSITIONS.items():
        for target in row.targets:
            label = call.value + (f" / {row.event}" if row.event else "")
            edges.setdefault((source, target), []).append(label)
    lines = ["stateDiagram-v2"]
    for kind in TierPhaseKind:
        lines.append(f'    state "{kind.value}" as T_{kind.name}')
    lines.append(f"    [*] --> T_{TierPhaseKind.ABSENT.name}")
    for (source, target), labels in edges.items():
        lines.append(f"    T_{source.name} --> T_{target.name}: {'<br/>'.join(labels)}")
    return "\n".join(lines) + "\n"


def render_tier_table() -> str:
    """:data:`TIER_TRANSITIONS` and :data:`FORBIDDEN` as the Markdown table
    docs/SPEC.md shows (a test keeps the two equal)."""
    lines = ["| from | observation | to | event | note |", "| --- | --- | --- | --- | --- |"]
    for (source, call), row in TIER_TRANSITIONS.items():
        targets = " or ".join(t.value for t in row.targets)
        lines.append(
            f"| {source.value} | {call.value} | {targets} | {row.event or '—'} | {row.note} |"
        )
    for (source, call), (invariant, why) in FORBIDDEN.items():
        lines.append(f"| {source.value} | {call.value} | — (`{invariant.label}`) | — | {why} |")
    return "\n".join(lines) + "\n"


__all__ = [
    "FORBIDDEN",
    "TIER_TRANSITIONS",
    "IllegalTierCallError",
    "InvalidTierJobError",
    "JobRecord",
    "TierCall",
    "TierKey",
    "TierModel",
    "TierPhaseKind",
    "TierTransition",
    "check_capacity",
    "check_drained",
    "chunk_pattern",
    "job_outcome",
    "render_tier_mermaid",
    "render_tier_table",
    "tier_apply",
]
