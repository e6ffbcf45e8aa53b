"""Drive the specification and a manager side by side, one call at a time.

:class:`Harness` holds a model (:class:`~kvoffload.spec.model.ManagerModel`,
or a :class:`~kvoffload.spec.reuse.ReuseFilterModel` in front of one) and the
manager under test. :meth:`Harness.step` applies one operation to both,
compares what they answer and checks the invariants; the first disagreement
raises :class:`Discrepancy`, naming the invariant and the key. Both the
Hypothesis state machine and the exhaustive checker step through this one
class, so they check the same things.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Union, cast

import attrs

from kvoffload.spec.contract import (
    InspectableManager,
    InspectablePolicy,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
)
from kvoffload.spec.errors import InvalidKeyError, OffloadingError
from kvoffload.spec.keys import OffloadKey, make_offload_key, validate_offload_key
from kvoffload.spec.model import (
    CompleteLoad,
    CompleteStore,
    Lookup,
    LookupPrefix,
    ManagerModel,
    Operation,
    PrepareLoad,
    PrepareStore,
    RequestHook,
    ResetCache,
    Result,
    SpecViolation,
    StoreResult,
    TakeEvents,
    Touch,
)
from kvoffload.spec.invariants import check_state
from kvoffload.spec.policies import ARCModel, LRUModel
from kvoffload.spec.reuse import ReuseFilterModel
from kvoffload.stateful.outputs import EventMetadata, store_slots

Model = Union[ManagerModel, ReuseFilterModel]
ManagerFactory = Callable[[int], OffloadingManager]
POLICIES = ("lru", "arc", "any")


class _ModelRefused(Exception):
    """The specification forbids a call (it raised ``error``)."""

    def __init__(self, error: OffloadingError) -> None:
        super().__init__(str(error))
        self.error = error


class Discrepancy(AssertionError):
    """The manager under test broke the specification.

    ``invariant`` names the rule (an invariant of DESIGN.md, or the call whose
    answer differs), ``key`` the key concerned when there is one.
    """

    def __init__(self, invariant: str, detail: str, key: object = None) -> None:
        where = f" (key {key!r})" if key is not None else ""
        super().__init__(f"[{invariant}]{where} {detail}")
        self.invariant = invariant
        self.detail = detail
        self.key = key


@attrs.frozen
class ReuseFilterParams:
    """The reuse filter the manager under test is expected to put in front."""

    store_threshold: int = 2
    max_tracker_size: int = 64_000


@attrs.frozen
class KitConfig:
    """What the kit audits and how.

    ``factory(num_blocks)`` builds a fresh manager with events enabled;
    ``policy`` is ``"lru"`` or ``"arc"`` (exact agreement with that policy's
    model) or ``"any"`` (any legal victim choice). ``reuse_filter``: the
    manager is a reuse filter with these parameters. ``typed_errors``: the
    manager promises an :class:`OffloadingError` for every illegal call, and
    the kit makes illegal calls. ``supports_reset``: the kit calls
    ``reset_cache``. ``events``: the manager emits events.
    """

    factory: ManagerFactory
    policy: str = "any"
    reuse_filter: ReuseFilterParams | None = None
    typed_errors: bool = True
    supports_reset: bool = True
    events: bool = True
    min_blocks: int = 1
    max_blocks: int = 4
    num_keys: int = 6

    def __attrs_post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if not 1 <= self.min_blocks <= self.max_blocks:
            raise ValueError("need 1 <= min_blocks <= max_blocks")
        if not 1 <= self.num_keys <= 256:
            raise ValueError("num_keys must be in [1, 256]")

    def keys(self) -> tuple[OffloadKey, ...]:
        """The key universe: ``num_keys`` keys, two KV groups per block hash
        (``K[2h]`` and ``K[2h+1]`` share block hash ``h``)."""
        return tuple(
            make_offload_key(b"blk%02d" % (index // 2), index % 2)
            for index in range(self.num_keys)
        )

    def new_model(self, num_blocks: int) -> Model:
        core = ManagerModel.create(num_blocks, self.policy, enable_events=self.events)
        if self.reuse_filter is None:
            return core
        return ReuseFilterModel(
            core,
            store_threshold=self.reuse_filter.store_threshold,
            max_tracker_size=self.reuse_filter.max_tracker_size,
        )


def policy_state_of(core: ManagerModel) -> dict[str, object]:
    """The policy model's state in :class:`InspectablePolicy`'s terms."""
    policy = core.policy
    if isinstance(policy, LRUModel):
        return {"order": policy.order}
    if isinstance(policy, ARCModel):
        return {
            "t1": policy.t1,
            "t2": policy.t2,
            "b1": policy.b1,
            "b2": policy.b2,
            "target": policy.target,
        }
    return {}


def core_of(model: Model) -> ManagerModel:
    """The manager model itself, behind a reuse filter or not."""
    return model.backing if isinstance(model, ReuseFilterModel) else model


def slots_of(spec: object) -> tuple[int, ...] | None:
    """The block ids a load/store spec names, if it exposes ``block_ids``."""
    block_ids = getattr(spec, "block_ids", None)
    if block_ids is None:
        return None
    return tuple(int(i) for i in list(block_ids))


class Harness:
    """One model and one manager, stepped together (see the module docstring)."""

    def __init__(self, config: KitConfig, num_blocks: int) -> None:
        self.config = config
        self.num_blocks = num_blocks
        self.keys = config.keys()
        self.model: Model = config.new_model(num_blocks)
        self.manager = config.factory(num_blocks)
        self.ctx = ReqContext(req_id="kit")
        self.trace: list[tuple[Operation, str]] = []
        self.inspectable = isinstance(self.manager, InspectableManager)
        self.policy_inspectable = config.policy in ("lru", "arc") and isinstance(
            self.manager, InspectablePolicy
        )
        self._last_event: dict[OffloadKey, bool] = {}
        self.evicted: list[OffloadKey] = []  # victims so far, oldest first
        self.last_answer: object = None  # the manager's answer to the last lookup_prefix
        profile = getattr(config, "profile", None)
        self.metadata = EventMetadata(
            self.manager,
            core_of(self.model).medium,
            carries_block_size=bool(getattr(profile, "event_block_size", True)),
        )
        self.slots_known = True  # False once a store's slots were not shown
        self._unordered: set[tuple[OffloadKey, ...]] = set()  # batches in no set order
        # called after each legal step with (model before, call, model after)
        self.observer: Callable[[Model, Operation, Model], None] | None = None

    # --- public -----------------------------------------------------------

    def step(self, op: Operation) -> None:
        """Apply ``op`` to model and manager; raise :class:`Discrepancy` on
        the first disagreement or broken invariant."""
        before, recorded = self.model, len(self.trace)
        try:
            if isinstance(op, PrepareStore):
                for key in op.keys:
                    validate_offload_key(key)
                _HANDLERS[PrepareStore](self, op)
            else:
                _HANDLERS[type(op)](self, op)
        except _ModelRefused as refused:
            self._illegal(op, refused.error)
            return
        except InvalidKeyError as error:
            self._illegal(op, error)
            return
        except BaseException:
            if len(self.trace) == recorded:  # the manager raised: keep its call
                self._record(op, "raised")
            raise
        self.check_state()
        if self.observer is not None:
            self.observer(before, op, self.model)

    def _expect(self, op: Operation) -> Result:
        """The model's answer to ``op``, the model moved on; an illegal call
        raises :class:`_ModelRefused` with the model unchanged."""
        try:
            self.model, expected = self.model.apply(op)
        except OffloadingError as error:
            raise _ModelRefused(error) from error
        return expected

    def check_state(self) -> None:
        """Check the specification's state invariants (1, 6 and
        well-formedness) on the model, which follows the manager's observed
        choices; then compare policy state, phases and slots (inspectable
        managers)."""
        core = core_of(self.model)
        for violation in check_state(self.model):
            raise Discrepancy(violation.invariant, violation.reason, violation.key)
        if not self.inspectable:
            return
        if self.policy_inspectable:
            self._check_policy_state(core)
        manager = cast(InspectableManager, self.manager)
        for key in self.keys:
            expected, actual = core.phase(key), manager.phase(key)
            if expected != actual:
                raise Discrepancy(
                    "lifecycle", f"phase is {actual}, the specification says {expected}", key
                )
            if core.slot(key) is not None and manager.slot_of(key) != core.slot(key):
                raise Discrepancy(
                    "1 capacity",
                    f"slot is {manager.slot_of(key)}, was allocated {core.slot(key)}",
                    key,
                )

    def _check_policy_state(self, core: ManagerModel) -> None:
        actual = dict(cast(InspectablePolicy, self.manager).policy_state())
        expected = policy_state_of(core)
        if actual != expected:
            field = next(
                (name for name in expected if actual.get(name) != expected[name]), "state"
            )
            raise Discrepancy(
                "policy state",
                _named(
                    f"{field} is {actual.get(field)!r}, the {self.config.policy} model "
                    f"says {expected[field]!r}"
                ),
            )

    # --- illegal calls ------------------------------------------------------

    def _illegal(self, op: Operation, expected: OffloadingError) -> None:
        if not self.config.typed_errors:
            return  # the manager promises nothing for illegal calls: skip it
        call = _render_call(op)
        self.trace.append((op, f"must_raise(lambda: {call})  # {type(expected).__name__}"))
        try:
            _invoke(self, op)
        except OffloadingError as error:
            if not isinstance(error, type(expected)):
                raise Discrepancy(
                    "errors",
                    f"{call} raised {type(error).__name__}, expected {type(expected).__name__}",
                    getattr(expected, "key", None),
                ) from error
        except Exception as error:
            raise Discrepancy(
                "errors",
                f"{call} raised {type(error).__name__}: {error}; expected an "
                f"OffloadingError ({type(expected).__name__}: {expected})",
                getattr(expected, "key", None),
            ) from error
        else:
            raise Discrepancy(
                "errors",
                f"{call} was accepted; the lifecycle table forbids it: {expected}",
                getattr(expected, "key", None),
            )
        self.check_state()  # 4: an illegal call changes nothing

    # --- legal calls ------------------------------------------------------

    def _record(self, op: Operation, note: str = "") -> None:
        self.trace.append((op, _render_call(op) + (f"  # {note}" if note else "")))

    def _lookup(self, op: Operation) -> None:
        if not isinstance(op, Lookup):  # pragma: no cover
            raise TypeError(op)
        expected = self._expect(op)
        self._record(op, f"-> {expected}")
        actual = self.manager.lookup(op.key, self.ctx)
        if actual is not None and actual != expected:
            raise Discrepancy("lookup", f"lookup answered {actual}, expected {expected}", op.key)

    def _lookup_prefix(self, op: Operation) -> None:
        if not isinstance(op, LookupPrefix):  # pragma: no cover
            raise TypeError(op)
        expected = self._expect(op)
        self._record(op, f"-> {expected}")
        actual = self.manager.lookup_prefix(op.keys, self.ctx)
        self.last_answer = actual
        if actual is not None and actual != expected:
            raise Discrepancy(
                "lookup", f"lookup_prefix answered {actual}, expected {expected}"
            )

    def _prepare_store(self, op: Operation) -> None:
        if not isinstance(op, PrepareStore):  # pragma: no cover
            raise TypeError(op)
        before = self.model
        actual = self.manager.prepare_store(list(op.keys), self.ctx)
        if actual is None:
            self._record(op, "-> None")
            after, expected = before.apply(op)
            if isinstance(expected, StoreResult):
                raise Discrepancy(
                    "5 liveness",
                    f"prepare_store refused, yet the specification stores "
                    f"{list(expected.keys_to_store)!r} evicting {list(expected.evicted)!r}",
                )
            self.model = after
            return
        if not isinstance(actual, PrepareStoreOutput):
            raise Discrepancy(
                "7 store spec", f"prepare_store returned {type(actual).__name__}"
            )
        slots = store_slots(
            self.manager, actual.store_spec, tuple(actual.keys_to_store), self.inspectable
        )
        if slots is None:
            self.slots_known = False  # the model's slots are its own: never compared
        victims = tuple(actual.evicted_keys)
        chosen = PrepareStore(op.keys, victims=victims, slots=slots)
        self._record(
            op,
            f"-> stores {_keys(actual.keys_to_store)} at {list(slots or ())!r}, "
            f"evicts {_keys(victims)}",
        )
        try:
            after, expected = before.apply(chosen)
        except SpecViolation as violation:
            key = victims[0] if victims and "evict" in violation.invariant else None
            raise Discrepancy(
                violation.invariant, _named(violation.reason), key
            ) from violation
        if not isinstance(expected, StoreResult):
            raise Discrepancy("5 liveness", "the specification refuses this store")
        self.evicted.extend(expected.evicted)
        if tuple(actual.keys_to_store) != expected.keys_to_store:
            raise Discrepancy(
                "3 protection",
                f"keys_to_store {list(actual.keys_to_store)!r}, expected "
                f"{list(expected.keys_to_store)!r}",
            )
        if slots is None and expected.keys_to_store:
            pass  # the spec does not expose slots: invariant 7 unchecked
        self.model = after

    def _complete_store(self, op: Operation) -> None:
        if not isinstance(op, CompleteStore):  # pragma: no cover
            raise TypeError(op)
        self._expect(op)
        self._record(op)
        self.manager.complete_store(list(op.keys), self.ctx, op.success)

    def _prepare_load(self, op: Operation) -> None:
        if not isinstance(op, PrepareLoad):  # pragma: no cover
            raise TypeError(op)
        expected = self._expect(op)
        self._record(op, f"-> slots {list(expected) if isinstance(expected, tuple) else expected!r}")
        spec = self.manager.prepare_load(list(op.keys), self.ctx)
        slots = slots_of(spec)
        if slots is not None and slots != expected:
            raise Discrepancy(
                "7 store spec",
                f"prepare_load names slots {list(slots)!r}, the keys hold {list(expected)!r}"
                if isinstance(expected, tuple)
                else "prepare_load returned slots for nothing",
            )

    def _complete_load(self, op: Operation) -> None:
        if not isinstance(op, CompleteLoad):  # pragma: no cover
            raise TypeError(op)
        self._expect(op)
        self._record(op)
        self.manager.complete_load(list(op.keys), self.ctx)

    def _touch(self, op: Operation) -> None:
        if not isinstance(op, Touch):  # pragma: no cover
            raise TypeError(op)
        self._expect(op)
        self._record(op)
        self.manager.touch(list(op.keys), self.ctx)

    def _reset(self, op: Operation) -> None:
        queued = len(core_of(self.model).events)
        self._expect(op)
        if not self.slots_known:  # "ascending slot order" of slots nobody showed
            self._unordered.update(e.keys for e in core_of(self.model).events[queued:])
        self._record(op)
        self.manager.reset_cache()

    def _take_events(self, op: Operation) -> None:
        expected = self._expect(op)
        actual = list(self.manager.take_events())
        self._record(op, f"-> {len(actual)} event(s)")
        if not isinstance(expected, tuple):  # pragma: no cover
            raise TypeError(expected)
        self._check_events(actual, [e for e in expected if isinstance(e, OffloadingEvent)])

    def _hook(self, op: Operation) -> None:
        if not isinstance(op, RequestHook):  # pragma: no cover
            raise TypeError(op)
        self._expect(op)
        self._record(op)
        _invoke(self, op)

    # --- events -------------------------------------------------------------

    def _check_events(
        self, actual: Sequence[OffloadingEvent], expected: Sequence[OffloadingEvent]
    ) -> None:
        for event in actual:
            wrong = self.metadata.check(event)
            if wrong is not None:
                raise Discrepancy("6 events", wrong)
            for key in event.keys:
                last = self._last_event.get(key)
                if event.removed and last is not True:
                    raise Discrepancy(
                        "6 events",
                        "removed event for a key that was not announced stored",
                        key,
                    )
                if not event.removed and last is True:
                    raise Discrepancy(
                        "6 events", "stored event for a key already announced stored", key
                    )
                self._last_event[key] = not event.removed
        got = [(tuple(e.keys), bool(e.removed)) for e in actual]
        want = [(tuple(e.keys), e.removed) for e in expected]
        if self._unordered and len(got) == len(want):
            got = [
                (w if w[0] in self._unordered and sorted(g[0]) == sorted(w[0]) else g)
                for g, w in zip(got, want)
            ]
        if got != want:
            raise Discrepancy(
                "6 events", f"events {_render_events(got)}, expected {_render_events(want)}"
            )
        held = frozenset(k for k, stored in self._last_event.items() if stored)
        readable = core_of(self.model).readable_keys()
        if held != readable:
            raise Discrepancy(
                "6 events",
                f"a consumer of the events holds {sorted(held)!r}, the readable "
                f"keys are {sorted(readable)!r}",
            )


def _invoke(harness: Harness, op: Operation) -> object:
    """Make the call ``op`` describes on the manager; its answer, if any."""
    manager, ctx = harness.manager, harness.ctx
    if isinstance(op, Lookup):
        return manager.lookup(op.key, ctx)
    if isinstance(op, LookupPrefix):
        return manager.lookup_prefix(op.keys, ctx)
    if isinstance(op, PrepareStore):
        return manager.prepare_store(list(op.keys), ctx)
    if isinstance(op, PrepareLoad):
        return manager.prepare_load(list(op.keys), ctx)
    if isinstance(op, TakeEvents):
        return list(manager.take_events())
    if isinstance(op, CompleteStore):
        manager.complete_store(list(op.keys), ctx, op.success)
    elif isinstance(op, CompleteLoad):
        manager.complete_load(list(op.keys), ctx)
    elif isinstance(op, Touch):
        manager.touch(list(op.keys), ctx)
    elif isinstance(op, ResetCache):
        manager.reset_cache()
    elif op.name in ("on_schedule_end", "shutdown"):
        getattr(manager, op.name)()
    else:
        getattr(manager, op.name)(ctx)
    return None


_HANDLERS: dict[type, Callable[[Harness, Operation], None]] = {
    Lookup: Harness._lookup,
    LookupPrefix: Harness._lookup_prefix,
    PrepareStore: Harness._prepare_store,
    CompleteStore: Harness._complete_store,
    PrepareLoad: Harness._prepare_load,
    CompleteLoad: Harness._complete_load,
    Touch: Harness._touch,
    ResetCache: Harness._reset,
    TakeEvents: Harness._take_events,
    RequestHook: Harness._hook,
}


def key_name(key: object) -> str:
    """How a key of the kit's universe is written in a replay script."""
    if isinstance(key, bytes) and key.startswith(b"blk") and len(key) == 9:
        return f"K[{2 * int(key[3:5]) + key[8]}]"
    return repr(key)


def _named(text: str) -> str:
    """``text`` with the kit's keys written as ``K[i]``."""
    return re.sub(
        r"b'blk(\d\d)\\x00\\x00\\x00\\x0([01])'",
        lambda m: f"K[{2 * int(m[1]) + int(m[2])}]",
        text,
    )


def _keys(keys: Sequence[object]) -> str:
    return "[" + ", ".join(key_name(k) for k in keys) + "]"


def _render_events(events: Sequence[tuple[tuple[OffloadKey, ...], bool]]) -> str:
    return "[" + ", ".join(
        f"{'removed' if removed else 'stored'} {_keys(keys)}" for keys, removed in events
    ) + "]"


def _render_call(op: Operation) -> str:
    if isinstance(op, Lookup):
        return f"m.lookup({key_name(op.key)}, ctx)"
    if isinstance(op, LookupPrefix):
        return f"m.lookup_prefix({_keys(op.keys)}, ctx)"
    if isinstance(op, PrepareStore):
        return f"m.prepare_store({_keys(op.keys)}, ctx)"
    if isinstance(op, CompleteStore):
        return f"m.complete_store({_keys(op.keys)}, ctx, success={op.success})"
    if isinstance(op, PrepareLoad):
        return f"m.prepare_load({_keys(op.keys)}, ctx)"
    if isinstance(op, CompleteLoad):
        return f"m.complete_load({_keys(op.keys)}, ctx)"
    if isinstance(op, Touch):
        return f"m.touch({_keys(op.keys)}, ctx)"
    if isinstance(op, ResetCache):
        return "m.reset_cache()"
    if isinstance(op, TakeEvents):
        return "list(m.take_events())"
    if op.name in ("on_schedule_end", "shutdown"):
        return f"m.{op.name}()"
    return f"m.{op.name}(ctx)"


def render_script(
    trace: Sequence[tuple[Operation, str]],
    *,
    num_blocks: int,
    num_keys: int,
    factory_import: str | None,
    failure: str,
) -> str:
    """A short Python script replaying ``trace`` against the factory."""
    lines = ["# Replays a conformance failure found by `kvoffload audit`."]
    if factory_import:
        module, _, name = factory_import.partition(":")
        lines.append(f"from {module} import {name} as factory")
    else:
        lines.append("from your_module import factory  # the audited factory")
    lines += [
        "from kvoffload import OffloadingError, ReqContext, make_offload_key",
        "",
        "",
        "def must_raise(call):",
        "    try:",
        "        call()",
        "    except OffloadingError:",
        "        return",
        '    raise AssertionError("accepted a call the specification forbids")',
        "",
        "",
        f"K = [make_offload_key(b'blk%02d' % (i // 2), i % 2) for i in range({num_keys})]",
        'ctx = ReqContext(req_id="kit")',
        f"m = factory({num_blocks})",
    ]
    lines += [line for _, line in trace]
    lines.append(f"# ^ last call broke the specification: {failure}")
    return "\n".join(lines) + "\n"
