"""Design H: LRU over an append-only log of use records, compacted lazily.

Every insert or touch appends ``(seq, key)`` and records ``last[key] = seq``.
A record is live iff it is the latest of a tracked key, so the live records,
in log order, are the recency order. The log is compacted (live records
only, renumbered) when it grows past twice the tracked keys plus a margin.
"""

from __future__ import annotations

from collections.abc import Collection

from kvoffload import InvalidKeyError, OffloadingManager, OffloadKey

from ._skeleton import Eligible, HookedManager

MARGIN = 6


class LogLRU(HookedManager):
    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.log: list[tuple[int, OffloadKey]] = []
        self.last: dict[OffloadKey, int] = {}
        self.seq = 0

    def _append(self, key: OffloadKey) -> None:
        self.seq += 1
        self.log.append((self.seq, key))
        self._note(key, self.seq)
        if len(self.log) > 2 * len(self.last) + MARGIN:
            self._compact()

    def _note(self, key: OffloadKey, seq: int) -> None:
        self.last[key] = seq

    def _keep(self, seq: int, key: OffloadKey) -> bool:
        return self.last.get(key) == seq

    def _compact(self) -> None:
        live = [key for seq, key in self.log if self._keep(seq, key)]
        self.log = []
        self.seq = 0
        for key in live:
            self.seq += 1
            self.log.append((self.seq, key))
            self.last[key] = self.seq

    def policy_insert(self, keys: list[OffloadKey]) -> None:
        for key in keys:
            self._append(key)

    def policy_touch(self, key: OffloadKey) -> None:
        self._append(key)

    def policy_victims(self, need: int, eligible: Eligible) -> list[OffloadKey] | None:
        victims: list[OffloadKey] = []
        for seq, key in self.log:
            if len(victims) == need:
                break
            if self.last.get(key) == seq and eligible(key):
                victims.append(key)
        return victims if len(victims) == need else None

    def policy_forget(self, key: OffloadKey) -> None:
        del self.last[key]

    def policy_clear(self) -> None:
        self.log = []
        self.last = {}
        self.seq = 0


def make(num_blocks: int) -> OffloadingManager:
    return LogLRU(num_blocks)


# -- defective twins -------------------------------------------------------


class CompactionKeepsStoredOnly(LogLRU):
    def _keep(self, seq: int, key: OffloadKey) -> bool:
        # slip: "live" taken to mean stored, so in-flight stores lose their record
        return self.last.get(key) == seq and self.refs.get(key, -1) >= 0


class TouchForgetsLatest(LogLRU):
    def policy_touch(self, key: OffloadKey) -> None:
        self.seq += 1  # slip: appends the record but leaves last[key] at the old one
        self.log.append((self.seq, key))


class CompactionForgetsRenumber(LogLRU):
    def _compact(self) -> None:
        live = [key for seq, key in self.log if self._keep(seq, key)]
        self.log = []
        for key in live:  # slip: renumbers records but not last[]
            self.seq += 1
            self.log.append((self.seq, key))


class RejectsBareGroupKeys(LogLRU):
    def _check_keys(self, keys: Collection[object]) -> list[OffloadKey]:
        for key in keys:  # slip: '<=' for '<', so a key with an empty hash is refused
            if not isinstance(key, bytes) or len(key) <= 4:
                raise InvalidKeyError(key, "too short")
        return super()._check_keys(keys)


def make_rejects_bare_group_keys(num_blocks: int) -> OffloadingManager:
    return RejectsBareGroupKeys(num_blocks)


def make_compaction_keeps_stored_only(num_blocks: int) -> OffloadingManager:
    return CompactionKeepsStoredOnly(num_blocks)


def make_touch_forgets_latest(num_blocks: int) -> OffloadingManager:
    return TouchForgetsLatest(num_blocks)


def make_compaction_forgets_renumber(num_blocks: int) -> OffloadingManager:
    return CompactionForgetsRenumber(num_blocks)
