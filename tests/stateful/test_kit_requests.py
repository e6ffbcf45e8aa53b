"""Requests in the kit: several open at once, one context object per
request for its lifetime, no call for a finished request, no request
finishing with a transfer in flight; the hooks mean something under
request-scoped recency; a backend's own context type."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection

import attrs

from kvoffload import CPUOffloadingManager
from kvoffload.spec.contract import (
    LoadStoreSpec,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from kvoffload.spec.invariants import Invariant
from kvoffload.spec.keys import (
    OffloadKey,
    get_offload_group_idx,
    make_offload_key,
    validate_offload_keys,
)
from kvoffload.spec.model import PrepareStore, StartRequest
from kvoffload.spec.profile import DEFAULT, RecencyCommit
from kvoffload.stateful import audit
from kvoffload.stateful.shrink import announced_first
from tests.stateful.test_kit_profiles import Delegating, lru

REQUEST_END = attrs.evolve(DEFAULT, name="request-end", recency_commit=RecencyCommit.REQUEST_END)


class ProtocolViolation(Exception):
    """The kit broke the engine's side of the protocol."""


class EngineProtocolChecker(Delegating):
    """Raises (a crash the audit reports) when a call names a request that
    is not open, a request's context object changes, or a request finishes
    with a load or store it made still in flight."""

    def __init__(self, inner: CPUOffloadingManager) -> None:
        super().__init__(inner)
        self.open: dict[str, object] = {}
        self.finished: set[str] = set()
        self.stores: dict[str, set[OffloadKey]] = {}
        self.loads: dict[str, Counter[OffloadKey]] = {}
        self.most_open = 0

    def _check(self, ctx: ReqContext) -> str:
        req_id = ctx.req_id
        if req_id in self.finished or req_id not in self.open:
            raise ProtocolViolation(f"a call for request {req_id}, which is not open")
        if self.open[req_id] is not ctx:
            raise ProtocolViolation(f"request {req_id} changed its context object")
        return req_id

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        if req_context.req_id in self.open or req_context.req_id in self.finished:
            raise ProtocolViolation(f"request {req_context.req_id} started twice")
        self.open[req_context.req_id] = req_context
        self.most_open = max(self.most_open, len(self.open))
        return self.inner.on_new_request(req_context)

    def on_request_finished(self, req_context: ReqContext) -> None:
        req_id = self._check(req_context)
        pending = {k for k in self.stores.get(req_id, ()) if self.inner.phase(k).kind.value == "PENDING"}
        loading = +self.loads.get(req_id, Counter())
        if pending or loading:
            raise ProtocolViolation(f"request {req_id} finished with transfers in flight")
        del self.open[req_id]
        self.finished.add(req_id)
        self.inner.on_request_finished(req_context)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> object:  # type: ignore[override]
        self._check(req_context)
        return super().lookup(key, req_context)

    def lookup_prefix(self, keys: object, req_context: ReqContext) -> int | None:
        self._check(req_context)
        return self.inner.lookup_prefix(keys, req_context)  # type: ignore[arg-type]

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self._check(req_context)
        super().touch(keys, req_context)

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        req_id = self._check(req_context)
        output = super().prepare_store(keys, req_context)
        if output is not None:
            self.stores.setdefault(req_id, set()).update(output.keys_to_store)
        return output

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        req_id = self._check(req_context)
        super().complete_store(keys, req_context, success)
        # a completed store is no longer in flight, even if another request
        # stores the same key again later
        self.stores.get(req_id, set()).difference_update(keys)

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        req_id = self._check(req_context)
        spec = super().prepare_load(keys, req_context)
        self.loads.setdefault(req_id, Counter()).update(keys)
        return spec

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        req_id = self._check(req_context)
        super().complete_load(keys, req_context)
        self.loads.setdefault(req_id, Counter()).subtract(keys)

    def reset_cache(self) -> None:
        super().reset_cache()
        self.loads.clear()
        self.stores.clear()  # nothing is in flight after a reset


CHECKERS: list[EngineProtocolChecker] = []


def checked_lru(num_blocks: int) -> OffloadingManager:
    CHECKERS.append(EngineProtocolChecker(lru(num_blocks)))
    return CHECKERS[-1]


def test_the_kit_keeps_the_engine_protocol_with_several_requests() -> None:
    CHECKERS.clear()
    report = audit(checked_lru, policy="lru", max_examples=80)
    assert report.passed, report.render()
    assert max(c.most_open for c in CHECKERS) == 3  # requests overlap
    assert sum(len(c.finished) for c in CHECKERS) > 50  # and finish


class RequestScopedLRU(Delegating):
    """LRU with request-scoped recency, built from the LRU manager: a
    request's loads and offers (new or readable keys) are used when it
    finishes, KV group by KV group in first-use order, as a touch."""

    def __init__(self, inner: CPUOffloadingManager) -> None:
        super().__init__(inner)
        self.seen: dict[str, list[OffloadKey]] = {}

    def _use(self, ctx: ReqContext, keys: Collection[OffloadKey]) -> None:
        seen = self.seen.setdefault(ctx.req_id, [])
        seen.extend(k for k in dict.fromkeys(keys) if k not in seen)

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        # keys are checked before the phases are read: a bad key must raise
        # InvalidKeyError, and the compiled build's phase() takes keys only
        keys = validate_offload_keys(keys)
        used = [
            k for k in keys
            if self.inner.phase(k).readable or self.inner.phase(k).kind.value == "ABSENT"
        ]
        output = super().prepare_store(keys, req_context)
        self._use(req_context, used)
        return output

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        spec = super().prepare_load(keys, req_context)
        self._use(req_context, keys)
        return spec

    def on_request_finished(self, req_context: ReqContext) -> None:
        used = self.seen.pop(req_context.req_id, [])
        self.inner.touch(sorted(used, key=get_offload_group_idx), req_context)

    def reset_cache(self) -> None:
        super().reset_cache()
        self.seen.clear()


def request_scoped_lru(num_blocks: int) -> OffloadingManager:
    return RequestScopedLRU(lru(num_blocks))


def test_request_scoped_recency_is_audited_through_the_hooks() -> None:
    passed = audit(request_scoped_lru, policy="lru", profile=REQUEST_END, max_examples=80)
    assert passed.passed, passed.render()
    # the same manager under the default profile, and the plain LRU manager
    # under request-scoped recency, disagree with the model once a request
    # that loaded or stored something finishes
    for factory, profile in ((request_scoped_lru, DEFAULT), (lru, REQUEST_END)):
        report = audit(factory, policy="lru", profile=profile)
        assert report.invariant in (Invariant.POLICY_STATE, Invariant.EVICTION), report.render()
        assert report.script is not None and "m.on_request_finished(ctx(" in report.script


@attrs.define
class EngineContext:
    """A backend's own request context: mutable, holding per-request state."""

    req_id: str
    state: dict[str, object] = attrs.Factory(dict)


class OwnContextManager(Delegating):
    """Takes only :class:`EngineContext` and keeps state in it."""

    def _own(self, ctx: object) -> ReqContext:
        if not isinstance(ctx, EngineContext):
            raise TypeError(f"expected an EngineContext, got {type(ctx).__name__}")
        ctx.state["calls"] = int(ctx.state.get("calls", 0)) + 1  # type: ignore[call-overload]
        return ReqContext(ctx.req_id)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> object:  # type: ignore[override]
        return super().lookup(key, self._own(req_context))

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        return super().prepare_store(keys, self._own(req_context))

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        return super().prepare_load(keys, self._own(req_context))

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return self.inner.on_new_request(self._own(req_context))


def own_context_manager(num_blocks: int) -> OffloadingManager:
    return OwnContextManager(lru(num_blocks))


def test_a_backend_with_its_own_context_type() -> None:
    report = audit(
        own_context_manager, policy="lru", max_examples=40, context_factory=EngineContext
    )
    assert report.passed, report.render()
    crash = audit(own_context_manager, policy="lru", max_examples=40)
    assert crash.invariant is Invariant.CRASH and "EngineContext" in (crash.message or "")


class AnnouncedPinningLRU:
    """Outputs only (no introspection, deep-copyable), as vLLM 0.33's
    tiering manager is to the kit: per-request state made by
    ``on_new_request`` (a call for a request never announced raises
    ``KeyError``), and F3's slip planted: an illegal ``prepare_load`` pins
    the readable keys before the bad one, then raises."""

    def __init__(self, num_blocks: int) -> None:
        self.inner = lru(num_blocks)
        self.announced: set[str] = set()

    def _seen(self, ctx: ReqContext) -> None:
        if ctx.req_id not in self.announced:
            raise KeyError(ctx.req_id)

    def on_new_request(self, ctx: ReqContext) -> object:
        self.announced.add(ctx.req_id)
        return self.inner.on_new_request(ctx)

    def on_request_finished(self, ctx: ReqContext) -> None:
        self.inner.on_request_finished(ctx)

    def on_schedule_end(self) -> None:
        self.inner.on_schedule_end()

    def lookup(self, key: OffloadKey, ctx: ReqContext) -> object:
        self._seen(ctx)
        return self.inner.lookup(key, ctx)

    def lookup_prefix(self, keys: Collection[OffloadKey], ctx: ReqContext) -> int | None:
        self._seen(ctx)
        return self.inner.lookup_prefix(list(keys), ctx)

    def touch(self, keys: Collection[OffloadKey], ctx: ReqContext) -> None:
        self._seen(ctx)
        self.inner.touch(keys, ctx)

    def prepare_load(self, keys: Collection[OffloadKey], ctx: ReqContext) -> LoadStoreSpec:
        self._seen(ctx)
        keys = list(keys)
        for index, key in enumerate(keys):
            if self.inner.lookup(key, ctx) is not True:
                if index:
                    self.inner.prepare_load(keys[:index], ctx)  # the slip: pinned for good
                break
        return self.inner.prepare_load(keys, ctx)

    def complete_load(self, keys: Collection[OffloadKey], ctx: ReqContext) -> None:
        self._seen(ctx)
        self.inner.complete_load(keys, ctx)

    def prepare_store(
        self, keys: Collection[OffloadKey], ctx: ReqContext
    ) -> PrepareStoreOutput | None:
        self._seen(ctx)
        return self.inner.prepare_store(keys, ctx)

    def complete_store(
        self, keys: Collection[OffloadKey], ctx: ReqContext, success: bool = True
    ) -> None:
        self._seen(ctx)
        self.inner.complete_store(keys, ctx, success)

    def take_events(self) -> Collection[object]:
        return list(self.inner.take_events())

    def reset_cache(self) -> None:
        self.inner.reset_cache()


def test_a_shrunk_failure_keeps_the_announcements_of_the_requests_it_uses() -> None:
    """Regression (vLLM 0.33's tiering manager, seed 0, after the swarm's
    tiered step ends): the shrinker dropped the probe's ``on_new_request``
    while keeping the probe's store. The replay without the illegal load
    then crashed (the backend's ``KeyError``), so the audit did not see
    that the illegal call did the damage and reported a liveness failure
    matching no finding instead of F3's ``errors``. Here, before the fix,
    seed 3 shrank to one illegal ``complete_store`` of a request it no
    longer announced, blaming the backend's ``KeyError`` on the kit's own
    slip."""
    for seed in range(4):
        report = audit(AnnouncedPinningLRU, policy="lru", seed=seed, max_examples=60)
        assert not report.passed
        assert report.invariant is Invariant.ERRORS, report.render()
        assert report.illegal_call_damage
        script = report.script or ""
        used = set(re.findall(r"ctx\((\d+)\)", script))
        announced = set(re.findall(r"on_new_request\(ctx\((\d+)\)\)", script))
        assert used and used <= announced, script


def test_announced_first_holds_only_requests_the_sequence_announced() -> None:
    key = make_offload_key(b"blk", 0)
    store = PrepareStore((key,), request=1)
    assert announced_first([StartRequest(1), store], frozenset({1}))
    assert not announced_first([store, StartRequest(1)], frozenset({1}))
    assert not announced_first([store], frozenset({1}))
    assert announced_first([store], frozenset({0}))  # never announced: not held to it
