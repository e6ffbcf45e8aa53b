"""``python -m kvoffload bench manager``: manager throughput and worst cases.

Measurements, for each policy (``lru``, ``arc``):

Throughput
    A prefix-caching workload (``multi-turn``: conversations over shared
    system prompts, growing turn by turn) is replayed; per request:
    ``lookup_prefix`` over the chain, ``prepare_load`` + ``complete_load``
    of the hit prefix, ``touch`` of the chain, ``prepare_store`` +
    ``complete_store`` of the rest, ``take_events`` (events enabled). A block
    operation is one key handed to one of those calls; the figure is block
    operations per second, best of ``--rounds`` fresh replays. Each replay
    is timed by the thread's CPU time (``--clock cpu``, the default: on a
    shared machine the wall clock also counts the time other processes held
    the core) and by the wall clock (``--clock wall`` ranks by it). Before
    every timed replay of every manager the garbage collector runs a full
    collection; the managers take turns, and each round starts with the
    next one (so no manager always runs first).

Eviction cost
    A cache of ``N + k`` blocks is filled; the ``N`` least recent are
    pinned by ``prepare_load`` (held); then ``prepare_store`` of one new key
    — which must evict one block — is timed, ``--repeats`` times (each
    followed, untimed, by ``complete_store``). The figure is the median.

Worst cases (``--worst-case``)
    kvoffload's manager only. *First eviction after a big pin*:
    ``prepare_load`` pins the ``N`` least
    recent blocks of a full cache (timed), then the first ``prepare_store``
    that evicts (timed), for ``N`` in ``--pin``. *Bulk eviction*: a full
    cache of ``M`` blocks, then one ``prepare_store`` of ``M`` new keys that
    evicts all ``M`` (timed: per victim), for ``M`` in ``--bulk``; the
    ``prepare_store`` that filled it is timed too. *Key checks*: what the
    malformed-key checks cost per key and per call.

With ``--vllm-path DIR`` the same measurements run, interleaved in the same
process, on a released vLLM's own ``CPUOffloadingManager`` and, for a 0.33
release, on kvoffload's 0.33 face (:mod:`kvoffload.vllm`, labelled
``kvoffload.vllm``) driven by the very calls vLLM's manager gets: ``DIR`` holds a
release (see :mod:`kvoffload.vllm_release`; ``scripts/fetch_vllm.py`` makes
one), loaded unchanged behind stand-ins for the few other vLLM modules it
imports. Any generation is driven by what it has: the block-hash API of
0.19, per-key ``lookup`` (``LookupResult`` answers) from 0.20, request
hooks, and request-scoped recency (0.31 on: ``on_request_finished`` commits
recency and the scheduler never calls ``touch``, so neither does the
driver). vLLM is never a dependency and none of its code is part of this
package.

Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs

from kvoffload.impl.build import build_name
from kvoffload.impl.manager import CPUOffloadingManager, check_keys, listed_keys
from kvoffload.spec.contract import ReqContext
from kvoffload.spec.errors import ConfigurationError, OffloadingError
from kvoffload.spec.keys import OffloadKey, make_offload_key
from kvoffload.usage import UsageError
from kvoffload.vllm_release import Generation, VllmRelease, VllmReleaseError, load_release
from kvoffload.workloads import WORKLOADS, generate_trace

POLICIES = ("lru", "arc")
CLOCKS = ("cpu", "wall")


# --- drivers: one thin face over each manager ----------------------------


class ManagerDriver(Protocol):
    """The calls the benchmark makes, without request contexts or output
    types, so that both managers pay the same adapter cost."""

    def begin(self, req_id: str) -> None: ...
    def lookup_prefix(self, keys: list[OffloadKey]) -> int: ...
    def prepare_load(self, keys: list[OffloadKey]) -> None: ...
    def complete_load(self, keys: list[OffloadKey]) -> None: ...
    def touch(self, keys: list[OffloadKey]) -> None: ...
    def prepare_store(
        self, keys: list[OffloadKey]
    ) -> tuple[Sequence[OffloadKey], int] | None: ...
    def complete_store(self, keys: Sequence[OffloadKey]) -> None: ...
    def end(self) -> None: ...
    def take_events(self) -> int: ...


class KvoffloadDriver:
    """Drives :class:`kvoffload.impl.manager.CPUOffloadingManager`."""

    def __init__(self, num_blocks: int, policy: str) -> None:
        self.manager = CPUOffloadingManager(16, num_blocks, policy, enable_events=True)
        self._ctx = ReqContext("")

    def begin(self, req_id: str) -> None:
        self._ctx = ReqContext(req_id)

    def lookup_prefix(self, keys: list[OffloadKey]) -> int:
        return self.manager.lookup_prefix(keys, self._ctx)

    def prepare_load(self, keys: list[OffloadKey]) -> None:
        self.manager.prepare_load(keys, self._ctx)

    def complete_load(self, keys: list[OffloadKey]) -> None:
        self.manager.complete_load(keys, self._ctx)

    def touch(self, keys: list[OffloadKey]) -> None:
        self.manager.touch(keys, self._ctx)

    def prepare_store(
        self, keys: list[OffloadKey]
    ) -> tuple[Sequence[OffloadKey], int] | None:
        output = self.manager.prepare_store(keys, self._ctx)
        if output is None:
            return None
        return output.keys_to_store, len(output.evicted_keys)

    def complete_store(self, keys: Sequence[OffloadKey]) -> None:
        self.manager.complete_store(keys, self._ctx)

    def end(self) -> None:
        return None

    def take_events(self) -> int:
        return len(self.manager.take_events())


class ReleaseDriver:
    """Drives a released vLLM's ``CPUOffloadingManager``, in the calls its
    generation has (see the module docstring)."""

    def __init__(
        self, release: VllmRelease, num_blocks: int, policy: str, manager: Any = None
    ) -> None:
        self.release = release
        self.manager: Any = (
            manager if manager is not None
            else release.new_manager(num_blocks, policy, enable_events=True)
        )
        features = release.features
        self._hash_api = features.block_hash_api
        self._touch_ctx = features.touch_context
        self._complete_ctx = features.complete_context
        self._hooks = features.request_hooks
        self._calls_touch = not features.request_recency
        hit = release.lookup_result
        self._hit: object = True if hit is None else hit["HIT"]
        self._ctx: Any = release.new_context("")

    def begin(self, req_id: str) -> None:
        if self._hash_api:
            return
        self._ctx = self.release.new_context(req_id)
        if self._hooks:
            self.manager.on_new_request(self._ctx)

    def lookup_prefix(self, keys: list[OffloadKey]) -> int:
        if self._hash_api:
            hits: int = self.manager.lookup(keys)
            return hits
        lookup, ctx, hit = self.manager.lookup, self._ctx, self._hit
        count = 0
        for key in keys:
            if lookup(key, ctx) != hit:
                break
            count += 1
        return count

    def prepare_load(self, keys: list[OffloadKey]) -> None:
        if self._hash_api:
            self.manager.prepare_load(keys)
        else:
            self.manager.prepare_load(keys, self._ctx)

    def complete_load(self, keys: list[OffloadKey]) -> None:
        if self._complete_ctx:
            self.manager.complete_load(keys, self._ctx)
        else:
            self.manager.complete_load(keys)

    def touch(self, keys: list[OffloadKey]) -> None:
        if not self._calls_touch:
            return
        if self._touch_ctx:
            self.manager.touch(keys, self._ctx)
        else:
            self.manager.touch(keys)

    def prepare_store(
        self, keys: list[OffloadKey]
    ) -> tuple[Sequence[OffloadKey], int] | None:
        if self._hash_api:
            output = self.manager.prepare_store(keys)
            if output is None:
                return None
            return output.block_hashes_to_store, len(output.block_hashes_evicted)
        output = self.manager.prepare_store(keys, self._ctx)
        if output is None:
            return None
        return output.keys_to_store, len(output.evicted_keys)

    def complete_store(self, keys: Sequence[OffloadKey]) -> None:
        if self._complete_ctx:
            self.manager.complete_store(keys, self._ctx)
        else:
            self.manager.complete_store(keys)

    def end(self) -> None:
        if self._hooks:
            self.manager.on_request_finished(self._ctx)

    def take_events(self) -> int:
        return sum(1 for _ in self.manager.take_events())


DriverFactory = Callable[[int, str], ManagerDriver]


# --- throughput -----------------------------------------------------------


@attrs.frozen
class ThroughputResult:
    """One replay: block operations, hits, evictions and the time it took."""

    block_ops: int
    block_refs: int
    hit_blocks: int
    blocks_evicted: int
    events: int
    seconds: float
    cpu_seconds: float = 0.0
    """The replaying thread's CPU time (``time.thread_time``)."""

    @property
    def ops_per_second(self) -> float:
        return self.block_ops / self.seconds if self.seconds > 0 else float("inf")

    def timed(self, clock: str) -> float:
        """Seconds by ``clock``: ``"cpu"`` (thread CPU time) or ``"wall"``."""
        return self.cpu_seconds if clock == "cpu" else self.seconds

    def rate(self, clock: str) -> float:
        """Block operations per second by ``clock``."""
        seconds = self.timed(clock)
        return self.block_ops / seconds if seconds > 0 else float("inf")

    @property
    def hit_ratio(self) -> float:
        return self.hit_blocks / self.block_refs if self.block_refs else 0.0


def replay_throughput(
    driver: ManagerDriver,
    key_chains: Sequence[list[OffloadKey]],
    req_ids: Sequence[str],
) -> ThroughputResult:
    """Replay every chain through ``driver`` (the protocol in the module doc)."""
    begin, lookup_prefix = driver.begin, driver.lookup_prefix
    prepare_load, complete_load = driver.prepare_load, driver.complete_load
    touch, take_events, end = driver.touch, driver.take_events, driver.end
    prepare_store, complete_store = driver.prepare_store, driver.complete_store
    ops = refs = hit_blocks = evicted = events = 0
    gc.collect()
    started_cpu = time.thread_time()
    started = time.perf_counter()
    for req_id, chain in zip(req_ids, key_chains):
        begin(req_id)
        length = len(chain)
        refs += length
        hits = lookup_prefix(chain)
        ops += 2 * length  # lookup_prefix + touch
        if hits:
            loaded = chain[:hits]
            prepare_load(loaded)
            complete_load(loaded)
            ops += 2 * hits
            hit_blocks += hits
        touch(chain)
        if hits < length:
            rest = chain[hits:]
            ops += length - hits
            output = prepare_store(rest)
            if output is not None:
                to_store, num_evicted = output
                evicted += num_evicted
                if to_store:
                    complete_store(to_store)
                    ops += len(to_store)
        end()
        events += take_events()
    seconds = time.perf_counter() - started
    cpu_seconds = time.thread_time() - started_cpu
    return ThroughputResult(ops, refs, hit_blocks, evicted, events, seconds, cpu_seconds)


# --- eviction cost --------------------------------------------------------


def _bench_key(index: int) -> OffloadKey:
    return make_offload_key(b"E" + index.to_bytes(8, "big"), 0)


def eviction_cost_ns(
    make_driver: DriverFactory,
    policy: str,
    pinned: int,
    unpinned: int = 1024,
    repeats: int = 101,
) -> float:
    """Median nanoseconds of a ``prepare_store`` of one new key that evicts
    one block, with ``pinned`` least-recent blocks held by loads."""
    driver = make_driver(pinned + unpinned, policy)
    driver.begin("fill")
    total = pinned + unpinned
    chunk = 4096
    for start in range(0, total, chunk):
        keys = [_bench_key(i) for i in range(start, min(total, start + chunk))]
        output = driver.prepare_store(keys)
        if output is None:
            raise OffloadingError("filling the cache was refused")
        driver.complete_store(output[0])
    # oldest first: the pinned blocks are the least recent ones
    driver.prepare_load([_bench_key(i) for i in range(pinned)])
    driver.take_events()
    samples: list[int] = []
    next_key = total
    gc.collect()
    for _ in range(repeats):
        key = [_bench_key(next_key)]
        next_key += 1
        started = time.perf_counter_ns()
        output = driver.prepare_store(key)
        elapsed = time.perf_counter_ns() - started
        if output is None or output[1] != 1:
            raise OffloadingError("the eviction scenario did not evict exactly one block")
        driver.complete_store(output[0])
        driver.take_events()
        samples.append(elapsed)
    return float(statistics.median(samples))


def _fill(driver: ManagerDriver, first: int, count: int) -> float:
    """Store and complete keys ``first .. first + count - 1`` in one call
    each; the seconds the ``prepare_store`` took."""
    keys = [_bench_key(i) for i in range(first, first + count)]
    gc.collect()
    started = time.perf_counter()
    output = driver.prepare_store(keys)
    seconds = time.perf_counter() - started
    if output is None or len(output[0]) != count:
        raise OffloadingError("filling the cache was refused")
    driver.complete_store(output[0])
    driver.take_events()
    return seconds


@attrs.frozen
class PinThenEvict:
    """``prepare_load`` of ``pinned`` blocks, then the first evicting store."""

    pinned: int
    pin_seconds: float
    first_eviction_seconds: float
    later_eviction_seconds: float

    @property
    def ratio(self) -> float:
        return self.first_eviction_seconds / self.pin_seconds


def pin_then_evict(
    make_driver: DriverFactory, policy: str, pinned: int, unpinned: int = 1024
) -> PinThenEvict:
    """A full cache of ``pinned + unpinned`` blocks; one ``prepare_load`` of
    the ``pinned`` least recent (timed), then the first ``prepare_store``
    of one new key, which evicts one block (timed), then a second one."""
    driver = make_driver(pinned + unpinned, policy)
    driver.begin("fill")
    _fill(driver, 0, pinned + unpinned)
    keys = [_bench_key(i) for i in range(pinned)]
    gc.collect()
    started = time.perf_counter()
    driver.prepare_load(keys)
    pin_seconds = time.perf_counter() - started
    timings = []
    for index in (pinned + unpinned, pinned + unpinned + 1):
        started = time.perf_counter()
        output = driver.prepare_store([_bench_key(index)])
        timings.append(time.perf_counter() - started)
        if output is None or output[1] != 1:
            raise OffloadingError("the pin scenario did not evict exactly one block")
        driver.complete_store(output[0])
    return PinThenEvict(pinned, pin_seconds, timings[0], timings[1])


@attrs.frozen
class BulkEviction:
    """One ``prepare_store`` of ``blocks`` new keys into a full cache of
    ``blocks`` blocks (every block a victim), and the store that filled it."""

    blocks: int
    fill_seconds: float
    evict_seconds: float

    @property
    def per_victim_ns(self) -> float:
        return self.evict_seconds * 1e9 / self.blocks


def bulk_eviction(
    make_driver: DriverFactory, policy: str, blocks: int, gc_off: bool = False
) -> BulkEviction:
    """Fill a cache of ``blocks`` blocks in one store, then replace every
    block in one store (with Python's cyclic garbage collector paused
    during both timed calls when ``gc_off``)."""
    driver = make_driver(blocks, policy)
    driver.begin("bulk")
    was_enabled = gc.isenabled()
    try:
        if gc_off:
            gc.disable()
        fill = _fill(driver, 0, blocks)
        keys = [_bench_key(i) for i in range(blocks, 2 * blocks)]
        gc.collect()
        started = time.perf_counter()
        output = driver.prepare_store(keys)
        seconds = time.perf_counter() - started
    finally:
        if was_enabled:
            gc.enable()
    if output is None or output[1] != blocks:
        raise OffloadingError("the bulk scenario did not evict every block")
    return BulkEviction(blocks, fill, seconds)


@attrs.frozen
class KeyCheckCost:
    """What the malformed-key checks cost on the replay's own chains."""

    keys: int
    calls: int
    seconds: float

    @property
    def per_key_ns(self) -> float:
        return self.seconds * 1e9 / self.keys if self.keys else 0.0

    @property
    def per_call_ns(self) -> float:
        return self.seconds * 1e9 / self.calls if self.calls else 0.0


def key_check_cost(key_chains: Sequence[list[OffloadKey]], rounds: int = 3) -> KeyCheckCost:
    """Best of ``rounds`` passes of the managers' list check (``listed_keys``
    then ``check_keys``, what ``touch`` and ``prepare_store`` run before
    acting) over every chain."""
    best = float("inf")
    for _ in range(rounds):
        gc.collect()
        started = time.perf_counter()
        for chain in key_chains:
            check_keys(listed_keys(chain))
        best = min(best, time.perf_counter() - started)
    keys = sum(len(chain) for chain in key_chains)
    return KeyCheckCost(keys, len(key_chains), best)


def machine_description() -> str:
    """CPU model, cores, load average, Python and the kvoffload build."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = "load average " + " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        load = "load average unknown"
    return (
        f"{model}, {os.cpu_count()} cores, {load}; "
        f"python {platform.python_version()}; kvoffload build: {build_name()}"
    )


# --- command line ---------------------------------------------------------


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or any(value < 1 for value in values):
        raise argparse.ArgumentTypeError(f"need positive integers, got {text!r}")
    return values


def _positive_int(text: str) -> int:
    values = _int_list(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"need one positive integer, got {text!r}")
    return values[0]


def _policies(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    for name in names:
        if name not in POLICIES:
            raise argparse.ArgumentTypeError(f"unknown policy {name!r}; choose from lru, arc")
    if not names:
        raise argparse.ArgumentTypeError("no policy given")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workload", default="multi-turn", choices=sorted(WORKLOADS),
        help="workload to replay (default multi-turn)",
    )
    parser.add_argument("--requests", type=_positive_int, default=20_000,
                        help="requests to replay (default 20000)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    parser.add_argument("--capacity", type=_positive_int, default=8192,
                        help="cache capacity in blocks for the replay (default 8192)")
    parser.add_argument("--policy", type=_policies, default=list(POLICIES),
                        metavar="LIST", help="policies, comma-separated (default lru,arc)")
    parser.add_argument("--rounds", type=_positive_int, default=3,
                        help="fresh replays per manager; the best is kept (default 3)")
    parser.add_argument("--clock", choices=CLOCKS, default="cpu",
                        help="what times a replay: the thread's CPU time (cpu, the "
                             "default) or the wall clock (wall); both are printed")
    parser.add_argument("--pinned", type=_int_list, default=[1_000, 10_000, 100_000],
                        metavar="LIST",
                        help="pinned-block counts for the eviction cost "
                             "(default 1000,10000,100000)")
    parser.add_argument("--unpinned", type=_positive_int, default=1024,
                        help="evictable blocks beside the pinned ones (default 1024)")
    parser.add_argument("--repeats", type=_positive_int, default=101,
                        help="timed evictions per point; the median is reported (default 101)")
    parser.add_argument("--vllm-path", type=Path, default=None, metavar="DIR",
                        help="a vLLM release (a directory holding vllm/v1/kv_offload/) "
                             "to run its manager side by side")
    parser.add_argument("--skip-eviction", action="store_true",
                        help="no eviction-cost table")
    parser.add_argument("--skip-throughput", action="store_true",
                        help="no throughput replay")
    parser.add_argument("--worst-case", action="store_true",
                        help="also the worst cases: first eviction after a big pin, "
                             "bulk eviction, key-check cost")
    parser.add_argument("--pin", type=_int_list, default=[100_000], metavar="LIST",
                        help="pinned blocks for the first-eviction case (default 100000)")
    parser.add_argument("--bulk", type=_int_list, default=[1_000_000], metavar="LIST",
                        help="cache sizes for the bulk-eviction case (default 1000000)")
    parser.add_argument("--bulk-gc-off", action="store_true",
                        help="also run the bulk case with the cyclic garbage collector "
                             "paused, to show what collection costs")


@attrs.frozen
class Contender:
    """A manager implementation under test."""

    label: str
    make_driver: DriverFactory


def contenders(vllm_path: Path | None) -> list[Contender]:
    """kvoffload, and the vLLM release under ``vllm_path`` when given.

    Raises :class:`~kvoffload.vllm_release.VllmReleaseError` when it cannot
    be loaded.
    """
    result = [Contender("kvoffload", KvoffloadDriver)]
    if vllm_path is not None:
        release = load_release(vllm_path)

        def make_vllm(num_blocks: int, policy: str) -> ManagerDriver:
            return ReleaseDriver(release, num_blocks, policy)

        result.append(Contender(f"vllm-{release.version}", make_vllm))
        if release.generation is Generation.V0_33:

            def make_face(num_blocks: int, policy: str) -> ManagerDriver:
                from kvoffload.vllm import KVOffloadingManager

                face = KVOffloadingManager(num_blocks, policy, enable_events=True)
                return ReleaseDriver(release, num_blocks, policy, manager=face)

            result.append(Contender(FACE_LABEL, make_face))
    return result


FACE_LABEL = "kvoffload.vllm"
"""The contender that is kvoffload's vLLM 0.33 face (:mod:`kvoffload.vllm`),
driven exactly as vLLM 0.33's own manager is."""


def _fmt_rate(value: float) -> str:
    return f"{value / 1e6:.2f} M/s"


def _fmt_ns(value: float) -> str:
    return f"{value / 1000:.1f} us" if value >= 1000 else f"{value:.0f} ns"


def _print_throughput(
    args: argparse.Namespace, runners: list[Contender], trace: Any
) -> None:
    key_chains = trace.key_chains()
    clock = args.clock
    print(f"\nthroughput: block operations per second, best of {args.rounds} rounds "
          f"by {'thread CPU time' if clock == 'cpu' else 'wall-clock time'} "
          f"(a full garbage collection before each replay; each round starts "
          f"with the next manager)")
    print(f"{'policy':<7}{'manager':<14}{'block-ops/s':>13}{'hit ratio':>11}"
          f"{'hit blocks':>12}{'evicted':>10}{'cpu s':>8}{'wall s':>8}")
    for policy in args.policy:
        best: dict[str, ThroughputResult] = {}
        for round_index in range(args.rounds):
            start = round_index % len(runners)
            # interleaved, so drift hits all alike; rotated, so none always leads
            for runner in runners[start:] + runners[:start]:
                result = replay_throughput(
                    runner.make_driver(args.capacity, policy), key_chains, trace.req_ids
                )
                previous = best.get(runner.label)
                if previous is None or result.timed(clock) < previous.timed(clock):
                    best[runner.label] = result
        for runner in runners:
            r = best[runner.label]
            print(f"{policy:<7}{runner.label:<14}{_fmt_rate(r.rate(clock)):>13}"
                  f"{r.hit_ratio:>11.4f}{r.hit_blocks:>12}{r.blocks_evicted:>10}"
                  f"{r.cpu_seconds:>8.2f}{r.seconds:>8.2f}")
        if len(runners) > 1:
            ours, theirs = best[runners[0].label], best[runners[1].label]
            same = (ours.hit_blocks, ours.blocks_evicted) == (
                theirs.hit_blocks, theirs.blocks_evicted
            )
            print(f"{policy:<7}speedup {ours.rate(clock) / theirs.rate(clock):.2f}x; "
                  f"hit ratios {'identical' if same else 'DIFFER'} "
                  f"({ours.hit_blocks} vs {theirs.hit_blocks} hit blocks)")
            for runner in runners[2:]:
                face = best[runner.label]
                same = (face.hit_blocks, face.blocks_evicted) == (
                    theirs.hit_blocks, theirs.blocks_evicted
                )
                print(f"{policy:<7}{runner.label} over {runners[1].label}: "
                      f"{face.rate(clock) / theirs.rate(clock):.2f}x; "
                      f"hit ratios {'identical' if same else 'DIFFER'} "
                      f"({face.hit_blocks} vs {theirs.hit_blocks} hit blocks, "
                      f"{face.blocks_evicted} vs {theirs.blocks_evicted} evicted)")
    check = key_check_cost(key_chains)
    print(f"\nkey checks (listed_keys + check_keys, as touch and prepare_store run "
          f"them, over every chain): {check.per_key_ns:.1f} ns per key, "
          f"{check.per_call_ns / 1000:.2f} us per call "
          f"({check.keys} keys in {check.calls} calls)")


def _print_eviction(args: argparse.Namespace, runners: list[Contender]) -> None:
    print(f"\neviction cost: median time of one prepare_store that evicts one "
          f"block, N least-recent blocks pinned, {args.unpinned} evictable, "
          f"{args.repeats} repeats")
    print(f"{'policy':<7}{'pinned N':>9}" + "".join(f"{r.label:>14}" for r in runners))
    for policy in args.policy:
        for pinned in args.pinned:
            cells = [
                _fmt_ns(eviction_cost_ns(r.make_driver, policy, pinned,
                                         args.unpinned, args.repeats))
                for r in runners
            ]
            print(f"{policy:<7}{pinned:>9}" + "".join(f"{c:>14}" for c in cells))


def _print_worst_cases(args: argparse.Namespace, runners: list[Contender]) -> None:
    # kvoffload only: vLLM's victim search rescans pinned blocks on every
    # eviction and its bulk eviction is far slower (see the eviction table)
    runners = runners[:1]
    print(f"\nfirst eviction after a big pin: prepare_load of N least-recent blocks "
          f"of a full cache ({args.unpinned} more evictable), then the first and "
          f"second prepare_store that evict one block")
    print(f"{'policy':<7}{'manager':<14}{'pinned N':>9}{'prepare_load':>14}"
          f"{'1st evict':>12}{'ratio':>8}{'2nd evict':>12}")
    for policy in args.policy:
        for pinned in args.pin:
            for runner in runners:
                case = pin_then_evict(runner.make_driver, policy, pinned, args.unpinned)
                print(f"{policy:<7}{runner.label:<14}{pinned:>9}"
                      f"{_fmt_ns(case.pin_seconds * 1e9):>14}"
                      f"{_fmt_ns(case.first_eviction_seconds * 1e9):>12}"
                      f"{case.ratio:>7.2f}x"
                      f"{_fmt_ns(case.later_eviction_seconds * 1e9):>12}")
    print("\nbulk eviction: one prepare_store of M new keys into a full cache of M "
          "blocks (every block a victim); the store that filled it")
    print(f"{'policy':<7}{'manager':<14}{'M':>9}{'fill':>11}{'evict all':>12}"
          f"{'per victim':>12}")
    modes = [False, True] if args.bulk_gc_off else [False]
    for policy in args.policy:
        for blocks in args.bulk:
            for runner in runners:
                for gc_off in modes:
                    bulk = bulk_eviction(runner.make_driver, policy, blocks, gc_off)
                    print(f"{policy:<7}{runner.label:<14}{blocks:>9}"
                          f"{bulk.fill_seconds:>10.2f}s{bulk.evict_seconds:>11.2f}s"
                          f"{_fmt_ns(bulk.per_victim_ns):>12}"
                          f"{'  (gc paused)' if gc_off else ''}")


def run(args: argparse.Namespace) -> int:
    try:  # a release that cannot load or build its managers: a usage error
        runners = contenders(args.vllm_path)
        for runner in runners:
            for policy in args.policy:
                runner.make_driver(1, policy)
    except Exception as error:
        raise UsageError(
            f"--vllm-path {args.vllm_path}: {type(error).__name__}: {error}"
        ) from None
    try:
        trace = generate_trace(args.workload, args.requests, args.seed)
        print(f"machine: {machine_description()}")
        print(
            f"workload {args.workload} (seed {args.seed}): {trace.num_requests} requests, "
            f"{trace.num_block_refs} block references, {trace.num_blocks} distinct blocks; "
            f"capacity {args.capacity} blocks; events on"
        )
        if not args.skip_throughput:
            _print_throughput(args, runners, trace)
        if not args.skip_eviction:
            _print_eviction(args, runners)
        if args.worst_case:
            _print_worst_cases(args, runners)
    except (OffloadingError, ConfigurationError, VllmReleaseError, OSError) as error:
        print(f"bench manager: error: {error}", file=sys.stderr)
        return 2
    return 0
