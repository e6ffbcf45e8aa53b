"""The swarm driver: random call sequences that reach deep states, fast.

Each *run* builds a fresh manager and model (a
:class:`~kvoffload.stateful.harness.Harness`) and makes a few dozen calls.
What a run does is itself drawn at random (swarm testing): the number of
blocks (1-8), how many keys of the universe are in play, and for every
*action* (a kind of call: ``prepare_store``, ``complete_load``, a ghost
touch, an illegal call, ...) whether it is enabled and with what weight. A
run with resets and touches off and load completions weighted up builds
states that a uniform mix almost never does: long LOADING chains, ARC with
a populated T2 and a fractional target, a deep event queue.

Weights favour what finds defects: stores, completions (of stores and
loads) and evictions are common, ``reset_cache`` and ``take_events`` rare.
The driver draws from :class:`random.Random` seeded by the audit's seed, so
a run replays exactly from its seed; a failing run's calls are shrunk by
:func:`kvoffload.stateful.shrink.shrink` like any other.

Every call goes through :meth:`Harness.step`, so each one is checked against
the specification; the driver only chooses the calls. Optionally it asks a
:class:`~kvoffload.stateful.probe.Prober` to drain a deep copy of the
manager now and then (see :mod:`kvoffload.stateful.probe`).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence

import attrs

from kvoffload.spec.keys import OffloadKey, make_offload_key
from kvoffload.spec.lifecycle import PhaseKind
from kvoffload.spec.model import (
    CompleteLoad,
    CompleteStore,
    FinishRequest,
    Lookup,
    LookupPrefix,
    ManagerModel,
    Operation,
    PrepareLoad,
    PrepareStore,
    ResetCache,
    ScheduleEnd,
    StartRequest,
    TakeEvents,
    Touch,
)
from kvoffload.spec.policies import ARCModel
from kvoffload.spec.profile import ResetAnnounce
from kvoffload.stateful.harness import Harness, KitConfig, Model, core_of, scale_key

BAD_KEYS: tuple[object, ...] = (b"", b"abc", "blk00\x00\x00\x00\x00", 7, None)
"""Offers that are not valid keys: too short, not bytes."""

MAX_BLOCKS = 8

ODD_KEYS: tuple[OffloadKey, ...] = (
    make_offload_key(b"", 0),
    make_offload_key(b"", 1),
    make_offload_key(b"h" * 60, 7),
)
"""Valid keys of unusual shape: an empty block hash (4 bytes, the shortest
key), a long hash with a high group index. One joins the keys of some runs."""
ODD_KEY_SHARE = 0.25


SCALE_SHARE = 0.02
"""The share of runs drawn at scale (when the configuration allows it)."""

SCALE_BLOCKS = (12, 24, 40, 64)
"""The capacities of a run at scale: past a machine word of slots, past a
32-key prefix, up to a few hundred keys in play."""

SCALE_BATCHES = (16, 40, 64)
"""The longest offer, chain or lookup of a run at scale."""

SCALE_GROUPS = (0, 1, 7, 255, 256, 257, 4096, 65535, 65536, 2**24 + 1, 2**31 - 1, 2**32 - 1)
"""KV-group indices of a run at scale: past one byte, two and three (a
group index decoded in the wrong byte order shows)."""


def scale_keys(count: int, rng: random.Random) -> tuple[OffloadKey, ...]:
    """``count`` keys of a run at scale: block hashes ``0, 1, ...`` each in
    a few KV groups drawn from :data:`SCALE_GROUPS` (``S(h, g)`` in a replay)."""
    groups = sorted(rng.sample(SCALE_GROUPS, rng.randint(1, 4)))
    keys = (
        scale_key(block, group) for block in range(count) for group in groups
    )
    return tuple(key for _, key in zip(range(count), keys))


class Run:
    """One run's state: the harness, the batches in flight, the swarm
    choices and the random source."""

    def __init__(
        self,
        harness: Harness,
        rng: random.Random,
        keys: Sequence[OffloadKey],
        max_batch: int | None = None,
    ) -> None:
        self.harness = harness
        self.rng = rng
        self.keys = tuple(keys)
        self.stores: list[tuple[int, tuple[OffloadKey, ...]]] = []  # (request, PENDING batch)
        self.loads: list[tuple[int, tuple[OffloadKey, ...]]] = []  # (request, load batch)
        self.max_batch = max_batch if max_batch is not None else rng.choice((2, 3, 4, 6, 8))
        self.open: list[int] = []  # requests open, oldest first
        self.next_request = 0
        self.start_request()

    def start_request(self) -> None:
        request = self.next_request
        self.next_request += 1
        self.step(StartRequest(request))
        self.open.append(request)

    def request(self) -> int:
        """One of the open requests: the one a call carries."""
        return self.rng.choice(self.open)

    def busy(self, request: int) -> bool:
        """Whether ``request`` has a store or load in flight."""
        return any(r == request for r, _ in self.stores) or any(
            r == request for r, _ in self.loads
        )

    @property
    def core(self) -> ManagerModel:
        return core_of(self.harness.model)

    def of(self, *kinds: PhaseKind) -> list[OffloadKey]:
        core = self.core
        return [k for k in self.keys if core.phase(k).kind in kinds]

    def some(self, pool: Sequence[OffloadKey], low: int = 1, high: int | None = None) -> tuple[OffloadKey, ...]:
        """A random list (repeats allowed) of ``low..high`` keys of ``pool``."""
        high = self.max_batch if high is None else high
        count = self.rng.randint(low, max(low, high))
        return tuple(self.rng.choice(pool) for _ in range(count)) if pool else ()

    def subset(self, pool: Sequence[OffloadKey], low: int = 1) -> tuple[OffloadKey, ...]:
        """Distinct keys of ``pool`` in random order."""
        if not pool:
            return ()
        count = self.rng.randint(min(low, len(pool)), min(len(pool), self.max_batch))
        return tuple(self.rng.sample(list(pool), count))

    def offer(self, low: int = 1) -> tuple[OffloadKey, ...]:
        """Keys for a ``prepare_store``: repeats only where the profile lets
        an engine repeat a key in one offer."""
        if self.harness.config.profile.offers_repeat_keys:
            return self.some(self.keys, low)
        return self.subset(self.keys, low)

    def step(self, op: Operation) -> None:
        self.harness.step(op)

    def store(
        self, keys: tuple[OffloadKey, ...], request: int | None = None
    ) -> tuple[int, tuple[OffloadKey, ...]]:
        """Offer ``keys`` for ``request`` (a random open one by default); the
        keys now PENDING join the batches in flight. The request and those
        keys."""
        request = self.request() if request is None else request
        new = self.core.new_keys(keys)
        self.step(PrepareStore(keys, request=request))
        core = self.core
        stored = tuple(k for k in new if core.phase(k).kind is PhaseKind.PENDING)
        if stored:
            self.stores.append((request, stored))
        return request, stored


Action = Callable[[Run], None]


# --- actions ----------------------------------------------------------------


def _lookup(run: Run) -> None:
    run.step(Lookup(run.rng.choice(run.keys), request=run.request()))


def _lookup_prefix(run: Run) -> None:
    run.step(LookupPrefix(run.some(run.keys, 0), request=run.request()))


def _lookup_chain(run: Run, whole: bool | None = None) -> None:
    """A chain of readable keys (``whole``: all of them, as long as the
    capacity allows; at random by default) then one more, looked up as a
    scheduler does: the whole readable prefix must be found, however long."""
    ready = run.of(PhaseKind.READY, PhaseKind.LOADING)
    if ready:
        if whole is None:
            whole = run.rng.random() < 0.5
        chain = (tuple(run.rng.sample(ready, len(ready))) if whole else run.subset(ready))
        chain += run.some(run.keys, 0, 1)
        run.step(LookupPrefix(chain, request=run.request()))


def _promote(run: Run) -> None:
    """A tiered manager (``profile.secondary_tiers``): look up keys only a
    tier holds, after readable ones, as a request's chain: promotions start
    (up to the bound), evicting READY blocks outside the chain."""
    core = run.core
    below = [k for k in run.of(PhaseKind.ABSENT) if k in core.below]
    if not below:
        return _lookup_prefix(run)
    chain = run.some(run.of(PhaseKind.READY, PhaseKind.LOADING), 0, 2) + run.some(below, 1, 4)
    if len(chain) == 1:
        run.step(Lookup(chain[0], request=run.request()))
    else:
        run.step(LookupPrefix(chain, request=run.request()))
    if core.polls_at_calls and run.rng.random() < 0.25:
        # under TierPoll.CALLS the step's end submits the promotions and
        # the next call takes them: sometimes end the step here, and
        # sometimes reset before any call polls (promotions in flight)
        run.step(ScheduleEnd())
        if run.harness.config.profile.has_reset and run.rng.random() < 0.3:
            _reset(run)


def _touch(run: Run) -> None:
    run.step(Touch(run.some(run.keys, 0), request=run.request()))


def _touch_tracked(run: Run) -> None:
    tracked = run.of(PhaseKind.PENDING, PhaseKind.READY, PhaseKind.LOADING)
    if tracked:
        run.step(Touch(run.subset(tracked), request=run.request()))


def _touch_evicted(run: Run) -> None:
    """Touch keys evicted earlier: ghost hits for ARC-like policies. Against
    an ARC model, half the time one ghost whose hit moves the target by a
    fractional step, when there is one (a state uniform choice rarely
    builds)."""
    evicted = run.harness.evicted
    if not evicted:
        return
    policy = run.core.policy
    if isinstance(policy, ARCModel) and run.rng.random() < 0.5:
        b1, b2 = len(policy.b1), len(policy.b2)
        fractional = [*(policy.b1 if b1 and b2 % b1 and b2 > b1 else ()),
                      *(policy.b2 if b2 and b1 % b2 and b1 > b2 else ())]
        if fractional:
            run.step(Touch((run.rng.choice(fractional),), request=run.request()))
            return
    recent = list(dict.fromkeys(reversed(evicted)))[:6]
    run.step(Touch(run.some(recent, 1, 3), request=run.request()))


def _prepare_store(run: Run) -> None:
    run.store(run.offer())


def _store_new(run: Run) -> None:
    """Offer only untracked keys: the store must evict when full. Half the
    time only keys never evicted, so the ghosts of evicted ones stay (ARC's
    B1/B2 grow)."""
    absent = run.of(PhaseKind.ABSENT)
    if run.rng.random() < 0.5:
        gone = set(run.harness.evicted)
        absent = [k for k in absent if k not in gone] or absent
    if absent:
        run.store(run.subset(absent))


def _store_chain(run: Run) -> None:
    """Stored keys followed by new ones, as a scheduler offers a chain."""
    ready = run.of(PhaseKind.READY, PhaseKind.LOADING)
    absent = run.of(PhaseKind.ABSENT)
    if ready and absent:
        run.store(run.subset(ready) + run.subset(absent))


def _store_and_complete_new(run: Run) -> bool:
    """Offer absent keys and complete the store; whether any was stored (a
    reuse filter still counting stores none)."""
    request, stored = run.store(run.subset(run.of(PhaseKind.ABSENT)))
    if stored:
        run.stores.remove((request, stored))
        run.step(CompleteStore(stored, True, request=request))
    return bool(stored)


def _store_and_complete(run: Run) -> None:
    request, stored = run.store(run.offer())
    if stored:
        run.stores.remove((request, stored))
        run.step(CompleteStore(stored, True, request=request))


def _counted_store(run: Run) -> None:
    """Look keys up as often as a reuse filter needs to pass them on, then
    offer them (what an engine's repeated requests do)."""
    keys = run.subset(run.keys)
    request = run.request()
    reuse = run.harness.config.reuse_filter
    for _ in range(reuse.store_threshold if reuse is not None else 1):
        run.step(LookupPrefix(keys, request=request))
    run.store(keys, request)


def _empty_offer(run: Run) -> None:
    run.step(PrepareStore((), request=run.request()))


def _complete_store(run: Run) -> None:
    """Complete part of a batch in flight (success or failure)."""
    if not run.stores:
        return
    request, batch = run.stores.pop(run.rng.randrange(len(run.stores)))
    core = run.core
    live = [k for k in batch if core.phase(k).kind is PhaseKind.PENDING]
    run.rng.shuffle(live)
    count = run.rng.randint(0, len(live)) if run.rng.random() < 0.5 else len(live)
    if run.harness.config.profile.stores_completed_whole:
        if not live:
            return  # a reset dropped it: the engine never completes it
        count = len(live)
    success = run.rng.random() < 0.8
    done, rest = tuple(live[:count]), tuple(live[count:])
    run.step(CompleteStore(done, success, request=request))
    if rest:
        run.stores.append((request, rest))


def _end_step_sometimes(run: Run) -> None:
    """Under ``profile.secondary_tiers``, end the step half the time. A
    tiered manager's cascades pin the blocks they read until the step's
    end, so a stored block is LOADING, not READY, until then: the calls
    whose READY rows need a step boundary first (an engine resets and
    completes between steps too) ask for one here. Other profiles draw
    nothing, so their runs replay as before."""
    if run.harness.config.profile.secondary_tiers and run.rng.random() < 0.5:
        run.step(ScheduleEnd())


def _complete_store_again(run: Run) -> None:
    """``complete_store`` of keys already stored: a no-op."""
    if run.harness.config.profile.stores_completed_whole:
        return
    _end_step_sometimes(run)
    stored = run.of(PhaseKind.READY, PhaseKind.LOADING)
    if stored:
        run.step(CompleteStore(run.subset(stored), run.rng.random() < 0.7, request=run.request()))


def _prepare_load(run: Run) -> None:
    readable = run.of(PhaseKind.READY, PhaseKind.LOADING)
    if readable:
        keys = run.some(readable, 1, 4)
        request = run.request()
        run.step(PrepareLoad(keys, request=request))
        run.loads.append((request, keys))


def _empty_load(run: Run) -> None:
    request = run.request()
    run.step(PrepareLoad((), request=request))
    run.step(CompleteLoad((), request=request))


def _complete_load(run: Run) -> None:
    """Complete all or part of a load batch; the rest stays in flight."""
    if not run.loads:
        return
    request, batch = run.loads.pop(run.rng.randrange(len(run.loads)))
    core = run.core
    available = Counter(
        {k: core.phase(k).loads for k in set(batch) if core.phase(k).kind is PhaseKind.LOADING}
    )
    keys: list[OffloadKey] = []
    for key in batch:
        if available[key] > 0:
            available[key] -= 1
            keys.append(key)
    count = run.rng.randint(0, len(keys)) if run.rng.random() < 0.5 else len(keys)
    done, rest = tuple(keys[len(keys) - count:]), tuple(keys[: len(keys) - count])
    run.step(CompleteLoad(done, request=request))
    if rest:
        run.loads.append((request, rest))


def _take_events(run: Run) -> None:
    run.step(TakeEvents())


def _reset(run: Run) -> None:
    _end_step_sometimes(run)
    if run.harness.config.profile.reset_announce is ResetAnnounce.ENGINE:
        # the engine takes the queued events, resets, then publishes its own
        # all-cleared event
        run.step(TakeEvents())
    run.step(ResetCache())
    if not core_of(run.harness.model).blocks:
        # the reset happened (refused, as with a load in flight, it changed
        # nothing: the transfers stay in flight)
        run.stores.clear()
        run.loads.clear()


def _start_request(run: Run) -> None:
    if len(run.open) < run.harness.config.max_requests:
        run.start_request()


def _finish_request(run: Run) -> None:
    """A request with nothing in flight finishes (no later call names it);
    if it was the last one open, the next one arrives."""
    done = [r for r in run.open if not run.busy(r)]
    if done:
        request = run.rng.choice(done)
        run.step(FinishRequest(request))
        run.open.remove(request)
        if not run.open:
            run.start_request()


def _schedule_end(run: Run) -> None:
    run.step(ScheduleEnd())


def _illegal_prepare_load(run: Run) -> None:
    bad = run.of(PhaseKind.ABSENT, PhaseKind.PENDING)
    if bad:
        good = run.of(PhaseKind.READY, PhaseKind.LOADING)
        run.step(PrepareLoad((*good[:1], run.rng.choice(bad)), request=run.request()))


def _illegal_complete_load(run: Run) -> None:
    """A load completion with no load in flight: a key that is not LOADING,
    or a LOADING key once more than it has loads (the occurrences of one
    call count together)."""
    idle = run.of(PhaseKind.ABSENT, PhaseKind.PENDING, PhaseKind.READY)
    loading = run.of(PhaseKind.LOADING)
    if loading and (not idle or run.rng.random() < 0.5):
        key = run.rng.choice(loading)
        others = tuple(k for k in loading if k != key)[:1]
        keys = (*others, *(key,) * (run.core.phase(key).loads + 1))
        run.step(CompleteLoad(keys, request=run.request()))
    elif idle:
        run.step(CompleteLoad((*loading[:1], run.rng.choice(idle)), request=run.request()))


def _illegal_complete_store(run: Run) -> None:
    profile = run.harness.config.profile
    if profile.stores_completed_whole and profile.complete_store_ignores_absent:
        return  # no store to complete: outside the engine's protocol
    absent = run.of(PhaseKind.ABSENT)
    if absent:
        pending = run.of(PhaseKind.PENDING)
        keys = (*pending[:1], run.rng.choice(absent))
        run.step(CompleteStore(keys, run.rng.random() < 0.5, request=run.request()))


def _illegal_prepare_store(run: Run) -> None:
    good = run.subset(run.keys)[:2]
    bad = run.rng.choice(BAD_KEYS)
    run.step(PrepareStore((*good, bad), request=run.request()))  # type: ignore[arg-type]


@attrs.frozen
class SwarmAction:
    """A kind of call the driver makes: its name, base weight (another one
    for reuse filters, which pass keys on only once counted), and whether
    it is an illegal call (each must raise, as the profile says, and change
    nothing), needs ``reset_cache`` or a tiered manager (``needs_tiers``)."""

    name: str
    weight: int
    act: Action
    illegal: bool = False
    needs_reset: bool = False
    needs_tiers: bool = False
    filter_weight: int | None = None  # the base weight when auditing a reuse filter


ACTIONS: tuple[SwarmAction, ...] = (
    SwarmAction("lookup", 4, _lookup, filter_weight=8),
    SwarmAction("lookup_prefix", 4, _lookup_prefix, filter_weight=8),
    SwarmAction("lookup_chain", 3, _lookup_chain),
    SwarmAction("promote", 8, _promote, needs_tiers=True),
    SwarmAction("touch", 4, _touch),
    SwarmAction("touch_tracked", 8, _touch_tracked),
    SwarmAction("touch_evicted", 6, _touch_evicted),
    SwarmAction("prepare_store", 10, _prepare_store),
    SwarmAction("store_new", 10, _store_new),
    SwarmAction("store_chain", 6, _store_chain),
    SwarmAction("store_and_complete", 10, _store_and_complete),
    SwarmAction("counted_store", 3, _counted_store, filter_weight=12),
    SwarmAction("empty_offer", 1, _empty_offer),
    SwarmAction("complete_store", 18, _complete_store),
    SwarmAction("complete_store_again", 3, _complete_store_again),
    SwarmAction("prepare_load", 10, _prepare_load),
    SwarmAction("empty_load", 1, _empty_load),
    SwarmAction("complete_load", 14, _complete_load),
    SwarmAction("take_events", 3, _take_events),
    SwarmAction("reset_cache", 1, _reset, needs_reset=True),
    SwarmAction("start_request", 2, _start_request),
    SwarmAction("finish_request", 2, _finish_request),
    SwarmAction("schedule_end", 1, _schedule_end),
    SwarmAction("illegal_prepare_load", 2, _illegal_prepare_load, illegal=True),
    SwarmAction("illegal_complete_load", 2, _illegal_complete_load, illegal=True),
    SwarmAction("illegal_complete_store", 2, _illegal_complete_store, illegal=True),
    SwarmAction("illegal_prepare_store", 1, _illegal_prepare_store, illegal=True),
)
"""Every action, with its base weight. Adding a kind of call: one entry."""

_CORE = frozenset({"prepare_store", "store_new", "store_and_complete"})


def draw_mix(rng: random.Random, config: KitConfig) -> dict[str, int]:
    """One run's swarm: each action on or off (the share off is itself
    random, as in Hypothesis's feature flags) and its weight scaled by 1-4x;
    at least one storing action stays on."""
    p_off = rng.choice((0.0, 0.15, 0.3, 0.5))
    mix: dict[str, int] = {}
    profile = config.profile
    for action in ACTIONS:
        if action.needs_reset and not profile.has_reset:
            continue
        if action.needs_tiers and not profile.secondary_tiers:
            continue
        if action.illegal and not config.illegal_calls:
            continue
        if action.name == "illegal_prepare_store" and not profile.validates_keys:
            continue
        if rng.random() < p_off and action.name not in _CORE:
            continue
        weight = action.weight
        if config.reuse_filter is not None and action.filter_weight is not None:
            weight = action.filter_weight
        mix[action.name] = weight * rng.choice((1, 1, 2, 4))
    if not _CORE & mix.keys():  # pragma: no cover - _CORE is never switched off
        mix["store_new"] = 10
    return mix


_BY_NAME = {action.name: action for action in ACTIONS}


@attrs.frozen
class RunPlan:
    """What one run does: blocks, keys in play, steps and the action mix."""

    num_blocks: int
    num_keys: int
    steps: int
    mix: tuple[tuple[str, int], ...]
    scale: bool = False  # a run at scale: its own keys, long batches


def draw_plan(rng: random.Random, config: KitConfig, steps: int) -> RunPlan:
    """Draw one run's plan (blocks, keys, length, mix)."""
    low, high = config.min_blocks, max(config.min_blocks, min(config.max_blocks, MAX_BLOCKS))
    num_blocks = rng.randint(low, high)
    universe = len(config.keys())
    extra = rng.choice((1, 2, 2, 3, 4, 6, 2 * num_blocks, 3 * num_blocks))
    num_keys = min(universe, num_blocks + extra)
    reuse = config.reuse_filter
    if reuse is not None and rng.random() < 0.5:
        # a stored key's count must be able to leave a small table
        num_keys = min(universe, max(num_keys, reuse.max_tracker_size + rng.randint(1, 3)))
    length = rng.choice((steps // 2, steps, steps, 2 * steps))
    mix = draw_mix(rng, config)
    if config.scale and rng.random() < SCALE_SHARE:
        num_blocks = rng.choice(SCALE_BLOCKS)
        num_keys = num_blocks + rng.choice((1, 4, num_blocks // 2, num_blocks))
        return RunPlan(num_blocks, num_keys, steps, tuple(mix.items()), scale=True)
    return RunPlan(num_blocks, max(1, num_keys), max(1, length), tuple(mix.items()))


ProbeHook = Callable[[Harness], None]


def run_plan(
    harness: Harness,
    plan: RunPlan,
    rng: random.Random,
    *,
    probe: ProbeHook | None = None,
    probe_every: int = 0,
) -> int:
    """Make ``plan.steps`` calls on ``harness``; the number of calls made.
    Raises what :meth:`Harness.step` raises (a :class:`Discrepancy`, or the
    manager's own exception)."""
    max_batch = None
    if plan.scale:
        keys = scale_keys(plan.num_keys, rng)
        max_batch = rng.choice(SCALE_BATCHES)
    else:
        keys = harness.keys[: plan.num_keys]  # the others stay ABSENT
        if rng.random() < ODD_KEY_SHARE:
            keys += (rng.choice(ODD_KEYS),)
    harness.keys = keys
    run = Run(harness, rng, keys, max_batch)
    if plan.scale:  # fill the capacity first, and read the chain back whole
        while len(run.core.blocks) < plan.num_blocks and run.of(PhaseKind.ABSENT):
            if not _store_and_complete_new(run):
                break
        _lookup_chain(run, whole=True)
    names = [name for name, _ in plan.mix]
    weights = [weight for _, weight in plan.mix]
    acts = [_BY_NAME[name].act for name in names]
    made = 0
    for act in rng.choices(acts, weights, k=plan.steps):
        act(run)
        made += 1
        if probe is not None and probe_every and made % probe_every == 0:
            probe(harness)
    run.step(TakeEvents())  # however long the queue grew, it is compared
    made += 1
    if probe is not None:
        probe(harness)
    return made


Observer = Callable[[Model, Operation, Model], None]


def observe_runs(
    config: KitConfig,
    runs: int,
    observer: Observer,
    *,
    steps: int = 60,
    before_run: Callable[[], None] | None = None,
) -> None:
    """Make ``runs`` swarm runs of about ``steps`` calls (run ``i`` drawn
    from ``random.Random(i)``), calling ``observer(model before, call, model
    after)`` after every legal call and ``before_run()`` before each run;
    each run's manager is shut down after it. For tests that check a
    property of every step the swarm makes."""
    for index in range(runs):
        if before_run is not None:
            before_run()
        rng = random.Random(index)
        plan = draw_plan(rng, config, steps)
        harness = Harness(config, plan.num_blocks)
        harness.observer = observer
        try:
            run_plan(harness, plan, rng)
        finally:
            harness.close()


__all__ = [
    "ACTIONS",
    "SCALE_SHARE",
    "RunPlan",
    "SwarmAction",
    "draw_mix",
    "draw_plan",
    "run_plan",
    "scale_keys",
]
