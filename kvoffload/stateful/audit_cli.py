"""``python -m kvoffload audit``: the main job.

With no ``--target`` it audits every built-in manager and policy (and the
reuse filter) and the built-in secondary tiers, and prints a table; with
``--tier module:callable`` it audits the secondary tier
``callable(capacity_blocks, primary_kv_view)`` builds
(:func:`~kvoffload.stateful.tier_audit.audit_tier`); with ``--target module:callable`` it audits
``callable(num_blocks)``; with ``--vllm DIR`` it audits the vLLM release
under ``DIR`` (:mod:`kvoffload.stateful.vllm_targets`), one line per target.
While a target runs, its progress goes to stderr. Exit status 1 on any
violation, 2 on bad usage (argparse's style: a usage line and the reason).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
from collections.abc import Callable, Sequence
from typing import cast

from kvoffload.spec.contract import OffloadingManager
from kvoffload.spec.profile import DEFAULT, LEGACY, Profile, preset_names, profile_named
from kvoffload.stateful.auditing import DEFAULT_EXAMPLES, AuditReport, audit
from kvoffload.stateful.harness import POLICIES, ReuseFilterParams, with_overrides
from kvoffload.stateful.legacy import LegacyManagerAdapter, LegacyOffloadingManager
from kvoffload.stateful.progress import Progress
from kvoffload.stateful.reports import TargetResult, result_of, write_reports
from kvoffload.stateful.targets import (
    BUILTIN_TARGETS,
    BUILTIN_TIER_TARGETS,
    BuiltinTarget,
    TierFactory,
)
from kvoffload.stateful.tier_audit import audit_tier
from kvoffload.stateful.tier_harness import REQUIRED_METHODS
from kvoffload.usage import int_in

Factory = Callable[[int], OffloadingManager]


class TargetError(Exception):
    """``--target`` does not name an importable callable."""


def import_callable(spec: str, option: str) -> Callable[..., object]:
    """The callable ``module:attr[.attr...]`` names, imported;
    :class:`TargetError` (one line, for ``option``) when it cannot be."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise TargetError(f"{option} must look like module:callable, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # ImportError, SyntaxError, or the module's own error
        raise TargetError(
            f"cannot import {module_name!r}: {type(error).__name__}: {error}"
        ) from None
    found: object = module
    for part in attr.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise TargetError(f"{module_name!r} has no attribute {attr!r}")
    if not callable(found):
        raise TargetError(f"{spec} is not callable")
    return cast(Callable[..., object], found)


def resolve_target(spec: str, legacy: bool = False) -> Factory:
    """Import ``module:callable``; wrap its managers for the legacy API."""
    factory = import_callable(spec, "--target")
    attr = spec.partition(":")[2]
    check_factory(spec, cast(Callable[[int], object], factory), legacy)
    if legacy:
        inner = factory

        def wrapped(num_blocks: int) -> OffloadingManager:
            return LegacyManagerAdapter(cast(LegacyOffloadingManager, inner(num_blocks)))

        wrapped.__qualname__ = attr
        return wrapped
    return cast(Factory, factory)


CONTRACT_METHODS = ("lookup", "prepare_load", "prepare_store", "complete_store", "take_events")
"""Methods every manager has, whichever API it speaks."""


def check_factory(spec: str, factory: Callable[[int], object], legacy: bool = False) -> None:
    """Raise :class:`TargetError` unless ``factory(num_blocks)`` builds a
    manager: it must accept one argument, and ``factory(1)`` must return an
    object with the contract's methods (checked by name, whatever its
    class)."""
    try:
        inspect.signature(factory).bind(1)
    except TypeError:
        raise TargetError(
            f"{spec} is not a factory: it cannot be called as {spec}(num_blocks)"
        ) from None
    except ValueError:
        pass  # no signature to inspect (some builtins): the call below decides
    try:
        manager = factory(1)
    except Exception as error:
        raise TargetError(
            f"{spec}(1) raised {type(error).__name__}: {error}; "
            "it must return a manager with 1 block"
        ) from None
    missing = [name for name in CONTRACT_METHODS if not callable(getattr(manager, name, None))]
    if missing:
        raise TargetError(
            f"{spec}(1) returned {type(manager).__name__}, not an offloading manager "
            f"(no {', '.join(missing)})"
        )


MAX_STEPS = 10_000
"""Most --steps: a run keeps its calls for the replay, so memory grows with
them (about 900 MB at 10**8); 10,000 calls a run is already 100 times the
drawn length."""


def positive_int(text: str) -> int:
    """An ``int >= 1`` (argparse type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


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
        type=int_in(2),
        metavar="K",
        help="the target is a reuse filter with this store_threshold",
    )
    parser.add_argument(
        "--tracker-size",
        type=int_in(1),
        default=64_000,
        help="the reuse filter's max_tracker_size (with --reuse-threshold)",
    )
    parser.add_argument(
        "--legacy",
        action="store_true",
        help="the target speaks the block-hash-list API (vLLM 0.11-0.19)",
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


def target_profile(target: BuiltinTarget, args: argparse.Namespace, profile: Profile) -> Profile:
    """The profile ``target`` is audited under: its own when it has one (a
    built-in tiered row's: its answers are defined by it, whatever
    ``--profile`` says), with ``--no-typed-errors``/``--no-reset`` applied;
    else ``profile``."""
    if target.profile is None:
        return profile
    return with_overrides(target.profile, args.typed_errors, args.reset)


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
        "--vllm",
        metavar="DIR",
        help="audit the vLLM release that `import vllm` finds in DIR (installed, or "
        "extracted by scripts/fetch_vllm.py): its CPU manager with LRU and ARC, its "
        "reuse filter, each under the release's profile",
    )
    parser.add_argument(
        "--tier",
        metavar="MODULE:FACTORY",
        help="audit a secondary tier: FACTORY(capacity_blocks, primary_kv_view) returns one "
        "in vLLM 0.33's SecondaryTierManager shape (any object with its methods)",
    )
    parser.add_argument(
        "--examples", type=positive_int, default=None, help="runs per target (default 500; each a fresh manager and a random plan)"
    )
    parser.add_argument(
        "--seed", type=int, default=None,
        help="replay the audit with this seed (default: a fresh seed, printed)",
    )
    parser.add_argument(
        "--steps", type=int_in(1, MAX_STEPS), default=None,
        help=f"calls per run, 1-{MAX_STEPS} (default: drawn per run)",
    )
    parser.add_argument(
        "--junit-xml",
        metavar="FILE",
        help="also write a JUnit XML report to FILE: one testcase per target, a failure "
        "carrying the invariant, the message, the seed and the replay script",
    )
    parser.add_argument(
        "--json",
        metavar="FILE",
        help="also write the results to FILE as JSON ({passed, targets: [...]})",
    )
    parser.add_argument(
        "--fail-on",
        choices=FAIL_ON,
        default="any",
        help="what fails the run (exit 1): any violation (default); 'engine': only "
        "violations an engine's calls reach (a failure that goes away with illegal "
        "calls set aside does not count); 'new' (--vllm): only violations that match "
        "no documented finding of the release (docs/FINDINGS.md)",
    )
    parser.add_argument(
        "--no-illegal-calls",
        dest="illegal_calls",
        action="store_false",
        help="make no illegal calls (for a backend known to be damaged by them, which an "
        "engine never makes; by default they are made, and a failure they cause is "
        "followed by a second audit without them)",
    )


FAIL_ON = ("any", "engine", "new")
"""The choices of ``--fail-on``."""


def fails_run(report: AuditReport, fail_on: str, known_finding: bool = False) -> bool:
    """Whether ``report`` fails the run under ``--fail-on``: ``any``
    violation; for ``engine`` only a violation that stays with illegal calls
    set aside (an engine never makes them); for ``new`` only one that is not
    a documented finding (``known_finding``), judged as ``engine`` when the
    documented finding needed illegal calls."""
    if report.passed:
        return False
    if fail_on == "any":
        return True
    if fail_on == "new" and known_finding:
        return False
    follow_up = report.without_illegal_calls
    if report.illegal_call_damage and follow_up is not None:
        return fails_run(follow_up, fail_on)
    return True


def _row(report: AuditReport) -> str:
    verdict = "PASS" if report.passed else f"FAIL ({report.invariant})"
    if report.without_illegal_calls is not None:
        verdict += ", then " + ("PASS" if report.without_illegal_calls.passed else "FAIL")
    return (
        f"{report.target:<36} {report.policy:<11} {verdict:<22} "
        f"{report.examples:>8} {report.steps:>8} {report.seconds:>7.1f} "
        f"{report.steps_per_second:>9.0f}"
    )


def resolve_tier(spec: str) -> TierFactory:
    """Import ``module:callable`` for ``--tier``: it must be callable as
    ``factory(capacity_blocks, primary_kv_view)`` and return an object with
    a tier's methods (checked by name on one tier built with capacity 1;
    :class:`TargetError` otherwise)."""
    factory = import_callable(spec, "--tier")
    try:
        inspect.signature(factory).bind(1, memoryview(b""))
    except TypeError:
        raise TargetError(
            f"{spec} is not a tier factory: it cannot be called as "
            f"{spec}(capacity_blocks, primary_kv_view)"
        ) from None
    except ValueError:
        pass  # no signature to inspect: the call below decides
    view = memoryview(bytearray(64)).cast("B", (1, 64))
    try:
        tier = cast(TierFactory, factory)(1, view)
    except Exception as error:
        raise TargetError(
            f"{spec}(1, primary_kv_view) raised {type(error).__name__}: {error}; "
            "it must return a secondary tier"
        ) from None
    missing = [name for name in REQUIRED_METHODS if not callable(getattr(tier, name, None))]
    shutdown = getattr(tier, "shutdown", None)
    if callable(shutdown):
        shutdown()
    if missing:
        raise TargetError(
            f"{spec}(1, primary_kv_view) returned {type(tier).__name__}, not a secondary "
            f"tier (no {', '.join(missing)})"
        )
    return cast(TierFactory, factory)


def _audit_tiers(
    targets: Sequence[tuple[str, TierFactory, str | None]], args: argparse.Namespace,
    profile: Profile,
) -> list[AuditReport]:
    reports = []
    for name, factory, import_path in targets:
        print(f"auditing tier {name} ...", end=" ", flush=True)
        report = audit_tier(
            factory,
            profile=profile,
            seed=args.seed,
            max_examples=args.examples,
            stateful_step_count=args.steps,
            name=name,
            factory_import=import_path,
        )
        print(
            "ok" if report.passed else "VIOLATION",
            f"({report.seconds:.1f} s, seed {report.seed})",
        )
        reports.append(report)
    return reports


def run_tier(args: argparse.Namespace) -> int:
    """``audit --tier MODULE:FACTORY``: one tier, its verdict, its replay."""
    try:
        factory = resolve_tier(args.tier)
        profile = profile_from_args(args)
    except TargetError as error:
        print(f"kvoffload audit: error: {error}", file=sys.stderr)
        return 2
    (report,) = _audit_tiers([(args.tier, factory, args.tier)], args, profile)
    print(report.render())
    write_reports([result_of(report, "kvoffload tiers")], junit=args.junit_xml,
                  json_path=args.json)
    return 0 if report.passed else 1


def run(args: argparse.Namespace) -> int:
    if getattr(args, "tier", None) is not None:
        if args.target is not None or getattr(args, "vllm", None) is not None:
            print("kvoffload audit: --tier excludes --target and --vllm", file=sys.stderr)
            return 2
        return run_tier(args)
    if getattr(args, "vllm", None) is not None:
        if args.target is not None:
            print("kvoffload audit: --vllm and --target exclude each other", file=sys.stderr)
            return 2
        from kvoffload.stateful.vllm_targets import run_release_audit

        return run_release_audit(args)
    try:
        targets = targets_from_args(args)
        profile = profile_from_args(args)
    except TargetError as error:
        print(f"kvoffload audit: error: {error}", file=sys.stderr)
        return 2
    reports: list[AuditReport] = []
    results: list[TargetResult] = []
    for target, import_path in targets:
        examples = args.examples if args.examples is not None else target.examples
        budget = examples if examples is not None else DEFAULT_EXAMPLES
        label = target.policy + ("+filter" if target.reuse_filter is not None else "")
        print(f"auditing {target.name} [{label}] ...", end=" ", flush=True)
        progress = Progress(f"{target.name} [{label}]", budget)
        report = audit(
            progress.wrap(target.factory),
            policy=target.policy,
            reuse_filter=target.reuse_filter,
            profile=target_profile(target, args, profile),
            max_examples=budget,
            stateful_step_count=args.steps,
            seed=args.seed,
            name=target.name,
            factory_import=import_path,
            illegal_calls=args.illegal_calls,
        )
        progress.done("ok" if report.passed else "VIOLATION")
        print(
            "ok" if report.passed else "VIOLATION",
            f"({report.seconds:.1f} s, seed {report.seed})",
        )
        if report.coverage is not None:
            print(f"  {report.coverage.line()}")
        for warning in report.warnings:
            print(f"  WARNING: {warning}")
        reports.append(report)
        results.append(result_of(report, "kvoffload", failed=fails_run(report, args.fail_on)))
    if args.target is None:
        tiers = [(t.name, t.factory, t.import_path) for t in BUILTIN_TIER_TARGETS]
        for report in _audit_tiers(tiers, args, profile):
            reports.append(report)
            results.append(result_of(report, "kvoffload tiers"))
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
    write_reports(results, junit=args.junit_xml, json_path=args.json)
    return 1 if any(r.failed for r in results) else 0


def main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - thin
    parser = argparse.ArgumentParser(prog="kvoffload audit")
    add_arguments(parser)
    return run(parser.parse_args(argv))


__all__ = [
    "FAIL_ON",
    "Progress",
    "TargetError",
    "add_arguments",
    "add_target_arguments",
    "check_factory",
    "fails_run",
    "positive_int",
    "profile_from_args",
    "resolve_target",
    "resolve_tier",
    "run",
    "run_tier",
]
