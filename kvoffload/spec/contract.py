"""The contract every offloading manager honours (the key-and-request-context interface of vLLM's
``vllm/v1/kv_offload``, 0.21 and later).

The phase rules of each call are in :mod:`kvoffload.spec.lifecycle`; the
invariants a manager keeps are in ``docs/SPEC.md``.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import attrs

from kvoffload.spec.errors import InvalidArgumentError
from kvoffload.spec.keys import OffloadKey

if TYPE_CHECKING:
    from kvoffload.spec.lifecycle import Phase


@attrs.frozen
class ReqContext:
    """Per-request context handed to every manager call."""

    req_id: str = ""
    kv_transfer_params: Mapping[str, object] | None = attrs.field(
        default=None, eq=False, hash=False
    )


def require_context(req_context: object) -> None:
    """Raise :class:`InvalidArgumentError` unless ``req_context`` has a
    ``str`` attribute ``req_id`` (a :class:`ReqContext`, or an engine's own
    context type of the same shape)."""
    if type(req_context) is ReqContext:
        return
    if not isinstance(getattr(req_context, "req_id", None), str):
        raise InvalidArgumentError(
            f"req_context must have a str req_id (a ReqContext), got {req_context!r}"
        )


def require_success(success: object) -> None:
    """Raise :class:`InvalidArgumentError` unless ``success`` is a ``bool``
    (``complete_store(success="no")`` would otherwise read as True)."""
    if type(success) is not bool:
        raise InvalidArgumentError(f"success must be a bool, got {success!r}")


class LookupResult(enum.Enum):
    """``lookup``'s answer under a profile whose ``lookup_answer`` is
    ``RESULT``: the key is readable (``HIT``), its store is in flight
    (``HIT_PENDING``), it is not tracked (``MISS``), or ask again later
    (``RETRY``, always allowed)."""

    MISS = "MISS"
    HIT = "HIT"
    HIT_PENDING = "HIT_PENDING"
    RETRY = "RETRY"


@attrs.frozen
class RequestOffloadingContext:
    """What a manager says about a new request: whether its blocks may be
    offloaded (``store``) and loaded back (``load``)."""

    req_id: str
    store: bool = True
    load: bool = True


class LoadStoreSpec(ABC):
    """Where a worker finds (or puts) the bytes of some blocks."""

    @staticmethod
    @abstractmethod
    def medium() -> str:
        """The medium this spec targets, e.g. ``"CPU"`` or ``"GPU"``."""


@attrs.frozen
class PrepareStoreOutput:
    """Result of a successful :meth:`OffloadingManager.prepare_store`.

    ``keys_to_store`` are the offered keys that were not tracked and now are
    PENDING, in offer order without repeats; ``store_spec`` names their slots
    in that order; ``evicted_keys`` are the victims this call removed, in
    eviction order.
    """

    keys_to_store: tuple[OffloadKey, ...]
    store_spec: LoadStoreSpec
    evicted_keys: tuple[OffloadKey, ...]


@attrs.frozen
class OffloadingEvent:
    """Keys that became readable (``removed=False``) or stopped being readable
    (``removed=True``) in ``medium``."""

    keys: tuple[OffloadKey, ...]
    block_size: int
    medium: str
    removed: bool


def count_hits(answers: Iterable[bool | None]) -> int | None:
    """How ``lookup_prefix`` reads a run of ``lookup`` answers: the hits
    before the first miss, or None ("ask again") when an answer on the way
    is None. ``answers`` is read lazily and only up to the first miss."""
    hits = 0
    for found in answers:
        if found is None:
            return None
        if not found:
            break
        hits += 1
    return hits


class OffloadingManager(ABC):
    """Scheduler-side bookkeeping of offloaded KV blocks.

    Calls that break the lifecycle table raise an
    :class:`~kvoffload.spec.errors.OffloadingError` subclass and change
    nothing. So does every call given a malformed argument: a key that is
    not ``bytes`` of at least 4 bytes, or a bare key or string where a list
    of keys is expected (:class:`~kvoffload.spec.errors.InvalidKeyError`); a
    ``req_context`` without a ``str`` ``req_id`` or a ``success`` that is not
    a ``bool`` (:class:`~kvoffload.spec.errors.InvalidArgumentError`, see
    :func:`require_context` and :func:`require_success`).

    Threads: a manager is not safe under concurrent calls. :attr:`lock`
    guards its whole state; every caller holds it around its calls (all but
    :meth:`shutdown`), and methods never take it themselves (docs/SPEC.md,
    "Threads and the lock").
    """

    @property
    def lock(self) -> AbstractContextManager[object]:
        """A context manager granting exclusive access to this manager's
        state (vLLM 0.33's ``OffloadingManager.lock``).

        Every caller of a manager method except :meth:`shutdown` holds it,
        across as many calls as its reasoning needs (a ``lookup`` hit and the
        ``prepare_load`` that pins it). Methods never enter it, so it need
        not be reentrant and must not be re-entered while held. This default
        is a no-op, for a backend only ever called from one thread; the
        built-in managers return one real :class:`threading.Lock` each.
        """
        return nullcontext()

    @abstractmethod
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """True if ``key`` is offloaded and ready to read, False if not, None
        if the caller should retry later."""

    def lookup_prefix(
        self, keys: Iterable[OffloadKey], req_context: ReqContext
    ) -> int | None:
        """Length of the longest prefix of ``keys`` whose blocks are ready.

        Stops at the first key that is not ready; None if any ``lookup`` on
        the way answered None.
        """
        return count_hits(self.lookup(key, req_context) for key in keys)

    @abstractmethod
    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> LoadStoreSpec:
        """Pin ``keys`` (each READY or LOADING) for reading until
        :meth:`complete_load`, and say where their bytes are."""

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Mark ``keys`` as recently used; the first key ends most recent."""
        return None

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> None:
        """Release one load of each key prepared by :meth:`prepare_load`."""
        return None

    @abstractmethod
    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        """Allocate slots for the offered keys not yet tracked, evicting READY
        blocks if needed; None (and no change at all) if there is no room."""

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        success: bool = True,
    ) -> None:
        """Make PENDING ``keys`` READY (``success``) or drop them (failure)."""
        return None

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """Called when the scheduler first sees a request."""
        require_context(req_context)
        return RequestOffloadingContext(req_id=req_context.req_id)

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Called when a request has finished."""
        require_context(req_context)
        return None

    def on_schedule_end(self) -> None:
        """Called once at the end of each scheduler step."""
        return None

    def take_events(self) -> Iterable[OffloadingEvent]:
        """The events collected since the last call, oldest first."""
        return ()

    def reset_cache(self) -> None:
        """Drop every tracked block. Illegal while a load is in flight
        (:class:`~kvoffload.spec.errors.IllegalTransitionError`, nothing
        changes): complete the loads first."""
        return None

    def shutdown(self) -> None:
        """Release resources held by the manager."""
        return None


class ManagerProtocol(Protocol):
    """The contract as a structural type: what the conformance kit calls.

    A backend written from docs/SPEC.md need not subclass
    :class:`OffloadingManager`: any object with these methods is accepted by
    ``audit``, ``conformance_test`` and ``machine_test_case`` (their factory
    is a ``Callable[[int], ManagerProtocol]``), and type-checks under
    ``mypy --strict``. Parameters are positional (any names) and of any
    type: the kit passes a key as ``bytes`` (an ``OffloadKey``), a list of
    keys as a ``list``, and the request context its ``context_factory``
    builds (:class:`ReqContext` by default), so a backend may annotate them
    as ``bytes``/``list[bytes]``/its own context class or as
    ``OffloadKey``/``Collection[OffloadKey]``/``ReqContext``. The kit reads
    answers by their attributes, so any return type passes the type check;
    the audit judges the values. ``reset_cache`` is called
    unless the profile says ``has_reset=False``.
    """

    def lookup(self, key: Any, req_context: Any, /) -> object: ...

    def lookup_prefix(self, keys: Any, req_context: Any, /) -> object: ...

    def prepare_load(self, keys: Any, req_context: Any, /) -> object: ...

    def touch(self, keys: Any, req_context: Any, /) -> object: ...

    def complete_load(self, keys: Any, req_context: Any, /) -> object: ...

    def prepare_store(self, keys: Any, req_context: Any, /) -> object: ...

    def complete_store(
        self, keys: Any, req_context: Any, success: bool, /
    ) -> object: ...

    def on_new_request(self, req_context: Any, /) -> object: ...

    def on_request_finished(self, req_context: Any, /) -> object: ...

    def on_schedule_end(self) -> object: ...

    def take_events(self) -> Iterable[Any]: ...

    def reset_cache(self) -> object: ...


@runtime_checkable
class InspectableManager(Protocol):
    """Optional introspection a manager offers to the conformance kit.

    Both methods are pure queries: they change no state, recency or counter.
    A manager without them is audited on its outputs alone.
    """

    def phase(self, key: OffloadKey) -> Phase:
        """The lifecycle phase ``key`` is in."""
        ...

    def slot_of(self, key: OffloadKey) -> int | None:
        """The slot of ``key``'s block, None when untracked."""
        ...


@runtime_checkable
class InspectablePolicy(Protocol):
    """Optional: a manager exposes its replacement policy's state, so the kit
    compares it with the policy model after every step (``lru``/``arc``).

    ``policy_state()`` is a pure query returning, for LRU,
    ``{"order": keys least recent first}``; for ARC, ``{"t1": ..., "t2": ...,
    "b1": ..., "b2": ...}`` (each least recent first) and ``"target"`` (the
    adaptive T1 target, a float).
    """

    def policy_state(self) -> Mapping[str, object]:
        """The policy's state (see the class docstring)."""
        ...
