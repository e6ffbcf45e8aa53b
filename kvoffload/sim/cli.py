"""``python -m kvoffload simulate``: replay a workload, report hit ratios.

Example::

    python -m kvoffload simulate --workload scan --capacity 512,1024,2048 \\
        --policy lru,arc,arc+reuse,opt --plot scan.png
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from kvoffload.sim.progress import ProgressBar
from kvoffload.sim.replay import DEFAULT_TRACKER_SIZE, PolicySpec, parse_policies, simulate
from kvoffload.sim.result import SimResult
from kvoffload.spec.errors import ConfigurationError, OffloadingError
from kvoffload.workloads import (
    WORKLOADS,
    Trace,
    compile_trace,
    generate_records,
    load_trace,
    write_trace,
)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _threshold(text: str) -> int:
    value = _positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError("reuse threshold must be >= 2 (1 filters nothing)")
    return value


def _capacities(text: str) -> list[str]:
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise argparse.ArgumentTypeError("no capacity given")
    for item in items:
        number = item[:-1] if item.endswith("%") else item
        try:
            value = float(number) if item.endswith("%") else int(number)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"capacity {item!r} is neither a block count nor a percentage"
            ) from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"capacity {item!r} must be positive")
    return items


def resolve_capacities(items: Sequence[str], trace: Trace) -> list[int]:
    """Block counts for capacity items: ``1024`` blocks, or ``10%`` of the
    trace's distinct blocks (at least 1). Sorted, without repeats."""
    capacities: set[int] = set()
    for item in items:
        if item.endswith("%"):
            capacities.add(max(1, round(trace.num_blocks * float(item[:-1]) / 100)))
        else:
            capacities.add(int(item))
    return sorted(capacities)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    names = ", ".join(WORKLOADS)
    parser.add_argument(
        "--workload",
        required=True,
        metavar="NAME|PATH",
        help=f"built-in workload ({names}) or a trace file (JSON Lines, see "
        "kvoffload.workloads)",
    )
    parser.add_argument(
        "--requests",
        type=_positive_int,
        default=None,
        help="requests to generate for a built-in workload (default: its own)",
    )
    parser.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    parser.add_argument(
        "--capacity",
        type=_capacities,
        default=None,
        metavar="LIST",
        help="comma-separated capacities: block counts, or percentages of the "
        "trace's distinct blocks (e.g. 512,1024 or 5%%,10%%)",
    )
    parser.add_argument(
        "--policy",
        default="lru,arc,opt",
        metavar="LIST",
        help="comma-separated policies: lru, arc, opt; a +reuse suffix "
        "(lru+reuse) puts one behind the reuse filter (default: lru,arc,opt)",
    )
    parser.add_argument(
        "--reuse-threshold",
        type=_threshold,
        default=None,
        metavar="K",
        help="reuse filter threshold: sets K for +reuse policies (default 2); "
        "when no policy says +reuse, puts every lru/arc behind the filter",
    )
    parser.add_argument(
        "--tracker-size",
        type=_positive_int,
        default=DEFAULT_TRACKER_SIZE,
        help=f"reuse filter table size (default {DEFAULT_TRACKER_SIZE})",
    )
    parser.add_argument(
        "--plot", type=Path, default=None, metavar="PNG",
        help="draw hit ratio against capacity per policy (needs matplotlib)",
    )
    parser.add_argument(
        "--format", choices=("table", "csv", "json"), default="table",
        help="output format (default table)",
    )
    parser.add_argument(
        "--export-trace", type=Path, default=None, metavar="PATH",
        help="write the workload as a trace file; without --capacity, only that",
    )
    parser.add_argument(
        "--tiers", default=None, metavar="LIST",
        help="replay through the tiered manager: the cpu tier first, then "
        "further tiers, name=blocks each (e.g. cpu=1024,fs=16384; further tiers "
        "are simulated in memory); reports hit ratios per tier beside OPT and "
        "replaces --capacity",
    )
    parser.add_argument(
        "--cascade", choices=("write-through", "write-back"), default="write-through",
        help="with --tiers: when stored blocks are cascaded (default write-through)",
    )
    parser.add_argument(
        "--max-promotions", type=_positive_int, default=None, metavar="N",
        help="with --tiers: bound on blocks being promoted at once "
        "(default: a quarter of the cpu tier)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _load(args: argparse.Namespace) -> tuple[Trace, str]:
    workload: str = args.workload
    if workload in WORKLOADS:
        records = list(generate_records(workload, args.requests, args.seed))
        if args.export_trace is not None:
            with args.export_trace.open("w", encoding="utf-8") as stream:
                write_trace(
                    records, stream, {"workload": workload, "seed": args.seed}
                )
        trace = compile_trace(records, name=workload)
        return trace, f"{workload} (seed {args.seed})"
    path = Path(workload)
    if not path.exists():
        raise ConfigurationError(
            f"--workload {workload!r} is neither a built-in workload "
            f"({', '.join(WORKLOADS)}) nor an existing file"
        )
    trace = load_trace(path)
    if args.export_trace is not None:
        raise ConfigurationError("--export-trace applies to built-in workloads only")
    return trace, str(path)


TABLE_COLUMNS = (
    "policy", "capacity", "hit ratio", "hit blocks", "stored", "evicted",
    "loaded", "refused", "seconds",
)


def format_table(results: Sequence[SimResult]) -> str:
    """Results as an aligned text table."""
    rows = [
        (
            r.policy, f"{r.capacity}", f"{r.hit_ratio:.4f}", f"{r.hit_blocks}",
            f"{r.blocks_stored}", f"{r.blocks_evicted}", f"{r.blocks_loaded}",
            f"{r.stores_refused}", f"{r.seconds:.2f}",
        )
        for r in results
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(TABLE_COLUMNS)]
    lines = ["  ".join(
        h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(TABLE_COLUMNS, widths))
    )]
    for row in rows:
        lines.append("  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))
        ))
    return "\n".join(lines)


def _emit(results: Sequence[SimResult], fmt: str, header: str, out: IO[str]) -> None:
    if fmt == "json":
        json.dump([r.as_dict() for r in results], out, indent=1)
        out.write("\n")
    elif fmt == "csv":
        out.write(
            "policy,capacity,hit_ratio,hit_blocks,block_refs,stored,evicted,loaded,refused,seconds\n"
        )
        for r in results:
            out.write(
                f"{r.policy},{r.capacity},{r.hit_ratio:.6f},{r.hit_blocks},{r.block_refs},"
                f"{r.blocks_stored},{r.blocks_evicted},{r.blocks_loaded},"
                f"{r.stores_refused},{r.seconds:.3f}\n"
            )
    else:
        out.write(header + "\n" + format_table(results) + "\n")


def run_simulations(
    trace: Trace,
    policies: Sequence[PolicySpec],
    capacities: Sequence[int],
    show_progress: bool | None = None,
) -> list[SimResult]:
    """Every (policy, capacity) pair, policies outermost."""
    key_chains = trace.key_chains()
    results: list[SimResult] = []
    for spec in policies:
        for capacity in capacities:
            bar = ProgressBar(
                trace.num_requests, f"{spec.label} @ {capacity}", enabled=show_progress
            )
            try:
                results.append(
                    simulate(trace, spec, capacity, bar.update, key_chains=key_chains)
                )
            finally:
                bar.close()
    return results


def _run_tiers(
    args: argparse.Namespace, policies: Sequence[PolicySpec], trace: Trace, source: str
) -> int:
    from kvoffload.sim.tiers import (
        format_tiered_table,
        opt_rows,
        parse_tiers,
        simulate_tiers,
        single_tier_row,
    )

    tiers = parse_tiers(args.tiers)
    if args.capacity is not None:
        raise ConfigurationError("--tiers sets the capacities; drop --capacity")
    names = [spec.name for spec in policies if spec.name != "opt"]
    if any(spec.reuse_threshold is not None for spec in policies):
        raise ConfigurationError("--tiers takes lru/arc without the reuse filter")
    key_chains = trace.key_chains()
    rows = []
    for name in names:
        bar = ProgressBar(trace.num_requests, f"{name} tiered", enabled=False if args.quiet else None)
        try:
            rows.append(simulate_tiers(
                trace, tiers, name, args.cascade, args.max_promotions, bar.update, key_chains
            ))
        finally:
            bar.close()
        rows.append(single_tier_row(trace, tiers, name, key_chains))
    rows.extend(opt_rows(trace, tiers))
    if args.format == "json":
        json.dump([row.as_dict() for row in rows], sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        header = (
            f"workload {source}: {trace.num_requests} requests, "
            f"{trace.num_block_refs} block references, {trace.num_blocks} distinct blocks; "
            f"tiers {args.tiers}"
        )
        print(header)
        print(format_tiered_table(tiers, rows))
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
            raise ConfigurationError(
                "--plot needs matplotlib: pip install 'kvoffload[plot]' (or matplotlib)"
            )
        policies = parse_policies(args.policy, args.reuse_threshold, args.tracker_size)
        trace, source = _load(args)
        if args.tiers is not None:
            return _run_tiers(args, policies, trace, source)
        if args.capacity is None:
            if args.export_trace is None:
                raise ConfigurationError("--capacity is required (or --export-trace alone)")
            print(f"wrote {trace.num_requests} requests to {args.export_trace}")
            return 0
        capacities = resolve_capacities(args.capacity, trace)
        header = (
            f"workload {source}: {trace.num_requests} requests, "
            f"{trace.num_block_refs} block references, {trace.num_blocks} distinct blocks"
        )
        results = run_simulations(
            trace, policies, capacities, show_progress=False if args.quiet else None
        )
        _emit(results, args.format, header, sys.stdout)
        if args.plot is not None:
            from kvoffload.sim.plot import plot_hit_ratios

            path = plot_hit_ratios(results, args.plot, title=source)
            print(f"plot written to {path}", file=sys.stderr)
    except (OffloadingError, OSError) as error:
        print(f"simulate: error: {error}", file=sys.stderr)
        return 2
    return 0
