"""``python -m kvoffload check``: the bounded exhaustive checker."""

from __future__ import annotations

import argparse
import sys

from kvoffload.stateful.audit_cli import (
    TargetError,
    add_target_arguments,
    profile_from_args,
    targets_from_args,
)
from kvoffload.stateful.check import check_exhaustively
from kvoffload.usage import int_in

DESCRIPTION = """\
Exhaustively check every call sequence up to --depth calls over --keys keys
and a manager of --blocks slots, breadth-first, extending only sequences that
reach a model state no shorter one reached. The calls enumerated at every
depth: lookup of each key, lookup_prefix of all keys, touch of each key and
of all keys, prepare_store of every non-empty subset of the keys,
complete_store (success and failure), prepare_load and complete_load of each
key, take_events, on_schedule_end and reset_cache. What it cannot see: any
defect that needs more keys, slots or calls than the bounds give. A recency
slip (a wrong victim after a touch or a reuse) shows only when the policy
orders more keys than fit in the slots, so with 2 blocks it needs at least 3
keys and often 4-5, and enough depth to store, touch and evict them: the
random audit (`python -m kvoffload audit`) reaches much further. Each level
multiplies the work by roughly the number of new states (about 3 per level
at the defaults), so --depth is capped at {max_depth} and progress is printed
per level on stderr."""

MAX_DEPTH = 8
"""Deepest --depth: each level costs about 3-4 times the one before (at
the defaults, depth 7 took 129 s for one target on a loaded 2-core VM)."""
MAX_KEYS = 6
"""Most --keys: prepare_store takes every subset (2**keys - 1 calls per level)."""
MAX_BLOCKS = 8
"""Most --blocks."""


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written; every option's default shown."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION.format(max_depth=MAX_DEPTH)
    parser.formatter_class = _Formatter
    add_target_arguments(parser)
    parser.add_argument(
        "--depth", type=int_in(1, MAX_DEPTH), default=6,
        help=f"longest call sequence, 1-{MAX_DEPTH}",
    )
    parser.add_argument(
        "--keys", type=int_in(1, MAX_KEYS), default=3,
        help=f"size of the key set, 1-{MAX_KEYS}",
    )
    parser.add_argument(
        "--blocks", type=int_in(1, MAX_BLOCKS), default=2,
        help=f"capacity in blocks, 1-{MAX_BLOCKS}",
    )


class _Progress:
    """One line per completed level on stderr, with an estimate of the next
    level's time (this level's, scaled by the growth of the frontier)."""

    def __init__(self) -> None:
        self.last_seconds = 0.0
        self.last_frontier = 1

    def __call__(
        self, level: int, sequences: int, states: int, frontier: int, seconds: float
    ) -> None:
        took = seconds - self.last_seconds
        estimate = took * frontier / max(self.last_frontier, 1) * (level + 1) / level
        self.last_seconds, self.last_frontier = seconds, frontier
        print(
            f"  depth {level}: {sequences} sequences run, {states} states, "
            f"{frontier} to extend, {seconds:.1f} s"
            + (f"; next level ~{estimate:.0f} s" if frontier else ""),
            file=sys.stderr, flush=True,
        )


def run(args: argparse.Namespace) -> int:
    try:
        targets = targets_from_args(args)
        profile = profile_from_args(args)
    except TargetError as error:
        print(f"kvoffload check: {error}", file=sys.stderr)
        return 2
    failed = False
    for target, import_path in targets:
        report = check_exhaustively(
            target.factory,
            policy=target.policy,
            depth=args.depth,
            num_keys=args.keys,
            num_blocks=args.blocks,
            reuse_filter=target.reuse_filter,
            profile=profile,
            name=target.name,
            factory_import=import_path,
            progress=_Progress(),
        )
        print(report.render(), flush=True)
        failed |= not report.passed
    return 1 if failed else 0
