"""The tiered manager: the CPU manager core in front of secondary tiers.

:class:`TieredOffloadingManager` composes one
:class:`~kvoffload.impl.manager.OffloadingManagerCore` (the *primary*: its
slots are what GPU loads and stores name) with one or more secondary tiers
(anything with the :class:`~kvoffload.spec.tier_contract.SecondaryTier`
methods, e.g. :class:`~kvoffload.impl.memtier.MemoryTier` or a file tier).
It keeps no block bookkeeping of its own: phases, slots, eviction and events
stay the core's; this module only adds tier jobs on top, through the core's
public calls:

- a **cascade** (primary → tier) pins the stored keys' primary slots with
  the core's ``prepare_load`` and releases them with ``complete_load`` when
  the tier's job result is taken, so a slot being read by a tier is never
  evicted (it is LOADING in the core meanwhile);
- a **promotion** (tier → primary) allocates slots with the core's
  ``prepare_store`` (the key is PENDING meanwhile, so it is neither readable
  nor evictable) and finishes with ``complete_store`` — success makes it
  READY with a "stored" event, failure makes it ABSENT.

Tier results are taken at two points only: :meth:`~TieredOffloadingManager.
on_schedule_end` and :meth:`~TieredOffloadingManager.poll`. Every method runs
on the caller's thread; callers that enter from several threads hold
:attr:`~TieredOffloadingManager.lock` (methods never take it).

The decisions (write-back, promotion bound, poll points, lock) are recorded
in ``docs/DECISIONS.md``; the user guide is ``docs/TIERS.md``.
"""

from __future__ import annotations

import enum
import threading
from collections import Counter
from collections.abc import Collection, Iterable, Sequence

import attrs

from kvoffload.impl.manager import OffloadingManagerCore, check_keys, listed_keys
from kvoffload.spec.contract import (
    LoadStoreSpec,
    LookupResult,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from kvoffload.spec.errors import (
    ConfigurationError,
    IllegalTransitionError,
    OffloadingError,
)
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.lifecycle import Call, Phase, PhaseKind
from kvoffload.spec.tier_contract import SecondaryTier, TierJob


class CascadeMode(enum.Enum):
    """When stored chunks are copied into the secondary tiers."""

    WRITE_THROUGH = "write-through"
    """At ``complete_store(success=True)``: one job per tier per call."""

    WRITE_BACK = "write-back"
    """Deferred to ``on_schedule_end``: one job per tier and request per
    step. The chunks are pinned from ``complete_store`` on, so none is
    evicted before it has been offered to every tier."""


@attrs.define
class TierStats:
    """Counters of one tiered manager, per secondary tier (index ``i`` is
    ``tiers[i]``). Read them; the manager alone writes them."""

    promotions_started: list[int]
    promotions_done: list[int]
    promotions_failed: list[int]
    cascades_started: list[int]
    cascades_done: list[int]
    cascades_failed: list[int]
    promotions_refused: int = 0
    """Keys a tier held that were answered as a miss: the bound on
    promotions in flight was reached or the primary had no room."""

    @classmethod
    def for_tiers(cls, count: int) -> TierStats:
        return cls(
            [0] * count, [0] * count, [0] * count, [0] * count, [0] * count, [0] * count
        )


@attrs.frozen
class _Job:
    tier: int
    job: TierJob


@attrs.define
class _Batch:
    """Keys waiting for a tier job to be submitted at the step's end."""

    req_context: ReqContext
    keys: list[OffloadKey] = attrs.Factory(list)


class TieredOffloadingManager(OffloadingManager):
    """An :class:`OffloadingManager` over a primary core and secondary tiers.

    ``primary`` answers every GPU-facing call; ``tiers`` (at least one) hold
    chunks behind it. ``cascade`` is ``"write-through"`` or ``"write-back"``
    (see :class:`CascadeMode`). ``max_promotions_in_flight`` bounds the keys
    being promoted at once (allocated and not yet completed); beyond it a
    key held only by a tier is a miss. The default is a quarter of the
    primary's capacity (at least 1).

    ``lookup`` answers True (readable in the primary), False (a miss,
    including a GPU store still in flight and a promotion refused by the
    bound) or None ("ask again": a promotion of the key runs or was just
    started, or a tier answered RETRY). ``lookup_prefix`` walks on past keys
    that need promotion so a whole prefix is promoted by one call (within
    the bound), and answers None when any key on the way did.

    Illegal calls raise the core's :class:`OffloadingError` subclasses and
    change nothing; besides the core's rules, ``complete_store`` of a key
    being promoted and ``complete_load`` beyond the caller's own loads (a
    cascade's pin is not the caller's) are illegal. A tier that reports a
    job it was never given, or keys outside a job, raises
    :class:`OffloadingError`. Raises :class:`ConfigurationError` for a bad
    option.
    """

    def __init__(
        self,
        primary: OffloadingManagerCore,
        tiers: Sequence[SecondaryTier],
        *,
        cascade: str = CascadeMode.WRITE_THROUGH.value,
        max_promotions_in_flight: int | None = None,
    ) -> None:
        if not isinstance(primary, OffloadingManagerCore):
            raise ConfigurationError(
                "primary must be an OffloadingManagerCore (e.g. CPUOffloadingManager), "
                f"got {type(primary).__name__}"
            )
        tiers = list(tiers)
        if not tiers:
            raise ConfigurationError("a tiered manager needs at least one secondary tier")
        for tier in tiers:
            if not isinstance(tier, SecondaryTier):
                raise ConfigurationError(
                    f"{type(tier).__name__} lacks the SecondaryTier methods"
                )
        try:
            self.cascade_mode = CascadeMode(cascade)
        except ValueError:
            raise ConfigurationError(
                f"cascade must be 'write-through' or 'write-back', got {cascade!r}"
            ) from None
        capacity = primary.policy.cache_capacity
        if max_promotions_in_flight is None:
            max_promotions_in_flight = max(1, capacity // 4)
        if (
            isinstance(max_promotions_in_flight, bool)
            or not isinstance(max_promotions_in_flight, int)
            or max_promotions_in_flight < 1
        ):
            raise ConfigurationError(
                "max_promotions_in_flight must be a positive int, "
                f"got {max_promotions_in_flight!r}"
            )
        self.primary = primary
        self.tiers: list[SecondaryTier] = tiers
        self.max_promotions_in_flight: int = max_promotions_in_flight
        self.block_size = primary.block_size
        self.medium = primary.medium
        self.stats = TierStats.for_tiers(len(tiers))
        self._lock = threading.Lock()
        self._next_job_id = 0
        self._jobs: dict[int, _Job] = {}
        # key -> tier it is promoted from (allocated, submitted or not)
        self._promoting: dict[OffloadKey, int] = {}
        # promotions allocated and not yet submitted: tier -> req_id -> batch
        self._promotion_batches: dict[int, dict[str, _Batch]] = {}
        # write-back: pinned chunks not yet submitted: tier -> req_id -> batch
        self._cascade_batches: dict[int, dict[str, _Batch]] = {}
        # pins a cascade (submitted or batched) holds on a primary key
        self._cascade_pins: Counter[OffloadKey] = Counter()

    # --- threads --------------------------------------------------------

    @property
    def lock(self) -> threading.Lock:
        """The lock every caller holds while calling this manager (vLLM's
        ``OffloadingManager.lock``); no method takes it itself."""
        return self._lock

    # --- queries --------------------------------------------------------

    def phase(self, key: OffloadKey) -> Phase:
        """``key``'s phase in the primary. A key being promoted is PENDING;
        a key whose cascade is in flight is LOADING, its count including
        one pin per cascade (see :meth:`cascade_pins`)."""
        return self.primary.phase(key)

    def slot_of(self, key: OffloadKey) -> int | None:
        """``key``'s primary slot, None when untracked."""
        return self.primary.slot_of(key)

    def cascade_pins(self, key: OffloadKey) -> int:
        """How many of ``key``'s loads in flight are cascades (not the
        caller's loads)."""
        try:
            return self._cascade_pins.get(key, 0)
        except TypeError:
            return 0

    def is_promoting(self, key: OffloadKey) -> bool:
        """Whether a promotion of ``key`` is allocated and not completed."""
        try:
            return key in self._promoting
        except TypeError:
            return False

    @property
    def promotions_in_flight(self) -> int:
        """Keys being promoted (allocated, submitted or not, not completed)."""
        return len(self._promoting)

    @property
    def jobs_in_flight(self) -> int:
        """Tier jobs submitted whose results are not yet taken."""
        return len(self._jobs)

    def has_pending_work(self) -> bool:
        """Whether a tier job is in flight or batched, or a tier has work."""
        return bool(
            self._jobs
            or self._promotion_batches
            or self._cascade_batches
            or any(tier.has_pending_work() for tier in self.tiers)
        )

    # --- lookups and promotion -----------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        if self.primary.lookup(key, req_context):  # validates the key
            return True
        hits = self._promote_run([key], 0, req_context)
        return None if hits is None else hits > 0

    def lookup_prefix(
        self, keys: Iterable[OffloadKey], req_context: ReqContext
    ) -> int | None:
        listed = listed_keys(keys)
        hits = self.primary.lookup_prefix(listed, req_context)  # validates the keys
        if hits == len(listed):
            return hits
        found = self._promote_run(listed, hits, req_context)
        return None if found is None else hits + found

    def lookup_result(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """``lookup`` in vLLM 0.33's vocabulary: HIT, HIT_PENDING (a promotion
        of the key runs or starts now, or its GPU store is in flight), RETRY
        (a tier asked to be asked again) or MISS."""
        if self.primary.lookup(key, req_context):  # validates the key
            return LookupResult.HIT
        if self.primary.phase(key).kind is PhaseKind.PENDING:
            return LookupResult.HIT_PENDING
        answer = self._promote_run([key], 0, req_context)
        if answer is None:
            return LookupResult.HIT_PENDING if key in self._promoting else LookupResult.RETRY
        return LookupResult.MISS

    def _promote_run(
        self, keys: list[OffloadKey], start: int, req_context: ReqContext
    ) -> int | None:
        """Walk ``keys`` from ``start`` (the first key the primary cannot
        serve) and start promotions for the run of keys a tier holds, within
        the bound. Returns None when the caller must ask again (a key on the
        way is being promoted, or a tier answered RETRY), else 0: nothing
        past ``start`` is readable."""
        promoting = self._promoting
        primary = self.primary
        ask_again = False
        wanted: dict[OffloadKey, int] = {}  # key -> tier, in prefix order
        end = start
        for position in range(start, len(keys)):
            key = keys[position]
            if key in promoting:
                ask_again = True
            elif key in wanted:
                pass
            else:
                kind = primary.phase(key).kind
                if kind is PhaseKind.PENDING:
                    break  # a GPU store in flight: not readable yet
                if kind is PhaseKind.ABSENT:
                    source, retry = self._tier_holding(key, req_context)
                    if source is None:
                        ask_again = ask_again or retry
                        break
                    wanted[key] = source
                # READY/LOADING past a key being promoted: readable later
            end = position + 1
        if wanted:
            started = self._start_promotions(keys[:end], wanted, req_context)
            ask_again = ask_again or started > 0
        if ask_again:
            return None
        return 0

    def _tier_holding(
        self, key: OffloadKey, req_context: ReqContext
    ) -> tuple[int | None, bool]:
        """The first tier answering HIT for ``key``, and whether one asked
        to be asked again."""
        retry = False
        for index, tier in enumerate(self.tiers):
            answer = tier.lookup(key, req_context)
            if answer is LookupResult.HIT:
                return index, retry
            if answer is LookupResult.RETRY:
                retry = True
        return None, retry

    def _start_promotions(
        self,
        prefix: list[OffloadKey],
        wanted: dict[OffloadKey, int],
        req_context: ReqContext,
    ) -> int:
        """Allocate primary slots for the first keys of ``wanted`` the bound
        allows and batch their load jobs; returns how many started. The
        other keys of ``prefix`` are offered along, so the core protects
        them from this allocation's evictions."""
        room = self.max_promotions_in_flight - len(self._promoting)
        chosen = list(wanted)[: max(0, room)]
        output: PrepareStoreOutput | None = None
        if chosen:
            last = prefix.index(chosen[-1])
            output = self.primary.prepare_store(prefix[: last + 1], req_context)
            if output is None and len(chosen) > 1:
                chosen = chosen[:1]
                output = self.primary.prepare_store(
                    prefix[: prefix.index(chosen[0]) + 1], req_context
                )
        if output is None:
            self.stats.promotions_refused += len(wanted)
            return 0
        self.stats.promotions_refused += len(wanted) - len(chosen)
        allocated = set(output.keys_to_store)
        if allocated != set(chosen):  # the core's contract makes this impossible
            raise OffloadingError(
                f"promotion allocated {sorted(allocated)!r} for {sorted(chosen)!r}"
            )
        for key in chosen:
            tier = wanted[key]
            self._promoting[key] = tier
            batch = self._promotion_batches.setdefault(tier, {}).setdefault(
                req_context.req_id, _Batch(req_context)
            )
            batch.keys.append(key)
            self.stats.promotions_started[tier] += 1
        return len(chosen)

    # --- loads ----------------------------------------------------------

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> LoadStoreSpec:
        return self.primary.prepare_load(keys, req_context)

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> None:
        listed = listed_keys(keys)
        check_keys(listed)
        if self._cascade_pins:
            wanted = Counter(listed)
            for key, count in wanted.items():
                pins = self._cascade_pins.get(key, 0)
                if not pins:
                    continue
                phase = self.primary.phase(key)
                if phase.loads - pins < count:
                    callers = phase.loads - pins
                    seen = Phase.from_ref_cnt(0) if callers <= 0 else phase
                    raise IllegalTransitionError(key, seen, Call.COMPLETE_LOAD)
        self.primary.complete_load(listed, req_context)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        listed = listed_keys(keys)
        self.primary.touch(listed, req_context)
        for tier in self.tiers:
            tier.touch(listed, req_context)

    # --- stores and cascades -------------------------------------------

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        return self.primary.prepare_store(keys, req_context)

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        success: bool = True,
    ) -> None:
        listed = listed_keys(keys)
        check_keys(listed)
        if self._promoting:
            for key in listed:
                if key in self._promoting:
                    call = Call.COMPLETE_STORE_OK if success else Call.COMPLETE_STORE_FAILED
                    raise IllegalTransitionError(key, self.primary.phase(key), call)
        unique = list(dict.fromkeys(listed))
        stored = [k for k in unique if self.primary.phase(k).kind is PhaseKind.PENDING]
        self.primary.complete_store(listed, req_context, success)
        if success and stored:
            self._cascade(stored, req_context)

    def _cascade(self, keys: list[OffloadKey], req_context: ReqContext) -> None:
        """Pin ``keys`` (READY in the primary) once per tier, and submit
        (write-through) or batch (write-back) their store jobs."""
        for tier_index in range(len(self.tiers)):
            self.primary.prepare_load(keys, req_context)
            self._cascade_pins.update(keys)
            if self.cascade_mode is CascadeMode.WRITE_THROUGH:
                self._submit(tier_index, keys, req_context, is_promotion=False)
            else:
                batch = self._cascade_batches.setdefault(tier_index, {}).setdefault(
                    req_context.req_id, _Batch(req_context)
                )
                batch.keys.extend(keys)

    def _submit(
        self,
        tier_index: int,
        keys: list[OffloadKey],
        req_context: ReqContext,
        is_promotion: bool,
    ) -> None:
        slots = [self.primary.slot_of(key) for key in keys]
        job = TierJob(
            self._next_job_id,
            tuple(keys),
            tuple(slot for slot in slots if slot is not None),
            is_promotion,
            req_context,
        )
        if len(job.chunk_ids) != len(keys):  # tracked keys all have slots
            raise OffloadingError(f"untracked key in a tier job: {keys!r}")
        self._next_job_id += 1
        self._jobs[job.job_id] = _Job(tier_index, job)
        tier = self.tiers[tier_index]
        if is_promotion:
            tier.submit_load(job)
        else:
            self.stats.cascades_started[tier_index] += len(keys)
            tier.submit_store(job)

    # --- the step -------------------------------------------------------

    def on_schedule_end(self) -> None:
        """Submit the step's batched promotions (and, in write-back mode,
        cascades), then take every finished tier job (see :meth:`poll`)."""
        self._flush_batches()
        self.poll()

    def _flush_batches(self) -> None:
        promotions, self._promotion_batches = self._promotion_batches, {}
        for tier_index, by_request in promotions.items():
            for batch in by_request.values():
                self._submit(tier_index, batch.keys, batch.req_context, is_promotion=True)
        cascades, self._cascade_batches = self._cascade_batches, {}
        for tier_index, by_request in cascades.items():
            for batch in by_request.values():
                self._submit(tier_index, batch.keys, batch.req_context, is_promotion=False)

    def poll(self) -> int:
        """Take every finished tier job: a promotion's keys become READY
        (with a "stored" event) or, for the keys that failed, ABSENT; a
        cascade's pins are released. Returns the jobs taken."""
        taken = 0
        for tier_index, tier in enumerate(self.tiers):
            for result in tier.get_finished_jobs():
                entry = self._jobs.get(result.job_id)
                if entry is None or entry.tier != tier_index:
                    raise OffloadingError(
                        f"tier {tier_index} reported job {result.job_id}, "
                        "which it was not given or already reported"
                    )
                job = entry.job
                if result.success:
                    made = frozenset(job.keys)
                else:
                    made = frozenset(result.successful_keys or ())
                    if not made <= frozenset(job.keys):
                        raise OffloadingError(
                            f"tier {tier_index} job {job.job_id} reported keys "
                            "outside the job as successful"
                        )
                del self._jobs[result.job_id]
                self._finish(tier_index, job, made)
                taken += 1
        return taken

    def _finish(self, tier_index: int, job: TierJob, made: frozenset[OffloadKey]) -> None:
        ctx = job.req_context
        if job.is_promotion:
            done = [key for key in job.keys if key in made]
            failed = [key for key in job.keys if key not in made]
            for key in job.keys:
                del self._promoting[key]
            if done:
                self.primary.complete_store(done, ctx, True)
            if failed:
                self.primary.complete_store(failed, ctx, False)
            self.stats.promotions_done[tier_index] += len(done)
            self.stats.promotions_failed[tier_index] += len(failed)
        else:
            self._cascade_pins.subtract(job.keys)
            for key in job.keys:
                if self._cascade_pins[key] <= 0:
                    del self._cascade_pins[key]
            self.primary.complete_load(list(job.keys), ctx)
            self.stats.cascades_done[tier_index] += len(made)
            self.stats.cascades_failed[tier_index] += len(job.keys) - len(made)

    # --- requests, events, housekeeping ---------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        answer = self.primary.on_new_request(req_context)
        for tier in self.tiers:
            tier.on_new_request(req_context)
        return answer

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.primary.on_request_finished(req_context)
        for tier in self.tiers:
            tier.on_request_finished(req_context)

    def take_events(self) -> list[OffloadingEvent]:
        """The primary's events (its ``medium``), then each tier's (theirs)."""
        events = list(self.primary.take_events())
        for tier in self.tiers:
            events.extend(tier.take_events())
        return events

    def reset_cache(self) -> None:
        """Drain every tier (no job touches primary memory afterwards), take
        their results, drop batched work, then reset the primary. The tiers
        keep their chunks. Raises :class:`OffloadingError` if a tier still
        has a job unreported after its ``drain_jobs``."""
        for tier in self.tiers:
            tier.drain_jobs()
        self.poll()
        if self._jobs:
            raise OffloadingError(
                f"{len(self._jobs)} tier jobs unreported after drain_jobs"
            )
        self._promotion_batches.clear()
        self._cascade_batches.clear()
        self._promoting.clear()
        self._cascade_pins.clear()
        self.primary.reset_cache()

    def shutdown(self) -> None:
        """Shut every tier down (each is tried; the first error is raised
        after), then the primary."""
        error: BaseException | None = None
        for tier in self.tiers:
            try:
                tier.shutdown()
            except Exception as caught:  # noqa: BLE001 - every tier gets its turn
                error = error or caught
        self.primary.shutdown()
        if error is not None:
            raise error
