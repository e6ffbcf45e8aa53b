"""``python -m kvoffload demo``: a short, printed walk through one manager."""

from __future__ import annotations

import argparse

from kvoffload.impl.manager import CPUOffloadingManager
from kvoffload.impl.reuse import FilterReusedOffloadingManager
from kvoffload.spec.contract import OffloadingManager, ReqContext
from kvoffload.spec.keys import OffloadKey, make_offload_key
from kvoffload.spec.policies import IMPLEMENTABLE_POLICY_NAMES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", choices=IMPLEMENTABLE_POLICY_NAMES, default="lru")
    parser.add_argument("--num-blocks", type=int, default=4)
    parser.add_argument(
        "--store-threshold",
        type=int,
        default=0,
        help="put a reuse filter with this threshold in front (0: none)",
    )


def _chain(prefix: str, count: int) -> list[OffloadKey]:
    return [make_offload_key(f"{prefix}{i}".encode(), 0) for i in range(count)]


def _name(key: OffloadKey) -> str:
    return key[:-4].decode()


def run(args: argparse.Namespace) -> int:
    core = CPUOffloadingManager(
        block_size=16, num_blocks=args.num_blocks, cache_policy=args.policy,
        enable_events=True,
    )
    manager: OffloadingManager = core
    if args.store_threshold:
        manager = FilterReusedOffloadingManager(core, store_threshold=args.store_threshold)
    ctx = ReqContext(req_id="demo")
    requests = [_chain("sys", 2) + _chain("a", 2), _chain("sys", 2) + _chain("b", 3),
                _chain("sys", 2) + _chain("a", 2)]
    for number, chain in enumerate(requests, 1):
        hits = manager.lookup_prefix(chain, ctx) or 0
        print(f"request {number}: {len(chain)} blocks, {hits} offloaded")
        if hits:
            spec = manager.prepare_load(chain[:hits], ctx)
            print(f"  load slots {spec!r}")
            manager.complete_load(chain[:hits], ctx)
        manager.touch(chain, ctx)
        output = manager.prepare_store(chain[hits:], ctx)
        if output is None:
            print("  store refused: no evictable block")
            continue
        print(f"  store {[_name(k) for k in output.keys_to_store]} at {output.store_spec!r}"
              f", evicted {[_name(k) for k in output.evicted_keys]}")
        manager.complete_store(output.keys_to_store, ctx)
        for event in manager.take_events():
            verb = "removed" if event.removed else "stored"
            print(f"  event: {verb} {[_name(k) for k in event.keys]}")
    return 0
