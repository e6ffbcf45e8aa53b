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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument("--depth", type=int, default=6, help="longest call sequence")
    parser.add_argument("--keys", type=int, default=3, help="size of the key set")
    parser.add_argument("--blocks", type=int, default=2, help="capacity in blocks")


def run(args: argparse.Namespace) -> int:
    if args.depth < 1 or args.keys < 1 or args.blocks < 1:
        print("kvoffload check: --depth, --keys and --blocks must be >= 1", file=sys.stderr)
        return 2
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
        )
        print(report.render(), flush=True)
        failed |= not report.passed
    return 1 if failed else 0
