"""``python -m kvoffload <command>``: the command line.

Each command lives in its own module, which provides
``add_arguments(parser)`` and ``run(args) -> int``; this file only routes.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from kvoffload.usage import OneLineParser, UsageError

# (command, module, one-line help). Command modules must not import torch at
# module level: `python -m kvoffload --help` works without it.
_COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("audit", "kvoffload.stateful.audit_cli", "audit managers against the specification (main job)"),
    ("check", "kvoffload.stateful.check_cli", "exhaustively check every call sequence up to a depth"),
    ("demo", "kvoffload.cli_demo", "walk the built-in managers through a short scenario"),
    ("simulate", "kvoffload.sim.cli", "replay a workload through the managers and OPT; hit ratios"),
    ("bench", "kvoffload.bench.cli", "benchmarks: manager (block-ops/s, eviction cost), transfer"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m kvoffload",
        description="KV-cache offloading: managers, specification, conformance kit.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name, help_text in _COMMANDS:
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        module = importlib.import_module(module_name)
        module.add_arguments(command_parser)
        command_parser.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; a usage error (bad argument, checked before any work)
    prints one line on stderr and returns 2 (argparse's own refusals exit 2
    the same way)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args._module.run(args)
    except UsageError as error:
        print(f"python -m kvoffload {args.command}: error: {error}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    sys.exit(main())
