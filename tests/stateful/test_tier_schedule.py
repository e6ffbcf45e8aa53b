"""Directed replays of a race (``tier_noise.Schedule``): a listed pause
holds the thread that reaches its line for the listed time across the
caller's steps, so a lost update that a free run almost never shows fails
every time; a caller waiting on the paused thread does not deadlock; what
did not go as listed is said, not hidden. And the noise records its pauses
in the form a schedule replays."""

from __future__ import annotations

import queue
import random
import sys
import threading
import time

import pytest

from kvoffload.impl.memtier import MemoryTier
from kvoffload.spec.profile import DEFAULT
from kvoffload.stateful import tier_harness, tier_noise
from kvoffload.stateful.targets import file_system_tier
from kvoffload.stateful.tier_audit import TierRunShape, _held_callers, make_harness, replay
from kvoffload.stateful.tier_noise import (
    DIRECTED_SWITCH_INTERVAL,
    PROBE_SWITCH_INTERVAL,
    Noise,
    Pause,
    Probe,
    Schedule,
)


class LostUpdate:
    """A worker adds each job's amount to ``value`` by reading it, then
    writing it back, without a lock; ``bump`` adds on the caller's thread.
    A bump between the worker's read and write is lost."""

    def __init__(self) -> None:
        self.value = 0
        self.jobs: queue.Queue[int | None] = queue.Queue()
        self.worker = threading.Thread(target=self._serve, daemon=True, name="lost-update")
        self.worker.start()

    def _serve(self) -> None:
        while True:
            amount = self.jobs.get()
            if amount is None:
                self.jobs.task_done()
                return
            seen = self.value
            self.value = seen + amount  # WRITE
            self.jobs.task_done()

    def submit(self, amount: int) -> None:
        self.jobs.put(amount)

    def bump(self, amount: int) -> None:
        self.value += amount  # BUMP

    def wait(self) -> None:
        self.jobs.join()

    def stop(self) -> None:
        self.jobs.put(None)
        self.worker.join(timeout=5)


WRITE, BUMP = (
    next(
        number
        for number, line in enumerate(open(__file__, encoding="utf-8"), 1)  # noqa: SIM115
        if line.rstrip().endswith(mark)
    )
    for mark in ("# WRITE", "# BUMP")
)


def window(until: int = 2) -> Pause:
    """The worker paused before its write, the 1st time, from before step 2
    (the bump) until step ``until`` has completed."""
    return Pause("tests/stateful/test_tier_schedule.py", WRITE, hit=1, after=1, until=until)


def run_lost_update(schedule: Schedule) -> LostUpdate:
    """Step 1 submits 1, step 2 bumps by 100, then the worker finishes,
    all under ``schedule`` (a probe too); the tier."""
    with schedule:
        tier = LostUpdate()
        traced = schedule.wrap(tier)
        for call, amount in (("submit", 1), ("bump", 100)):
            schedule.before_step()
            getattr(traced, call)(amount)
            schedule.stepped()
        tier.wait()
        tier.stop()
    return tier


def lost_update(pauses: list[Pause]) -> tuple[bool, Schedule]:
    """:func:`run_lost_update` directed by ``pauses``: whether the bump was
    lost, and the schedule."""
    schedule = Schedule(pauses)
    return run_lost_update(schedule).value != 101, schedule


def test_a_directed_pause_makes_the_lost_update_fail_every_time() -> None:
    outcomes = [lost_update([window()]) for _ in range(10)]
    assert all(lost for lost, _ in outcomes)
    assert all(s.verdict() == "every pause held as listed" for _, s in outcomes)


def test_without_the_pause_the_lost_update_is_rare() -> None:
    lost = sum(lost_update([])[0] for _ in range(10))
    # the caller bumps right after it submits, long before its switch
    # interval lets the worker in: the window is a few bytecodes wide
    assert lost <= 3, lost


def test_a_caller_waiting_on_the_paused_thread_does_not_deadlock() -> None:
    started = time.monotonic()
    with Schedule([window(until=3)], bound=1.5) as schedule:
        tier = LostUpdate()
        traced = schedule.wrap(tier)
        schedule.before_step()
        traced.submit(1)
        schedule.stepped()
        schedule.before_step()
        tier.wait()  # blocks on the worker held until step 3: the others stall
        schedule.stepped()
        tier.stop()
    assert time.monotonic() - started < 1.0
    assert tier.value == 1
    assert "the others stalled" in schedule.verdict(), schedule.verdict()


def test_a_pause_never_reached_is_reported() -> None:
    never = Pause("tests/stateful/test_tier_schedule.py", WRITE, hit=5, after=1, until=2)
    lost, schedule = lost_update([never])
    assert not lost
    assert "(the 5th time)" in schedule.verdict() and "was not reached" in schedule.verdict()


def test_the_bound_ends_a_pause_and_is_reported() -> None:
    with Schedule([window()], bound=0.05) as schedule:
        tier = LostUpdate()
        traced = schedule.wrap(tier)
        schedule.before_step()
        traced.submit(1)
        schedule.stepped()
        schedule.before_step()  # the worker is held until step 2 completes
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:  # the caller runs: it is not stalled
            pass
        schedule.stepped()
        tier.wait()
        tier.stop()
    assert "ended at the bound" in schedule.verdict(), schedule.verdict()


def test_drive_makes_each_call_a_step() -> None:
    class Harness:
        """As a TierHarness: the tier in ``tier``, steps as methods."""

        def __init__(self) -> None:
            self.tier = LostUpdate()

        def submit(self, amount: int) -> None:
            self.tier.submit(amount)

        def bump(self, amount: int) -> None:
            self.tier.bump(amount)

    with Schedule([window()]) as schedule:
        harness = Harness()
        worker = harness.tier
        steps = schedule.drive(harness)
        steps.submit(1)
        steps.bump(100)
        worker.wait()
        worker.stop()
    assert (schedule.started, schedule.steps) == (2, 2)
    assert worker.value == 1, "the bump was not lost: the pause did not hold"


def test_schedules_and_pauses_refuse_bad_input() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Pause("f.py", 0)
    with pytest.raises(ValueError, match="negative"):
        Pause("f.py", 3, after=-1)
    with pytest.raises(ValueError):
        Pause("f.py", 3, end="later")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="listed twice"):
        Schedule([Pause("f.py", 3), Pause("f.py", 3, after=2)])
    with pytest.raises(TypeError):
        Schedule([("f.py", 3)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="directed replay"):
        replay(
            lambda capacity, view: object(), TierRunShape(1, 2), [], DEFAULT,
            noise=random.Random(1), schedule=Schedule([]),
        )


def test_noise_records_a_pause_as_a_schedule_replays_it() -> None:
    noise = Noise(random.Random(1))
    noise.progress = lambda: (5, 4)
    with noise:
        noise.pause(("/somewhere/tier.py", 12, False), 3)  # no other thread: stalled at once
    [pause] = noise.recorded()
    assert pause == Pause(
        "/somewhere/tier.py", 12, hit=3, after=5, until=4, end="stalled",
        thread=threading.current_thread().name,
    )
    assert pause.render().startswith("Pause('/somewhere/tier.py', 12, hit=3, after=5, until=4")
    assert "tier.py:12 (the 3rd time) from step 6" in pause.describe()


def test_noise_notes_where_the_tiers_threads_are_as_each_step_begins() -> None:
    """``Noise.snapshot`` (called as each step begins) notes each of the
    tier's threads' last line; ``positions`` offers each as a pause held
    through that step, the last step first."""
    parked = threading.Event()
    release = threading.Event()

    def park() -> None:
        parked.set()
        release.wait(5)  # PARKED

    line = next(
        number
        for number, text in enumerate(open(__file__, encoding="utf-8"), 1)  # noqa: SIM115
        if text.rstrip().endswith("# PARKED")
    )
    with Noise(random.Random(3)) as noise:
        noise.snapshot(0)  # no thread of the tier yet
        worker = threading.Thread(target=park, name="parked-worker")
        worker.start()
        assert parked.wait(5)
        deadline = time.monotonic() + 5
        while (park.__code__.co_filename, line, False) not in noise.hot:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        noise.snapshot(4)
        release.set()
        worker.join(5)
    [position] = noise.positions()
    assert (position.line, position.hit, position.after, position.until) == (line, 1, 4, 5)
    assert position.file.endswith("test_tier_schedule.py") and not position.caller
    assert position.thread == "parked-worker" and position.end == "steps"


def test_a_schedule_replays_at_its_own_switch_interval() -> None:
    """A directed replay runs at Python's default interval whatever the
    caller's (its scripts then repeat), a probe at the audit's; both put
    the caller's back."""
    saved = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    try:
        with Schedule([]):
            assert sys.getswitchinterval() == pytest.approx(DIRECTED_SWITCH_INTERVAL)
        assert sys.getswitchinterval() == pytest.approx(0.001)
        with Probe():
            assert sys.getswitchinterval() == pytest.approx(PROBE_SWITCH_INTERVAL)
        assert sys.getswitchinterval() == pytest.approx(0.001)
        with pytest.raises(ValueError, match="switch interval"):
            Schedule([], switch_interval=0)
    finally:
        sys.setswitchinterval(saved)


def test_an_error_of_the_noise_is_the_kits_not_the_tiers() -> None:
    """A bug in the noise (once: a snapshot that iterated the threads'
    positions while a new thread of the tier added its own, "dictionary
    changed size during iteration", reported as the tier's crash) is raised
    as the kit's error, never reported as a finding about the tier."""
    from kvoffload.stateful.tier_audit import _is_kit_error

    try:
        raise RuntimeError("dictionary changed size during iteration")
    except RuntimeError as error:
        raised_here = error
    assert not _is_kit_error(raised_here)  # a test file is the tier's code
    try:
        Pause("f.py", 0)
    except ValueError as error:
        assert _is_kit_error(error)  # raised in kvoffload/stateful/tier_noise.py


def test_thread_states_are_read_through_kept_files_and_an_ended_thread_is_dropped() -> None:
    # a pause looks at every other thread's kernel state; the /proc files
    # are kept open (a pread per look), so an ended thread's file must be
    # dropped, not read for a new thread the kernel gives its id
    from kvoffload.stateful.tier_noise import _ThreadStates

    states = _ThreadStates()
    release = threading.Event()
    waiter = threading.Thread(target=release.wait, daemon=True)
    waiter.start()
    try:
        native = waiter.native_id
        assert native is not None
        deadline = time.monotonic() + 5
        while states(native) != "S" and time.monotonic() < deadline:
            time.sleep(0.001)
        assert states(native) == "S"
        assert (native, "stat") in states.fds
        asleep = states.ran(native)
        assert asleep is not None
        time.sleep(0.01)
        assert states.ran(native) == asleep  # a blocked thread does not run
        # schedstat's figure for a running thread moves at scheduler ticks
        # (4-10 ms), so the looker works until a tick lands, within a bound
        me = threading.get_native_id()
        mine = states.ran(me)
        assert mine is not None
        later = mine
        busy_until = time.monotonic() + 2
        while later == mine and time.monotonic() < busy_until:
            sum(range(100_000))
            later = states.ran(me) or mine
        assert later > mine
    finally:
        release.set()
        waiter.join()
    # join returns as the thread ends; the kernel lets it go just after
    while states(native) is not None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert states(native) is None
    assert (native, "stat") not in states.fds
    assert states(threading.get_native_id()) == "R"  # the looker runs
    states.close()
    assert states.fds == {}
    assert states(threading.get_native_id()) == "R"  # still answers, keeping nothing
    assert states.fds == {}


def test_quiet_lines_count_as_progress_but_never_pause_or_delay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inside ``Noise.quiet`` (a census asking again while RETRY) the
    caller's lines of the tier count, and make no hot line and no pause;
    outside it, with every line hot, the same call pauses."""
    monkeypatch.setattr(tier_noise, "HOT_RATE", 1.0)
    tier = LostUpdate()
    try:
        with Noise(random.Random(1)) as noise:
            traced = noise.wrap(tier)
            with noise.quiet():
                traced.bump(1)
            assert noise.lines > 0
            assert noise.hot == {} and noise.recorded() == []
            assert noise.quiet_threads == set()
            traced.bump(1)
            assert noise.recorded(), "outside quiet() a hot line pauses"
    finally:
        tier.stop()
    assert tier.value == 2


def test_settle_naps_only_while_the_tiers_threads_may_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``settle`` waits a millisecond for the tier's threads; not when the
    tier started none, nor when no job is in flight and every thread it
    started sleeps (``threads_idle``, set by the audit's noise)."""
    naps: list[float] = []
    monkeypatch.setattr(tier_harness, "nap", naps.append)
    shape = TierRunShape(2, 4, row_bytes=4096)
    threadless = make_harness(MemoryTier, shape, DEFAULT)
    try:
        threadless.settle()
        assert naps == []
    finally:
        threadless.close()
    threaded = make_harness(file_system_tier, shape, DEFAULT)
    try:
        assert threaded.tier_threads()
        threaded.settle()  # nothing watches the threads: always a nap
        assert naps == [0.001]
        threaded.threads_idle = lambda: True
        threaded.settle()
        assert naps == [0.001]
        assert threaded.store([0]) is not None  # in flight until polled
        threaded.settle()
        assert naps == [0.001, 0.001]
        threaded.threads_idle = lambda: False
        threaded.drain()
        threaded.settle()
        assert naps == [0.001, 0.001, 0.001]
    finally:
        threaded.close()


def probe_lost_update(eager: bool) -> Probe:
    """:func:`run_lost_update` under a probe."""
    probe = Probe(eager=eager)
    run_lost_update(probe)
    return probe


def test_a_probe_notes_the_lines_the_tiers_threads_reach() -> None:
    """A probe lists no file, yet traces every file of the tier's code (it
    once reached no line at all, so ``find_schedule`` never tried a line
    the noise had not made hot); an eager probe lets the threads run
    before each step, so the worker's write is noted at the earliest step
    it can happen: before step 2 begins."""
    for eager in (False, True):
        writes = [
            reach for reach in probe_lost_update(eager).reached
            if reach.line == WRITE and reach.file.endswith("test_tier_schedule.py")
        ]
        assert len(writes) == 1 and writes[0].thread == "lost-update"
        if eager:
            assert (writes[0].after, writes[0].until) == (1, 1)


def test_a_probe_notes_the_callers_lines_as_pauses_until_the_others_stall() -> None:
    """The caller's lines too, each as a pause that holds the caller during
    its own step until the tier's threads stall (a held caller completes no
    step); ``_held_callers`` offers them, the last first, and nothing else."""
    reached = probe_lost_update(eager=False).reached
    bumps = [reach for reach in reached if reach.caller and reach.line == BUMP]
    assert len(bumps) == 1
    assert (bumps[0].after, bumps[0].until, bumps[0].end) == (2, 1, "stalled")
    offered = list(_held_callers(reached))
    assert offered and all(len(pauses) == 1 and pauses[0].caller for pauses in offered)
    assert offered[0] == [[reach for reach in reached if reach.caller][-1]]
