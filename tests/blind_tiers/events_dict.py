"""Design (i): the dict tier of design (a), announcing its contents as
events (``take_events``), the way the CPU tier announces its blocks.

``OffloadingEvent(keys, block_size, medium, removed)``: one ``removed=False``
event per finished store job listing the keys that became readable in it (in
job order), one ``removed=True`` event per submit that evicted, listing the
victims in eviction order. A consumer applying every event in order holds
exactly the keys that read HIT; per key the events alternate stored,
removed, stored... ``block_size`` is the tier's class attribute (tokens per
block: a tier does not know it from its arguments, so it is fixed here).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from kvoffload.spec.contract import OffloadingEvent
from tests.blind_tiers._common import OffloadKey, TierJobLike, TierJobResult
from tests.blind_tiers.dict_poll import DictPollTier, _Queued


class EventsTier(DictPollTier):
    block_size = 16
    medium = "STORAGE"

    def __init__(self, capacity_blocks: int, primary_kv_view: memoryview) -> None:
        super().__init__(capacity_blocks, primary_kv_view)
        self._events: list[OffloadingEvent] = []
        self._evicted_now: list[OffloadKey] = []

    def _event(self, keys: Iterable[OffloadKey], removed: bool) -> None:
        listed = tuple(keys)
        if listed:
            self._events.append(OffloadingEvent(listed, self.block_size, self.medium, removed))

    def _victim(self, protect: Collection[OffloadKey]) -> OffloadKey | None:
        victim = super()._victim(protect)
        if victim is not None:
            self._evicted_now.append(victim)
        return victim

    def submit_store(self, job: TierJobLike) -> None:
        self._evicted_now = []
        super().submit_store(job)
        self._announce_evictions()

    def _announce_evictions(self) -> None:
        self._event(self._evicted_now, removed=True)

    def _finish_store(self, q: _Queued) -> TierJobResult:
        before = set(self._data)
        result = super()._finish_store(q)
        self._announce_stored(q, [k for k, _ in q.copy if k in self._data and k not in before])
        return result

    def _announce_stored(self, q: _Queued, stored: list[OffloadKey]) -> None:
        self._event(stored, removed=False)

    def take_events(self) -> Iterable[OffloadingEvent]:
        out, self._events = self._events, []
        return out


# ---------------------------------------------------------------------------
# Defects.


class AnnouncesFailedKeys(EventsTier):
    """Announces every key the job tried to store, including the ones that
    found no room and were never stored."""

    def _announce_stored(self, q: _Queued, stored: list[OffloadKey]) -> None:
        self._event([k for k, _ in q.copy] + [k for k, _ in q.failed], removed=False)


class SilentEviction(EventsTier):
    """Evicts without announcing it: consumers keep the victims."""

    def _announce_evictions(self) -> None:
        return None


class AnnouncesAtSubmit(EventsTier):
    """Announces the keys to store when the store is submitted, before they
    are copied (and readable)."""

    def submit_store(self, job: TierJobLike) -> None:
        super().submit_store(job)
        queued = self._queue[-1]
        self._event([k for k, _ in queued.copy], removed=False)

    def _announce_stored(self, q: _Queued, stored: list[OffloadKey]) -> None:
        return None


class AnnouncesSkipped(EventsTier):
    """Announces every key the job reports stored, the skipped (already held)
    ones too: a held key is announced stored a second time."""

    def _announce_stored(self, q: _Queued, stored: list[OffloadKey]) -> None:
        self._event(stored + [k for k in q.skipped if k in self._data], removed=False)


def make(capacity_blocks: int, primary_kv_view: memoryview) -> EventsTier:
    return EventsTier(capacity_blocks, primary_kv_view)


def make_announces_failed_keys(capacity_blocks: int, primary_kv_view: memoryview) -> EventsTier:
    return AnnouncesFailedKeys(capacity_blocks, primary_kv_view)


def make_silent_eviction(capacity_blocks: int, primary_kv_view: memoryview) -> EventsTier:
    return SilentEviction(capacity_blocks, primary_kv_view)


def make_announces_at_submit(capacity_blocks: int, primary_kv_view: memoryview) -> EventsTier:
    return AnnouncesAtSubmit(capacity_blocks, primary_kv_view)


def make_announces_skipped(capacity_blocks: int, primary_kv_view: memoryview) -> EventsTier:
    return AnnouncesSkipped(capacity_blocks, primary_kv_view)
