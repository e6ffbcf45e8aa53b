"""``audit_tier()``: hold a secondary tier to the tier model and report.

>>> from kvoffload.stateful import audit_tier
>>> report = audit_tier(my_factory, seed=1)      # doctest: +SKIP
>>> print(report.render())                       # doctest: +SKIP

``my_factory(capacity_blocks, primary_kv_view)`` returns a tier in vLLM
0.33's ``SecondaryTierManager`` shape, taken structurally. Each run builds a
fresh tier over a fresh primary memory (:class:`TierHarness`) and makes the
calls a tiering manager makes, drawn at random with a mix drawn per run:
cascades (also re-stores of present keys), promotions of keys the model
holds present, polls, drains at random points, requests finished with jobs
in flight, resets, lookups, censuses (every key looked up; capacity), and
pauses that let the tier's threads run. Every run ends with a drain and a
census. The first violation is shrunk (the shared delta debugging of
:mod:`kvoffload.stateful.shrink`) into a replay script; a race with the
tier's own threads, with the schedule of pauses that replays it every time
(:func:`find_schedule`).
"""

from __future__ import annotations

import contextlib
import itertools
import random
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence

import attrs

from kvoffload.spec.profile import DEFAULT, Profile
from kvoffload.spec.tier_model import IllegalTierCallError, InvalidTierJobError
from kvoffload.spec.violations import Invariant, SpecViolation
from kvoffload.stateful.auditing import AuditReport, default_seed
from kvoffload.stateful.drivers import run_seed
from kvoffload.stateful.shrink import shrink_sequence
from kvoffload.stateful.tier_harness import (
    KIT_THREAD_PREFIX,
    ROW_BYTES,
    TierFactory,
    TierHarness,
    TierOp,
)
from kvoffload.stateful.tier_noise import (
    DIRECTED_SWITCH_INTERVAL,
    Noise,
    Pause,
    Probe,
    Schedule,
    nap,
)

DEFAULT_TIER_EXAMPLES = 500
DEFAULT_TIER_STEPS = 40
ROWS = 12
"""Primary slots of the kit's primary memory."""

DRIVER = "tier"

POLL_THREAD_EVERY = 2
"""One run in this many has a tier-poll thread (:class:`PollThread`). The
tier's code runs under noise (:mod:`kvoffload.stateful.tier_noise`) in
those runs, and in the others when the tier has threads of its own."""

_KINDS = (
    "store", "load", "poll", "lookup", "drain", "settle", "finish_request",
    "schedule_end", "touch", "census", "reset", "take_events", "lookup_loading",
)


@attrs.frozen
class TierRunShape:
    """What one run's tier looks like."""

    capacity: int
    num_keys: int
    rows: int = ROWS
    row_bytes: int = ROW_BYTES


def draw_shape(rng: random.Random, row_bytes: int = ROW_BYTES) -> TierRunShape:
    capacity = rng.randint(1, 4)
    return TierRunShape(
        capacity, rng.randint(capacity + 1, 2 * capacity + 3), row_bytes=row_bytes
    )


def draw_ops(
    rng: random.Random, shape: TierRunShape, steps: int, disk_faults: bool = True
) -> list[TierOp]:
    """A run's calls: a weight per kind drawn for the run (swarm testing),
    then ``steps`` calls. Promotions name keys the kit has stored (the
    harness decides at run time whether the model holds them present: see
    :meth:`TierHarness.load`); the run ends with a drain, a census, and
    ``shutdown`` (in one run of two with a cascade in flight)."""
    weights = [rng.choice((0, 1, 3, 6)) for _ in _KINDS]
    weights[0] = max(weights[0], 3)  # always store
    ops: list[TierOp] = [TierOp("new_request", (0,))]
    open_requests, next_request = [0], 1
    stored: list[int] = []
    # in a run of three the disk fails now and then (profile option tier_disk_faults)
    faults = rng.random() < 0.3 and disk_faults
    for _ in range(steps):
        kind = rng.choices(_KINDS, weights)[0]
        req = rng.choice(open_requests) if open_requests else 0
        size = rng.randint(1, min(3, shape.num_keys))
        if kind == "store":
            pool = list(range(shape.num_keys))
            if stored and rng.random() < 0.3:  # re-stores of keys stored before
                pool = sorted(set(stored))
            keys = rng.sample(pool, min(size, len(pool)))
            stored += keys
            if faults and rng.random() < 0.3:  # the store meets a full disk
                ops += [
                    TierOp("disk_full", (True,)),
                    TierOp("store", (keys, req)),
                    TierOp("drain"),
                    TierOp("disk_full", (False,)),
                    TierOp("lookup_load", (keys, req)),
                ]
                continue
            ops.append(TierOp("store", (keys, req)))
            if rng.random() < 0.25:  # promoted as soon as they read HIT, copy in flight or not
                ops.append(TierOp("lookup_load", (keys, req)))
        elif kind == "load" and stored and rng.random() < 0.15:
            # now and then keys the tier may not hold (evicted since their
            # HIT, or never stored): the load must fail for those
            keys = rng.sample(range(shape.num_keys), size)
            ops.append(TierOp("load", (keys, req, True)))
        elif kind == "load" and stored:
            keys = rng.sample(sorted(set(stored)), min(size, len(set(stored))))
            ops.append(TierOp("load", (keys, req)))
        elif kind in ("lookup", "load"):
            ops.append(TierOp("lookup", (rng.randrange(shape.num_keys), req)))
        elif kind == "touch":
            ops.append(TierOp("touch", (rng.sample(range(shape.num_keys), size), req)))
        elif kind == "finish_request":
            if open_requests:
                ops.append(TierOp("finish_request", (open_requests.pop(0),)))
            ops.append(TierOp("new_request", (next_request,)))
            open_requests.append(next_request)
            next_request += 1
        else:
            ops.append(TierOp(kind))
    ops += [TierOp("drain"), TierOp("census"), TierOp("take_events")]
    if rng.random() < 0.5:  # shut down with a cascade in flight
        keys = rng.sample(range(shape.num_keys), rng.randint(1, min(3, shape.num_keys)))
        ops.append(TierOp("store", (keys, 0)))
    ops.append(TierOp("shutdown"))
    return ops


SWITCH_INTERVAL = 1e-6
"""The interpreter's thread switch interval during an audit (seconds;
Python's default is 5 ms): the tier's threads, the tier-poll thread and the
caller then interleave at the grain of a few bytecodes, so a race window of
a few statements (a result list copied then cleared without the tier's
lock, an index rebuilt outside it) is entered within the default budget.
Restored when the audit returns."""

RACE_TRIES = 3
"""How many times the shrinker replays a candidate of a race (with the
poll thread and noise) before it counts the candidate as passing."""

DIRECTED_TRIES = 5
"""How many directed replays (:class:`~kvoffload.stateful.tier_noise.Schedule`)
of a race must each fail for its schedule to count as deterministic."""

DIRECTED_INTERVALS = (DIRECTED_SWITCH_INTERVAL, 0.001, 0.02)
"""The interpreter's switch intervals the directed replays of a candidate
cycle through (the script replays at the first): a schedule that fails
only while the threads it does not hold happen to switch as they did in
the audit's process is not deterministic, and a printed script of it
failed to repeat in CI."""

SCHEDULE_BUDGET = 10.0
"""Seconds an audit spends at most finding and minimising a race's schedule."""

RECORDINGS = 3
"""Racing replays whose recorded pauses :func:`find_schedule` tries."""

POLL_INTERVAL = 0.0002
"""Seconds between two polls of the tier-poll thread."""


class PollThread(threading.Thread):
    """The tier-poll thread: calls ``get_finished_jobs`` (the harness's
    ``poll`` step) every :data:`POLL_INTERVAL` seconds under the callers'
    lock, as vLLM's tiering manager polls its tiers between engine steps,
    while the main thread makes the other calls under the same lock."""

    def __init__(self, harness: TierHarness, lock: threading.Lock) -> None:
        super().__init__(daemon=True, name=f"{KIT_THREAD_PREFIX}tier-poll")
        self.harness = harness
        self.lock = lock
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        sys.settrace(None)  # the kit's own code is not traced (tier calls are: Noise.wrap)
        while not self.stopping.is_set():
            with self.lock:
                if self.stopping.is_set() or self.harness.closed:
                    return
                try:
                    self.harness.step(TierOp("poll", (False,)))
                except Exception as error:
                    self.error = error
                    return
            nap(POLL_INTERVAL)

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=10)


def replay(
    factory: TierFactory,
    shape: TierRunShape,
    ops: list[TierOp],
    profile: Profile = DEFAULT,
    *,
    poll_thread: bool = False,
    noise: random.Random | None = None,
    recorded: list[Pause] | None = None,
    positions: list[Pause] | None = None,
    schedule: Schedule | None = None,
) -> tuple[TierHarness | None, BaseException | None]:
    """Run ``ops`` on a fresh tier; the harness and the failure (None if
    all held). With ``poll_thread`` a :class:`PollThread` polls the tier
    meanwhile, and ``harness.ops`` records the calls of both threads in the
    order they took effect (a sequential replay of that order is then
    deterministic as far as the callers go). With ``noise`` (a random
    source) the tier's code runs under :class:`~kvoffload.stateful.tier_noise.Noise`
    from its factory to its shutdown, the pauses it made are appended to
    ``recorded`` and where the tier's threads were as each step began to
    ``positions`` (when given; :meth:`~kvoffload.stateful.tier_noise.Noise.positions`). With ``schedule`` instead, the run is directed
    by it: ``ops`` are its steps, on this thread (no poll thread). The tier
    is shut down either way."""
    if schedule is not None and (noise is not None or poll_thread):
        raise ValueError("a directed replay (schedule) runs without noise and poll thread")
    tracer: Noise | Schedule | None = schedule
    if noise is not None:
        tracer = Noise(noise)
    with tracer if tracer is not None else contextlib.nullcontext():
        outcome = _replay(factory, shape, ops, profile, poll_thread, tracer)
    if recorded is not None and isinstance(tracer, Noise):
        recorded.extend(tracer.recorded())
    if positions is not None and isinstance(tracer, Noise):
        positions.extend(tracer.positions())
    return outcome


def _replay(
    factory: TierFactory,
    shape: TierRunShape,
    ops: list[TierOp],
    profile: Profile,
    poll_thread: bool,
    tracer: Noise | Schedule | None,
) -> tuple[TierHarness | None, BaseException | None]:
    try:
        harness = make_harness(factory, shape, profile)
    except Exception as error:  # the factory itself failed
        return None, error
    if isinstance(tracer, Noise):
        if not poll_thread and not harness.tier_threads():
            tracer.stop()  # one thread only: nothing to interleave
        # a pause records the steps of both callers, in the order they took effect
        tracer.progress = lambda: (len(harness.ops), harness.done)
        harness.on_step = tracer.snapshot
        if tracer.active:
            harness.quietly = tracer.quiet
            harness.threads_idle = tracer.others_idle
    if tracer is not None and tracer.active:
        harness.tier = tracer.wrap(harness.tier)
    lock = threading.Lock()
    poller = PollThread(harness, lock) if poll_thread else None
    failure: BaseException | None = None
    try:
        if poller is not None:
            poller.start()
        for op in ops:
            if tracer is not None:
                tracer.before_step()
            with lock:
                if poller is not None and poller.error is not None:
                    break
                harness.step(op)
            if tracer is not None:
                tracer.stepped()
    except Exception as error:
        failure = error
    finally:
        if poller is not None:
            poller.stop()
            if failure is None:
                failure = poller.error
        try:
            harness.close()
        except SpecViolation as error:  # a shutdown that hangs or leaves threads running
            if failure is None:
                failure = error
        except Exception:  # noqa: S110 - a shutdown that raises is not a finding here
            pass
    if failure is not None and _is_kit_error(failure):
        raise failure
    return harness, failure


def make_harness(factory: TierFactory, shape: TierRunShape, profile: Profile) -> TierHarness:
    return TierHarness(
        factory,
        shape.capacity,
        rows=shape.rows,
        num_keys=shape.num_keys,
        row_bytes=shape.row_bytes,
        bounded=profile.tier_capacity_bounded,
        stale_misses=profile.tier_stale_misses,
        pending_work=profile.tier_pending_work,
        loads_succeed=profile.tier_loads_succeed,
        evicts_on_store=profile.tier_evicts_on_store,
        own_temp=profile.tier_shutdown_removes_temp,
    )


def _is_kit_error(error: BaseException) -> bool:
    """An error raised by the kit's own model (a bug of the kit)."""
    if isinstance(error, (IllegalTierCallError, InvalidTierJobError)):
        return True
    if isinstance(error, SpecViolation):
        return False
    tb = error.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    if last is None:
        return False
    where = last.replace("\\", "/")
    return any(f"kvoffload/{part}" in where for part in _KIT_FILES)


_KIT_FILES = (
    "spec/tier_model",
    "stateful/tier_harness",
    "stateful/tier_audit",
    "stateful/tier_noise",
)


def failure_kind(error: BaseException) -> str:
    if isinstance(error, SpecViolation):
        return error.invariant.label
    return f"crash:{type(error).__name__}"


def _smaller(op: TierOp) -> list[TierOp]:
    keys = op.key_list
    if keys is None or len(keys) < 2:
        return []
    return [
        TierOp(op.method, (keys[:i] + keys[i + 1 :],) + op.args[1:]) for i in range(len(keys))
    ]


Recording = tuple[list[TierOp], list[Pause], list[Pause]]
"""A failing run with noise: its calls in the order they took effect, the
pauses the noise made (:meth:`~kvoffload.stateful.tier_noise.Noise.recorded`)
and where the tier's threads were as each call began
(:meth:`~kvoffload.stateful.tier_noise.Noise.positions`)."""


@attrs.frozen
class Directed:
    """A race replayed deterministically (:func:`find_schedule`): the calls
    in the order they took effect, the pauses that direct the tier's threads
    (empty: that order alone repeats it) and the last directed replay."""

    ops: list[TierOp]
    pauses: list[Pause]
    harness: TierHarness
    failure: BaseException
    tries: int


def race_recordings(
    factory: TierFactory,
    shape: TierRunShape,
    ops: list[TierOp],
    profile: Profile,
    kind: str,
    *,
    poll_thread: bool,
    runs: int = RECORDINGS,
) -> Iterator[Recording]:
    """Replays of ``ops`` with noise (and, with ``poll_thread``, the poll
    thread), ``runs`` of them: the recordings of those that fail with ``kind``."""
    for index in range(runs):
        recorded: list[Pause] = []
        positions: list[Pause] = []
        harness, error = replay(
            factory, shape, ops, profile, poll_thread=poll_thread,
            noise=random.Random(RACE_TRIES + index), recorded=recorded, positions=positions,
        )
        if harness is not None and error is not None and failure_kind(error) == kind:
            yield list(harness.ops), recorded, positions


def find_schedule(
    factory: TierFactory,
    shape: TierRunShape,
    profile: Profile,
    kind: str,
    recordings: Iterable[Recording],
    *,
    time_budget: float = SCHEDULE_BUDGET,
) -> Directed | None:
    """A schedule of pauses under which a race fails with ``kind`` in each of
    :data:`DIRECTED_TRIES` directed replays, or None.

    For each recording in turn (see :func:`race_recordings`), until
    ``time_budget`` seconds have passed, directed replays of its calls,
    the narrowest candidates of every kind first: with no pause; with one
    of the tier's threads held where it stood as a call began, through
    that call (:func:`_held_positions`); with each of its recorded pauses
    alone, as recorded (:func:`_single_pauses`); with each moved to where a
    replay with no pause reaches its line (:func:`_retimed`;
    :class:`~kvoffload.stateful.tier_noise.Probe`, its threads run eagerly,
    then starved); with one pause at each line the eager replay's threads
    reach, held one step; with the caller held at each line it reaches
    until the tier's threads stall (:func:`_held_callers`). Then wider:
    the held positions and recorded pauses held longer; all the recorded
    pauses, dropping pauses (delta debugging,
    :func:`~kvoffload.stateful.shrink.shrink_sequence`) while the replay
    still fails every time; the retimed pauses begun earlier and held
    longer; the probes' lines held two steps, then windows ending at the
    failing call."""
    deadline = time.perf_counter() + time_budget

    def directed(
        order: list[TierOp], pauses: Sequence[Pause]
    ) -> tuple[TierHarness, BaseException] | None:
        """The last of :data:`DIRECTED_TRIES` directed replays if each
        failed with ``kind``."""
        last: tuple[TierHarness, BaseException] | None = None
        for attempt in range(DIRECTED_TRIES):
            interval = DIRECTED_INTERVALS[attempt % len(DIRECTED_INTERVALS)]
            schedule = Schedule(pauses, switch_interval=interval)
            harness, error = replay(factory, shape, order, profile, schedule=schedule)
            if harness is None or error is None or failure_kind(error) != kind:
                return None
            last = harness, error
        return last

    def first(order: list[TierOp], candidates: Iterable[list[Pause]]) -> Directed | None:
        """The first of ``candidates`` that fails every time, within the budget."""
        for candidate in candidates:
            if time.perf_counter() > deadline:
                return None
            outcome = directed(order, candidate)
            if outcome is not None:
                return Directed(order, candidate, outcome[0], outcome[1], DIRECTED_TRIES)
        return None

    def reached(order: list[TierOp], eager: bool) -> list[Pause]:
        """Each line the tier's threads reach in a directed replay of
        ``order`` with no pause (:class:`~kvoffload.stateful.tier_noise.Probe`),
        in order; ``eager``: the threads run until they stall before each call."""
        probe = Probe(eager=eager)
        replay(factory, shape, order, profile, schedule=probe)
        return probe.reached

    def probed(
        order: list[TierOp], reaches: list[Pause], tried: list[Pause], wider: bool
    ) -> Iterator[list[Pause]]:
        """One pause at each line the tier's threads reach (``reaches``, the
        last first), held one step; ``wider``: instead, held two, then
        windows ending at the failing call."""
        seen = {(pause.file, pause.line, pause.hit) for pause in tried if not pause.caller}
        fresh = [
            reach
            for reach in reversed(reaches)
            if not reach.caller and (reach.file, reach.line, reach.hit) not in seen
        ]
        for more in WIDER[1:] if wider else WIDER[:1]:
            for reach in fresh:
                yield [attrs.evolve(reach, until=reach.after + more)]
        if not wider:
            return
        # then windows that end at the failing call (or the one before it),
        # begun later than the probe's thread reached the line: the replay
        # holds the caller until the thread is there, and the thread there
        # through the calls that damage what it is about to publish
        last = len(order)
        for window in range(1, last):
            for until in (last, last - 1):
                for reach in fresh:
                    after = until - window
                    if after > reach.after and after >= 0:
                        yield [attrs.evolve(reach, after=after, until=until)]

    def shrunk(order: list[TierOp], pauses: list[Pause]) -> Directed | None:
        """All of ``pauses``, if they fail every time, with pauses dropped
        while the replay still does (delta debugging), checked again."""
        if len(pauses) < 2 or time.perf_counter() > deadline or not directed(order, pauses):
            return None

        def fails(candidate: list[Pause]) -> list[Pause] | None:
            return candidate if directed(order, candidate) is not None else None

        left = max(0.0, deadline - time.perf_counter())
        smaller = shrink_sequence(pauses, fails, lambda pause: [], time_budget=left)
        # a shrunk schedule that was lucky is not deterministic: checked again
        return first(order, [smaller])

    for order, recorded, positions in recordings:
        if time.perf_counter() > deadline:
            break
        # the pauses begun before the failing call
        pauses = [pause for pause in recorded if pause.after < len(order)]
        # the narrowest candidates of every kind before the wider ones: a
        # long run has many calls, and the budget may not reach the end
        found = first(order, _held_positions(order, positions, wider=False)) or first(
            order, _single_pauses(pauses, wider=False)
        )
        if found is not None:
            return found
        if time.perf_counter() > deadline:
            break
        early, late = reached(order, eager=True), reached(order, eager=False)
        found = (
            first(order, _retimed(pauses, early + late, wider=False))
            or first(order, probed(order, early, pauses, wider=False))
            or first(order, _held_callers(early))
            or first(order, _held_positions(order, positions, wider=True))
            or first(order, _single_pauses(pauses, wider=True))
            or shrunk(order, pauses)
            or first(order, _retimed(pauses, early + late, wider=True))
            or first(order, probed(order, early, pauses, wider=True))
            or first(order, probed(order, late, pauses, wider=False))
            or first(order, probed(order, late, pauses, wider=True))
        )
        if found is not None:
            return found
    return None


WIDER = (1, 2)
"""How many more steps :func:`find_schedule` tries holding a recorded pause."""


def _held_positions(
    order: list[TierOp], positions: list[Pause], wider: bool
) -> Iterator[list[Pause]]:
    """The schedules :func:`find_schedule` tries first: one of the tier's
    threads held where it was as a call of the run began, through that call,
    the calls nearest the failing one first; ``wider``: instead, held one
    and two calls more. Without ``wider``, none at all comes first: the
    calls' order alone."""
    if not wider:
        yield []
    steps = [position for position in positions if position.after < len(order)]
    for more in WIDER if wider else (0,):
        for position in steps:
            if position.until + more <= len(order):
                yield [attrs.evolve(position, until=position.until + more)]


def _single_pauses(pauses: list[Pause], wider: bool) -> Iterator[list[Pause]]:
    """Each recorded pause of the tier's own threads alone, as it was, the
    last first (a window is near the failing call); ``wider``: instead,
    each held :data:`WIDER` steps longer than it began."""
    threads = [pause for pause in reversed(pauses) if not pause.caller]
    if not wider:
        for pause in threads:
            yield [pause]
        return
    for more in WIDER:
        for pause in threads:
            until = max(pause.until, pause.after) + more
            yield [attrs.evolve(pause, until=until, end="steps")]


def _held_callers(reaches: list[Pause]) -> Iterator[list[Pause]]:
    """The caller held at each line of the tier's code it reaches in a
    replay (``reaches``, the last first) until the tier's threads stall (a
    held caller completes no step): a window on the caller's side, e.g. a
    list of results copied and then cleared without the lock, for the
    tier's threads to run in."""
    for reach in reversed(reaches):
        if reach.caller:
            yield [reach]


def _retimed(
    pauses: list[Pause], reaches: list[Pause], wider: bool
) -> Iterator[list[Pause]]:
    """Each recorded pause of the tier's own threads (the last first) begun
    where a directed replay with no pause reaches its line that time
    (``reaches``: replays whose threads run eagerly, then starved), held
    as many steps as recorded (at least one). The noise delays a thread,
    and a replay starves it until the caller blocks, so the run that failed
    and a replay reach the line at different steps; a window begun before
    the thread is there holds the caller until it is. ``wider``: the
    candidates not tried without it: also begun one and two steps before
    those steps and before the recorded one, and held :data:`WIDER` steps
    longer."""
    at: dict[tuple[str, int, int], list[int]] = {}
    for reach in reaches:
        if reach.caller:
            continue
        steps = at.setdefault((reach.file, reach.line, reach.hit), [])
        if reach.after not in steps:
            steps.append(reach.after)
    threads = [pause for pause in reversed(pauses) if not pause.caller]
    seen: set[tuple[str, int, int, int, int]] = set()
    for more in (0, *WIDER) if wider else (0,):
        for shift in (0, 1, 2) if wider else (0,):
            for pause in threads:
                reached = at.get((pause.file, pause.line, pause.hit))
                if reached is None:
                    continue  # a replay never gets there
                held = max(1, pause.until - pause.after) + more
                starts = [step - shift for step in reached]
                if wider:
                    starts.append(pause.after - shift)
                for start in starts:
                    if start < 0 or (start == pause.after and more == 0):
                        continue  # tried as recorded
                    if wider and shift == more == 0 and start in reached:
                        continue  # tried without ``wider``
                    key = (pause.file, pause.line, pause.hit, start, held)
                    if key in seen:
                        continue
                    seen.add(key)
                    yield [attrs.evolve(pause, after=start, until=start + held, end="steps")]


def audit_tier(
    factory: TierFactory,
    *,
    profile: Profile = DEFAULT,
    seed: int | None = None,
    max_examples: int | None = None,
    stateful_step_count: int | None = None,
    name: str | None = None,
    factory_import: str | None = None,
    time_limit: float | None = None,
    chunk_bytes: int = ROW_BYTES,
) -> AuditReport:
    """Audit the tiers ``factory(capacity_blocks, primary_kv_view)`` builds
    against the tier model (:mod:`kvoffload.spec.tier_model`).

    ``profile``: the conventions the tier keeps (its tier options, e.g.
    ``tier_capacity_bounded``). ``seed``: as :func:`~kvoffload.stateful.audit`
    (None draws one, or reads ``KVOFFLOAD_AUDIT_SEED``; the report prints
    it). ``max_examples`` runs (default :data:`DEFAULT_TIER_EXAMPLES`) of
    about ``stateful_step_count`` calls (default
    :data:`DEFAULT_TIER_STEPS`), or fewer when ``time_limit`` seconds pass.
    ``factory_import`` (``"module:callable"``) lets the replay script import
    the factory. ``chunk_bytes``: the bytes of one primary slot (a file
    tier writing with ``O_DIRECT`` needs a multiple of the disk's block,
    e.g. 4096). A tier the factory cannot build is reported as a failure
    (invariant ``no crash``).
    """
    runs = DEFAULT_TIER_EXAMPLES if max_examples is None else max_examples
    steps = DEFAULT_TIER_STEPS if stateful_step_count is None else stateful_step_count
    if seed is None:
        seed = default_seed()
    target = name or str(getattr(factory, "__qualname__", repr(factory)))
    started = time.perf_counter()
    deadline = None if time_limit is None else started + time_limit
    done_runs = done_steps = 0
    failure: BaseException | None = None
    failing: tuple[TierRunShape, list[TierOp]] | None = None
    driver = DRIVER
    failed_harness: TierHarness | None = None
    failed_pauses: list[Pause] = []
    failed_positions: list[Pause] = []
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        for index in range(runs):
            if deadline is not None and time.perf_counter() > deadline:
                break
            rng = run_seed(seed, index)
            shape = draw_shape(rng, chunk_bytes)
            ops = draw_ops(
                rng, shape, rng.randint(max(4, steps // 4), steps), profile.tier_disk_faults
            )
            threaded = index % POLL_THREAD_EVERY == POLL_THREAD_EVERY - 1
            recorded: list[Pause] = []
            positions: list[Pause] = []
            harness, error = replay(
                factory, shape, ops, profile, poll_thread=threaded, noise=rng,
                recorded=recorded, positions=positions,
            )
            done_runs += 1
            done_steps += len(harness.trace) if harness is not None else 0
            if error is not None:
                failure = error
                driver = DRIVER + (" + poll thread" if threaded else "")
                failing = (shape, list(harness.ops) if harness is not None else [])
                failed_harness = harness
                failed_pauses = recorded
                failed_positions = positions
                break
    finally:
        sys.setswitchinterval(switch_interval)
    report = AuditReport(
        target,
        f"tier/{profile.name}",
        True,
        done_runs,
        done_steps,
        time.perf_counter() - started,
        seed=seed,
        driver=driver,
    )
    if failure is None or failing is None:
        return report
    shape, ops = failing
    kind = failure_kind(failure)

    def attempt(
        candidate: list[TierOp], racing: bool
    ) -> tuple[TierHarness | None, BaseException | None]:
        """A replay of ``candidate``: sequential, or (``racing``) with the
        poll thread (when the audit's run had it) and noise, up to
        :data:`RACE_TRIES` times until it fails as the audit's run did."""
        outcome: tuple[TierHarness | None, BaseException | None] = (None, None)
        for attempt_index in range(RACE_TRIES if racing else 1):
            noise = random.Random(attempt_index) if racing else None
            outcome = replay(
                factory, shape, candidate, profile, poll_thread=racing and threaded, noise=noise
            )
            if outcome[1] is not None and failure_kind(outcome[1]) == kind:
                break
        return outcome

    def fails(candidate: list[TierOp]) -> list[TierOp] | None:
        harness, error = attempt(candidate, racing)
        if error is None or failure_kind(error) != kind:
            return None
        if harness is None:
            return candidate
        # the calls that took effect (with a poll thread: its polls too)
        return list(harness.ops) if racing else candidate[: len(harness.trace)]

    threaded = driver != DRIVER
    harness, shrunk = replay(factory, shape, ops, profile)
    # a race with the tier's own threads that a sequential replay does not
    # repeat shrinks with noise (and the poll thread if the run had it), a
    # few tries a candidate
    racing = (shrunk is None or failure_kind(shrunk) != kind) and failed_harness is not None
    if failing[1]:
        ops = shrink_sequence(ops, fails, _smaller)
    harness, shrunk = attempt(ops, racing)
    note = ""
    pauses: list[Pause] | None = None
    if racing and failed_harness is not None:
        # the shrunk calls' races first (a shorter script), then the audit's own run
        recordings = itertools.chain(
            race_recordings(factory, shape, ops, profile, kind, poll_thread=threaded)
            if shrunk is not None and failure_kind(shrunk) == kind
            else (),
            [(list(failed_harness.ops), failed_pauses, failed_positions)],
        )
        found = find_schedule(factory, shape, profile, kind, recordings)
        if found is not None:
            harness, shrunk, pauses = found.harness, found.failure, found.pauses
            note = _directed_note(found)
    if racing and pauses is None:
        note = (
            " (a race with the tier's own threads: the replay makes the callers' "
            "interleaving deterministic, the tier's threads may need a few runs; "
            "no schedule of pauses repeated it in every directed replay)"
        )
    if shrunk is None or failure_kind(shrunk) != kind:
        # not repeated: report the calls of the audit's run in the order they
        # took effect
        shrunk, harness = failure, failed_harness
    invariant = shrunk.invariant if isinstance(shrunk, SpecViolation) else Invariant.CRASH
    if isinstance(shrunk, SpecViolation):
        message = f"invariant {invariant.label}: {shrunk.reason}{note}"
    else:
        message = f"the tier raised {type(shrunk).__name__}: {shrunk}{note}"
    script = harness.script(factory_import, message, pauses or None) if harness is not None else None
    return attrs.evolve(
        report,
        passed=False,
        invariant=invariant,
        message=message,
        script=script,
        calls=len(harness.trace) if harness is not None else 0,
        seconds=time.perf_counter() - started,
    )


def _directed_note(found: Directed) -> str:
    """What the report says of a race replayed deterministically."""
    if not found.pauses:
        return (
            " (a race with the tier's own threads; the calls in the order they took "
            f"effect repeat it: it failed in each of {found.tries} replays)"
        )
    return (
        " (a race with the tier's own threads, replayed deterministically: the replay "
        + "; ".join(f"pauses {pause.describe()}" for pause in found.pauses)
        + f"; it failed in each of {found.tries} directed replays)"
    )


__all__ = [
    "DEFAULT_TIER_EXAMPLES",
    "DEFAULT_TIER_STEPS",
    "DIRECTED_TRIES",
    "Directed",
    "Recording",
    "TierRunShape",
    "audit_tier",
    "draw_ops",
    "draw_shape",
    "find_schedule",
    "race_recordings",
    "replay",
]

