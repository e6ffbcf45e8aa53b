"""``python -m kvoffload bench <name>``: run one benchmark.

Each benchmark is a module with ``add_arguments(parser)`` and
``run(args) -> int``; one whose module is not present is not offered.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util

# (name, module, one-line help)
BENCHMARKS: tuple[tuple[str, str, str], ...] = (
    (
        "manager",
        "kvoffload.bench.manager",
        "block operations per second and eviction cost of the managers "
        "(optionally beside vLLM's)",
    ),
    (
        "transfer",
        "kvoffload.bench.transfer",
        "CPU<->GPU transfer throughput of the worker-side handlers",
    ),
    (
        "tier",
        "kvoffload.bench.tier",
        "store/load throughput of the file tier beside the disk's ceiling "
        "(optionally beside vLLM's fs tier)",
    ),
)


def _available(module_name: str) -> bool:
    try:
        return importlib.util.find_spec(module_name) is not None
    except ImportError:
        return False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for name, module_name, help_text in BENCHMARKS:
        if not _available(module_name):
            continue
        bench_parser = sub.add_parser(name, help=help_text, description=help_text)
        module = importlib.import_module(module_name)
        module.add_arguments(bench_parser)
        bench_parser.set_defaults(_bench_module=module)


def run(args: argparse.Namespace) -> int:
    status: int = args._bench_module.run(args)
    return status
