"""Noise for threaded tier runs: random delays at lines of the tier's code.

A race window of a few statements (a result list copied, then cleared
without the tier's lock; an index rebuilt outside it; a job taken off a
queue and not yet published) is entered by chance only when a thread
switch lands inside it. :class:`Noise` widens every such window at random,
as ConTest-style noise makers do: a trace function that, at a random
fraction of the lines executed in the tier's code (any file outside the
standard library and the kit's own ``kvoffload/spec`` and
``kvoffload/stateful``), yields the interpreter or sleeps up to
:data:`MAX_SLEEP` seconds, and that *pauses* a thread at the run's hot
lines until the other threads have made progress (:meth:`Noise.pause`).
It never changes what the tier computes, only when; the kit's checks
accept every interleaving the tier model allows, so noise adds no false
alarm, only reach.

Traced are the threads started while the noise is on (``threading.settrace``:
the tier's own threads) and the callers' threads while they are inside a
tier call (:meth:`Noise.wrap`), not the kit's own code between calls, whose
tracing would cost more than the tier's.

Every pause the noise makes is recorded (:class:`Pause`: where, which time
that line was reached, and the steps it spanned), and :class:`Schedule`
replays a list of them with no noise at all: each listed pause *directed*
(the thread reaching the line for that time pauses until the caller has
completed the listed step, and the caller waits for it to be paused before
the step it opened the window for), so that a race the noise entered by
chance replays the same way every time.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from types import FrameType, TracebackType
from typing import Any, Literal

import attrs

YIELD_RATE = 0.05
"""The fraction of traced lines before which the thread yields."""

SLEEP_RATE = 0.01
"""The fraction of traced lines before which the thread sleeps."""

MAX_SLEEP = 0.0002
"""The longest such sleep, in seconds."""

HOT_RATE = 0.05
"""The fraction of the tier's lines (distinct file and line number) that a
run makes *hot*, drawn afresh per run: every time a thread reaches a hot
line it pauses there first (:meth:`Noise.pause`, as probabilistic
concurrency testing picks change points), so a window that follows a hot
line stays open while the other threads run, the first :data:`HOT_REPEATS`
times it is entered in the run (a hot line on a busy path does not use up
the others' turns)."""

HOT_REPEATS = 4

THREAD_HOT_RATE = 0.2
""":data:`HOT_RATE` for the lines that the tier's own threads run (a worker,
an I/O pool): pausing such a thread costs little (the callers go on
meanwhile), and the windows of a race with the callers are on them."""

PAUSE_STEPS = (1, 2)
"""A paused thread waits for the caller to complete this many steps
(drawn per pause; :meth:`Noise.stepped`: a whole call of the caller, e.g. a
cascade that evicts, runs inside the window) ..."""

PAUSE_LINES = 60
"""... or for the other threads to run this many lines of the tier's code
(a worker publishes a result inside a caller's window) ..."""

PAUSE_BOUND = 0.02
"""... or for every other thread to be stalled (sleeping in the kernel, not
in one of the kit's own naps: blocked on a lock the paused thread holds, or
idle), and at most this many seconds. Progress, not time, ends a pause:
on a loaded machine a thread that is runnable but not running makes no
progress, and the window stays open until it has run."""

PAUSE_TICK = 0.0002
"""How often a paused thread looks at the others (seconds)."""

_KIT = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), part) + os.sep
    for part in ("spec", "stateful")
)
_STDLIB = tuple(
    os.path.abspath(p) + os.sep
    for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)

Tracer = Callable[[FrameType, str, Any], Any]

_NAPPING: set[int] = set()
"""Native ids of the kit's threads in one of their deliberate sleeps
(:func:`nap`): they will go on by themselves, so they are not stalled."""


def nap(seconds: float) -> None:
    """``time.sleep(seconds)`` for a kit thread that pauses on purpose (a
    settle, the poll thread's interval): a paused thread then keeps
    waiting for it rather than taking it for stalled."""
    me = threading.get_native_id()
    _NAPPING.add(me)
    try:
        time.sleep(seconds)
    finally:
        _NAPPING.discard(me)


_READ_BYTES = 128
"""Enough of a ``stat`` or ``schedstat`` file for the fields read."""


def _reader() -> Callable[[int], bytes]:
    """A function reading the first :data:`_READ_BYTES` of an open file
    (empty on an error), for one :class:`_ThreadStates` (its buffer is
    used under that object's lock): libc's ``pread`` through
    ``ctypes.PyDLL``, which keeps the interpreter lock during the call.
    ``os.pread`` gives the lock up, so each read of a look handed the
    interpreter to the threads being looked at: most of a look's cost in
    a threaded audit. ``os.pread`` where the C library has no ``pread``."""
    try:
        import ctypes

        pread = ctypes.PyDLL(None).pread
    except (ImportError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return lambda fd: os.pread(fd, _READ_BYTES, 0)
    pread.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long)
    pread.restype = ctypes.c_ssize_t
    buffer = ctypes.create_string_buffer(_READ_BYTES)

    def read(fd: int) -> bytes:
        count: int = pread(fd, buffer, _READ_BYTES, 0)
        return buffer.raw[:count] if count > 0 else b""

    return read


class _ThreadStates:
    """What the kernel says of a thread of this process, read with one
    ``pread`` of its ``/proc`` files, kept open (:meth:`close` closes
    them): its state letter (:meth:`__call__`) and its time on a CPU
    (:meth:`ran`). Most pauses of a threaded audit find the other threads
    already stalled and end after two looks, so a look is what they cost:
    an open, a read and a close per thread made it 88 µs."""

    def __init__(self) -> None:
        self.fds: dict[tuple[int, str], int] = {}
        self.read = _reader()
        self.lock = threading.Lock()
        """Held while a file is read or closed (two paused threads may look
        at once; a file closed under a reader could be reused by another)."""
        self.closed = False

    def _read(self, native_id: int, name: str) -> bytes:
        """The content of ``/proc/self/task/<native_id>/<name>``; empty
        when the thread is gone or the file unknown."""
        with self.lock:
            for _ in range(2):
                fd = self.fds.get((native_id, name))
                if fd is None:
                    try:
                        fd = os.open(f"/proc/self/task/{native_id}/{name}", os.O_RDONLY)
                    except OSError:
                        return b""
                    if not self.closed:
                        self.fds[native_id, name] = fd
                try:
                    text = self.read(fd)
                except OSError:
                    text = b""
                if self.closed:
                    os.close(fd)
                if text:
                    return text
                # the thread ended (the kernel may give its id to a new one)
                if self.fds.pop((native_id, name), None) is not None:
                    os.close(fd)
            return b""

    def __call__(self, native_id: int) -> str | None:
        """The state letter (``R`` running or runnable, ``S``/``D``
        sleeping, ...), None where unknown."""
        text = self._read(native_id, "stat")
        end = text.rfind(b")")
        return chr(text[end + 2]) if 0 <= end < len(text) - 2 else None

    def ran(self, native_id: int) -> int | None:
        """Nanoseconds the thread has run on a CPU (``schedstat``), None
        where unknown: a thread asleep at two looks that has not run in
        between has not moved."""
        field = self._read(native_id, "schedstat").split(b" ", 1)[0]
        return int(field) if field.isdigit() else None

    def close(self) -> None:
        with self.lock:
            self.closed = True
            for fd in self.fds.values():
                os.close(fd)
            self.fds.clear()


PauseEnd = Literal["steps", "lines", "stalled", "bound", "stopped"]
"""What ended a recorded pause: the caller's steps, the other threads'
lines, every other thread stalled, :data:`PAUSE_BOUND`, the noise stopped."""

_ENDS: tuple[PauseEnd, ...] = ("steps", "lines", "stalled", "bound", "stopped")

SCHEDULE_BOUND = 2.0
"""The longest a :class:`Schedule` holds a thread, or waits for one to
reach its pause (seconds): a safety bound, never what ends a pause that
goes as recorded; when it is hit, :meth:`Schedule.verdict` says so."""

DIRECTED_SWITCH_INTERVAL = 0.005
"""The interpreter's thread switch interval while a :class:`Schedule`
replays (seconds; Python's default, set whatever the caller's): the
listed pauses force the order that matters, and between them the caller
runs until it blocks, so that the rest of a replay goes the same way
each time. At an audit's 1 µs, the scripts of the blind corpus's index
race repeated their failure in 64 of 80 runs; at 5 ms in every run
(docs/DECISIONS.md, "replay")."""

PROBE_SWITCH_INTERVAL = 1e-6
"""The switch interval of a :class:`Probe` (the audit's): the tier's
threads then reach their lines near the calls that gave them work, as in
the audit's runs, which is where :func:`~kvoffload.stateful.tier_audit.find_schedule`
tries pauses (at 5 ms a worker thread ran mostly when the caller
blocked: in the final drain)."""

STALL_LOOKS = 20
"""A :class:`Schedule` takes the other threads for stalled when this many
looks in a row, :data:`PAUSE_TICK` apart, found each of them asleep in the
kernel and not run on a CPU since the first (a thread waiting for the
interpreter lock sleeps too, but runs as soon as the looker sleeps)."""


def _tier_code(filename: str) -> bool:
    """Whether ``filename`` is the tier's code: outside the standard library
    and the kit's own ``kvoffload/spec`` and ``kvoffload/stateful``."""
    path = os.path.abspath(filename)
    return not (filename.startswith("<") or path.startswith(_KIT) or path.startswith(_STDLIB))


def _ordinal(number: int) -> str:
    suffixes = {1: "st", 2: "nd", 3: "rd"}
    suffix = "th" if 10 <= number % 100 <= 20 else suffixes.get(number % 10, "th")
    return f"{number}{suffix}"


def script_path(filename: str) -> str:
    """``filename`` as a script names it: relative to the current directory
    or an entry of ``sys.path`` where it lies under one (the shortest such
    path), else absolute. :class:`Schedule` matches it as the end of a path."""
    path = os.path.abspath(filename)
    best = path
    for root in (os.getcwd(), *sys.path):
        if not root:
            continue
        base = os.path.abspath(root) + os.sep
        if path.startswith(base) and len(path) - len(base) < len(best):
            best = path[len(base) :]
    return best


def _positive(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"Pause.{attribute.name} must be at least 1, not {value}")


def _not_negative(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"Pause.{attribute.name} must not be negative, not {value}")


@attrs.frozen
class Pause:
    """One pause of a run, as :class:`Noise` records it and :class:`Schedule`
    replays it.

    The thread that reached line ``line`` of ``file`` for the ``hit``-th time
    (counted over all threads; the callers' and the tier's own threads apart,
    ``caller``) paused there when ``after`` of the run's steps had started,
    until ``until`` had completed. Steps are the run's calls in the order
    they took effect (with a tier-poll thread, its polls too). ``end``:
    what ended it when it was recorded (:data:`PauseEnd`); ``thread``: the
    paused thread's name, for the reader. ``file`` may be the end of a path
    (``tests/blind_tiers/thread_worker.py`` names that file wherever it lies).
    """

    file: str
    line: int = attrs.field(validator=_positive)
    hit: int = attrs.field(default=1, validator=_positive)
    after: int = attrs.field(default=0, validator=_not_negative)
    until: int = attrs.field(default=0, validator=_not_negative)
    caller: bool = False
    end: PauseEnd = attrs.field(default="steps", validator=attrs.validators.in_(_ENDS))
    thread: str = ""

    def render(self) -> str:
        """The pause as a script writes it (defaults left out)."""
        parts = [repr(script_path(self.file)), str(self.line), f"hit={self.hit}"]
        parts += [f"after={self.after}", f"until={self.until}"]
        if self.caller:
            parts.append("caller=True")
        if self.end != "steps":
            parts.append(f"end={self.end!r}")
        if self.thread:
            parts.append(f"thread={self.thread!r}")
        return f"Pause({', '.join(parts)})"

    def describe(self) -> str:
        """In words: ``thread-tier at thread_worker.py:187 (the 2nd time)
        until step 7``."""
        who = self.thread or ("the caller" if self.caller else "a thread of the tier")
        where = f"{os.path.basename(self.file)}:{self.line} (the {_ordinal(self.hit)} time)"
        if self.end == "steps":
            return f"{who} at {where} from step {self.after + 1} until step {self.until}"
        return (
            f"{who} at {where} from step {self.after + 1} until the others stall "
            f"(or step {self.until + 1})"
        )


_Recorded = tuple[tuple[str, int, bool], int, int, int, PauseEnd, str]


class _Tracing:
    """What :class:`Noise` and :class:`Schedule` share: a trace function on
    the threads started while active and, through :meth:`wrap`, on the
    callers inside the tier's methods."""

    def __init__(self) -> None:
        self.line_tracer: Tracer = self._line
        """The one bound trace function, returned on every line (a new bound
        method per line is an allocation)."""
        self.traced: dict[str, bool] = {}
        self.callers: set[int] = set()
        """Idents of the threads that called the tier (:meth:`wrap`)."""
        self.saved: Any = None
        self.active = False
        self.bystanders: set[threading.Thread] = set()
        """Threads already running when the tracing began (another run's
        leftovers): not part of this run, never waited for."""
        self.steps = 0
        """The caller's steps completed so far (:meth:`stepped`)."""
        self.thread_state = _ThreadStates()

    def _wanted(self, filename: str) -> bool:
        """Whether calls into ``filename`` are traced: the tier's code
        (:func:`_tier_code`), cached per file (:class:`Schedule`: the files
        it lists)."""
        wanted = self.traced.get(filename)
        if wanted is None:
            wanted = self.traced[filename] = _tier_code(filename)
        return wanted

    def _call(self, frame: FrameType, event: str, arg: Any) -> Tracer | None:
        if event == "call" and self.active and self._wanted(frame.f_code.co_filename):
            return self.line_tracer
        return None

    def _line(self, frame: FrameType, event: str, arg: Any) -> Tracer:
        raise NotImplementedError

    def _asleep_others(self, me: int, skip: Collection[int] = ()) -> list[int] | None:
        """The native ids of the run's other live threads (not ``me``, not
        bystanders, not those in ``skip``) when each sleeps in the kernel and
        not in a kit nap; None as soon as one does not."""
        asleep = []
        for thread in threading.enumerate():
            other = thread.native_id
            if other is None or other == me or thread in self.bystanders:
                continue
            if not thread.is_alive() or other in skip:
                continue
            if other in _NAPPING or self.thread_state(other) not in ("S", "D"):
                return None
            asleep.append(other)
        return asleep

    def before_step(self) -> None:
        """The caller is about to start a step."""

    def stepped(self) -> None:
        """The caller (the thread making the run's calls) completed a step."""
        self.steps += 1

    def wrap(self, tier: Any) -> Any:
        """``tier`` with its methods traced while they run (on whichever
        thread calls them)."""
        return _NoisyTier(tier, self)

    def __enter__(self) -> _Tracing:
        self.saved = threading.gettrace()
        here = threading.current_thread()
        self.bystanders = {t for t in threading.enumerate() if t is not here}
        self.active = True
        threading.settrace(self._call)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """No more tracing, on any thread."""
        self.active = False
        threading.settrace(self.saved)
        self.thread_state.close()


class Noise(_Tracing):
    """A context manager: while active, the tier's code (see the module
    docstring) runs with random delays and pauses, on every thread started
    meanwhile and, through :meth:`wrap`, on the callers' threads inside
    the tier's methods. ``rng``: the run's random source. Every pause is
    recorded (:meth:`recorded`)."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        self.rng = random.Random(rng.random())
        self.hot: dict[tuple[str, int, bool], list[int]] = {}
        """Per line of the tier's code: how many more times it pauses (hot
        lines), and how many times it was reached (all threads; the
        callers' and the tier's own threads apart)."""
        self.lines = 0
        """Lines of the tier's code run so far (all threads)."""
        self.progress: Callable[[], tuple[int, int]] = lambda: (self.steps, self.steps)
        """The run's steps started and completed so far, as a pause records
        them (:class:`Pause`); the caller's own steps unless the run sets it
        (with a tier-poll thread the steps of both callers)."""
        self.pauses: list[_Recorded] = []
        self.at: dict[int, tuple[tuple[str, int, bool], int]] = {}
        """Where each of the tier's own threads is: its last line reached,
        and which time that was."""
        self.snapshots: list[tuple[int, list[tuple[tuple[str, int, bool], int, str]]]] = []
        """Where the tier's threads were as each step began (:meth:`snapshot`)."""
        self.quiet_threads: set[int] = set()
        """Idents of the threads inside :meth:`quiet`."""

    def __enter__(self) -> Noise:
        super().__enter__()
        return self

    def _line(self, frame: FrameType, event: str, arg: Any) -> Tracer:
        if event == "line" and self.active:
            self.lines += 1
            me = threading.get_ident()
            if me in self.quiet_threads:
                return self.line_tracer
            caller = me in self.callers
            where = (frame.f_code.co_filename, frame.f_lineno, caller)
            # [turns left hot, times reached]; not under a lock (one per line
            # cost a fifth of a threaded audit): two threads reaching one
            # line at the same instant may miscount it, which costs a replay
            # candidate, never a finding
            entry = self.hot.get(where)
            if entry is None:
                rate = HOT_RATE if caller else THREAD_HOT_RATE
                entry = self.hot[where] = [HOT_REPEATS if self.rng.random() < rate else 0, 0]
            entry[1] += 1
            hit = entry[1]
            if not caller:
                self.at[me] = (where, hit)
            if entry[0] > 0:
                entry[0] -= 1
                # a hot line pauses the first HOT_REPEATS times it is reached
                self.pause(where, hit)
                return self.line_tracer
            roll = self.rng.random()
            if roll < YIELD_RATE:
                time.sleep(0)
            elif roll < YIELD_RATE + SLEEP_RATE:
                time.sleep(self.rng.random() * MAX_SLEEP)
        return self.line_tracer

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """While inside, the current thread's lines of the tier's code are
        counted (they are progress for a paused thread) but neither delayed
        nor paused, and use up no hot line's turns: the kit's polls (a
        census asking again while RETRY), whose interleavings with the
        tier's threads those threads' own noise opens."""
        me = threading.get_ident()
        self.quiet_threads.add(me)
        try:
            yield
        finally:
            self.quiet_threads.discard(me)

    def others_idle(self) -> bool:
        """Every other thread of the run sleeps in the kernel, not in a kit
        nap, at two looks a yield apart (nothing would run if the caller
        waited)."""
        me = threading.get_native_id()
        if self._asleep_others(me) is None:
            return False
        time.sleep(0)
        return self._asleep_others(me) is not None

    def pause(self, where: tuple[str, int, bool] | None = None, hit: int = 1) -> None:
        """Hold the current thread until the others have made progress:
        :data:`PAUSE_STEPS` of the caller's steps completed or :data:`PAUSE_LINES`
        lines of the tier run elsewhere, or every other thread stalled
        (two looks, a yield apart), or :data:`PAUSE_BOUND` seconds. A pause
        at ``where`` (file, line, whether a caller) is recorded, as the
        ``hit``-th time a thread reached it."""
        began = self.progress()[0]
        end = self._hold()
        if where is not None:
            name = threading.current_thread().name
            self.pauses.append((where, hit, began, self.progress()[1], end, name))

    def _hold(self) -> PauseEnd:
        lines, steps = self.lines, self.steps
        want = self.rng.randint(*PAUSE_STEPS)
        deadline = time.monotonic() + PAUSE_BOUND
        while self.active:
            if self.others_idle():  # two looks: not a moment between two runs
                return "stalled"
            time.sleep(PAUSE_TICK)
            if self.steps - steps >= want:
                return "steps"
            if self.lines - lines >= PAUSE_LINES:
                return "lines"
            if time.monotonic() > deadline:
                return "bound"
        return "stopped"

    def snapshot(self, started: int) -> None:
        """Note where the tier's own threads are as a step begins, ``started``
        steps having begun before it (:meth:`positions`): each one's last
        line reached in the tier's code, and which time that line was
        reached. Kept per line, not read from ``sys._current_frames()``:
        walking another thread's frames while it runs crashed the
        interpreter (a segmentation fault in the main job's FileSystemTier
        row)."""
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        at = dict(self.at)  # one copy (the tier's threads add to it meanwhile)
        self.snapshots.append(
            (started, [(where, hit, names[ident]) for ident, (where, hit) in at.items()
                       if ident in names])
        )

    def positions(self) -> list[Pause]:
        """For each step, where each of the tier's threads was as it began,
        as a pause held through that step (the last step first): a replay
        that holds a thread there re-creates the run's interleaving at that
        step, whether a pause, a yield or the scheduler put it there."""
        return [
            Pause(where[0], where[1], hit, started, started + 1, False, "steps", name)
            for started, entries in reversed(self.snapshots)
            for where, hit, name in entries
        ]

    def recorded(self) -> list[Pause]:
        """The pauses made so far, in the order they began."""
        return [
            Pause(where[0], where[1], hit, after, until, where[2], end, name)
            for where, hit, after, until, end, name in self.pauses
        ]


class Schedule(_Tracing):
    """A directed replay of recorded pauses (:class:`Pause`), with no noise:
    a context manager that, while active, holds the thread that reaches a
    listed line for the listed time until the caller has completed the
    listed step (``end`` other than ``"steps"``: until the other threads
    stall, or the step after), and makes the caller wait, before each step
    (:meth:`before_step`), until the pauses recorded as begun by then are
    engaged. A pause also ends when every other thread is stalled (a caller
    waiting on the paused thread does not deadlock), and at
    :data:`SCHEDULE_BOUND`; :meth:`verdict` says whether every pause held
    as listed.

    The caller drives it with :meth:`before_step` and :meth:`stepped` around
    each call, or through :meth:`drive`. Build the tier inside the ``with``:
    its threads are traced only if they start while it is active.
    """

    def __init__(
        self,
        pauses: Sequence[Pause],
        bound: float = SCHEDULE_BOUND,
        switch_interval: float = DIRECTED_SWITCH_INTERVAL,
    ) -> None:
        super().__init__()
        if not all(isinstance(pause, Pause) for pause in pauses):
            raise TypeError("a Schedule lists Pause records")
        if bound <= 0:
            raise ValueError(f"the bound must be positive, not {bound}")
        if switch_interval <= 0:
            raise ValueError(f"the switch interval must be positive, not {switch_interval}")
        self.switch_interval = switch_interval
        self.pauses = tuple(pauses)
        self.bound = bound
        self.engaged = [False] * len(self.pauses)
        self.wheres: dict[tuple[str, int, bool], dict[int, int]] = {}
        self.due: dict[int, list[int]] = {}
        for index, pause in enumerate(self.pauses):
            hits = self.wheres.setdefault((pause.file, pause.line, pause.caller), {})
            if pause.hit in hits:
                raise ValueError(f"{pause.render()} is listed twice")
            hits[pause.hit] = index
            self.due.setdefault(pause.after, []).append(index)
        self.files: dict[str, str | None] = {}
        self.hits: dict[tuple[str, int, bool], int] = {}
        self.counting = threading.Lock()
        self.holding: set[int] = set()
        """Native ids of the threads this schedule holds (stalled, to the others)."""
        self.started = 0
        """The steps started so far (:meth:`before_step`)."""
        self.missed: list[str] = []
        """What did not go as listed."""
        self.saved_interval: float | None = None

    def __enter__(self) -> Schedule:
        self.saved_interval = sys.getswitchinterval()
        sys.setswitchinterval(self.switch_interval)
        super().__enter__()
        return self

    def stop(self) -> None:
        super().stop()
        if self.saved_interval is not None:
            sys.setswitchinterval(self.saved_interval)
            self.saved_interval = None

    def _file(self, filename: str) -> str | None:
        """The listed file that ``filename`` is (None: none)."""
        if filename in self.files:
            return self.files[filename]
        path = os.path.abspath(filename)
        found = None
        for file, _, _ in self.wheres:
            name = os.path.normpath(file)
            if path == name or path.endswith(os.sep + name):
                found = file
                break
        self.files[filename] = found
        return found

    def _wanted(self, filename: str) -> bool:
        return self._file(filename) is not None

    def _line(self, frame: FrameType, event: str, arg: Any) -> Tracer:
        if event == "line" and self.active:
            file = self.files.get(frame.f_code.co_filename)
            if file is not None:
                where = (file, frame.f_lineno, threading.get_ident() in self.callers)
                hits = self.wheres.get(where)
                if hits is not None:
                    with self.counting:
                        count = self.hits[where] = self.hits.get(where, 0) + 1
                    index = hits.get(count)
                    if index is not None:
                        self._hold(index)
        return self.line_tracer

    def _hold(self, index: int) -> None:
        pause = self.pauses[index]
        me = threading.get_native_id()
        self.engaged[index] = True
        self.holding.add(me)
        try:
            deadline = time.monotonic() + self.bound
            quiet, last = 0, None
            while self.active:
                done = self.steps
                if done > pause.until or (done == pause.until and pause.end == "steps"):
                    return
                look = self._look(me)
                quiet = quiet + 1 if look is not None and look == last else 0
                last = look
                if quiet >= STALL_LOOKS:
                    if pause.end == "steps":
                        self.missed.append(
                            f"{pause.describe()} ended at step {done}: the others stalled"
                        )
                    return
                if time.monotonic() > deadline:
                    self.missed.append(
                        f"{pause.describe()} ended at the bound ({self.bound:g} s)"
                    )
                    return
                time.sleep(PAUSE_TICK)
        finally:
            self.holding.discard(me)

    def before_step(self) -> None:
        """Wait until each pause recorded as begun before this step is
        engaged (until the others stall, or :data:`SCHEDULE_BOUND`): the
        window is open before the call that ran inside it."""
        for index in self.due.get(self.started, ()):
            self._await(index)
        self.started += 1

    def _await(self, index: int) -> None:
        why = self._wait(lambda: self.engaged[index])
        if why is not None:
            self.missed.append(
                f"{self.pauses[index].describe()} was not reached before step "
                f"{self.started + 1} ({why})"
            )

    def _wait(self, done: Callable[[], bool], bound: float | None = None) -> str | None:
        """Nap until ``done()``; why it gave up first ("the others
        stalled": :data:`STALL_LOOKS` looks saw the other threads asleep
        and not moving; "the bound": ``bound`` seconds, by default the
        schedule's), None once done or stopped."""
        me = threading.get_native_id()
        deadline = time.monotonic() + (self.bound if bound is None else bound)
        quiet, last = 0, None
        while self.active and not done():
            look = self._look(me)
            quiet = quiet + 1 if look is not None and look == last else 0
            last = look
            if quiet >= STALL_LOOKS:
                return "the others stalled"
            if time.monotonic() > deadline:
                return "the bound"
            nap(PAUSE_TICK)
        return None

    def _look(self, me: int) -> tuple[tuple[int, int | None], ...] | None:
        """The other threads of the run (thread, nanoseconds on a CPU), when
        each is asleep in the kernel or held by this schedule; None when one
        is not (running, runnable, or in a kit nap). Not their frames:
        ``sys._current_frames()`` read while the threads ran corrupted the
        interpreter under Python 3.11 (a frame read back as a dict; a
        segmentation fault in CI)."""
        asleep = self._asleep_others(me, self.holding)
        if asleep is None:
            return None
        return tuple((other, self.thread_state.ran(other)) for other in asleep)

    def stepped(self) -> None:
        """The caller completed a step: pauses held until it end."""
        self.steps += 1

    def drive(self, harness: Any) -> Any:
        """``harness`` (an object whose ``tier`` is the tier, e.g. a
        :class:`~kvoffload.stateful.tier_harness.TierHarness`) with its tier
        traced (:meth:`wrap`), as an object each of whose method calls is one
        step: :meth:`before_step`, the call, :meth:`stepped`."""
        harness.tier = self.wrap(harness.tier)
        return _Driven(harness, self)

    def verdict(self) -> str:
        """Whether every pause held as listed; if not, what went otherwise."""
        missed = list(self.missed)
        missed += [
            f"{pause.describe()} was never reached"
            for pause, engaged in zip(self.pauses, self.engaged, strict=True)
            if not engaged and pause.after < self.started
        ]
        if not missed:
            return "every pause held as listed"
        return "; ".join(missed)


class Probe(Schedule):
    """A directed replay with no pause that notes every line of the tier's
    code each thread reaches (:attr:`reached`: as a :class:`Pause` there
    would name it, begun then and held for no step; a caller's until the
    others stall, as a held caller completes no step), for
    :func:`~kvoffload.stateful.tier_audit.find_schedule` to try pauses at
    lines the noise did not make hot."""

    def __init__(self, eager: bool = False) -> None:
        super().__init__([], switch_interval=PROBE_SWITCH_INTERVAL)
        self.reached: list[Pause] = []
        self.eager = eager
        """Before each step, wait until the tier's threads stall, or
        :data:`PAUSE_BOUND` (a thread that never sleeps costs no more): each
        line is then noted at the earliest step a thread can reach it;
        without, a thread the caller starves reaches it when the caller
        blocks."""

    def before_step(self) -> None:
        if self.eager:
            self._wait(lambda: False, PAUSE_BOUND)
        super().before_step()

    # every file of the tier's code, not only the files a schedule lists
    # (it lists none): without this the probe reached no line at all
    _wanted = _Tracing._wanted

    def _line(self, frame: FrameType, event: str, arg: Any) -> Tracer:
        if event == "line" and self.active:
            caller = threading.get_ident() in self.callers
            where = (frame.f_code.co_filename, frame.f_lineno, caller)
            with self.counting:
                hit = self.hits[where] = self.hits.get(where, 0) + 1
            name = threading.current_thread().name
            self.reached.append(
                Pause(
                    where[0], where[1], hit, self.started, self.steps, caller,
                    "stalled" if caller else "steps", name,
                )
            )
        return self.line_tracer


class _MethodProxy:
    """An object whose methods run wrapped (:meth:`_wrap`); every other
    attribute is the target's own."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        return self._wrap(name, value) if callable(value) else value

    def _wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        raise NotImplementedError


class _Driven(_MethodProxy):
    """A harness whose method calls are steps of a :class:`Schedule` (see
    :meth:`Schedule.drive`)."""

    def __init__(self, harness: Any, schedule: Schedule) -> None:
        super().__init__(harness)
        self._schedule = schedule

    def _wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        schedule = self._schedule
        # a harness that checks after each call (``drive_step``) checks here
        # too: the script's calls then interleave with the tier's threads as
        # the audit's did (a check may take the tier's lock)
        drive_step = getattr(self._target, "drive_step", None)

        def step(*args: Any, **kwargs: Any) -> Any:
            schedule.before_step()
            if callable(drive_step) and not kwargs:
                result = drive_step(name, args)
            else:
                result = method(*args, **kwargs)
            schedule.stepped()
            return result

        return step


class _NoisyTier(_MethodProxy):
    """A tier whose methods run traced by a :class:`Noise` or a
    :class:`Schedule` (see :meth:`Noise.wrap`); every other attribute is the
    tier's own."""

    def __init__(self, tier: Any, noise: _Tracing) -> None:
        super().__init__(tier)
        self._noise = noise

    def _wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        noise = self._noise

        def traced(*args: Any, **kwargs: Any) -> Any:
            noise.callers.add(threading.get_ident())
            saved = sys.gettrace()
            sys.settrace(noise._call)
            try:
                return method(*args, **kwargs)
            finally:
                sys.settrace(saved)

        return traced


__all__ = [
    "HOT_RATE",
    "HOT_REPEATS",
    "MAX_SLEEP",
    "PAUSE_BOUND",
    "PAUSE_STEPS",
    "PAUSE_LINES",
    "SCHEDULE_BOUND",
    "SLEEP_RATE",
    "STALL_LOOKS",
    "THREAD_HOT_RATE",
    "YIELD_RATE",
    "Noise",
    "Pause",
    "PauseEnd",
    "Probe",
    "Schedule",
    "nap",
    "script_path",
]
