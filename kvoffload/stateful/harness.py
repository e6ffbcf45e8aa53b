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

import ast
import re
from collections.abc import Callable, Sequence
from typing import Union, cast

import attrs

from kvoffload.spec.contract import (
    InspectableManager,
    InspectablePolicy,
    LookupResult,
    ManagerProtocol,
    OffloadingEvent,
    ReqContext,
)
from kvoffload.spec.errors import InvalidKeyError, OffloadingError
from kvoffload.spec.invariants import Invariant, check_state
from kvoffload.spec.keys import OffloadKey, make_offload_key, validate_offload_key
from kvoffload.spec.lifecycle import PhaseKind
from kvoffload.spec.model import (
    Answer,
    ManagerModel,
    Operation,
    PrepareStore,
    ResetCache,
    Result,
    SpecViolation,
    StoreResult,
)
from kvoffload.spec.policies import POLICY_NAMES, POLICY_REGISTRY
from kvoffload.spec.profile import DEFAULT, ErrorStyle, Profile
from kvoffload.spec.reuse import ReuseFilterModel
from kvoffload.stateful.outputs import EventMetadata, compact_call, store_slots

Model = Union[ManagerModel, ReuseFilterModel]
ManagerFactory = Callable[[int], ManagerProtocol]
"""``factory(num_blocks)``: a fresh manager, any object with the contract's
methods (:class:`~kvoffload.spec.contract.ManagerProtocol`)."""
ContextFactory = Callable[[str], object]
"""``context_factory(req_id)``: the request context a backend takes (the kit
builds one per request and passes that object with every call of the
request)."""


def default_context(req_id: str) -> ReqContext:
    """The request context the kit passes unless told otherwise."""
    return ReqContext(req_id=req_id)


def request_id(request: int) -> str:
    """The ``req_id`` of the kit's request number ``request``."""
    return f"req-{request}"
ILLEGAL_CALL = "  # illegal: must raise "
"""What follows the call in the trace line of an illegal call (one that
must raise and change nothing)."""


def is_illegal(text: str) -> bool:
    """Whether a trace line records an illegal call."""
    return ILLEGAL_CALL in text


POLICIES = POLICY_NAMES
"""The policy names the kit accepts (the specification's registry)."""


class _ModelRefused(Exception):
    """The specification forbids a call (it raised ``error``)."""

    def __init__(self, error: OffloadingError) -> None:
        super().__init__(str(error))
        self.error = error


class Discrepancy(AssertionError):
    """The manager under test broke the specification.

    ``invariant`` names the rule, ``key`` the key concerned when there is
    one. ``check`` is a line of Python, for the replay script, that fails
    when the manager still answers as it did (``out`` is the answer of the
    last call, ``m`` the manager); None when no such line can be written.
    ``illegal_call_damage``: an illegal call raised but changed the manager.
    """

    def __init__(
        self,
        invariant: Invariant,
        detail: str,
        key: object = None,
        check: str | None = None,
        *,
        illegal_call_damage: bool = False,
    ) -> None:
        where = f" (key {key_name(key)})" if key is not None else ""
        super().__init__(f"[{invariant.label}]{where} {detail}")
        self.invariant = invariant
        self.detail = detail
        self.key = key
        self.check = check
        self.illegal_call_damage = illegal_call_damage


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
    manager is a reuse filter with these parameters. ``profile``: the
    conventions the manager keeps (:class:`~kvoffload.spec.profile.Profile`;
    the kit makes only the calls the profile allows and judges answers as it
    says). ``events``: the manager emits events. ``context_factory(req_id)``
    builds the request context the backend takes (default: ``ReqContext``;
    a backend with its own, e.g. mutable, context type supplies its own);
    ``max_requests``: how many requests the kit keeps open at once.
    ``illegal_calls``: the kit makes illegal calls (each must raise, as the
    profile says, and change nothing); when False every call the model
    refuses is left out, not made: for looking past a backend known to be
    damaged by illegal calls, which an engine never makes.

    ``scale``: now and then a run at scale (dozens to hundreds of blocks,
    long offers and chains, KV-group indices past one, two and three bytes;
    :mod:`kvoffload.stateful.swarm`).

    ``typed_errors`` and ``supports_reset`` are the older spelling of
    ``profile.errors`` and ``profile.has_reset``: when given (not None) they
    override those options; afterwards both read the profile's values.
    """

    factory: ManagerFactory
    policy: str = "any"
    reuse_filter: ReuseFilterParams | None = None
    profile: Profile = DEFAULT
    typed_errors: bool | None = None
    supports_reset: bool | None = None
    events: bool = True
    min_blocks: int = 1
    max_blocks: int = 4
    num_keys: int = 6
    context_factory: ContextFactory = attrs.field(factory=lambda: default_context)
    max_requests: int = 3
    illegal_calls: bool = True
    scale: bool = True

    def __attrs_post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if not 1 <= self.min_blocks <= self.max_blocks:
            raise ValueError("need 1 <= min_blocks <= max_blocks")
        if not 1 <= self.num_keys <= 256:
            raise ValueError("num_keys must be in [1, 256]")
        if self.max_requests < 1:
            raise ValueError("max_requests must be >= 1")
        profile = with_overrides(self.profile, self.typed_errors, self.supports_reset)
        object.__setattr__(self, "profile", profile)
        object.__setattr__(self, "typed_errors", profile.errors is ErrorStyle.TYPED)
        object.__setattr__(self, "supports_reset", profile.has_reset)

    def keys(self) -> tuple[OffloadKey, ...]:
        """The key universe: ``num_keys`` keys, two KV groups per block hash
        (``K[2h]`` and ``K[2h+1]`` share block hash ``h``)."""
        return tuple(
            make_offload_key(b"blk%02d" % (index // 2), index % 2)
            for index in range(self.num_keys)
        )

    def new_model(self, num_blocks: int) -> Model:
        core = ManagerModel.create(
            num_blocks, self.policy, enable_events=self.events, profile=self.profile
        )
        if self.reuse_filter is None:
            return core
        return ReuseFilterModel(
            core,
            store_threshold=self.reuse_filter.store_threshold,
            max_tracker_size=self.reuse_filter.max_tracker_size,
        )


def with_overrides(
    profile: Profile, typed_errors: bool | None = None, supports_reset: bool | None = None
) -> Profile:
    """``profile`` with the older ``typed_errors``/``supports_reset`` flags
    applied where given."""
    if typed_errors is not None:
        profile = attrs.evolve(
            profile, errors=ErrorStyle.TYPED if typed_errors else ErrorStyle.ANY
        )
    if supports_reset is not None:
        profile = attrs.evolve(profile, has_reset=supports_reset)
    return profile


def policy_state_of(core: ManagerModel) -> dict[str, object]:
    """The policy model's state in :class:`InspectablePolicy`'s terms."""
    return core.policy.state_view()


def core_of(model: Model) -> ManagerModel:
    """The manager model itself, behind a reuse filter or not."""
    return model.core


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
        self.contexts: dict[int, object] = {}  # one context per request, for its lifetime
        self.trace: list[tuple[Operation, str]] = []
        self.inspectable = isinstance(self.manager, InspectableManager)
        self.policy_inspectable = POLICY_REGISTRY[config.policy].implementable and isinstance(
            self.manager, InspectablePolicy
        )
        self.evicted: list[OffloadKey] = []  # victims so far, oldest first
        self.last_answer: object = None  # the manager's answer to the last lookup_prefix
        self.answer: object = None  # the manager's answer to the last call (None: raised)
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

    @property
    def ctx(self) -> object:
        """The context of request 0 (the one request of a single-request run)."""
        return self.context(0)

    def close(self) -> None:
        """Shut the manager down when it has ``shutdown`` (a tiered
        manager's tiers own threads and directories); the trace stays. A
        failing shutdown is not the kit's verdict."""
        shutdown = getattr(self.manager, "shutdown", None)
        if callable(shutdown):
            try:
                shutdown()
            except Exception:  # noqa: S110, BLE001 - hygiene, not a check
                pass

    def context(self, request: int) -> object:
        """The context the calls of ``request`` carry: built once by the
        configuration's ``context_factory`` from the request id, then the
        same object for the request's lifetime (a backend may keep state in
        it)."""
        context = self.contexts.get(request)
        if context is None:
            context = self.contexts[request] = self.config.context_factory(
                request_id(request)
            )
        return context

    def context_for(self, op: Operation) -> object:
        """The context ``op`` carries (None for calls without one)."""
        request = op.context_of
        return None if request is None else self.context(request)

    def step(self, op: Operation) -> None:
        """Apply ``op`` to model and manager; raise :class:`Discrepancy` on
        the first disagreement or broken invariant."""
        before, recorded = self.model, len(self.trace)
        self.answer = None
        if len(op.keys_mentioned) <= TRACKED_MENTIONS:
            self._track(op.keys_mentioned)
        if op.answer is Answer.STORE:
            try:
                for key in op.keys_mentioned:
                    validate_offload_key(key)
            except InvalidKeyError as error:  # the specification refuses the offer
                self._illegal(op, error)
                return
        try:
            _CHECKS[op.answer](self, op)
        except _ModelRefused as refused:
            self._illegal(op, refused.error)
            return
        except BaseException:  # the manager's own error on a legal call is a finding
            if len(self.trace) == recorded:  # the manager raised: keep its call
                self._record(op, "raised")
            raise
        self.check_state()
        if self.observer is not None:
            self.observer(before, op, self.model)

    def _track(self, keys: Sequence[OffloadKey]) -> None:
        """Keys of the scale universe join ``keys`` (whose phases are
        compared) when first named: a replay checks them as the run did."""
        for key in keys:
            if isinstance(key, bytes) and key.startswith(SCALE_PREFIX) and key not in self.keys:
                self.keys += (key,)

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
                    Invariant.LIFECYCLE,
                    f"phase is {actual}, the specification says {expected}",
                    key,
                )
            if core.slot(key) is not None and manager.slot_of(key) != core.slot(key):
                raise Discrepancy(
                    Invariant.CAPACITY,
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
            want = expected.get(field)
            raise Discrepancy(
                Invariant.POLICY_STATE,
                _named(
                    f"{field} is {actual.get(field)!r}, the {self.config.policy} model "
                    f"says {want!r}"
                ),
            )

    # --- illegal calls ------------------------------------------------------

    def _illegal(self, op: Operation, expected: OffloadingError) -> None:
        if not self.config.illegal_calls:
            return  # set aside: the call is not made
        typed = self.config.profile.errors is ErrorStyle.TYPED
        call = op.render(SCRIPT_SPELLING)
        raises = type(expected).__name__ if typed else "an exception"
        self.trace.append((op, f"{call}{ILLEGAL_CALL}{raises}, change nothing"))
        try:
            op.call(self.manager, self.context_for(op))
        except OffloadingError as error:
            if typed and not isinstance(error, type(expected)):
                raise Discrepancy(
                    Invariant.ERRORS,
                    f"{call} raised {type(error).__name__}, expected {type(expected).__name__}",
                    getattr(expected, "key", None),
                ) from error
        except Exception as error:
            if typed:
                raise Discrepancy(
                    Invariant.ERRORS,
                    f"{call} raised {type(error).__name__}: {error}; expected an "
                    f"OffloadingError ({type(expected).__name__}: {expected})",
                    getattr(expected, "key", None),
                ) from error
        else:
            raise Discrepancy(
                Invariant.ERRORS,
                f"{call} was accepted; the lifecycle table forbids it: {expected}",
                getattr(expected, "key", None),
            )
        try:
            self.check_state()  # an illegal call changes nothing
        except Discrepancy as changed:
            raise Discrepancy(
                Invariant.ERRORS,
                f"{call} raised but changed the manager: {changed}",
                changed.key,
                illegal_call_damage=True,
            ) from changed

    # --- legal calls: one check per kind of answer -----------------------------

    def _record(self, op: Operation, note: str = "") -> None:
        text = compact_call(op) or op.render(SCRIPT_SPELLING)
        self.trace.append((op, text + (f"  # {note}" if note else "")))

    def _no_answer(self, op: Operation) -> None:
        queued = len(core_of(self.model).events)
        self._expect(op)
        if isinstance(op, ResetCache) and not self.slots_known:
            # "ascending slot order" of slots nobody showed: no verdict
            self._unordered.update(e.keys for e in core_of(self.model).events[queued:])
        self._record(op)
        self.answer = op.call(self.manager, self.context_for(op))

    def _lookup_answer(self, op: Operation) -> None:
        expected = self._expect(op)
        self._record(op, f"-> {_shown_answer(expected)}")
        actual = op.call(self.manager, self.context_for(op))
        self.last_answer = self.answer = actual
        if not lookup_agrees(actual, expected, exact=core_of(self.model).tiered):
            raise Discrepancy(
                Invariant.LOOKUP,
                _named(
                    f"{op.render(SCRIPT_SPELLING)} answered {_shown_answer(actual)}, "
                    f"expected {_shown_answer(expected)}"
                ),
                op.keys_mentioned[0] if op.answer is Answer.LOOKUP else None,
            )

    def _store_answer(self, op: Operation) -> None:
        if not isinstance(op, PrepareStore):  # pragma: no cover - Answer.STORE
            raise TypeError(op)
        before = self.model
        self._record(op)
        actual = self.answer = op.call(self.manager, self.context_for(op))
        if actual is None:
            self.trace[-1] = (op, op.render(SCRIPT_SPELLING) + "  # -> None")
            after, expected = before.apply(op)
            if isinstance(expected, StoreResult):
                raise Discrepancy(
                    Invariant.LIVENESS,
                    _named(
                        f"prepare_store refused, yet the specification stores "
                        f"{list(expected.keys_to_store)!r} evicting {list(expected.evicted)!r}"
                    ),
                )
            self.model = after
            return
        try:
            keys_to_store = tuple(getattr(actual, "keys_to_store"))
            victims = tuple(getattr(actual, "evicted_keys"))
            store_spec = getattr(actual, "store_spec")
        except (AttributeError, TypeError) as error:
            raise Discrepancy(
                Invariant.STORE_SPEC,
                f"prepare_store returned {type(actual).__name__}, which lacks the "
                f"contract's keys_to_store/evicted_keys/store_spec: {error}",
            ) from None
        slots = store_slots(self.manager, store_spec, keys_to_store, self.inspectable)
        if slots is None:
            self.slots_known = False  # the model's slots are its own: never compared
        chosen = attrs.evolve(op, victims=victims, slots=slots)
        self.trace[-1] = (
            op,
            op.render(SCRIPT_SPELLING)
            + f"  # -> stores {_keys(keys_to_store)} at {list(slots or ())!r}, "
            f"evicts {_keys(victims)}",
        )
        try:
            after, expected = before.apply(chosen)
        except SpecViolation as violation:
            key = victims[0] if victims and violation.invariant is Invariant.EVICTION else None
            reason = violation.reason
            if violation.invariant is Invariant.EVICTION and victims:
                reason += " — " + "; ".join(_victim_roles(before, op, victims))
            raise Discrepancy(
                violation.invariant,
                _named(reason) + self._filter_hint(before, op, keys_to_store),
                key,
            ) from violation
        if not isinstance(expected, StoreResult):
            raise Discrepancy(Invariant.LIVENESS, "the specification refuses this store")
        self.evicted.extend(expected.evicted)
        if keys_to_store != expected.keys_to_store:
            raise Discrepancy(
                Invariant.PROTECTION,
                _named(
                    f"keys_to_store {list(keys_to_store)!r}, expected "
                    f"{list(expected.keys_to_store)!r}"
                )
                + self._filter_hint(before, op, keys_to_store),
            )
        self.model = after

    def _filter_hint(
        self, before: Model, op: PrepareStore, keys_to_store: Sequence[object]
    ) -> str:
        """A hint when the manager stored fewer of the offered keys than the
        specification would, and no reuse filter was declared: the likely
        cause is a reuse filter audited without its parameters."""
        if self.config.reuse_filter is not None:
            return ""
        wanted = before.apply(attrs.evolve(op, victims=None, slots=None))[1]
        if not isinstance(wanted, StoreResult):
            return ""
        if len(keys_to_store) >= len(wanted.keys_to_store):
            return ""
        return (
            f" (the manager stored {len(keys_to_store)} of the "
            f"{len(wanted.keys_to_store)} new keys offered: if it is a reuse filter, "
            "which stores a key only once it was looked up often enough, audit it with "
            "its parameters: --reuse-threshold K --tracker-size N, or "
            "reuse_filter=ReuseFilterParams(K, N))"
        )

    def _load_answer(self, op: Operation) -> None:
        expected = self._expect(op)
        self._record(
            op, f"-> slots {list(expected) if isinstance(expected, tuple) else expected!r}"
        )
        spec = self.answer = op.call(self.manager, self.context_for(op))
        slots = slots_of(spec)
        if slots is not None and slots != expected:
            raise Discrepancy(
                Invariant.STORE_SPEC,
                f"prepare_load names slots {list(slots)!r}, the keys hold {list(expected)!r}"
                if isinstance(expected, tuple)
                else "prepare_load returned slots for nothing",
            )

    def _events_answer(self, op: Operation) -> None:
        held = core_of(self.model).consumer_view  # what a consumer holds now
        expected = self._expect(op)
        self._record(op)
        answer = op.call(self.manager, self.context_for(op))
        actual = list(cast(Sequence[OffloadingEvent], answer))
        self.answer = list(actual)
        if self.config.profile.private_events:  # internal clean-up, never published
            actual = [e for e in actual if not getattr(e, "metadata_only", False)]
        self.trace[-1] = (op, op.render(SCRIPT_SPELLING) + f"  # -> {len(actual)} event(s)")
        if not isinstance(expected, tuple):  # pragma: no cover
            raise TypeError(expected)
        self._check_events(
            held, actual, [e for e in expected if isinstance(e, OffloadingEvent)]
        )

    # --- events -------------------------------------------------------------

    def _check_events(
        self,
        held: frozenset[OffloadKey],
        actual: Sequence[OffloadingEvent],
        expected: Sequence[OffloadingEvent],
    ) -> None:
        """``actual`` against ``expected``, for a consumer that holds
        ``held`` (the model's view: it follows engine-announced resets)."""
        want = [(tuple(e.keys), e.removed) for e in expected]
        stored: dict[OffloadKey, bool] = dict.fromkeys(held, True)
        for event in actual:
            wrong = self.metadata.check(event)
            if wrong is not None:
                raise Discrepancy(Invariant.EVENTS, wrong)
            for key in event.keys:
                last = stored.get(key)
                if event.removed and last is not True:
                    raise Discrepancy(
                        Invariant.EVENTS,
                        "removed event for a key that was not announced stored",
                        key,
                    )
                if not event.removed and last is True:
                    raise Discrepancy(
                        Invariant.EVENTS,
                        "stored event for a key already announced stored",
                        key,
                    )
                stored[key] = not event.removed
        got = [(tuple(e.keys), bool(e.removed)) for e in actual]
        if self._unordered and len(got) == len(want):
            got = [
                (w if w[0] in self._unordered and sorted(g[0]) == sorted(w[0]) else g)
                for g, w in zip(got, want)
            ]
        if got != want:
            raise Discrepancy(
                Invariant.EVENTS,
                f"events {_render_events(got)}, expected {_render_events(want)}",
            )
        now_held = frozenset(k for k, is_stored in stored.items() if is_stored)
        readable = core_of(self.model).readable_keys()
        if now_held != readable:
            raise Discrepancy(
                Invariant.EVENTS,
                f"a consumer of the events holds {sorted(now_held)!r}, the readable "
                f"keys are {sorted(readable)!r}",
            )


_CHECKS: dict[Answer, Callable[[Harness, Operation], None]] = {
    Answer.NOTHING: Harness._no_answer,
    Answer.LOOKUP: Harness._lookup_answer,
    Answer.PREFIX: Harness._lookup_answer,
    Answer.STORE: Harness._store_answer,
    Answer.LOAD_SPEC: Harness._load_answer,
    Answer.EVENTS: Harness._events_answer,
}
"""How the kit checks each kind of answer (every operation names its kind)."""


def _shown_answer(value: object) -> object:
    """A lookup answer as compared: a result enum by its name."""
    name = getattr(value, "name", None)
    return name if isinstance(name, str) and not isinstance(value, (bool, int)) else value


def lookup_agrees(actual: object, expected: object, exact: bool = False) -> bool:
    """Whether a manager's lookup answer ``actual`` is the model's
    ``expected`` (a bool, an int for ``lookup_prefix``, or a
    :class:`LookupResult`). ``None`` and a result named ``RETRY`` ("ask
    again") always agree, unless ``exact`` (a tiered manager, whose model
    says when a promotion makes it ask again: ``None`` then agrees with
    ``None`` only); a result enum is compared by name, and a plain bool
    against a result means "readable" (``HIT``)."""
    if exact:
        if actual is None or expected is None:
            return actual is None and expected is None
    elif actual is None or _shown_answer(actual) == "RETRY":
        return True
    if isinstance(expected, LookupResult):
        if isinstance(actual, bool):
            return actual == (expected is LookupResult.HIT)
        return _shown_answer(actual) == expected.name
    if isinstance(expected, bool) and not isinstance(actual, bool):
        name = _shown_answer(actual)
        if isinstance(name, str):
            return (name == "HIT") == expected
    return actual == expected


SCALE_PREFIX = b"big"
"""How the block hash of a key of a run at scale begins."""

TRACKED_MENTIONS = 64
"""Calls naming more keys (a probe's flood) add none to a harness's keys."""


def scale_key(block: int, group: int) -> OffloadKey:
    """Key ``S(block, group)`` of a run at scale."""
    return make_offload_key(SCALE_PREFIX + b"%04d" % block, group)


def key_name(key: object) -> str:
    """How a key of the kit's universe is written in a replay script:
    ``K[i]``, ``S(h, g)`` for a key of a run at scale, else its literal."""
    if isinstance(key, bytes):
        name = _KEY_NAMES.get(key)
        if name is None:
            if key.startswith(b"blk") and len(key) == 9:
                name = f"K[{2 * int(key[3:5]) + key[8]}]"
            elif key.startswith(SCALE_PREFIX) and len(key) == 11 and key[3:7].isdigit():
                name = f"S({int(key[3:7])}, {int.from_bytes(key[7:], 'big')})"
            else:
                name = repr(key)
            if len(_KEY_NAMES) < 4096:
                _KEY_NAMES[key] = name
        return name
    return repr(key)


_KEY_NAMES: dict[bytes, str] = {}


class _ScriptSpelling:
    """Keys as ``K[i]``, request ``i``'s context as ``ctx(i)``."""

    def key(self, key: object) -> str:
        return key_name(key)

    def ctx(self, request: int) -> str:
        return f"ctx({request})"


SCRIPT_SPELLING = _ScriptSpelling()


def _named(text: str) -> str:
    """``text`` with the kit's keys written as ``K[i]`` (or ``S(h, g)``)."""
    return _BYTES_LITERAL.sub(_literal_name, text)


_BYTES_LITERAL = re.compile(r"b'(?:blk|big)[^'\\]*(?:\\.[^'\\]*)*'")


def _literal_name(match: re.Match[str]) -> str:
    try:
        value = ast.literal_eval(match[0])
    except (ValueError, SyntaxError):
        return match[0]
    return key_name(value) if isinstance(value, bytes) else match[0]


def _keys(keys: Sequence[object]) -> str:
    return "[" + ", ".join(key_name(k) for k in keys) + "]"


def _victim_roles(before: Model, op: Operation, victims: Sequence[OffloadKey]) -> list[str]:
    """What each victim of a wrong eviction was, and so which rule it broke:
    offered in the call (3 protection), not READY (2 eviction safety), or a
    READY key the policy's model would not evict."""
    core = core_of(before)
    roles = []
    for victim in victims:
        name = key_name(victim)
        phase = core.phase(victim)
        if victim in op.keys_mentioned:
            roles.append(f"{name} was offered in this call (rule 3: a store keeps the keys "
                         "it is offered)")
        elif phase.kind is PhaseKind.READY:
            roles.append(f"{name} was READY: a legal victim, but not the policy's")
        elif phase.kind is PhaseKind.ABSENT:
            roles.append(f"{name} was not stored (rule 2: only READY blocks are evicted)")
        else:
            roles.append(f"{name} was {phase} (rule 2: only READY blocks are evicted)")
    return roles


def _render_events(events: Sequence[tuple[tuple[OffloadKey, ...], bool]]) -> str:
    return "[" + ", ".join(
        f"{'removed' if removed else 'stored'} {_keys(keys)}" for keys, removed in events
    ) + "]"


def render_script(
    trace: Sequence[tuple[Operation, str]],
    *,
    num_blocks: int,
    num_keys: int,
    factory_import: str | None,
    failure: str,
    check: str | None = None,
    context_import: str | None = None,
    config: KitConfig | None = None,
) -> str:
    """A short Python script replaying ``trace`` against the factory.

    Every call goes through :class:`~kvoffload.stateful.replaying.Replay`'s
    checked manager, which judges it as the audit did (``config``'s policy,
    profile, reuse filter and key universe; the defaults without one): the
    script stops with a :class:`Discrepancy` (an ``AssertionError``) at the
    first call that breaks the specification, and runs to its end, printing
    ``replay passed``, for a manager that keeps it, whatever other legal
    choices it makes. The last call of ``trace`` is the one the audit found
    failing (``failure``); its answer is kept as ``out``, and ``check``, when
    given, is a line judging it that the harness does not (a protocol
    property of the engine driver). Request ``i``'s context is ``ctx(i)``,
    built once by ``make_context``: ``ReqContext``, or the callable
    ``context_import`` (``"module:name"``) names. The last line is
    :data:`~kvoffload.stateful.replaying.REPLAY_END`.
    """
    from kvoffload.stateful.replaying import REPLAY_END, config_arguments

    lines = [
        "# Replays a conformance failure found by `kvoffload audit`: each call is made",
        "# on a fresh manager and checked as the audit checked it; the script stops at",
        "# the first call that breaks the specification and passes for a manager that",
        "# keeps it (other legal choices of slots, victims or answers included).",
    ]
    if factory_import:
        module, _, name = factory_import.partition(":")
        lines.append(f"from {module} import {name} as factory")
    else:
        lines.append("from your_module import factory  # the audited factory")
    lines.append(
        f"from {context_import.replace(':', ' import ')} as make_context"
        if context_import
        else "from kvoffload import ReqContext as make_context"
    )
    arguments = (
        config_arguments(config) if config is not None else f"num_keys={num_keys}"
    )
    lines += [
        "from kvoffload.stateful.replaying import Replay, S, expect",
        "",
        f"replay = Replay(factory, {num_blocks}, {arguments}, make_context=make_context)",
        "m, K, ctx = replay.manager, replay.keys, replay.ctx",
    ]
    body = [line for _, line in trace]
    if body and not is_illegal(body[-1]):
        body[-1] = "out = " + body[-1]
    lines += body
    lines.append(f"# ^ the audit found that this call broke the specification: {failure}")
    if check is not None:
        lines.append(check)
    lines += ["replay.passed()", REPLAY_END]
    return "\n".join(lines) + "\n"
