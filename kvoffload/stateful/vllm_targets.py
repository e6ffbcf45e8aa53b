"""vLLM's own managers as kit targets, one generation of the contract each.

:func:`release_targets` turns a loaded release
(:func:`kvoffload.vllm_release.load_release`) into the targets
``python -m kvoffload audit --vllm DIR`` runs: the release's CPU manager with
LRU and with ARC, and its reuse filter at threshold 2 with a count table of 2
and with the release's default table, each under the release's profile
(:mod:`kvoffload.spec.releases`).

:class:`ReleaseManager` presents a release's manager through kvoffload's
contract. It adapts *shapes* only: how calls are spelled (block-hash lists
in 0.19, calls without a request context in 0.20, ``ScheduleEndContext``),
one vLLM ``ReqContext`` per request (it is a mutable per-request record from
0.27 on), and ``lookup_prefix`` as the engine's own loop (``lookup`` key by
key up to the first key that is not a hit; vLLM's managers have no
``lookup_prefix`` after 0.19). Answers, store outputs and events are the
release's own objects, passed through: the kit reads them by their
attributes. Every difference of *behaviour* is an option of the release's
profile, never a special case here.
"""

from __future__ import annotations

import argparse
import copy
import inspect
import re
import sys
from collections.abc import Callable, Collection, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import attrs

from kvoffload.spec.contract import (
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    count_hits,
)
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.profile import Profile, profile_named
from kvoffload.spec.releases import preset_for_generation
from kvoffload.stateful.auditing import DEFAULT_EXAMPLES, DEFAULT_STEPS, AuditReport, audit
from kvoffload.stateful.harness import ReuseFilterParams, with_overrides
from kvoffload.stateful.legacy import LegacyManagerAdapter
from kvoffload.stateful.progress import Progress
from kvoffload.stateful.reports import TargetResult, result_of, write_reports
from kvoffload.vllm_release import VllmRelease, load_release

ManagerFactory = Callable[[int], OffloadingManager]

SMALL_TRACKER = 2
"""The count table of the small-table filter target: the filter's LRU bound
is reached within a few calls."""


class ReleaseManager(OffloadingManager):
    """kvoffload's :class:`OffloadingManager` over a release's manager (0.20
    on; 0.19's block-hash lists go through :class:`LegacyManagerAdapter`).

    ``inner`` is the release's manager object. Each kvoffload request
    context (by ``req_id``) gets one vLLM ``ReqContext`` for its lifetime.
    """

    def __init__(self, release: VllmRelease, inner: Any) -> None:
        self.release = release
        self.inner = inner
        self._contexts: dict[str, Any] = {}
        self._new_requests: list[str] = []
        features = release.features
        self._touch_context = features.touch_context
        self._complete_context = features.complete_context
        self._reset_unflushed = False

    def __deepcopy__(self, memo: dict[int, Any]) -> ReleaseManager:
        """A copy for the kit's probes: the manager and its per-request
        state copied, the release (its loaded modules, which ``deepcopy``
        refuses) shared."""
        from kvoffload.stateful.vllm_tiers import shared_on_copy

        clone = copy.copy(self)
        memo[id(self)] = clone
        memo.update(shared_on_copy(self.inner))
        for name, value in vars(self).items():
            if name != "release":
                setattr(clone, name, copy.deepcopy(value, memo))
        return clone

    @property
    def lock(self) -> AbstractContextManager[object]:
        """The release's manager's ``lock`` (0.33 on), else a no-op."""
        lock = getattr(self.inner, "lock", None)
        return lock if lock is not None else nullcontext()

    def context_for(self, req_context: ReqContext) -> Any:
        """The release's ``ReqContext`` standing for ``req_context``."""
        context = self._contexts.get(req_context.req_id)
        if context is None:
            context = self.release.new_context(req_context.req_id)
            self._contexts[req_context.req_id] = context
        return context

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> Any:
        """The release's own answer, as it gives it: a bool, or its
        ``LookupResult`` (the kit compares results by name, so ``HIT_PENDING``
        is checked)."""
        return self.inner.lookup(key, self.context_for(req_context))

    def lookup_prefix(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> int | None:
        """The engine's loop over ``lookup`` (vLLM's managers have no
        ``lookup_prefix`` after 0.19): count hits up to the first miss;
        ``None`` ("ask again") when a key answers ``HIT_PENDING``/``RETRY``."""
        return count_hits(self.release.lookup_answer(self.lookup(k, req_context)) for k in keys)

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> LoadStoreSpec:
        spec: LoadStoreSpec = self.inner.prepare_load(list(keys), self.context_for(req_context))
        return spec

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        if self._touch_context:
            self.inner.touch(list(keys), self.context_for(req_context))
        else:
            self.inner.touch(list(keys))

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> None:
        if self._complete_context:
            self.inner.complete_load(list(keys), self.context_for(req_context))
        else:
            self.inner.complete_load(list(keys))

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        # the release's own PrepareStoreOutput (or None): the kit reads it by
        # its attributes
        output: PrepareStoreOutput | None = self.inner.prepare_store(
            list(keys), self.context_for(req_context)
        )
        return output

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        success: bool = True,
    ) -> None:
        if self._complete_context:
            self.inner.complete_store(list(keys), self.context_for(req_context), success)
        else:
            self.inner.complete_store(list(keys), success)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        hook = getattr(self.inner, "on_new_request", None)
        if callable(hook):
            hook(self.context_for(req_context))
        self._new_requests.append(req_context.req_id)
        return RequestOffloadingContext(req_id=req_context.req_id)

    def on_request_finished(self, req_context: ReqContext) -> None:
        hook = getattr(self.inner, "on_request_finished", None)
        if callable(hook):
            hook(self.context_for(req_context))
        # the request is over: a later call under the same req_id is a new
        # request with a new vLLM ReqContext (vLLM asserts on keys seen
        # after a request's finalization, 0.31 on)
        self._contexts.pop(req_context.req_id, None)

    def on_schedule_end(self) -> None:
        hook = getattr(self.inner, "on_schedule_end", None)
        if not callable(hook):
            return
        if self.release.schedule_end_context is not None:
            hook(self.release.schedule_end_context(tuple(self._new_requests), ()))
        else:
            hook()
        self._new_requests.clear()
        if self._reset_unflushed:
            # the workers report the jobs in flight at a reset with this
            # step's output: vLLM's scheduler then calls on_reset_flushed
            self._reset_unflushed = False
            flushed = getattr(self.inner, "on_reset_flushed", None)
            if callable(flushed):
                flushed()

    def take_events(self) -> Iterable[OffloadingEvent]:
        # the release's own events, private ones included: the kit reads them
        # by their attributes and drops metadata_only events when the
        # profile says they are private
        events: Iterable[OffloadingEvent] = self.inner.take_events()
        return events

    def reset_cache(self) -> None:
        reset = getattr(self.inner, "reset_cache", None)
        if callable(reset):
            reset()
            self._reset_unflushed = True

    def shutdown(self) -> None:
        shutdown = getattr(self.inner, "shutdown", None)
        if callable(shutdown):
            shutdown()


@attrs.frozen
class ReleaseTarget:
    """One audit of a release: its name in the output (``lru``, ``arc``,
    ``filter ...``), the factory, the policy model, the filter parameters."""

    name: str
    factory: ManagerFactory
    policy: str
    reuse_filter: ReuseFilterParams | None = None
    #: the replay script's lines building the factory (None: ``make_factory``)
    header: str | None = None


def release_factory(
    release: VllmRelease, policy: str, reuse_filter: ReuseFilterParams | None = None
) -> ManagerFactory:
    """``factory(capacity)`` building the release's manager as the kit
    drives it."""

    def factory(num_blocks: int) -> OffloadingManager:
        inner = release.new_manager(
            num_blocks,
            policy,
            enable_events=True,
            store_threshold=None if reuse_filter is None else reuse_filter.store_threshold,
            max_tracker_size=None if reuse_filter is None else reuse_filter.max_tracker_size,
        )
        if release.features.block_hash_api:
            return LegacyManagerAdapter(inner)
        return ReleaseManager(release, inner)

    suffix = "" if reuse_filter is None else f"_filter{reuse_filter.max_tracker_size}"
    factory.__qualname__ = factory.__name__ = f"vllm_{release.version}_{policy}{suffix}"
    return factory


def default_tracker_size(release: VllmRelease) -> int:
    """The release's default ``max_tracker_size`` (read from its filter's
    constructor)."""
    owner = release.filter_cls if release.filter_cls is not None else release.manager_cls
    parameter = inspect.signature(owner.__init__).parameters.get("max_tracker_size")
    if parameter is None or not isinstance(parameter.default, int):
        return 64_000
    return parameter.default


def release_targets(release: VllmRelease) -> list[ReleaseTarget]:
    """The four audits of a release (module docstring)."""
    small = ReuseFilterParams(store_threshold=2, max_tracker_size=SMALL_TRACKER)
    default = ReuseFilterParams(store_threshold=2, max_tracker_size=default_tracker_size(release))
    return [
        ReleaseTarget("lru", release_factory(release, "lru"), "lru"),
        ReleaseTarget("arc", release_factory(release, "arc"), "arc"),
        ReleaseTarget(
            f"filter lru threshold=2 tracker={small.max_tracker_size}",
            release_factory(release, "lru", small),
            "lru",
            small,
        ),
        ReleaseTarget(
            f"filter lru threshold=2 tracker={default.max_tracker_size}",
            release_factory(release, "lru", default),
            "lru",
            default,
        ),
    ]


def make_factory(
    directory: str,
    policy: str,
    store_threshold: int | None = None,
    max_tracker_size: int | None = None,
) -> ManagerFactory:
    """The factory of one target of the release under ``directory``: what a
    replay script imports to build the audited manager again."""
    release = load_release(directory)
    reuse = None
    if store_threshold is not None:
        reuse = ReuseFilterParams(
            store_threshold,
            max_tracker_size if max_tracker_size is not None else default_tracker_size(release),
        )
    return release_factory(release, policy, reuse)


def tiered_factory(release: VllmRelease) -> ManagerFactory:
    """``factory(capacity)``: vLLM's ``TieringOffloadingManager`` over its
    CPU primary tier and the example tier
    (:func:`kvoffload.stateful.vllm_tiers.new_tiered_manager`), presented
    through :class:`ReleaseManager`."""
    from kvoffload.stateful.vllm_tiers import new_tiered_manager

    def factory(num_blocks: int) -> OffloadingManager:
        return ReleaseManager(release, new_tiered_manager(release, num_blocks))

    factory.__qualname__ = factory.__name__ = f"vllm_{release.version}_tiered"
    return factory


def make_tiered_factory(directory: str) -> ManagerFactory:
    """The ``tiered`` target's factory for the release under ``directory``:
    what its replay script imports."""
    return tiered_factory(load_release(directory))


TIERED_PROFILE = "vllm-0.33-tiered"
"""The ``tiered`` row's own profile (it wins over ``--profile``: the row's
answers are defined by its options)."""


def release_tiered_target(release: VllmRelease) -> ReleaseTarget | None:
    """The ``tiered`` target of a release with tiering (0.33 on), else None."""
    from kvoffload.stateful.vllm_tiers import has_tiering

    if not has_tiering(release):
        return None
    header = (
        "from kvoffload.stateful.vllm_targets import make_tiered_factory\n"
        f"factory = make_tiered_factory({str(release.root)!r})  # {release.describe()}"
    )
    return ReleaseTarget("tiered", tiered_factory(release), "lru", header=header)


def _replay_header(release: VllmRelease, target: ReleaseTarget) -> str:
    if target.header is not None:
        return target.header
    args = [repr(str(release.root)), repr(target.policy)]
    if target.reuse_filter is not None:
        args += [str(target.reuse_filter.store_threshold), str(target.reuse_filter.max_tracker_size)]
    return (
        "from kvoffload.stateful.vllm_targets import make_factory\n"
        f"factory = make_factory({', '.join(args)})  # {release.describe()}"
    )


def _verdict(report: AuditReport) -> str:
    return "PASS" if report.passed else f"FAIL ({report.invariant})"


@attrs.frozen
class KnownFinding:
    """A finding of docs/FINDINGS.md as an audit line reports it: the
    invariant it reads, the targets it shows on, the releases it is in."""

    id: str
    kind: str
    summary: str
    invariants: tuple[str, ...]
    targets: str  # a regular expression over the target names
    releases: tuple[tuple[int, int], tuple[int, int]]
    illegal_calls: bool = False  # reached only through illegal calls


KNOWN_FINDINGS = (
    KnownFinding(
        "F3", "defect", "an illegal load changes the manager before it asserts; only "
        "illegal calls reach it, and an engine never makes them",
        ("errors",), ".*", ((0, 19), (0, 33)), illegal_calls=True,
    ),
    KnownFinding(
        "F1", "defect", "ARC refuses a store that had room",
        ("5 liveness",), "arc$", ((0, 19), (0, 29)),
    ),
    KnownFinding(
        "F2", "defect", "the reuse filter evicts a key its own offer named",
        ("2/3/5 eviction", "1/4 protection"), "filter ", ((0, 19), (0, 30)),
    ),
    KnownFinding(
        "F6", "defect at the engine's level", "the filter counts lookups only to the "
        "first miss, so a repeated prompt is offloaded one block per two requests",
        ("protocol: repeated prompt",), "filter ", ((0, 20), (0, 28)),
    ),
    KnownFinding(
        "F8", "defect", "the example tier reports a promotion successful without "
        "writing its bytes into the primary slots",
        ("T1 tier readable",), "^tier example$", ((0, 33), (0, 33)),
    ),
    KnownFinding(
        "F10", "defect", "reset_cache completes a promotion in flight and announces it "
        "stored, then drops it with the primary: a consumer is told of a chunk that is gone",
        ("6 events",), "^tiered$", ((0, 33), (0, 33)),
    ),
)
"""The defects of docs/FINDINGS.md an audit of a release reports (the
conventions, F4, F5 and F7, are named by the release's preset and pass)."""


def _minor(version: str) -> tuple[int, int]:
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def known_finding(version: str, target: str, report: AuditReport) -> KnownFinding | None:
    """The documented finding ``report``'s failure matches (its invariant,
    its target, its release), or None."""
    if report.passed or report.invariant is None:
        return None
    release = _minor(version)
    for finding in KNOWN_FINDINGS:
        low, high = finding.releases
        if (
            report.invariant.label in finding.invariants
            and re.search(finding.targets, target)
            and low <= release <= high
            and finding.illegal_calls == report.illegal_call_damage
        ):
            return finding
    return None


CONVENTIONS = {
    "offers_repeat_keys": "F4",
    "reset_announce": "F5",
    "filter_reset_clears": "F5",
    "lru_rank": "F7",
}
"""The profile options naming the conventions of docs/FINDINGS.md."""


def differing_options(profile: Profile, preset: Profile) -> list[str]:
    """The options where ``profile`` departs from the release's ``preset``,
    each with the convention finding it names, if any."""
    differing = []
    for field in attrs.fields(Profile):
        if field.name != "name" and getattr(profile, field.name) != getattr(preset, field.name):
            finding = CONVENTIONS.get(field.name)
            differing.append(field.name + (f" ({finding})" if finding else ""))
    return differing


def finding_tag(
    version: str, target: str, report: AuditReport, conventions: Sequence[str] = ()
) -> str:
    """What a failing line says about its finding: the documented one it
    matches and whether it is a defect or a convention, or that none
    matches (``conventions``: the options where the audit's profile departs
    from the release's preset, the likely cause then)."""
    finding = known_finding(version, target, report)
    if finding is not None:
        return f" [{finding.id}, {finding.kind}: {finding.summary}]"
    if conventions:
        return (
            " [matches no documented defect; likely a convention: the profile departs "
            f"from the release's preset in {', '.join(conventions)}]"
        )
    return " [matches no documented finding: a new defect]"


def _counts(report: AuditReport) -> str:
    return f"{report.examples} examples, {report.steps} steps, {report.seconds:.1f} s"


def release_line(
    version: str, target: str, report: AuditReport, conventions: Sequence[str] = ()
) -> str:
    """One target's line: the verdict, the finding it matches (F1...F7,
    defect or convention), and for a failure caused by an illegal call what
    the audit without illegal calls found, with that audit's own counts."""
    if report.passed:
        return f"PASS {target} ({_counts(report)})"
    text = f"FAIL {target}: invariant {report.invariant}"
    if report.illegal_call_damage:
        text += " (an illegal call changed the manager)"
    text += f"{finding_tag(version, target, report, conventions)} ({_counts(report)})"
    follow_up = report.without_illegal_calls
    if follow_up is not None:
        if follow_up.passed:
            text += f"; without illegal calls: PASS ({_counts(follow_up)})"
        else:
            text += (
                f"; without illegal calls: FAIL: invariant {follow_up.invariant}"
                f"{finding_tag(version, target, follow_up, conventions)} ({_counts(follow_up)})"
            )
    return text


def run_release_audit(args: argparse.Namespace) -> int:
    """``python -m kvoffload audit --vllm DIR``: load the release, audit its
    targets under its profile, one line per target; 1 on any violation, 2
    when DIR holds no loadable release."""
    from kvoffload.stateful.audit_cli import fails_run

    try:
        release = load_release(args.vllm)
    except Exception as error:  # a broken release: not a finding, a usage error
        print(f"kvoffload audit: error: cannot load the vLLM release in {args.vllm!r}: "
              f"{type(error).__name__}: {error}", file=sys.stderr)
        return 2
    generation = release.generation
    preset = profile = preset_for_generation(generation.value)
    if args.profile is not None:
        try:
            profile = profile_named(args.profile)
        except KeyError as error:
            print(f"kvoffload audit: error: {error.args[0]}", file=sys.stderr)
            return 2
    profile = with_overrides(profile, args.typed_errors, args.reset)
    conventions = differing_options(profile, preset)
    stand_ins = ", ".join(release.stubbed) or "none"
    print(f"{release.describe()}")
    print(f"profile {profile.describe()}")
    print(f"stand-ins for vLLM modules outside kv_offload: {stand_ins}")
    budget = args.examples if args.examples is not None else DEFAULT_EXAMPLES
    steps = args.steps if args.steps is not None else DEFAULT_STEPS
    print(f"budget: {budget} examples x {steps} calls per target, seed {args.seed}")
    try:
        targets = list(release_targets(release))
        for target in targets:  # a manager that cannot be built is not a finding
            target.factory(1)
    except Exception as error:
        print(f"kvoffload audit: error: the release's managers cannot be built: "
              f"{type(error).__name__}: {error}", file=sys.stderr)
        return 2
    reports: list[tuple[ReleaseTarget, AuditReport]] = []
    results: list[TargetResult] = []
    fail_on = getattr(args, "fail_on", "any")
    for target in targets:
        report, result = _audit_target(
            release, target, profile, conventions, args, f"vllm {release.version}"
        )
        reports.append((target, report))
        results.append(result)
    failures = [(t, r) for t, r in reports if not r.passed]
    for target, report in failures:
        print()
        print(_with_header(report.render(), release, target))
    tier_reports = _audit_release_tiers(release, profile, args)
    for name, report in tier_reports:
        finding = known_finding(release.version, f"tier {name}", report)
        results.append(
            result_of(
                report,
                f"vllm {release.version} tiers",
                failed=fails_run(report, fail_on, known_finding=finding is not None),
                finding=None if finding is None else finding.id,
                kind=None if finding is None else finding.kind,
            )
        )
        if not report.passed:
            print()
            print(report.render().replace(
                "from your_module import factory  # the audited factory",
                "from kvoffload.stateful.vllm_tiers import make_tier_factory\n"
                f"factory = make_tier_factory({str(release.root)!r}, {name!r})"
                f"  # {release.describe()}",
            ))
    tiered = release_tiered_target(release)
    if tiered is not None:
        tiered_preset = profile_named(TIERED_PROFILE)
        tiered_profile = with_overrides(tiered_preset, args.typed_errors, args.reset)
        print(f"tiered: vLLM's TieringOffloadingManager over its CPU tier and the example "
              f"tier, under its own profile {tiered_profile.name}")
        report, result = _audit_target(
            release, tiered, tiered_profile, differing_options(tiered_profile, tiered_preset),
            args, f"vllm {release.version} tiered",
        )
        results.append(result)
        if not report.passed:
            print()
            print(_with_header(report.render(), release, tiered))
    write_reports(results, junit=getattr(args, "junit_xml", None),
                  json_path=getattr(args, "json", None))
    if fail_on != "any":
        tolerated = sum(not r.failed for r in results if not r.verdict.startswith("PASS"))
        failing = sum(not r.verdict.startswith("PASS") for r in results)
        print(f"\n--fail-on {fail_on}: {tolerated} of {failing} failing target(s) "
              "do not fail the run")
    return 1 if any(r.failed for r in results) else 0


def _audit_target(
    release: VllmRelease,
    target: ReleaseTarget,
    profile: Profile,
    conventions: Sequence[str],
    args: argparse.Namespace,
    suite: str,
) -> tuple[AuditReport, TargetResult]:
    """Audit one of the release's managers under ``profile``, print its
    line, and name the documented finding its failure is (if any) in its
    result for the reports."""
    from kvoffload.stateful.audit_cli import fails_run

    budget = args.examples if args.examples is not None else DEFAULT_EXAMPLES
    progress = Progress(target.name, budget)
    report = audit(
        progress.wrap(target.factory),
        policy=target.policy,
        reuse_filter=target.reuse_filter,
        profile=profile,
        max_examples=args.examples,
        stateful_step_count=args.steps,
        seed=args.seed,
        name=target.name,
        illegal_calls=getattr(args, "illegal_calls", True),
    )
    progress.done(_verdict(report))
    print(release_line(release.version, target.name, report, conventions), flush=True)
    follow_up = report.without_illegal_calls
    finding = known_finding(release.version, target.name, report)
    if finding is None and follow_up is not None:
        finding = known_finding(release.version, target.name, follow_up)
    known = follow_up is None or follow_up.passed or known_finding(
        release.version, target.name, follow_up
    ) is not None
    fail_on = getattr(args, "fail_on", "any")
    result = result_of(
        attrs.evolve(report, script=_with_header(report.script, release, target)),
        suite,
        failed=fails_run(report, fail_on, known_finding=finding is not None and known),
        finding=None if finding is None else finding.id,
        kind=None if finding is None else finding.kind,
    )
    return report, result


def _with_header(text: str | None, release: VllmRelease, target: ReleaseTarget) -> str | None:
    """``text`` (a report or a replay script) with the replay's factory
    built from the release directory."""
    if text is None:
        return None
    return text.replace(
        "from your_module import factory  # the audited factory",
        _replay_header(release, target),
    )


def _audit_release_tiers(
    release: VllmRelease, profile: Profile, args: argparse.Namespace
) -> list[tuple[str, AuditReport]]:
    """The release's secondary tiers (0.33 on: ``tier example``, ``tier fs``
    in a temporary directory), one line each, under the release's profile."""
    from kvoffload.stateful.tier_audit import audit_tier
    from kvoffload.stateful.vllm_tiers import (
        CHUNK_BYTES,
        TIER_EXAMPLES,
        release_tier_factories,
    )

    reports = []
    for name, factory in release_tier_factories(release).items():
        report = audit_tier(
            factory,
            profile=profile,
            seed=args.seed,
            max_examples=args.examples or TIER_EXAMPLES.get(name),
            stateful_step_count=args.steps,
            name=f"tier {name}",
            chunk_bytes=CHUNK_BYTES,
        )
        word, _, detail = report.verdict().partition(": ")
        finding = known_finding(release.version, f"tier {name}", report)
        tag = "" if finding is None else f" [{finding.id}, {finding.kind}: {finding.summary}]"
        print(
            f"{word} tier {name}{': ' + detail if detail else ''}{tag} ({report.examples} "
            f"examples, {report.steps} steps, {report.seconds:.1f} s)",
            flush=True,
        )
        reports.append((name, report))
    return reports
