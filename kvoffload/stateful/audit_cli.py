"""``python -m kvoffload audit``: the main job.

With no ``--target`` it audits every built-in manager and policy (and the
reuse filter) and prints a table; with ``--target module:callable`` it audits
``callable(num_blocks)``. Exit status 1 on any violation, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import cast

from kvoffload.spec.contract import OffloadingManager
from kvoffload.spec.profile import DEFAULT, LEGACY, Profile, preset_names, profile_named
from kvoffload.stateful.auditing import AuditReport, audit
from kvoffload.stateful.harness import POLICIES, ReuseFilterParams, with_overrides
from kvoffload.stateful.legacy import LegacyManagerAdapter
from kvoffload.stateful.targets import BUILTIN_TARGETS, BuiltinTarget

Factory = Callable[[int], OffloadingManager]


class TargetError(Exception):
    """``--target`` does not name an importable callable."""


def resolve_target(spec: str, legacy: bool = False) -> Factory:
    """Import ``module:callable``; wrap its managers for the legacy API."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise TargetError(f"--target must look like module:callable, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise TargetError(f"cannot import {module_name!r}: {error}") from error
    factory: object = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise TargetError(f"{module_name!r} has no attribute {attr!r}")
    if not callable(factory):
        raise TargetError(f"{spec} is not callable")
    if legacy:
        inner = factory

        def wrapped(num_blocks: int) -> OffloadingManager:
            return LegacyManagerAdapter(inner(num_blocks))

        wrapped.__qualname__ = attr
        return wrapped
    return cast(Factory, factory)


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """The options ``audit`` and ``check`` share."""
    parser.add_argument(
        "--target",
        metavar="MODULE:CALLABLE",
        help="factory(num_blocks) -> manager to audit (default: every built-in)",
    )
    parser.add_argument(
        "--policy",
        choices=POLICIES,
        default="any",
        help="lru/arc: exact agreement with that policy; any: any legal victims",
    )
    parser.add_argument(
        "--reuse-threshold",
        type=int,
        metavar="K",
        help="the target is a reuse filter with this store_threshold",
    )
    parser.add_argument(
        "--tracker-size",
        type=int,
        default=64_000,
        help="the reuse filter's max_tracker_size (with --reuse-threshold)",
    )
    parser.add_argument(
        "--legacy",
        action="store_true",
        help="the target speaks the block-hash-list API (references 000-002)",
    )
    parser.add_argument(
        "--profile",
        metavar="NAME",
        default=None,
        help="the conventions the target keeps, a preset name: "
        + ", ".join(preset_names())
        + " (default: kvoffload; legacy with --legacy)",
    )
    parser.add_argument(
        "--no-typed-errors",
        dest="typed_errors",
        action="store_const",
        const=False,
        default=None,
        help="illegal calls may raise any exception (the profile's errors=any)",
    )
    parser.add_argument(
        "--no-reset",
        dest="reset",
        action="store_const",
        const=False,
        default=None,
        help="never call reset_cache (the profile's has_reset=False)",
    )


def profile_from_args(args: argparse.Namespace) -> Profile:
    """The profile ``--profile`` names (``TargetError`` for an unknown name),
    with ``--no-typed-errors``/``--no-reset`` applied."""
    name = args.profile
    if name is None:
        name = LEGACY.name if getattr(args, "legacy", False) else DEFAULT.name
    try:
        profile = profile_named(name)
    except KeyError as error:
        raise TargetError(str(error.args[0])) from None
    return with_overrides(profile, args.typed_errors, args.reset)


def targets_from_args(args: argparse.Namespace) -> list[tuple[BuiltinTarget, str | None]]:
    """The (target, import path) pairs the arguments name."""
    if args.target is None:
        return [(target, target.import_path) for target in BUILTIN_TARGETS]
    factory = resolve_target(args.target, args.legacy)
    reuse = None
    if args.reuse_threshold is not None:
        reuse = ReuseFilterParams(args.reuse_threshold, args.tracker_size)
    target = BuiltinTarget(args.target, factory, args.policy, reuse)
    return [(target, None if args.legacy else args.target)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument(
        "--examples", type=int, default=None, help="Hypothesis examples per target"
    )
    parser.add_argument(
        "--seed", type=int, default=None,
        help="replay the audit with this seed (default: a fresh seed, printed)",
    )
    parser.add_argument("--steps", type=int, default=None, help="calls per example")


def _row(report: AuditReport) -> str:
    verdict = "PASS" if report.passed else f"FAIL ({report.invariant})"
    return (
        f"{report.target:<36} {report.policy:<11} {verdict:<22} "
        f"{report.examples:>8} {report.steps:>8} {report.seconds:>7.1f} "
        f"{report.steps_per_second:>9.0f}"
    )


def run(args: argparse.Namespace) -> int:
    try:
        targets = targets_from_args(args)
        profile = profile_from_args(args)
    except TargetError as error:
        print(f"kvoffload audit: {error}", file=sys.stderr)
        return 2
    if args.examples is not None and args.examples < 1:
        print("kvoffload audit: --examples must be >= 1", file=sys.stderr)
        return 2
    reports: list[AuditReport] = []
    for target, import_path in targets:
        label = target.policy + ("+filter" if target.reuse_filter is not None else "")
        print(f"auditing {target.name} [{label}] ...", end=" ", flush=True)
        report = audit(
            target.factory,
            policy=target.policy,
            reuse_filter=target.reuse_filter,
            profile=profile,
            max_examples=args.examples,
            stateful_step_count=args.steps,
            seed=args.seed,
            name=target.name,
            factory_import=import_path,
        )
        print(
            "ok" if report.passed else "VIOLATION",
            f"({report.seconds:.1f} s, seed {report.seed})",
        )
        if report.coverage is not None:
            print(f"  {report.coverage.line()}")
        for warning in report.warnings:
            print(f"  WARNING: {warning}")
        reports.append(report)
    header = (
        f"{'target':<36} {'policy':<11} {'result':<22} "
        f"{'examples':>8} {'steps':>8} {'seconds':>7} {'steps/s':>9}"
    )
    print()
    print(header)
    print("-" * len(header))
    for report in reports:
        print(_row(report))
    failures = [r for r in reports if not r.passed]
    for report in failures:
        print()
        print(report.render())
    return 1 if failures else 0


def main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - thin
    parser = argparse.ArgumentParser(prog="kvoffload audit")
    add_arguments(parser)
    return run(parser.parse_args(argv))


__all__ = [
    "TargetError",
    "add_arguments",
    "add_target_arguments",
    "profile_from_args",
    "resolve_target",
    "run",
]
