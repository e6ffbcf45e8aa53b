"""Observe a manager's hidden state without introspection: drain a copy.

A manager that offers neither ``phase``/``slot_of`` nor ``policy_state``
shows its state only through outputs, and a wrong recency order or a block
it wrongly believes pinned shows only when a store happens to need that very
victim. :class:`Prober` makes it show at once, on a deep copy
(``copy.deepcopy``) of the manager, leaving the original untouched:

1. optionally, first: touch keys evicted earlier, one at a time (ghost hits
   move an ARC target); *settle* the copy (complete every store and load in
   flight, so every tracked block is READY); *fill* it (store fresh keys
   into the free slots and touch part of the stored keys, which an ARC
   promotes) — each at random, so successive probes look from different
   angles;
2. offer it fresh keys (outside the audit's key universe) one at a time and
   leave them PENDING, until it refuses: first the free slots fill, then
   every further offer must evict exactly one READY block, so the victims
   spell out the manager's whole eviction order, and the first refusal
   must come exactly when no READY block is left (liveness);
3. take its events.

Each call goes through a :class:`~kvoffload.stateful.harness.Harness` that
continues the audit's own (same model, same event history), so the drain is
checked like any other calls: for ``lru``/``arc`` every victim must be the
policy model's, for ``any`` every victim READY and the refusal exactly when
room runs out. A discrepancy in the copy is a discrepancy of the manager:
the failing sequence is the audit's calls followed by the drain's, and it
replays on a fresh manager like any other.

A reuse filter in front passes fresh keys on only once they are counted
``store_threshold`` times: the drain looks each one up that often first.
For a filter, a probe now and then *floods* the copy instead
(:func:`flood`): as many fresh lookups as its count table holds, then an
offer whose stored keys must stay protected — the protection rule, checked
whatever the table's size.
"""

from __future__ import annotations

import copy
import random
from collections import Counter

import attrs

from kvoffload.spec.contract import ManagerProtocol
from kvoffload.spec.keys import OffloadKey, make_offload_key
from kvoffload.spec.lifecycle import PhaseKind
from kvoffload.spec.model import (
    CompleteLoad,
    CompleteStore,
    Lookup,
    LookupPrefix,
    PrepareStore,
    StartRequest,
    TakeEvents,
    Touch,
)
from kvoffload.spec.policies import ARCModel
from kvoffload.spec.profile import FilterCounts, RecencyCommit
from kvoffload.stateful.harness import Harness, core_of
from kvoffload.stateful.outputs import flood_keys


class ProbeFailure(Exception):
    """The drained copy broke the specification: ``harness`` holds the
    whole call sequence (the audit's, then the probe's), ``error`` what
    broke."""

    def __init__(self, harness: Harness, error: BaseException) -> None:
        super().__init__(str(error))
        self.harness = harness
        self.error = error


FLOOD_BUDGET = 200_000
"""Keys flooded per audit, all floods together: a flood costs a pass over a
count table that may hold tens of thousands of keys (three floods of the
default 64,000-entry table, many of a small one). The first probe of a
filter audit floods."""


PROBE_REQUEST = 1_000_000
"""The request every call of a probe carries (opened on the copy)."""


def probe_key(index: int) -> OffloadKey:
    """The ``index``-th fresh key a probe offers (outside the universe)."""
    return make_offload_key(b"probe%04d" % index, 0)


class Prober:
    """Drains deep copies of the audited manager (see the module docstring).

    ``copyable`` is None until the first attempt, then whether
    ``copy.deepcopy`` worked; ``probes`` counts drains made.
    """

    def __init__(self, seed: int = 0) -> None:
        self.copyable: bool | None = None
        self.copy_error: str | None = None
        self.probes = 0
        self.rng = random.Random(seed)
        self.flood_budget = FLOOD_BUDGET
        self.calls = 0  # calls made on copies

    def __call__(self, harness: Harness) -> None:
        if self.copyable is False:
            return
        try:
            clone = copy.deepcopy(harness.manager)
        except Exception as error:
            self.copyable = False
            self.copy_error = f"{type(error).__name__}: {error}"
            return
        self.copyable = True
        probe = fork(harness, clone)
        rng = self.rng
        try:
            probe.step(StartRequest(PROBE_REQUEST))
            reuse = harness.config.reuse_filter
            if (
                reuse is not None
                and self.flood_budget >= reuse.max_tracker_size
                and (self.probes == 0 or rng.random() < 0.1)
            ):
                self.flood_budget -= reuse.max_tracker_size
                flood(probe, rng)
            else:
                self._look(probe, rng)
        except Exception as error:
            raise ProbeFailure(probe, error) from error
        self.probes += 1
        self.calls += len(probe.trace) - len(harness.trace)

    @staticmethod
    def _look(probe: Harness, rng: random.Random) -> None:
        """Preludes at random, then one drain (two for an ARC)."""
        adaptive = isinstance(core_of(probe.model).policy, ARCModel)
        if rng.random() < 0.5:
            touch_ghosts(probe, rng)
        if adaptive or rng.random() < 0.6:
            settle(probe)
            if adaptive or rng.random() < 0.5:
                fill(probe, rng)
        drain(probe, batch=rng.random() < 0.5)
        if adaptive or rng.random() < 0.3:
            # the drain filled the ghost lists (an ARC's B1 with its T1
            # victims, B2 with its T2 ones) and trimmed them: promote part
            # of the drain's keys, hit ghosts, and drain in one batch,
            # whose victims show where the target now switches lists
            settle(probe)
            fill(probe, rng)
            touch_ghosts(probe, rng)
            drain(probe, batch=True, base=SECOND_DRAIN)


def fork(harness: Harness, manager: ManagerProtocol) -> Harness:
    """A harness continuing ``harness`` (model, events seen, trace) over
    ``manager``, a copy of its manager."""
    config = attrs.evolve(harness.config, factory=lambda num_blocks: manager)
    probe = Harness(config, harness.num_blocks)
    # continue the audit's own state: what the copy is a copy of
    for name, value in vars(harness).items():
        if name in ("config", "manager"):
            continue
        setattr(probe, name, copy.copy(value))
    return probe


def settle(probe: Harness) -> None:
    """Complete every store and load in flight: every tracked key READY.
    Only where recency is committed at touch: under request-scoped recency
    a transfer is completed by the request that started it, which the
    probe does not know."""
    if probe.config.profile.recency_commit is not RecencyCommit.TOUCH:
        return
    core = core_of(probe.model)
    pending = tuple(k for k, b in core.blocks.items() if b.phase.kind is PhaseKind.PENDING)
    if pending:
        probe.step(CompleteStore(pending, True, request=PROBE_REQUEST))
    core = core_of(probe.model)
    loads: Counter[OffloadKey] = Counter(
        {k: b.phase.loads for k, b in core.blocks.items() if b.phase.kind is PhaseKind.LOADING}
    )
    if loads:
        probe.step(CompleteLoad(tuple(loads.elements()), request=PROBE_REQUEST))


def touch_ghosts(probe: Harness, rng: random.Random) -> None:
    """Touch keys evicted earlier and not stored now, one at a time: some
    the policy still remembers (ARC's ghosts: hits move its target, which
    the drain then shows), and every one it has forgotten (a ghost list
    trimmed to capacity), whose touch must change nothing. The remembered
    ones go in a random order, or B1's before B2's (the target climbs, then
    falls), or B2's before B1's."""
    core = core_of(probe.model)
    gone = [k for k in dict.fromkeys(probe.evicted) if core.phase(k).kind is PhaseKind.ABSENT]
    policy = core.policy
    if isinstance(policy, ARCModel):
        b1, b2 = list(policy.b1), list(policy.b2)
        rng.shuffle(b1)
        rng.shuffle(b2)
        order = rng.choice(("mixed", "b1 first", "b2 first"))
        ghosts = b1 + b2 if order == "b1 first" else b2 + b1
        if order == "mixed":
            rng.shuffle(ghosts)
        remembered = set(ghosts)
        if rng.random() < 0.5:  # first a hit that moves the target by a fraction
            n1, n2 = len(b1), len(b2)
            fractional = [*(b1 if n1 and n2 > n1 and n2 % n1 else ()),
                          *(b2 if n2 and n1 > n2 and n1 % n2 else ())]
            if fractional:
                first = rng.choice(fractional)
                ghosts = [first, *(k for k in ghosts if k != first)]
    else:
        ghosts = list(gone)
        rng.shuffle(ghosts)
        remembered = set(gone)
    forgotten = [k for k in gone if k not in remembered]
    rng.shuffle(forgotten)
    # hits first: a target moved off zero makes a forgotten key's touch show
    most = min(3, len(ghosts)) if forgotten else len(ghosts)
    hits = ghosts[: rng.randint(1, most)] if ghosts else []
    for key in [*hits, *forgotten]:
        probe.step(Touch((key,), request=PROBE_REQUEST))


def count(probe: Harness, keys: tuple[OffloadKey, ...]) -> None:
    """Make a reuse filter in front count each of ``keys`` (fresh, so
    missing) ``store_threshold`` times, as its profile counts: one
    ``lookup_prefix`` naming each key that often, or single lookups where
    only lookups up to the first miss count. A filter that counts offers
    is counted by the offers themselves (:func:`_offer_fresh`)."""
    reuse = probe.config.reuse_filter
    counts = probe.config.profile.filter_counts
    if reuse is None or counts is FilterCounts.OFFERS or not keys:
        return
    if counts is FilterCounts.LOOKUPS:
        probe.step(LookupPrefix(keys * reuse.store_threshold, request=PROBE_REQUEST))
        return
    for key in keys:
        for _ in range(reuse.store_threshold):
            probe.step(Lookup(key, request=PROBE_REQUEST))


def _offers_needed(probe: Harness) -> int:
    """How often a fresh key may have to be offered before it is stored:
    once, or up to ``store_threshold + 1`` times behind a filter that
    counts offers."""
    reuse = probe.config.reuse_filter
    if reuse is not None and probe.config.profile.filter_counts is FilterCounts.OFFERS:
        return reuse.store_threshold + 1
    return 1


def _offer_fresh(probe: Harness, key: OffloadKey) -> bool:
    """Offer one fresh key (counted first so a reuse filter passes it
    on); whether it is now PENDING."""
    count(probe, (key,))
    for _ in range(_offers_needed(probe)):
        probe.step(PrepareStore((key,), request=PROBE_REQUEST))
        if core_of(probe.model).phase(key).kind is PhaseKind.PENDING:
            return True
    return False


def fill(probe: Harness, rng: random.Random) -> None:
    """Store fresh keys into the free slots (one offer), complete them, and
    touch a random part of the stored keys (an ARC promotes them to T2)."""
    core = core_of(probe.model)
    keys = tuple(probe_key(FILL_BASE + index) for index in range(core.free_count()))
    if keys:
        count(probe, keys)
        for _ in range(_offers_needed(probe)):
            probe.step(PrepareStore(keys, request=PROBE_REQUEST))
            core = core_of(probe.model)
            if all(core.phase(k).kind is PhaseKind.PENDING for k in keys):
                break
        stored = tuple(k for k in keys if core_of(probe.model).phase(k).kind is PhaseKind.PENDING)
        if stored:
            probe.step(CompleteStore(stored, True, request=PROBE_REQUEST))
    core = core_of(probe.model)
    ready = [k for k, b in core.blocks.items() if b.phase.kind is PhaseKind.READY]
    rng.shuffle(ready)
    chosen = ready[: rng.randint(0, len(ready))]
    if chosen:
        probe.step(Touch(tuple(chosen), request=PROBE_REQUEST))


def flood(probe: Harness, rng: random.Random) -> None:
    """A reuse filter's protection, whatever its table size: with every slot
    taken by READY blocks, look up as many fresh keys as the count table
    holds (every stored key's count leaves it), count one new key, and
    offer it with every READY key. The READY keys are stored, so they must
    be passed on and protected: there is no victim, the offer must be
    refused."""
    reuse = probe.config.reuse_filter
    if reuse is None:
        return
    settle(probe)
    fill(probe, rng)
    core = core_of(probe.model)
    ready = [k for k, b in core.blocks.items() if b.phase.kind is PhaseKind.READY]
    if core.free_count() or not ready:
        return
    probe.step(LookupPrefix(flood_keys(reuse.max_tracker_size), request=PROBE_REQUEST))
    new = probe_key(FILL_BASE - 1)
    count(probe, (new,))
    rng.shuffle(ready)
    probe.step(PrepareStore((new, *ready), request=PROBE_REQUEST))


FILL_BASE = 500
"""Fresh keys of :func:`fill` start here; the drain's at 0."""


SECOND_DRAIN = 1000
"""Fresh keys of a second drain start here."""


def drain(probe: Harness, batch: bool = False, base: int = 0) -> None:
    """Offer fresh keys until the copy refuses; every call is checked.

    One at a time (each offer evicts one block), or, with ``batch``, all
    the keys that fit in one offer: its victims are then chosen in one
    call, so the order shows where the policy switches lists (an ARC's
    target), followed by one more key, which must be refused."""
    core = core_of(probe.model)
    ready = sum(1 for b in core.blocks.values() if b.phase.kind is PhaseKind.READY)
    offers = core.free_count() + ready + 1  # the last one must be refused
    if batch and offers > 2:
        keys = tuple(probe_key(base + index) for index in range(offers - 1))
        count(probe, keys)
        probe.step(PrepareStore(keys, request=PROBE_REQUEST))
        _offer_fresh(probe, probe_key(base + offers - 1))
    else:
        for index in range(offers):
            if not _offer_fresh(probe, probe_key(base + index)):
                break  # refused: liveness was checked by the step
    probe.step(TakeEvents())


__all__ = [
    "ProbeFailure",
    "Prober",
    "drain",
    "fill",
    "flood",
    "fork",
    "probe_key",
    "settle",
    "touch_ghosts",
]
