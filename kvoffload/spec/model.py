"""The executable specification of an offloading manager.

:class:`ManagerModel` is an immutable (``attrs`` frozen, hashable, compared by
value) state of a manager. Each ``OffloadingManager`` call is a pure method
returning ``(new_model, result)``; the old model is untouched. Results are
plain values an implementation's outputs are compared with:

=====================  =====================================================
call                   result
=====================  =====================================================
``lookup``             ``bool`` (a ``LookupResult`` under
                       ``lookup_answer=RESULT``)
``lookup_prefix``      ``int``
``prepare_store``      :class:`StoreResult` or ``None`` (no room; model unchanged)
``complete_store``     ``None``
``prepare_load``       ``tuple[int, ...]``: the slots of the keys, in call order
``complete_load``      ``None``
``touch``              ``None``
``reset_cache``        ``None``
``take_events``        ``tuple[OffloadingEvent, ...]``, oldest first
request hooks          ``None`` (``on_new_request``, ``on_request_finished``,
                       ``on_schedule_end``: no change but, under
                       request-scoped recency, a request's record and its
                       commit at finish)
=====================  =====================================================

Errors. A call the lifecycle table forbids raises the same
:class:`~kvoffload.spec.errors.OffloadingError` subclass the implementation
must raise (:class:`InvalidKeyError`, :class:`IllegalTransitionError`), and no
new model exists: the caller keeps the old one.

Auditing an implementation. ``prepare_store`` takes the implementation's
choices: ``victims=`` (its ``evicted_keys``) and ``slots=`` (its store-spec
slots). The model checks them and raises :class:`SpecViolation` when they are
not allowed — for LRU and ARC only the policy's own choice is allowed, for
:class:`~kvoffload.spec.policies.AnyPolicyModel` any ``need`` distinct READY
keys outside the offered set; slots must be distinct, free and as many as the
keys to store. Left out, the model chooses itself: victims by its policy,
slots as the CPU backend does (never-used slots in ascending order, then
freed slots last-freed first). Every call can also be given as an operation
value (:class:`PrepareStore`, :class:`Touch`, …) to :meth:`ManagerModel.apply`.

The slot pool is ``fresh`` (never-used slots, ascending) plus ``free_list``
(freed slots, in the order they were freed; reuse pops its end).
``consumer_view`` is the set of keys an event consumer holds after applying
every event already taken (invariant 6).
"""

from __future__ import annotations

import abc
import enum
import operator
from collections import Counter
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, Sequence, ValuesView
from typing import Any, ClassVar, Protocol, SupportsIndex, TypeVar, Union, overload

import attrs

from kvoffload.spec.contract import LookupResult, OffloadingEvent, require_success
from kvoffload.spec.errors import ConfigurationError, IllegalTransitionError
from kvoffload.spec.keys import (
    OffloadKey,
    get_offload_group_idx,
    validate_offload_key,
    validate_offload_keys,
)
from kvoffload.spec.lifecycle import (
    ABSENT,
    PENDING,
    READY,
    Call,
    Phase,
)
from kvoffload.spec.lifecycle import (
    apply as apply_call,
)
from kvoffload.spec.policies import PolicyModel, make_policy
from kvoffload.spec.profile import (
    DEFAULT,
    Cascade,
    LookupAnswer,
    Profile,
    RecencyCommit,
    ResetAnnounce,
    TierPoll,
)
from kvoffload.spec.violations import Invariant, SpecViolation

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")


class FrozenMap(Mapping[K, V]):
    """An immutable, hashable mapping; equal maps hash equal.

    ``set`` and ``without`` return new maps; the underlying dict is never
    mutated after construction.
    """

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[tuple[K, V]] = ()) -> None:
        self._items: dict[K, V] = dict(items)

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def items(self) -> ItemsView[K, V]:
        return self._items.items()

    def values(self) -> ValuesView[V]:
        return self._items.values()

    def keys(self) -> KeysView[K]:
        return self._items.keys()

    @overload
    def get(self, key: K, /) -> V | None: ...

    @overload
    def get(self, key: K, /, default: V | D) -> V | D: ...

    def get(self, key: K, /, default: object = None) -> object:
        """The value of ``key``, else ``default`` (the dict's own lookup:
        the models ask this on every step)."""
        return self._items.get(key, default)

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenMap):
            return self._items == other._items
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"

    def set(self, key: K, value: V) -> FrozenMap[K, V]:
        """This map with ``key`` bound to ``value``."""
        return FrozenMap([*self._items.items(), (key, value)])

    def without(self, keys: Iterable[K]) -> FrozenMap[K, V]:
        """This map without ``keys`` (missing keys are ignored)."""
        gone = frozenset(keys)
        return FrozenMap((k, v) for k, v in self._items.items() if k not in gone)


@attrs.frozen
class Block:
    """A tracked key's phase and slot."""

    phase: Phase
    slot: int


@attrs.frozen
class StoreResult:
    """A successful ``prepare_store``: the keys now PENDING (offer order, no
    repeats), their slots in that order, and the victims in eviction order."""

    keys_to_store: tuple[OffloadKey, ...]
    store_slots: tuple[int, ...]
    evicted: tuple[OffloadKey, ...]


M = TypeVar("M", bound="CallableModel")


class CallableModel(Protocol):
    """A model with one pure method per manager call (``ManagerModel``,
    ``ReuseFilterModel``): what an :class:`Operation` applies itself to.
    ``request`` names the request whose context a call carries."""

    def lookup(
        self: M, key: OffloadKey, *, request: int = ...
    ) -> tuple[M, bool | LookupResult | None]: ...
    def lookup_prefix(
        self: M, keys: Sequence[OffloadKey], *, request: int = ...
    ) -> tuple[M, int | None]: ...
    def prepare_store(
        self: M,
        keys: Sequence[OffloadKey],
        *,
        victims: Sequence[OffloadKey] | None = ...,
        slots: Sequence[int] | None = ...,
        request: int = ...,
    ) -> tuple[M, StoreResult | None]: ...
    def complete_store(
        self: M, keys: Sequence[OffloadKey], success: bool = ..., *, request: int = ...
    ) -> tuple[M, None]: ...
    def prepare_load(
        self: M, keys: Sequence[OffloadKey], *, request: int = ...
    ) -> tuple[M, tuple[int, ...]]: ...
    def complete_load(self: M, keys: Sequence[OffloadKey]) -> tuple[M, None]: ...
    def touch(self: M, keys: Sequence[OffloadKey]) -> tuple[M, None]: ...
    def reset_cache(self: M) -> tuple[M, None]: ...
    def take_events(self: M) -> tuple[M, tuple[OffloadingEvent, ...]]: ...
    def start_request(self: M, request: int) -> tuple[M, None]: ...
    def finish_request(self: M, request: int) -> tuple[M, None]: ...
    def schedule_end(self: M) -> tuple[M, None]: ...


# --- operations: one value per call -----------------------------------------
#
# Each call of the contract is one Operation class, and that class is the only
# place that knows the call: how it applies to a model (``apply_to``), how it
# is made on a manager (``call``), how a replay script writes it (``render``),
# which lifecycle-table calls it makes on a key (``table_calls``) and what kind
# of answer it returns (``answer``). Adding a call means adding one class.


class Answer(enum.Enum):
    """What kind of value a call returns, i.e. how a kit compares it."""

    NOTHING = "nothing"
    LOOKUP = "lookup"
    PREFIX = "prefix"
    STORE = "store"
    LOAD_SPEC = "load spec"
    EVENTS = "events"


class Spelling(Protocol):
    """How a replay script writes keys and request contexts."""

    def key(self, key: object) -> str: ...
    def ctx(self, request: int) -> str: ...


def _keys_text(spelling: Spelling, keys: Iterable[object]) -> str:
    return "[" + ", ".join(spelling.key(k) for k in keys) + "]"


class Operation(abc.ABC):
    """One manager call with its arguments (see the comment above)."""

    __slots__ = ()

    #: The manager method this operation calls.
    method: ClassVar[str]
    #: The kind of value the call returns.
    answer: ClassVar[Answer] = Answer.NOTHING

    @property
    def keys_mentioned(self) -> tuple[OffloadKey, ...]:
        """The keys named in the call (for checks that look at each)."""
        return ()

    @property
    def context_of(self) -> int | None:
        """The request whose context the call carries (None: no context)."""
        return None

    @abc.abstractmethod
    def apply_to(self, model: M) -> tuple[M, Result]:
        """Perform this call on ``model``: the new model and the result."""

    @abc.abstractmethod
    def call(self, manager: Any, ctx: Any) -> object:
        """Make this call on ``manager`` with request context ``ctx``."""

    @abc.abstractmethod
    def render(self, spelling: Spelling) -> str:
        """This call as a line of a replay script (manager ``m``)."""

    def table_calls(self, before: Any, result: Result, key: OffloadKey) -> list[Call]:
        """The lifecycle-table calls this call makes on ``key``, in order,
        given the state ``before`` it and its ``result``."""
        return []


@attrs.frozen
class KeyListOperation(Operation):
    """A call that takes a list of keys (the kit shrinks such lists) and a
    request's context (``request``, keyword only)."""

    keys: tuple[OffloadKey, ...]
    request: int = attrs.field(default=0, kw_only=True)

    @property
    def keys_mentioned(self) -> tuple[OffloadKey, ...]:
        return self.keys

    @property
    def context_of(self) -> int | None:
        return self.request


@attrs.frozen
class Lookup(Operation):
    key: OffloadKey
    request: int = attrs.field(default=0, kw_only=True)

    method = "lookup"
    answer = Answer.LOOKUP

    @property
    def keys_mentioned(self) -> tuple[OffloadKey, ...]:
        return (self.key,)

    @property
    def context_of(self) -> int | None:
        return self.request

    def apply_to(self, model: M) -> tuple[M, Result]:
        return model.lookup(self.key, request=self.request)

    def call(self, manager: Any, ctx: Any) -> object:
        return manager.lookup(self.key, ctx)

    def render(self, spelling: Spelling) -> str:
        return f"m.lookup({spelling.key(self.key)}, {spelling.ctx(self.request)})"


@attrs.frozen
class LookupPrefix(KeyListOperation):
    method = "lookup_prefix"
    answer = Answer.PREFIX

    def apply_to(self, model: M) -> tuple[M, Result]:
        return model.lookup_prefix(self.keys, request=self.request)

    def call(self, manager: Any, ctx: Any) -> object:
        return manager.lookup_prefix(list(self.keys), ctx)

    def render(self, spelling: Spelling) -> str:
        return f"m.lookup_prefix({_keys_text(spelling, self.keys)}, {spelling.ctx(self.request)})"


@attrs.frozen
class PrepareStore(KeyListOperation):
    """``prepare_store``; ``victims``/``slots``: the implementation's choices
    for the model to check (None: the model chooses)."""

    victims: tuple[OffloadKey, ...] | None = None
    slots: tuple[int, ...] | None = None

    method = "prepare_store"
    answer = Answer.STORE

    def apply_to(self, model: M) -> tuple[M, Result]:
        return model.prepare_store(
            self.keys, victims=self.victims, slots=self.slots, request=self.request
        )

    def call(self, manager: Any, ctx: Any) -> object:
        return manager.prepare_store(list(self.keys), ctx)

    def render(self, spelling: Spelling) -> str:
        return f"m.prepare_store({_keys_text(spelling, self.keys)}, {spelling.ctx(self.request)})"

    def table_calls(self, before: Any, result: Result, key: OffloadKey) -> list[Call]:
        if not isinstance(result, StoreResult):
            return []
        if key in result.keys_to_store:
            return [Call.PREPARE_STORE]
        if key in result.evicted:
            return [Call.EVICT]
        if key in before.passed_keys(self.keys) and key in before.core.blocks:
            return [Call.PREPARE_STORE]
        return []


@attrs.frozen
class CompleteStore(KeyListOperation):
    success: bool = True

    method = "complete_store"

    def apply_to(self, model: M) -> tuple[M, Result]:
        return model.complete_store(self.keys, self.success, request=self.request)

    def call(self, manager: Any, ctx: Any) -> object:
        return manager.complete_store(list(self.keys), ctx, self.success)

    def render(self, spelling: Spelling) -> str:
        return (
            f"m.complete_store({_keys_text(spelling, self.keys)}, {spelling.ctx(self.request)}, "
            f"success={self.success})"
        )

    def table_calls(self, before: Any, result: Result, key: OffloadKey) -> list[Call]:
        if key not in self.keys:
            return []
        core = before.core
        if core.profile.complete_store_ignores_absent and key not in core.blocks:
            return []  # the profile makes it a no-op, not a table call
        return [Call.COMPLETE_STORE_OK if self.success else Call.COMPLETE_STORE_FAILED]


@attrs.frozen
class PrepareLoad(KeyListOperation):
    method = "prepare_load"
    answer = Answer.LOAD_SPEC

    def apply_to(self, model: M) -> tuple[M, Result]:
        return model.prepare_load(self.keys, request=self.request)

    def call(self, manager: Any, ctx: Any) -> object:
        return manager.prepare_load(list(self.keys), ctx)

    def render(self, spelling: Spelling) -> str:
        return f"m.prepare_load({_keys_text(spelling, self.keys)}, {spelling.ctx(self.request)})"

    def table_calls(self, before: Any, result: Result, key: OffloadKey) -> list[Call]:
        return [Call.PREPARE_LOAD] * self.keys.count(key)


@attrs.frozen
class CompleteLoad(KeyListOperation):
    method = "complete_load"

    def apply_to(self, model: M) -> tuple[M, Result]:
        return model.complete_load(self.keys)

    def call(self, manager: Any, ctx: Any) -> object:
        return manager.complete_load(list(self.keys), ctx)

    def render(self, spelling: Spelling) -> str:
        return f"m.complete_load({_keys_text(spelling, self.keys)}, {spelling.ctx(self.request)})"

    def table_calls(self, before: Any, result: Result, key: OffloadKey) -> list[Call]:
        return [Call.COMPLETE_LOAD] * self.keys.count(key)


@attrs.frozen
class Touch(KeyListOperation):
    method = "touch"

    def apply_to(self, model: M) -> tuple[M, Result]:
        return model.touch(self.keys)

    def call(self, manager: Any, ctx: Any) -> object:
        return manager.touch(list(self.keys), ctx)

    def render(self, spelling: Spelling) -> str:
        return f"m.touch({_keys_text(spelling, self.keys)}, {spelling.ctx(self.request)})"

    def table_calls(self, before: Any, result: Result, key: OffloadKey) -> list[Call]:
        return [Call.TOUCH] if key in self.keys else []


@attrs.frozen
class ResetCache(Operation):
    method = "reset_cache"

    def apply_to(self, model: M) -> tuple[M, Result]:
        return model.reset_cache()

    def call(self, manager: Any, ctx: Any) -> object:
        return manager.reset_cache()

    def render(self, spelling: Spelling) -> str:
        return "m.reset_cache()"

    def table_calls(self, before: Any, result: Result, key: OffloadKey) -> list[Call]:
        # a reset the model allowed with loads in flight (reset_with_loads:
        # the engine flushed them; a tiered manager: its own cascade pins,
        # released after draining) ends those loads, then resets the key
        block = before.core.blocks.get(key)
        loads = 0 if block is None else block.phase.loads
        return [Call.COMPLETE_LOAD] * loads + [Call.RESET]


@attrs.frozen
class TakeEvents(Operation):
    method = "take_events"
    answer = Answer.EVENTS

    def apply_to(self, model: M) -> tuple[M, Result]:
        return model.take_events()

    def call(self, manager: Any, ctx: Any) -> object:
        return list(manager.take_events())

    def render(self, spelling: Spelling) -> str:
        return "list(m.take_events())"


@attrs.frozen
class StartRequest(Operation):
    """``on_new_request``: the engine first sees request ``request``."""

    request: int

    method = "on_new_request"

    @property
    def context_of(self) -> int | None:
        return self.request

    def apply_to(self, model: M) -> tuple[M, Result]:
        return model.start_request(self.request)

    def call(self, manager: Any, ctx: Any) -> object:
        return manager.on_new_request(ctx)

    def render(self, spelling: Spelling) -> str:
        return f"m.on_new_request({spelling.ctx(self.request)})"


@attrs.frozen
class FinishRequest(Operation):
    """``on_request_finished``: request ``request`` is done; no call names
    it afterwards."""

    request: int

    method = "on_request_finished"

    @property
    def context_of(self) -> int | None:
        return self.request

    def apply_to(self, model: M) -> tuple[M, Result]:
        return model.finish_request(self.request)

    def call(self, manager: Any, ctx: Any) -> object:
        return manager.on_request_finished(ctx)

    def render(self, spelling: Spelling) -> str:
        return f"m.on_request_finished({spelling.ctx(self.request)})"


@attrs.frozen
class ScheduleEnd(Operation):
    """``on_schedule_end``: the end of one scheduler step."""

    method = "on_schedule_end"

    def apply_to(self, model: M) -> tuple[M, Result]:
        return model.schedule_end()

    def call(self, manager: Any, ctx: Any) -> object:
        return manager.on_schedule_end()

    def render(self, spelling: Spelling) -> str:
        return "m.on_schedule_end()"


Result = Union[
    bool, LookupResult, int, StoreResult, tuple[int, ...], tuple[OffloadingEvent, ...], None
]
"""What a call returns (see the module docstring)."""


def dedup(keys: Iterable[OffloadKey]) -> tuple[OffloadKey, ...]:
    """``keys`` without repeats, in first-occurrence order."""
    return tuple(dict.fromkeys(keys))


def apply_events(
    view: frozenset[OffloadKey], events: Iterable[OffloadingEvent]
) -> frozenset[OffloadKey]:
    """What a consumer holding ``view`` holds after applying ``events``."""
    for event in events:
        view = view - frozenset(event.keys) if event.removed else view | frozenset(event.keys)
    return view


@attrs.frozen
class RequestRecord:
    """What one open request used, kept under request-scoped recency
    (``RecencyCommit.REQUEST_END``) until it finishes: the keys it loaded or
    offered (``seen``, first use first), those it stored (``inserted``),
    the stored ones it used again (``reused``: loaded, or offered while
    readable, unless it stored them itself) and the keys whose store misses
    its policy has already seen (``store_missed``)."""

    seen: tuple[OffloadKey, ...] = ()
    inserted: frozenset[OffloadKey] = frozenset()
    reused: frozenset[OffloadKey] = frozenset()
    store_missed: frozenset[OffloadKey] = frozenset()

    def seeing(self, keys: Iterable[OffloadKey]) -> RequestRecord:
        known = set(self.seen)
        added = tuple(k for k in dict.fromkeys(keys) if k not in known)
        return attrs.evolve(self, seen=self.seen + added) if added else self

    def reusing(self, keys: Iterable[OffloadKey]) -> RequestRecord:
        again = frozenset(k for k in keys if k not in self.inserted)
        return attrs.evolve(self, reused=self.reused | again) if again else self

    def order(self) -> tuple[OffloadKey, ...]:
        """The keys used, KV group by KV group (ascending group index), each
        group in first-use order: the order a request's uses commit in."""
        return tuple(sorted(self.seen, key=get_offload_group_idx))


_NO_USE = RequestRecord()


Batch = tuple[int, tuple[OffloadKey, ...]]
"""A tiered manager's batch of keys for one request: ``(request, keys)``."""

TierJob = tuple[int, bool, int, tuple[OffloadKey, ...]]
"""A tier job submitted and not yet taken, under ``TierPoll.CALLS``:
``(tier, is_promotion, request, keys)``."""


def _batched(batches: tuple[Batch, ...], request: int, keys: Sequence[OffloadKey]) -> tuple[
    Batch, ...
]:
    """``batches`` with ``keys`` appended to ``request``'s batch (a new batch
    last when the request has none): one tier job per request."""
    for index, (owner, held) in enumerate(batches):
        if owner == request:
            return (*batches[:index], (owner, held + tuple(keys)), *batches[index + 1 :])
    return (*batches, (request, tuple(keys)))


def _fresh_slots(model: ManagerModel) -> tuple[int, ...]:
    return tuple(range(model.num_blocks))


@attrs.frozen
class ManagerModel:
    """One state of an offloading manager (see the module docstring)."""

    num_blocks: int
    policy: PolicyModel
    block_size: int = 16
    enable_events: bool = False
    medium: str = "CPU"
    profile: Profile = DEFAULT
    blocks: FrozenMap[OffloadKey, Block] = FrozenMap()
    fresh: tuple[int, ...] = attrs.field(
        default=attrs.Factory(_fresh_slots, takes_self=True)
    )
    free_list: tuple[int, ...] = ()
    events: tuple[OffloadingEvent, ...] = ()
    consumer_view: frozenset[OffloadKey] = frozenset()
    requests: FrozenMap[int, RequestRecord] = FrozenMap()
    # --- a tiered manager's state (profile.secondary_tiers >= 1) ---
    #: keys the secondary tiers hold (every block cascaded to them)
    below: frozenset[OffloadKey] = frozenset()
    #: promotions started and not yet completed: (request, keys) batches
    promoting: tuple[Batch, ...] = ()
    #: write-through cascades submitted and not yet taken
    cascading: tuple[Batch, ...] = ()
    #: write-back cascades batched until the step's end
    write_back: tuple[Batch, ...] = ()
    #: under ``TierPoll.CALLS``: jobs submitted and not yet taken, in
    #: submission order (write-through cascades, submitted promotions)
    in_flight: tuple[TierJob, ...] = ()
    #: under ``TierPoll.CALLS``: the step's poll gate is closed (a poll ran
    #: since the last ``on_schedule_end``)
    polled: bool = False
    #: under ``reset_holds_promotions``: a reset's promotions are held
    held: bool = False

    @classmethod
    def create(
        cls,
        num_blocks: int,
        policy: str | PolicyModel = "lru",
        *,
        block_size: int = 16,
        enable_events: bool = False,
        profile: Profile = DEFAULT,
    ) -> ManagerModel:
        """An empty manager with ``num_blocks`` slots and the named policy
        (``"lru"``, ``"arc"``, ``"any"``) or the given policy model, keeping
        the conventions of ``profile``.

        Raises :class:`ConfigurationError` for ``num_blocks < 1``,
        ``block_size < 1``, a negative ``secondary_tiers`` or
        ``max_promotions_in_flight`` or an unknown policy name.
        """
        if num_blocks < 1:
            raise ConfigurationError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ConfigurationError(f"block_size must be >= 1, got {block_size}")
        bound = profile.max_promotions_in_flight
        if profile.secondary_tiers < 0 or (bound is not None and bound < 0):
            raise ConfigurationError(
                "secondary_tiers and max_promotions_in_flight must be >= 0, got "
                f"{profile.secondary_tiers} and {profile.max_promotions_in_flight}"
            )
        model = policy if not isinstance(policy, str) else make_policy(policy, num_blocks, profile)
        return cls(
            num_blocks=num_blocks,
            policy=model,
            block_size=block_size,
            enable_events=enable_events,
            profile=profile,
        )

    # --- queries (pure, no result model) ---------------------------------

    @property
    def core(self) -> ManagerModel:
        """The manager model itself (a reuse filter's is its backing)."""
        return self

    def passed_keys(self, keys: tuple[OffloadKey, ...]) -> tuple[OffloadKey, ...]:
        """The keys a ``prepare_store(keys)`` offers the manager: all."""
        return keys

    def phase(self, key: OffloadKey) -> Phase:
        """The phase of ``key`` (ABSENT if untracked)."""
        block = self.blocks.get(key)
        return ABSENT if block is None else block.phase

    def slot(self, key: OffloadKey) -> int | None:
        """The slot of ``key``, ``None`` if untracked."""
        block = self.blocks.get(key)
        return None if block is None else block.slot

    def readable_keys(self) -> frozenset[OffloadKey]:
        """The keys whose ``lookup`` is True (READY or LOADING)."""
        return frozenset(k for k, b in self.blocks.items() if b.phase.readable)

    def free_count(self) -> int:
        """How many slots are free."""
        return len(self.fresh) + len(self.free_list)

    def eligible_victims(self, offered: Iterable[OffloadKey]) -> tuple[OffloadKey, ...]:
        """READY keys outside ``offered``, in ascending slot order."""
        protected = frozenset(offered)
        ready = [
            (b.slot, k)
            for k, b in self.blocks.items()
            if b.phase.evictable and k not in protected
        ]
        return tuple(k for _, k in sorted(ready))

    def ready_prefix(self, keys: Iterable[OffloadKey]) -> int:
        """How many keys from the first are READY or LOADING."""
        hits = 0
        for key in keys:
            if not self.phase(key).readable:
                break
            hits += 1
        return hits

    @property
    def tiered(self) -> bool:
        """Whether the profile describes a tiered manager."""
        return self.profile.secondary_tiers > 0

    def promoting_keys(self) -> frozenset[OffloadKey]:
        """The keys being promoted (PENDING, not the caller's to complete):
        batched, or submitted and not yet taken."""
        batched = frozenset(k for _, keys in self.promoting for k in keys)
        return batched | self.submitted_promotions()

    def submitted_promotions(self) -> frozenset[OffloadKey]:
        """Under ``TierPoll.CALLS``: the keys of promotions submitted and
        not yet taken (the next poll completes them)."""
        return frozenset(k for _, promotion, _, keys in self.in_flight if promotion for k in keys)

    def cascade_pins(self, key: OffloadKey) -> int:
        """How many of ``key``'s loads are a tiered manager's cascades (one
        per tier while its copy is in flight), not the caller's."""
        for batches in (self.cascading, self.write_back):
            for _, keys in batches:
                if key in keys:
                    return self.profile.secondary_tiers
        return sum(1 for _, promotion, _, keys in self.in_flight if not promotion and key in keys)

    @property
    def promotion_bound(self) -> int:
        """The most keys a tiered manager promotes at once (no bound: every
        slot)."""
        bound = self.profile.max_promotions_in_flight
        if bound is None:
            return self.num_blocks
        return bound if bound > 0 else max(1, self.num_blocks // 4)

    @property
    def polls_at_calls(self) -> bool:
        """Whether a tiered manager takes its tiers' jobs at its calls
        (``TierPoll.CALLS``)."""
        return self.tiered and self.profile.tier_poll is TierPoll.CALLS

    def poll(self) -> ManagerModel:
        """Under ``TierPoll.CALLS``, a poll: every job in flight is taken,
        tier by tier in submission order (a promotion's keys become READY,
        one ``stored`` event per job; a cascade releases its pin), and the
        step's gate closes."""
        model = self
        for tier in range(self.profile.secondary_tiers):
            for owner, promotion, _, keys in self.in_flight:
                if owner != tier:
                    continue
                if promotion:
                    model = model._complete_store(keys, True, Call.COMPLETE_STORE_OK)[0]
                else:
                    model = model._complete_load(keys)[0]
        return attrs.evolve(model, in_flight=(), polled=True)

    def drained(self) -> ManagerModel:
        """Under ``TierPoll.CALLS``, what ``reset_cache`` starts with: the
        tiers drained and their cascades taken (pins released); the
        promotions in flight are dropped with the primary, unannounced."""
        cascades = tuple(job for job in self.in_flight if not job[1])
        return attrs.evolve(self, in_flight=cascades).poll()

    def poll_for(self, op: Operation) -> ManagerModel:
        """The model after the poll the call ``op`` starts with (this model
        when it starts with none): under ``TierPoll.CALLS``, every
        ``prepare_store`` and ``reset_cache``, and a ``lookup`` /
        ``lookup_prefix`` / ``on_schedule_end`` while the step's gate is
        open."""
        if not self.polls_at_calls:
            return self
        if isinstance(op, ResetCache):
            return self.drained()
        if isinstance(op, PrepareStore):
            return self.poll()
        if isinstance(op, (Lookup, LookupPrefix, ScheduleEnd)) and not self.polled:
            return self.poll()
        return self

    def new_keys(self, keys: Iterable[OffloadKey]) -> tuple[OffloadKey, ...]:
        """The offered keys a ``prepare_store`` would store: ABSENT, offer
        order, no repeats."""
        return tuple(k for k in dedup(keys) if self.blocks.get(k) is None)

    # --- calls ------------------------------------------------------------

    def lookup(
        self, key: OffloadKey, *, request: int = 0
    ) -> tuple[ManagerModel, bool | LookupResult | None]:
        """True iff ``key`` is READY or LOADING. Under a profile answering
        ``LookupAnswer.RESULT``: ``HIT`` (READY, LOADING), ``HIT_PENDING``
        (PENDING) or ``MISS``.

        A tiered manager (``profile.secondary_tiers``): an ABSENT key the
        tiers hold starts a promotion (:meth:`_promote`) and answers None
        (``HIT_PENDING``), as does a key being promoted; a promotion refused
        (bound, no room) is a miss."""
        validate_offload_key(key)
        return self._lookup((key,), request)

    def _lookup(
        self, chain: tuple[OffloadKey, ...], request: int
    ) -> tuple[ManagerModel, bool | LookupResult | None]:
        """``lookup`` of ``chain[-1]``, the keys before it being the ready
        keys of the chain it ends (what a promotion offers along under
        ``promotion_offers_chain``)."""
        if self.polls_at_calls and not self.polled:
            return self.poll()._lookup(chain, request)
        key = chain[-1]
        phase = self.phase(key)
        if self.tiered and self.held and phase == ABSENT:
            held: bool | LookupResult = False
            if self.profile.lookup_answer is LookupAnswer.RESULT:
                held = LookupResult.MISS
            return self, held
        if self.tiered and not phase.readable and (phase == ABSENT or key in self.promoting_keys()):
            model, started = self._promote_run(chain, len(chain) - 1, request)
            if self.profile.lookup_answer is LookupAnswer.BOOL:
                return model, None if started else False
            return model, LookupResult.HIT_PENDING if started else LookupResult.MISS
        if self.profile.lookup_answer is LookupAnswer.BOOL:
            return self, phase.readable
        if phase.readable:
            return self, LookupResult.HIT
        return self, LookupResult.HIT_PENDING if phase == PENDING else LookupResult.MISS

    @property
    def request_scoped(self) -> bool:
        """Whether uses commit when a request finishes (the profile's
        ``recency_commit`` is ``REQUEST_END``)."""
        return self.profile.recency_commit is RecencyCommit.REQUEST_END

    def record(self, request: int) -> RequestRecord:
        """What ``request`` used so far (empty if it used nothing)."""
        return self.requests.get(request, _NO_USE)

    def offered(self, keys: Sequence[OffloadKey], request: int = 0) -> ManagerModel:
        """What an offer of ``keys`` by ``request`` records before any room
        is sought: the model a refused ``prepare_store(keys)`` leaves
        (invariant 4). Under the default profile, nothing. Under
        request-scoped recency, the request's record notes the new keys and
        the readable ones (in offer order; the readable ones as reused), and
        the new keys not yet missed by this request are store misses: the
        policy sees them as a ``touch`` would (ARC adapts its target for a
        ghost key; nothing else changes, as new keys are untracked)."""
        if not self.request_scoped:
            return self
        new = frozenset(self.new_keys(keys))
        record = self.record(request)
        misses = tuple(k for k in dedup(keys) if k in new and k not in record.store_missed)
        readable = [k for k in keys if self.phase(k).readable]
        record = record.seeing(k for k in keys if k in new or self.phase(k).readable)
        record = attrs.evolve(
            record.reusing(readable), store_missed=record.store_missed | frozenset(misses)
        )
        policy = self.policy.touched(misses, frozenset()) if misses else self.policy
        return attrs.evolve(self, policy=policy, requests=self.requests.set(request, record))

    def lookup_prefix(
        self, keys: Iterable[OffloadKey], *, request: int = 0
    ) -> tuple[ManagerModel, int | None]:
        """Length of the longest prefix of READY/LOADING keys.

        A tiered manager walks on past that prefix through the keys being
        promoted, the READY/LOADING ones and the ABSENT ones the tiers hold,
        up to the first key that is none of these (a GPU store in flight, a
        key no tier holds, an ABSENT key past the promotion bound); it starts the promotions of the ABSENT ones
        (:meth:`_promote`) and answers None when a key on the way is being
        promoted or a promotion started, else the ready prefix."""
        listed = validate_offload_keys(keys)
        if self.polls_at_calls and not self.polled and listed:
            return self.poll().lookup_prefix(listed, request=request)
        hits = self.ready_prefix(listed)
        if not self.tiered or hits == len(listed):
            return self, hits
        if not self.profile.prefix_walks_promotions:
            model, answer = self._lookup(tuple(listed[: hits + 1]), request)
            return model, None if answer is None or answer is LookupResult.HIT_PENDING else hits
        if self.held:
            return self, hits
        model, ask_again = self._promote_run(tuple(listed), hits, request)
        return model, None if ask_again else hits

    def _promote_run(
        self, keys: tuple[OffloadKey, ...], start: int, request: int
    ) -> tuple[ManagerModel, bool]:
        """A tiered manager's walk of ``keys`` from ``start`` (see
        :meth:`lookup_prefix`): the model with the promotions started, and
        whether the caller must ask again."""
        promoting = self.promoting_keys()
        room = self.promotion_bound - len(promoting)
        ask_again = False
        wanted: dict[OffloadKey, None] = {}
        end = start
        for position in range(start, len(keys)):
            key = keys[position]
            if key in promoting:
                ask_again = True
            elif key not in wanted:
                block = self.blocks.get(key)
                if block is None:
                    if key not in self.below:
                        break  # no tier holds it
                    if len(wanted) >= room:
                        break  # past the bound: a miss from here on
                    wanted[key] = None
                elif block.phase == PENDING:
                    break  # a GPU store in flight: not readable yet
            end = position + 1
        if not wanted:
            return self, ask_again
        model, started = self._promote(keys[:end], tuple(wanted), request, len(promoting))
        return model, ask_again or started

    def _promote(
        self,
        prefix: tuple[OffloadKey, ...],
        wanted: tuple[OffloadKey, ...],
        request: int,
        in_flight: int,
    ) -> tuple[ManagerModel, bool]:
        """Start promotions of the first ``wanted`` keys the bound allows:
        one ``prepare_store`` of ``prefix`` up to the last of them (the
        prefix's other keys are offered along, so they are protected from
        its evictions); refused, a ``prepare_store`` up to the first of them
        alone. The promoted keys are PENDING, batched per request until the
        step's end. Returns whether any started."""
        chosen = wanted[: max(0, self.promotion_bound - in_flight)]
        if not chosen:
            return self, False
        if not self.profile.promotion_offers_chain:
            # each key offered alone (vLLM 0.33's prepare_write([key])): a
            # promotion's victims may be keys of the chain before it
            model: ManagerModel = self
            started: list[OffloadKey] = []
            for key in chosen:
                model, alone = model._prepare_store((key,), request=request)
                if alone is None:
                    break
                started.append(key)
            if not started:
                return model, False
            return attrs.evolve(
                model, promoting=_batched(model.promoting, request, started)
            ), True
        model, result = self._prepare_store(
            prefix[: prefix.index(chosen[-1]) + 1], request=request
        )
        if result is None and len(chosen) > 1:
            chosen = chosen[:1]
            model, result = model._prepare_store(
                prefix[: prefix.index(chosen[0]) + 1], request=request
            )
        if result is None:
            return model, False
        return attrs.evolve(model, promoting=_batched(model.promoting, request, chosen)), True

    def prepare_store(
        self,
        keys: Sequence[OffloadKey],
        *,
        victims: Sequence[OffloadKey] | None = None,
        slots: Iterable[SupportsIndex] | None = None,
        request: int = 0,
    ) -> tuple[ManagerModel, StoreResult | None]:
        """Make the ABSENT offered keys PENDING, evicting READY keys not
        offered if free slots do not suffice.

        Raises :class:`InvalidKeyError` for a key that is not ``bytes`` of at
        least 4 bytes. ``None`` (and :meth:`offered`'s model: under the
        default profile this very model) when fewer than ``need = |new| -
        free`` eligible victims exist. ``victims``/``slots``:
        the implementation's choices, checked (:class:`SpecViolation`).
        """
        offered = dedup(validate_offload_keys(keys))
        model = self.poll() if self.polls_at_calls else self
        return model.offered(offered, request)._store(offered, victims, slots, request)

    def _prepare_store(
        self, keys: Sequence[OffloadKey], *, request: int = 0
    ) -> tuple[ManagerModel, StoreResult | None]:
        """A promotion's ``prepare_store`` in the primary (no poll)."""
        offered = dedup(keys)
        return self.offered(offered, request)._store(offered, None, None, request)

    def _store(
        self,
        offered: tuple[OffloadKey, ...],
        victims: Sequence[OffloadKey] | None,
        slots: Iterable[SupportsIndex] | None,
        request: int,
    ) -> tuple[ManagerModel, StoreResult | None]:
        given_slots = None if slots is None else tuple(slots)
        new = self.new_keys(offered)
        if not new:
            if victims or given_slots:
                raise SpecViolation(
                    Invariant.STORE_SPEC, "nothing to store, yet victims or slots were given"
                )
            return self, StoreResult((), (), ())
        need = len(new) - self.free_count()
        eligible = self.eligible_victims(offered)
        chosen: tuple[OffloadKey, ...] = ()
        if need > 0:
            if victims is None:
                picked = self.policy.choose_victims(need, eligible)
                if picked is None:
                    return self, None
                chosen = picked
            else:
                reason = self.policy.check_victims(victims, need, eligible)
                if reason is not None:
                    raise SpecViolation(Invariant.EVICTION, reason)
                chosen = tuple(victims)
        elif victims:
            raise SpecViolation(
                Invariant.LIVENESS, f"free slots sufficed, yet {tuple(victims)!r} were evicted"
            )

        blocks = self.blocks.without(chosen)
        free_list = self.free_list + tuple(self.blocks[k].slot for k in chosen)
        events = self.events
        if chosen and self.enable_events:
            events += (self._event(chosen, removed=True),)

        fresh = self.fresh
        if given_slots is None:
            from_fresh = fresh[: len(new)]
            reused = len(new) - len(from_fresh)
            taken = from_fresh + tuple(reversed(free_list))[:reused]
            fresh = fresh[len(from_fresh) :]
            free_list = free_list[: len(free_list) - reused]
        else:
            try:
                taken = tuple(operator.index(s) for s in given_slots)
            except TypeError as error:
                raise SpecViolation(Invariant.STORE_SPEC, f"slots {given_slots!r}: {error}") from None
            pool = frozenset(fresh) | frozenset(free_list)
            if len(taken) != len(new) or len(set(taken)) != len(taken):
                raise SpecViolation(
                    Invariant.STORE_SPEC,
                    f"{len(new)} distinct slots were needed, got {taken!r}",
                )
            if not all(s in pool for s in taken):
                raise SpecViolation(
                    Invariant.CAPACITY, f"slots {taken!r} are not all free (free: {sorted(pool)!r})"
                )
            fresh = tuple(s for s in fresh if s not in taken)
            free_list = tuple(s for s in free_list if s not in taken)

        for key, slot in zip(new, taken):
            blocks = blocks.set(key, Block(PENDING, slot))
        requests = self.requests
        if self.request_scoped:
            record = self.record(request)
            record = attrs.evolve(record, inserted=record.inserted | frozenset(new))
            requests = requests.set(request, record)
        model = attrs.evolve(
            self,
            blocks=blocks,
            fresh=fresh,
            free_list=free_list,
            events=events,
            policy=self.policy.evicted(chosen).inserted(new),
            requests=requests,
        )
        return model, StoreResult(new, taken, chosen)

    def complete_store(
        self, keys: Iterable[OffloadKey], success: bool = True, *, request: int = 0
    ) -> tuple[ManagerModel, None]:
        """PENDING keys become READY (``success``, one ``stored`` event) or
        ABSENT (failure: slot freed, no trace); READY/LOADING keys: no-op.

        Raises :class:`IllegalTransitionError` for the first ABSENT key,
        :class:`InvalidArgumentError` when ``success`` is not a ``bool``.

        A tiered manager: a key being promoted is illegal too (its tier job
        completes it); the keys a success made READY are cascaded to every
        tier, each tier's copy pinning them as a load does (LOADING, one pin
        per tier) until the step's end."""
        require_success(success)
        call = Call.COMPLETE_STORE_OK if success else Call.COMPLETE_STORE_FAILED
        keys = dedup(validate_offload_keys(keys))
        if self.tiered and self.promoting:
            promoting = self.promoting_keys()
            for key in keys:
                if key in promoting:
                    raise IllegalTransitionError(key, self.phase(key), call)
        model, changed = self._complete_store(keys, success, call)
        if not (self.tiered and success and changed):
            return model, None
        for _ in range(self.profile.secondary_tiers):
            # a cascade's pin is no use by the request (no request record)
            model = model._pin(changed)
        if self.polls_at_calls:
            jobs = tuple((tier, False, request, changed) for tier in range(self.profile.secondary_tiers))
            return attrs.evolve(
                model, in_flight=model.in_flight + jobs, below=model.below | set(changed)
            ), None
        if self.profile.cascade is Cascade.WRITE_THROUGH:
            cascading = (*model.cascading, (request, changed))
            return attrs.evolve(model, cascading=cascading, below=model.below | set(changed)), None
        return attrs.evolve(model, write_back=_batched(model.write_back, request, changed)), None

    def _complete_store(
        self, keys: tuple[OffloadKey, ...], success: bool, call: Call
    ) -> tuple[ManagerModel, tuple[OffloadKey, ...]]:
        """``complete_store`` in the primary: the model and the keys whose
        phase changed (PENDING ones)."""
        if self.profile.complete_store_ignores_absent:
            keys = tuple(key for key in keys if key in self.blocks)
        targets = {key: apply_call(key, self.phase(key), call)[0] for key in keys}
        changed = tuple(k for k, phase in targets.items() if phase != self.phase(k))
        if success:
            blocks = self.blocks
            for key in changed:
                blocks = blocks.set(key, Block(targets[key], self.blocks[key].slot))
            events = self.events
            if changed and self.enable_events:
                events += (self._event(changed, removed=False),)
            policy = self.policy.made_evictable(changed)
            model = attrs.evolve(self, blocks=blocks, events=events, policy=policy)
        else:
            policy = self.policy
            for key in changed:
                policy = policy.removed(key)
            model = attrs.evolve(
                self,
                blocks=self.blocks.without(changed),
                free_list=self.free_list + tuple(self.blocks[k].slot for k in changed),
                policy=policy,
            )
        return model, changed

    def prepare_load(
        self, keys: Sequence[OffloadKey], *, request: int = 0
    ) -> tuple[ManagerModel, tuple[int, ...]]:
        """Each occurrence of a key adds one load (READY → LOADING(1),
        LOADING(n) → LOADING(n+1)); the result names the keys' slots in call
        order. Raises :class:`IllegalTransitionError` for the first key that
        is not READY or LOADING. Under request-scoped recency the request
        has used (reused) the keys."""
        keys = validate_offload_keys(keys)
        blocks = self._count_loads(keys, Call.PREPARE_LOAD)
        requests = self.requests
        if self.request_scoped:
            record = self.record(request).seeing(keys).reusing(keys)
            requests = requests.set(request, record)
        pinned = tuple(k for k in dedup(keys) if self.phase(k) == READY)
        policy = self.policy.made_unevictable(pinned)
        model = attrs.evolve(self, blocks=blocks, requests=requests, policy=policy)
        return model, tuple(self.blocks[k].slot for k in keys)

    def _pin(self, keys: Sequence[OffloadKey]) -> ManagerModel:
        """A cascade's ``prepare_load`` of ``keys`` (READY/LOADING), recording
        no use by a request."""
        blocks = self._count_loads(keys, Call.PREPARE_LOAD)
        pinned = tuple(k for k in dedup(keys) if self.phase(k) == READY)
        return attrs.evolve(self, blocks=blocks, policy=self.policy.made_unevictable(pinned))

    def complete_load(self, keys: Sequence[OffloadKey]) -> tuple[ManagerModel, None]:
        """Each occurrence of a key removes one load (LOADING(1) → READY).
        Raises :class:`IllegalTransitionError` at the first occurrence that
        finds no load in flight, naming the phase found there."""
        keys = validate_offload_keys(keys)
        if self.cascading or self.write_back or self.in_flight:
            for key, count in Counter(keys).items():
                pins = self.cascade_pins(key)
                if pins and self.phase(key).loads - pins < count:
                    callers = self.phase(key).loads - pins
                    seen = READY if callers <= 0 else self.phase(key)
                    raise IllegalTransitionError(key, seen, Call.COMPLETE_LOAD)
        return self._complete_load(keys)

    def _complete_load(self, keys: Sequence[OffloadKey]) -> tuple[ManagerModel, None]:
        blocks = self._count_loads(keys, Call.COMPLETE_LOAD)
        # a block whose last load completes at its last occurrence in the call
        last = {key: i for i, key in enumerate(keys)}
        released = sorted(
            (k for k in last if blocks[k].phase == READY), key=last.__getitem__
        )
        policy = self.policy.made_evictable(released)
        return attrs.evolve(self, blocks=blocks, policy=policy), None

    def touch(self, keys: Sequence[OffloadKey]) -> tuple[ManagerModel, None]:
        """Recency only (see the policy); unknown keys are ignored."""
        keys = validate_offload_keys(keys)
        pending = frozenset(k for k, b in self.blocks.items() if b.phase == PENDING)
        return attrs.evolve(self, policy=self.policy.touched(tuple(keys), pending)), None

    def reset_cache(self) -> tuple[ManagerModel, None]:
        """Every key ABSENT, every slot free (handed out ascending again), the
        policy emptied; one ``removed`` event for the READY/LOADING keys, in
        ascending slot order. A tiered manager's tiers keep what they hold;
        its batched promotions and write-back cascades are dropped.

        Illegal while a load is in flight (the slot it reads would go to the
        next store): raises :class:`IllegalTransitionError` naming the
        LOADING key of the lowest slot, and nothing changes — unless the
        profile's ``reset_with_loads`` says the engine flushes such loads. A
        tiered manager's cascade pins are not such loads: it drains its tiers
        and releases them itself.
        """
        if self.polls_at_calls:
            model, result = attrs.evolve(self.drained(), polled=False)._reset()
            return attrs.evolve(
                model, polled=False, held=self.profile.reset_holds_promotions
            ), result
        model, result = self._reset()
        if self.tiered and self.profile.reset_holds_promotions:
            model = attrs.evolve(model, held=True)
        return model, result

    def _reset(self) -> tuple[ManagerModel, None]:
        by_slot = sorted((b.slot, k) for k, b in self.blocks.items())
        if not self.profile.reset_with_loads:
            for _, key in by_slot:
                phase = self.blocks[key].phase
                if self.tiered and phase.loads and phase.loads <= self.cascade_pins(key):
                    continue
                apply_call(key, phase, Call.RESET)  # raises for LOADING
        readable = [(s, k) for s, k in by_slot if self.blocks[k].phase.readable]
        events, view = self.events, self.consumer_view
        if self.profile.reset_announce is ResetAnnounce.ENGINE:
            if self.enable_events:
                view = frozenset()  # the engine publishes its own all-cleared event
        elif readable and self.enable_events:
            events += (self._event(tuple(k for _, k in readable), removed=True),)
        model = attrs.evolve(
            self,
            blocks=FrozenMap(),
            fresh=tuple(range(self.num_blocks)),
            free_list=(),
            events=events,
            consumer_view=view,
            policy=self.policy.cleared(),
            requests=FrozenMap((r, _NO_USE) for r in self.requests),
            promoting=(),
            cascading=(),
            write_back=(),
        )
        return model, None

    def take_events(self) -> tuple[ManagerModel, tuple[OffloadingEvent, ...]]:
        """The events since the last call, oldest first; the queue empties."""
        view = apply_events(self.consumer_view, self.events)
        return attrs.evolve(self, events=(), consumer_view=view), self.events

    def start_request(self, request: int) -> tuple[ManagerModel, None]:
        """``on_new_request``: no change, but under request-scoped recency
        the request opens with an empty record."""
        if not self.request_scoped or request in self.requests:
            return self, None
        return attrs.evolve(self, requests=self.requests.set(request, _NO_USE)), None

    def finish_request(self, request: int) -> tuple[ManagerModel, None]:
        """``on_request_finished``: no change, but under request-scoped
        recency the request's uses reach the policy now
        (:meth:`~kvoffload.spec.policies.LRUModel.committed`: its keys, KV
        group by KV group in first-use order; the keys it only stored; the
        stored keys it reused) and its record is dropped."""
        record = self.requests.get(request)
        if record is None:
            return self, None
        policy = self.policy.committed(
            record.order(), record.inserted - record.reused, record.reused
        )
        return attrs.evolve(self, policy=policy, requests=self.requests.without([request])), None

    def schedule_end(self) -> tuple[ManagerModel, None]:
        """``on_schedule_end``: no change, but a tiered manager's poll point:
        its batched jobs are submitted and every job's result is taken, tier
        by tier in submission order (the first tier's: write-through
        cascades, promotions, write-back cascades; the others': cascades).
        A promotion's keys become READY (one ``stored`` event per request's
        batch); a cascade releases its pins; the write-back keys are held
        below from now on."""
        if self.polls_at_calls:
            # poll when the gate is open, then submit the step's promotions
            # (one job per request's batch, from the first tier)
            model = self if self.polled else self.poll()
            jobs = tuple((0, True, request, keys) for request, keys in model.promoting)
            return attrs.evolve(
                model, in_flight=model.in_flight + jobs, promoting=(), polled=False, held=False
            ), None
        if not (self.promoting or self.cascading or self.write_back):
            return attrs.evolve(self, held=False) if self.held else self, None
        model = self
        for tier in range(self.profile.secondary_tiers):
            for _, keys in self.cascading:
                model = model._complete_load(keys)[0]
            if tier == 0:
                for _, keys in self.promoting:
                    model = model._complete_store(keys, True, Call.COMPLETE_STORE_OK)[0]
            for _, keys in self.write_back:
                model = model._complete_load(keys)[0]
        below = model.below.union(*(keys for _, keys in self.write_back))
        return attrs.evolve(
            model, promoting=(), cascading=(), write_back=(), below=below, held=False
        ), None

    def apply(self, op: Operation) -> tuple[ManagerModel, Result]:
        """Perform the call ``op`` describes."""
        return op.apply_to(self)

    # --- helpers ----------------------------------------------------------

    def _event(self, keys: tuple[OffloadKey, ...], *, removed: bool) -> OffloadingEvent:
        return OffloadingEvent(
            keys=keys, block_size=self.block_size, medium=self.medium, removed=removed
        )

    def _count_loads(
        self, keys: Sequence[OffloadKey], call: Call
    ) -> FrozenMap[OffloadKey, Block]:
        """``blocks`` after applying ``call`` once per occurrence, in order;
        the first illegal occurrence raises and nothing is returned."""
        phases: dict[OffloadKey, Phase] = {}
        for key in keys:
            phases[key] = apply_call(key, phases.get(key, self.phase(key)), call)[0]
        blocks = self.blocks
        for key, phase in phases.items():
            blocks = blocks.set(key, Block(phase, self.blocks[key].slot))
        return blocks



__all__ = [
    "Answer",
    "Batch",
    "Block",
    "CallableModel",
    "CompleteLoad",
    "CompleteStore",
    "FinishRequest",
    "FrozenMap",
    "KeyListOperation",
    "Lookup",
    "LookupPrefix",
    "ManagerModel",
    "Operation",
    "PrepareLoad",
    "PrepareStore",
    "RequestRecord",
    "ResetCache",
    "Result",
    "ScheduleEnd",
    "SpecViolation",
    "Spelling",
    "StartRequest",
    "StoreResult",
    "TakeEvents",
    "TierJob",
    "Touch",
    "apply_events",
    "dedup",
]
