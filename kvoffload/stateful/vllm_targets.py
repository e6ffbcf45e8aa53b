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
import inspect
import sys
from collections.abc import Callable, Collection, Iterable
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
from kvoffload.spec.profile import profile_named
from kvoffload.spec.releases import preset_for_generation
from kvoffload.stateful.auditing import DEFAULT_EXAMPLES, DEFAULT_STEPS, AuditReport, audit
from kvoffload.stateful.harness import ReuseFilterParams, with_overrides
from kvoffload.stateful.legacy import LegacyManagerAdapter
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


def _replay_header(release: VllmRelease, target: ReleaseTarget) -> str:
    args = [repr(str(release.root)), repr(target.policy)]
    if target.reuse_filter is not None:
        args += [str(target.reuse_filter.store_threshold), str(target.reuse_filter.max_tracker_size)]
    return (
        "from kvoffload.stateful.vllm_targets import make_factory\n"
        f"factory = make_factory({', '.join(args)})  # {release.describe()}"
    )


def _verdict(report: AuditReport) -> str:
    return "PASS" if report.passed else f"FAIL ({report.invariant})"


def run_release_audit(args: argparse.Namespace) -> int:
    """``python -m kvoffload audit --vllm DIR``: load the release, audit its
    targets under its profile, one line per target; 1 on any violation, 2
    when DIR holds no loadable release."""
    from kvoffload.stateful.audit_cli import Progress

    try:
        release = load_release(args.vllm)
    except Exception as error:  # a broken release: not a finding, a usage error
        print(f"kvoffload audit: error: cannot load the vLLM release in {args.vllm!r}: "
              f"{type(error).__name__}: {error}", file=sys.stderr)
        return 2
    generation = release.generation
    profile = preset_for_generation(generation.value)
    if args.profile is not None:
        try:
            profile = profile_named(args.profile)
        except KeyError as error:
            print(f"kvoffload audit: error: {error.args[0]}", file=sys.stderr)
            return 2
    profile = with_overrides(profile, args.typed_errors, args.reset)
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
    for target in targets:
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
        word, _, detail = report.verdict().partition(": ")
        seconds = report.seconds
        if report.without_illegal_calls is not None:
            seconds += report.without_illegal_calls.seconds
        print(
            f"{word} {target.name}{': ' + detail if detail else ''} ({report.examples} "
            f"examples, {report.steps} steps, {seconds:.1f} s)",
            flush=True,
        )
        reports.append((target, report))
    failures = [(t, r) for t, r in reports if not r.passed]
    for target, report in failures:
        print()
        text = report.render()
        text = text.replace(
            "from your_module import factory  # the audited factory",
            _replay_header(release, target),
        )
        print(text)
    return 1 if failures else 0
