"""A lifecycle skeleton with the replacement policy left to subclasses.

Used by the heap, append-only-log and random designs. Phases live in a
``refs`` dict (-1 pending, 0 ready, n loads) and slots in a ``slots`` dict.
These managers implement the optional ``InspectableManager`` protocol.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Iterable

from kvoffload import (
    Call,
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    Phase,
    PrepareStoreOutput,
    ReqContext,
)

from ._common import (
    ABSENT,
    SlotPool,
    as_key,
    check_size,
    cpu_spec,
    dedup,
    event,
    illegal,
    phase_of_ref,
    refuse_reset_with_loads,
    store_call,
    validated,
)

Eligible = Callable[[OffloadKey], bool]


class HookedManager(OffloadingManager, abc.ABC):
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = check_size(num_blocks)
        self.refs: dict[OffloadKey, int] = {}
        self.slots: dict[OffloadKey, int] = {}
        self.pool = self._make_pool(num_blocks)
        self.pending_events: list[OffloadingEvent] = []

    def _make_pool(self, num_blocks: int) -> SlotPool:
        return SlotPool(num_blocks)

    # -- policy hooks ----------------------------------------------------
    @abc.abstractmethod
    def policy_insert(self, keys: list[OffloadKey]) -> None: ...

    @abc.abstractmethod
    def policy_touch(self, key: OffloadKey) -> None: ...

    @abc.abstractmethod
    def policy_victims(self, need: int, eligible: Eligible) -> list[OffloadKey] | None:
        """Exactly ``need`` eligible keys, or None; must not change state."""

    @abc.abstractmethod
    def policy_forget(self, key: OffloadKey) -> None: ...

    @abc.abstractmethod
    def policy_clear(self) -> None: ...

    # -- internals -------------------------------------------------------
    def _emit_removed(self, victims: list[OffloadKey]) -> None:
        self.pending_events.append(event(victims, removed=True))

    def _drop(self, key: OffloadKey) -> None:
        del self.refs[key]
        self.pool.give(self.slots.pop(key))
        self.policy_forget(key)

    def _fail_pending(self, key: OffloadKey) -> None:
        self._drop(key)

    def _check_unloads(self, keys: list[OffloadKey]) -> dict[OffloadKey, int]:
        remaining: dict[OffloadKey, int] = {}
        for key in keys:
            ref = remaining[key] if key in remaining else self.refs.get(key)
            if ref is None or ref < 1:
                raise illegal(key, phase_of_ref(ref), Call.COMPLETE_LOAD)
            remaining[key] = ref - 1
        return remaining

    def _reset_announced(self) -> list[OffloadKey]:
        return sorted(
            (k for k, r in self.refs.items() if r >= 0), key=self.slots.__getitem__
        )

    def _check_keys(self, keys: Collection[object]) -> list[OffloadKey]:
        return validated(keys)

    # -- InspectableManager (pure queries) --------------------------------
    def phase(self, key: OffloadKey) -> Phase:
        return phase_of_ref(self.refs.get(key))

    def slot_of(self, key: OffloadKey) -> int | None:
        return self.slots.get(key)

    # -- contract --------------------------------------------------------
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool:
        return isinstance(key, bytes) and self.refs.get(key, -1) >= 0

    def lookup_prefix(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> int:
        hits = 0
        for key in keys:
            if not self.lookup(key, req_context):
                break
            hits += 1
        return hits

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        offered = dedup(self._check_keys(keys))
        new = [k for k in offered if k not in self.refs]
        if not new:
            return PrepareStoreOutput((), cpu_spec([]), ())
        need = len(new) - self.pool.free_count()
        victims: list[OffloadKey] = []
        if need > 0:
            protected = set(offered)
            chosen = self.policy_victims(
                need, lambda k: self.refs.get(k) == 0 and k not in protected
            )
            if chosen is None:
                return None
            victims = chosen
            for key in victims:
                self._drop(key)
            self._emit_removed(victims)
        slots = []
        for key in new:
            self.refs[key] = -1
            self.slots[key] = self.pool.take()
            slots.append(self.slots[key])
        self.policy_insert(new)
        return PrepareStoreOutput(tuple(new), cpu_spec(slots), tuple(victims))

    def complete_store(
        self,
        keys: Collection[OffloadKey],
        req_context: ReqContext,
        success: bool = True,
    ) -> None:
        uniq = dedup(as_key(k) for k in keys)
        for key in uniq:
            if key not in self.refs:
                raise illegal(key, ABSENT, store_call(success))
        pending = [k for k in uniq if self.refs[k] == -1]
        for key in pending:
            if success:
                self.refs[key] = 0
            else:
                self._fail_pending(key)
        if success and pending:
            self.pending_events.append(event(pending, removed=False))

    def prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> LoadStoreSpec:
        seq = [as_key(k) for k in keys]
        for key in seq:
            ref = self.refs.get(key)
            if ref is None or ref < 0:
                raise illegal(key, phase_of_ref(ref), Call.PREPARE_LOAD)
        for key in seq:
            self.refs[key] += 1
        return cpu_spec(self.slots[k] for k in seq)

    def complete_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> None:
        self.refs.update(self._check_unloads([as_key(k) for k in keys]))

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in reversed(list(keys)):
            if isinstance(key, bytes) and key in self.refs:
                self.policy_touch(key)

    def reset_cache(self) -> None:
        refuse_reset_with_loads(self.refs.items())
        announced = self._reset_announced()
        self.refs.clear()
        self.slots.clear()
        self.pool.reset()
        self.policy_clear()
        if announced:
            self._emit_removed(announced)

    def take_events(self) -> Iterable[OffloadingEvent]:
        events, self.pending_events = self.pending_events, []
        return events
