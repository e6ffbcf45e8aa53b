"""The Hypothesis state machine of the conformance kit.

:func:`make_manager_machine` turns a :class:`KitConfig` into a
``RuleBasedStateMachine`` subclass whose rules make every call of the
contract — legal ones, and illegal ones (each must raise, as the profile's
``errors`` says, and change nothing) — and step a :class:`~kvoffload.stateful.harness.Harness` with each.
Requests are first-class: up to ``max_requests`` are open at once, each
call carries one open request's context, and a request finishes
(``on_request_finished``) only when none of its loads and stores is in
flight; no call names it afterwards. The machine keeps the transfers in
flight per request between ``prepare_*`` and ``complete_*``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.lifecycle import PhaseKind
from kvoffload.spec.model import (
    CompleteLoad,
    CompleteStore,
    FinishRequest,
    Lookup,
    LookupPrefix,
    Operation,
    PrepareLoad,
    PrepareStore,
    ResetCache,
    ScheduleEnd,
    StartRequest,
    TakeEvents,
    Touch,
)
from kvoffload.spec.profile import ResetAnnounce
from kvoffload.spec.reuse import ReuseFilterModel
from kvoffload.stateful.harness import Harness, KitConfig, core_of

_TRACKED = (PhaseKind.PENDING, PhaseKind.READY, PhaseKind.LOADING)

BAD_KEYS: tuple[object, ...] = (b"", b"abc", "blk00\x00\x00\x00\x00", 7, None)
"""Offers that are not valid keys: too short, not bytes."""



def _completes_absent(config: Any) -> bool:
    """Whether the kit may complete a store of an ABSENT key: an illegal
    call, or a no-op under ``complete_store_ignores_absent`` — unless the
    engine completes only whole stores (``stores_completed_whole``), when
    such a call is outside its protocol."""
    profile = config.profile
    return not (profile.stores_completed_whole and profile.complete_store_ignores_absent)

class TraceSink:
    """Where a machine leaves its harness, so a caller can read the trace
    of the last (after shrinking: the minimal failing) run."""

    def __init__(self) -> None:
        self.harness: Harness | None = None
        self.steps = 0
        self.runs = 0


@attrs.define
class Transfer:
    """A load or store in flight: the request that made it and its keys."""

    request: int
    keys: tuple[OffloadKey, ...]


class ManagerMachine(RuleBasedStateMachine):
    """Model and manager side by side (configure with
    :func:`make_manager_machine`)."""

    config: ClassVar[KitConfig]
    sink: ClassVar[TraceSink]

    def __init__(self) -> None:
        super().__init__()
        self._harness: Harness | None = None
        self.open_requests: list[int] = []
        self.next_request = 0
        self.stores: list[Transfer] = []
        self.loads: list[Transfer] = []

    @property
    def harness(self) -> Harness:
        if self._harness is None:  # pragma: no cover - initialize runs first
            raise RuntimeError("the machine was not initialised")
        return self._harness

    def _keys(self) -> st.SearchStrategy[OffloadKey]:
        return st.sampled_from(self.config.keys())

    def _offer(self, max_size: int) -> st.SearchStrategy[list[OffloadKey]]:
        """An offer: repeats only where the profile lets an engine repeat."""
        unique = not self.config.profile.offers_repeat_keys
        return st.lists(self._keys(), min_size=1, max_size=max_size, unique=unique)

    def _phase_keys(self, *kinds: PhaseKind) -> list[OffloadKey]:
        core = core_of(self.harness.model)
        return [k for k in self.harness.keys if core.phase(k).kind in kinds]

    def _request(self, data: st.DataObject) -> int:
        """One of the open requests."""
        return data.draw(st.sampled_from(self.open_requests), label="request")

    def step(self, op: Operation) -> None:
        self.sink.steps += 1
        self.harness.step(op)

    def _start_request(self) -> None:
        request = self.next_request
        self.next_request += 1
        self.step(StartRequest(request))
        self.open_requests.append(request)

    def _stored(self, request: int, new: tuple[OffloadKey, ...]) -> None:
        """Keep the keys of ``new`` the last store made PENDING in flight."""
        after = core_of(self.harness.model)
        pending = tuple(k for k in new if after.phase(k).kind is PhaseKind.PENDING)
        if pending:
            self.stores.append(Transfer(request, pending))

    def _in_flight(self, request: int) -> bool:
        """Whether ``request`` has a store or load still in flight (batches
        whose keys a reset or a failure dropped do not count)."""
        core = core_of(self.harness.model)
        for transfer in (*self.stores, *self.loads):
            if transfer.request != request:
                continue
            kinds = {core.phase(k).kind for k in transfer.keys}
            if kinds & {PhaseKind.PENDING, PhaseKind.LOADING}:
                return True
        return False

    # --- set-up and requests ------------------------------------------------

    @initialize(data=st.data())
    def start(self, data: st.DataObject) -> None:
        num_blocks = data.draw(
            st.integers(self.config.min_blocks, self.config.max_blocks), label="num_blocks"
        )
        self._harness = Harness(self.config, num_blocks)
        self.sink.harness = self._harness
        self.sink.runs += 1
        self._start_request()

    @precondition(lambda self: len(self.open_requests) < self.config.max_requests)
    @rule()
    def start_request(self) -> None:
        """A new request arrives (``on_new_request``)."""
        self._start_request()

    @precondition(lambda self: any(not self._in_flight(r) for r in self.open_requests))
    @rule(data=st.data())
    def finish_request(self, data: st.DataObject) -> None:
        """A request with nothing in flight finishes; if it was the last one
        open, the next request arrives."""
        done = [r for r in self.open_requests if not self._in_flight(r)]
        request = data.draw(st.sampled_from(done), label="request")
        self.step(FinishRequest(request))
        self.open_requests.remove(request)
        self.stores = [t for t in self.stores if t.request != request]
        self.loads = [t for t in self.loads if t.request != request]
        if not self.open_requests:
            self._start_request()

    @precondition(
        lambda self: bool(self._phase_keys(PhaseKind.READY))
        and any(not self._in_flight(r) for r in self.open_requests)
    )
    @rule(data=st.data())
    def reuse_and_finish(self, data: st.DataObject) -> None:
        """A request reads stored blocks back and finishes: the use a
        request-scoped policy commits at the finish."""
        done = [r for r in self.open_requests if not self._in_flight(r)]
        request = data.draw(st.sampled_from(done), label="request")
        ready = self._phase_keys(PhaseKind.READY)
        keys = tuple(data.draw(st.permutations(ready), label="keys")[:3])
        self.step(PrepareLoad(keys, request=request))
        self.step(CompleteLoad(keys, request=request))
        self.step(FinishRequest(request))
        self.open_requests.remove(request)
        self.stores = [t for t in self.stores if t.request != request]
        self.loads = [t for t in self.loads if t.request != request]
        if not self.open_requests:
            self._start_request()

    @rule()
    def schedule_end(self) -> None:
        self.step(ScheduleEnd())

    # --- reads --------------------------------------------------------------

    @rule(data=st.data())
    def lookup(self, data: st.DataObject) -> None:
        self.step(Lookup(data.draw(self._keys(), label="key"), request=self._request(data)))

    @rule(data=st.data())
    def lookup_prefix(self, data: st.DataObject) -> None:
        keys = data.draw(st.lists(self._keys(), max_size=6), label="keys")
        self.step(LookupPrefix(tuple(keys), request=self._request(data)))

    @rule(data=st.data())
    def touch(self, data: st.DataObject) -> None:
        keys = data.draw(st.lists(self._keys(), max_size=5), label="keys")
        self.step(Touch(tuple(keys), request=self._request(data)))

    @precondition(lambda self: len(self._phase_keys(*_TRACKED)) >= 2)
    @rule(data=st.data())
    def touch_tracked(self, data: st.DataObject) -> None:
        """Touch an ordering of tracked keys (what an engine touches)."""
        tracked = self._phase_keys(*_TRACKED)
        order = data.draw(st.permutations(tracked), label="order")
        count = data.draw(st.integers(2, len(order)), label="how many")
        self.step(Touch(tuple(order[:count]), request=self._request(data)))

    @precondition(lambda self: bool(self.harness.evicted))
    @rule(data=st.data())
    def touch_evicted(self, data: st.DataObject) -> None:
        """Touch keys evicted earlier: ghost hits for ARC-like policies."""
        recent = list(dict.fromkeys(reversed(self.harness.evicted)))[:4]
        keys = data.draw(st.lists(st.sampled_from(recent), min_size=1, max_size=3))
        self.step(Touch(tuple(keys), request=self._request(data)))

    # --- stores -------------------------------------------------------------

    @rule(data=st.data())
    def prepare_store(self, data: st.DataObject) -> None:
        keys = tuple(data.draw(self._offer(5), label="keys"))
        request = self._request(data)
        new = core_of(self.harness.model).new_keys(keys)
        self.step(PrepareStore(keys, request=request))
        self._stored(request, new)

    @rule(data=st.data())
    def store_and_complete(self, data: st.DataObject) -> None:
        """The common engine flow: prepare a store and complete it at once."""
        keys = tuple(data.draw(self._offer(4), label="keys"))
        request = self._request(data)
        new = core_of(self.harness.model).new_keys(keys)
        self.step(PrepareStore(keys, request=request))
        after = core_of(self.harness.model)
        stored = tuple(k for k in new if after.phase(k).kind is PhaseKind.PENDING)
        if stored:
            self.step(CompleteStore(stored, True, request=request))

    @precondition(
        lambda self: bool(self._phase_keys(PhaseKind.READY))
        and bool(self._phase_keys(PhaseKind.ABSENT))
    )
    @rule(data=st.data())
    def store_chain(self, data: st.DataObject) -> None:
        """Offer stored keys followed by new ones, as a scheduler offers a
        request's chain: the stored ones must stay protected."""
        ready = data.draw(
            st.lists(st.sampled_from(self._phase_keys(PhaseKind.READY)), min_size=1,
                     max_size=3, unique=True), label="stored")
        new = data.draw(
            st.lists(st.sampled_from(self._phase_keys(PhaseKind.ABSENT)), min_size=1,
                     max_size=3, unique=True), label="new")
        request = self._request(data)
        self.step(PrepareStore((*ready, *new), request=request))
        self._stored(request, tuple(new))

    def _filter_split(self) -> tuple[list[OffloadKey], list[OffloadKey]]:
        """Behind a reuse filter: the READY keys the filter would not pass on
        by count (below the threshold) and the ABSENT keys it admits."""
        model = self.harness.model
        if not isinstance(model, ReuseFilterModel):
            return [], []
        below = [
            k for k in self._phase_keys(PhaseKind.READY)
            if model.count(k) < model.store_threshold
        ]
        admitted = [
            k for k in self._phase_keys(PhaseKind.ABSENT)
            if model.count(k) >= model.store_threshold
        ]
        return below, admitted

    @precondition(
        lambda self: isinstance(self.harness.model, ReuseFilterModel)
        and bool(self._phase_keys(PhaseKind.READY))
    )
    @rule(data=st.data())
    def look_up_other_keys(self, data: st.DataObject) -> None:
        """Behind a reuse filter, look up the keys that are not stored (other
        requests' prompts): their counts push stored keys' counts out of the
        filter's table, the case where only protection keeps a stored key."""
        others = self._phase_keys(PhaseKind.ABSENT, PhaseKind.PENDING)
        keys = tuple(data.draw(st.permutations(others), label="keys"))
        self.step(LookupPrefix(keys, request=self._request(data)))

    def _needs_eviction_through_filter(self) -> bool:
        below, admitted = self._filter_split()
        return bool(below) and len(admitted) > core_of(self.harness.model).free_count()

    @precondition(lambda self: self._needs_eviction_through_filter())
    @rule(data=st.data())
    def store_chain_through_filter(self, data: st.DataObject) -> None:
        """Behind a reuse filter, offer stored keys whose counts are below
        the threshold with more keys the filter admits than there are free
        slots: the stored ones must stay protected from the eviction though
        their counts alone would drop them."""
        below, admitted = self._filter_split()
        free = core_of(self.harness.model).free_count()
        stored = data.draw(st.permutations(below), label="stored")[:3]
        new = data.draw(st.permutations(admitted), label="new")
        count = data.draw(st.integers(free + 1, len(new)), label="how many new")
        request = self._request(data)
        self.step(PrepareStore((*stored, *new[:count]), request=request))
        self._stored(request, tuple(new[:count]))

    @precondition(lambda self: bool(self.stores))
    @rule(data=st.data())
    def complete_store(self, data: st.DataObject) -> None:
        """Complete all or part of a store in flight, with success or not;
        the rest stays in flight."""
        index = data.draw(st.integers(0, len(self.stores) - 1), label="store")
        batch = self.stores.pop(index)
        core = core_of(self.harness.model)
        live = [k for k in batch.keys if core.phase(k).kind is not PhaseKind.ABSENT]
        order = data.draw(st.permutations(live), label="order")
        if self.config.profile.stores_completed_whole:
            if not live:
                return  # a reset dropped it: the engine never completes it
            count = len(order)
        else:
            count = data.draw(st.integers(0, len(order)), label="how many")
        success = data.draw(st.booleans(), label="success")
        chosen, rest = tuple(order[:count]), tuple(order[count:])
        self.step(CompleteStore(chosen, success, request=batch.request))
        if rest:
            self.stores.append(Transfer(batch.request, rest))

    # --- a tiered manager's promotions ------------------------------------------

    def _held_below(self) -> list[OffloadKey]:
        """ABSENT keys a tiered manager's tiers hold (promotable)."""
        core = core_of(self.harness.model)
        return [k for k in self._phase_keys(PhaseKind.ABSENT) if k in core.below]

    @precondition(lambda self: bool(self._held_below()))
    @rule(data=st.data())
    def promote(self, data: st.DataObject) -> None:
        """Under a tiered profile, look up keys only a tier holds, after
        readable ones (a request's chain): promotions start, up to the
        bound, evicting READY blocks outside the chain."""
        below = data.draw(
            st.lists(st.sampled_from(self._held_below()), min_size=1, max_size=4, unique=True),
            label="below",
        )
        readable = self._phase_keys(PhaseKind.READY, PhaseKind.LOADING)
        ready = data.draw(
            st.lists(st.sampled_from(readable), max_size=2, unique=True) if readable
            else st.just([]),
            label="ready",
        )
        request = self._request(data)
        if len(below) == 1 and not ready:
            self.step(Lookup(below[0], request=request))
        else:
            self.step(LookupPrefix((*ready, *below), request=request))

    # --- loads --------------------------------------------------------------

    @precondition(lambda self: bool(self._phase_keys(PhaseKind.READY, PhaseKind.LOADING)))
    @rule(data=st.data())
    def prepare_load(self, data: st.DataObject) -> None:
        readable = self._phase_keys(PhaseKind.READY, PhaseKind.LOADING)
        keys = tuple(
            data.draw(st.lists(st.sampled_from(readable), min_size=1, max_size=3), label="keys")
        )
        request = self._request(data)
        self.step(PrepareLoad(keys, request=request))
        self.loads.append(Transfer(request, keys))

    @precondition(lambda self: bool(self.loads))
    @rule(data=st.data())
    def complete_load(self, data: st.DataObject) -> None:
        """Complete all or part of a load batch; the rest stays in flight."""
        index = data.draw(st.integers(0, len(self.loads) - 1), label="load")
        batch = self.loads.pop(index)
        core = core_of(self.harness.model)
        available = Counter(
            {
                k: core.phase(k).loads
                for k in set(batch.keys)
                if core.phase(k).kind is PhaseKind.LOADING
            }
        )
        keys: list[OffloadKey] = []
        for key in batch.keys:
            if available[key] > 0:
                available[key] -= 1
                keys.append(key)
        count = data.draw(st.integers(0, len(keys)), label="how many")
        done, rest = tuple(keys[len(keys) - count :]), tuple(keys[: len(keys) - count])
        self.step(CompleteLoad(done, request=batch.request))
        if rest:
            self.loads.append(Transfer(batch.request, rest))

    # --- the rest -----------------------------------------------------------

    @rule()
    def take_events(self) -> None:
        self.step(TakeEvents())

    @precondition(lambda self: self.config.profile.has_reset)
    @rule()
    def reset_cache(self) -> None:
        if self.config.profile.reset_announce is ResetAnnounce.ENGINE:
            # the engine takes the queued events, resets, then publishes its
            # own all-cleared event
            self.step(TakeEvents())
        self.step(ResetCache())
        if self.config.profile.stores_completed_whole and not core_of(self.harness.model).blocks:
            self.stores.clear()  # the reset dropped them: never completed

    # --- illegal calls (every manager: typed errors or any, as the profile says)

    @precondition(lambda self: bool(self._phase_keys(PhaseKind.ABSENT, PhaseKind.PENDING)))
    @rule(data=st.data())
    def illegal_prepare_load(self, data: st.DataObject) -> None:
        bad = data.draw(st.sampled_from(self._phase_keys(PhaseKind.ABSENT, PhaseKind.PENDING)))
        good = self._phase_keys(PhaseKind.READY, PhaseKind.LOADING)
        keys = [*good[:1], bad]
        self.step(PrepareLoad(tuple(keys), request=self._request(data)))

    @rule(data=st.data())
    def illegal_complete_load(self, data: st.DataObject) -> None:
        idle = self._phase_keys(PhaseKind.ABSENT, PhaseKind.PENDING, PhaseKind.READY)
        loading = self._phase_keys(PhaseKind.LOADING)
        if idle:
            keys = (*loading[:1], data.draw(st.sampled_from(idle)))
        elif loading:
            key = loading[0]
            keys = (key,) * (core_of(self.harness.model).phase(key).loads + 1)
        else:  # pragma: no cover - some key is always in one of those phases
            return
        self.step(CompleteLoad(keys, request=self._request(data)))

    @precondition(
        lambda self: bool(self._phase_keys(PhaseKind.ABSENT)) and _completes_absent(self.config)
    )
    @rule(data=st.data(), success=st.booleans())
    def illegal_complete_store(self, data: st.DataObject, success: bool) -> None:
        absent = data.draw(st.sampled_from(self._phase_keys(PhaseKind.ABSENT)))
        pending = self._phase_keys(PhaseKind.PENDING)
        self.step(CompleteStore((*pending[:1], absent), success, request=self._request(data)))

    @precondition(lambda self: self.config.profile.validates_keys)
    @rule(data=st.data(), bad=st.sampled_from(BAD_KEYS))
    def illegal_prepare_store(self, data: st.DataObject, bad: object) -> None:
        unique = not self.config.profile.offers_repeat_keys
        good = data.draw(st.lists(self._keys(), max_size=2, unique=unique), label="keys")
        keys = (*good, bad)
        self.step(PrepareStore(keys, request=self._request(data)))  # type: ignore[arg-type]

    @invariant()
    def agrees(self) -> None:
        if self._harness is not None:
            self._harness.check_state()

    def teardown(self) -> None:
        """Shut the manager down (a tiered manager's tiers own threads and
        directories)."""
        if self._harness is not None:
            self._harness.close()


def make_manager_machine(
    config: KitConfig, sink: TraceSink | None = None, name: str = "ManagerMachine"
) -> type[ManagerMachine]:
    """A :class:`ManagerMachine` subclass bound to ``config``."""
    namespace = {"config": config, "sink": sink or TraceSink()}
    return type(name, (ManagerMachine,), namespace)
