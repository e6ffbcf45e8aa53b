"""``python -m kvoffload bench manager``: manager throughput and eviction cost.

Two measurements, for each policy (``lru``, ``arc``):

Throughput
    A prefix-caching workload (``multi-turn``: conversations over shared
    system prompts, growing turn by turn) is replayed; per request:
    ``lookup_prefix`` over the chain, ``prepare_load`` + ``complete_load``
    of the hit prefix, ``touch`` of the chain, ``prepare_store`` +
    ``complete_store`` of the rest, ``take_events`` (events enabled). A block
    operation is one key handed to one of those calls; the figure is block
    operations per second, best of ``--rounds`` fresh replays.

Eviction cost
    A cache of ``N + k`` blocks is filled; the ``N`` least recent are
    pinned by ``prepare_load`` (held); then ``prepare_store`` of one new key
    — which must evict one block — is timed, ``--repeats`` times (each
    followed, untimed, by ``complete_store``). The figure is the median.

With ``--vllm-path DIR`` the same measurements run, interleaved in the same
process, on vLLM's own ``CPUOffloadingManager``: ``DIR`` holds an unpacked
``vllm/v1/kv_offload/`` tree (e.g. from ``pip download --no-deps
vllm==0.19.0``; only that directory is needed), loaded unchanged behind
import shims for the two names it takes from the rest of vLLM. vLLM is never
a dependency and none of its code is part of this package.

Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import statistics
import sys
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NewType, Protocol

import attrs

from kvoffload.impl.manager import CPUOffloadingManager
from kvoffload.spec.contract import ReqContext
from kvoffload.spec.errors import ConfigurationError, OffloadingError
from kvoffload.spec.keys import OffloadKey, make_offload_key
from kvoffload.spec.policies import IMPLEMENTABLE_POLICY_NAMES
from kvoffload.workloads import WORKLOADS, generate_trace

POLICIES = IMPLEMENTABLE_POLICY_NAMES


class VllmUnavailableError(OffloadingError):
    """``--vllm-path`` does not hold a loadable ``vllm/v1/kv_offload`` tree."""


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

    def take_events(self) -> int:
        return len(self.manager.take_events())


class VllmDriver:
    """Drives vLLM's ``CPUOffloadingManager`` (block-hash list API: no
    request context, ``lookup`` returns the hit prefix length)."""

    def __init__(self, manager_cls: Any, num_blocks: int, policy: str) -> None:
        self.manager = manager_cls(
            block_size=16, num_blocks=num_blocks, cache_policy=policy, enable_events=True
        )

    def begin(self, req_id: str) -> None:
        return None

    def lookup_prefix(self, keys: list[OffloadKey]) -> int:
        hits: int = self.manager.lookup(keys)
        return hits

    def prepare_load(self, keys: list[OffloadKey]) -> None:
        self.manager.prepare_load(keys)

    def complete_load(self, keys: list[OffloadKey]) -> None:
        self.manager.complete_load(keys)

    def touch(self, keys: list[OffloadKey]) -> None:
        self.manager.touch(keys)

    def prepare_store(
        self, keys: list[OffloadKey]
    ) -> tuple[Sequence[OffloadKey], int] | None:
        output = self.manager.prepare_store(keys)
        if output is None:
            return None
        return output.block_hashes_to_store, len(output.block_hashes_evicted)

    def complete_store(self, keys: Sequence[OffloadKey]) -> None:
        self.manager.complete_store(keys)

    def take_events(self) -> int:
        return sum(1 for _ in self.manager.take_events())


DriverFactory = Callable[[int, str], ManagerDriver]


def load_vllm(path: str | Path) -> tuple[type[Any], str]:
    """vLLM's ``CPUOffloadingManager`` class from the tree under ``path``,
    and a label naming its version when the tree says it.

    The modules are loaded unchanged; ``vllm.v1.core.kv_cache_utils`` (for
    ``BlockHash``) is a shim. Raises :class:`VllmUnavailableError` when
    ``path`` has no ``vllm/v1/kv_offload/cpu/manager.py`` or another
    ``vllm`` is already imported.
    """
    root = Path(path)
    package_dir = root / "vllm"
    if not (package_dir / "v1" / "kv_offload" / "cpu" / "manager.py").is_file():
        raise VllmUnavailableError(
            f"{root} has no vllm/v1/kv_offload/cpu/manager.py; unpack it with e.g. "
            "`pip download --no-deps vllm==0.19.0 -d W && unzip W/vllm-*.whl "
            f"'vllm/v1/kv_offload/*' 'vllm-*.dist-info/METADATA' -d {root}`"
        )
    existing = sys.modules.get("vllm")
    if existing is not None and getattr(existing, "__path__", None) != [str(package_dir)]:
        raise VllmUnavailableError("another vllm package is already imported")
    shims: dict[str, list[str] | None] = {
        "vllm": [str(package_dir)],
        "vllm.v1": [str(package_dir / "v1")],
        "vllm.v1.core": [],
        "vllm.v1.core.kv_cache_utils": None,
    }
    for name, search_path in shims.items():
        if name in sys.modules:
            continue
        module = types.ModuleType(name)
        if search_path is not None:
            module.__path__ = search_path
        sys.modules[name] = module
    utils = sys.modules["vllm.v1.core.kv_cache_utils"]
    if not hasattr(utils, "BlockHash"):
        utils.BlockHash = NewType("BlockHash", bytes)  # type: ignore[attr-defined]
    try:
        manager_module = importlib.import_module("vllm.v1.kv_offload.cpu.manager")
    except ImportError as error:
        raise VllmUnavailableError(f"cannot import vLLM's manager from {root}: {error}") from None
    version = "vllm"
    for metadata in sorted(root.glob("vllm-*.dist-info/METADATA")):
        for line in metadata.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                version = f"vllm-{line.split(':', 1)[1].strip()}"
                break
    manager_cls: type[Any] = manager_module.CPUOffloadingManager
    return manager_cls, version


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

    @property
    def ops_per_second(self) -> float:
        return self.block_ops / self.seconds if self.seconds > 0 else float("inf")

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
    touch, take_events = driver.touch, driver.take_events
    prepare_store, complete_store = driver.prepare_store, driver.complete_store
    ops = refs = hit_blocks = evicted = events = 0
    gc.collect()
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
        events += take_events()
    seconds = time.perf_counter() - started
    return ThroughputResult(ops, refs, hit_blocks, evicted, events, seconds)


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
    parser.add_argument("--pinned", type=_int_list, default=[1_000, 10_000, 100_000],
                        metavar="LIST",
                        help="pinned-block counts for the eviction cost (default 1000,10000,100000)")
    parser.add_argument("--unpinned", type=_positive_int, default=1024,
                        help="evictable blocks beside the pinned ones (default 1024)")
    parser.add_argument("--repeats", type=_positive_int, default=101,
                        help="timed evictions per point; the median is reported (default 101)")
    parser.add_argument("--vllm-path", type=Path, default=None, metavar="DIR",
                        help="directory holding vllm/v1/kv_offload/ to run vLLM's manager side by side")
    parser.add_argument("--skip-eviction", action="store_true",
                        help="only the throughput replay")


@attrs.frozen
class Contender:
    """A manager implementation under test."""

    label: str
    make_driver: DriverFactory


def contenders(vllm_path: Path | None) -> list[Contender]:
    """kvoffload, and vLLM's manager when ``vllm_path`` is given."""
    result = [Contender("kvoffload", KvoffloadDriver)]
    if vllm_path is not None:
        manager_cls, label = load_vllm(vllm_path)

        def make_vllm(num_blocks: int, policy: str) -> ManagerDriver:
            return VllmDriver(manager_cls, num_blocks, policy)

        result.append(Contender(label, make_vllm))
    return result


def _fmt_rate(value: float) -> str:
    return f"{value / 1e6:.2f} M/s"


def _fmt_ns(value: float) -> str:
    return f"{value / 1000:.1f} us" if value >= 1000 else f"{value:.0f} ns"


def run(args: argparse.Namespace) -> int:
    try:
        runners = contenders(args.vllm_path)
        trace = generate_trace(args.workload, args.requests, args.seed)
        key_chains = trace.key_chains()
        print(
            f"workload {args.workload} (seed {args.seed}): {trace.num_requests} requests, "
            f"{trace.num_block_refs} block references, {trace.num_blocks} distinct blocks; "
            f"capacity {args.capacity} blocks; events on; python {sys.version.split()[0]}"
        )
        print(f"\nthroughput: block operations per second, best of {args.rounds} rounds")
        print(f"{'policy':<7}{'manager':<14}{'block-ops/s':>13}{'hit ratio':>11}"
              f"{'hit blocks':>12}{'evicted':>10}{'seconds':>9}")
        for policy in args.policy:
            best: dict[str, ThroughputResult] = {}
            for _ in range(args.rounds):
                for runner in runners:  # interleaved, so drift hits both alike
                    result = replay_throughput(
                        runner.make_driver(args.capacity, policy), key_chains, trace.req_ids
                    )
                    previous = best.get(runner.label)
                    if previous is None or result.seconds < previous.seconds:
                        best[runner.label] = result
            for runner in runners:
                r = best[runner.label]
                print(f"{policy:<7}{runner.label:<14}{_fmt_rate(r.ops_per_second):>13}"
                      f"{r.hit_ratio:>11.4f}{r.hit_blocks:>12}{r.blocks_evicted:>10}"
                      f"{r.seconds:>9.2f}")
            if len(runners) > 1:
                ours, theirs = best[runners[0].label], best[runners[1].label]
                same = (ours.hit_blocks, ours.blocks_evicted) == (
                    theirs.hit_blocks, theirs.blocks_evicted
                )
                print(f"{policy:<7}speedup {ours.ops_per_second / theirs.ops_per_second:.2f}x; "
                      f"hit ratios {'identical' if same else 'DIFFER'} "
                      f"({ours.hit_blocks} vs {theirs.hit_blocks} hit blocks)")
        if not args.skip_eviction:
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
    except (OffloadingError, ConfigurationError, OSError) as error:
        print(f"bench manager: error: {error}", file=sys.stderr)
        return 2
    return 0
