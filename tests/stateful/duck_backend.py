"""A backend written from docs/SPEC.md alone, without subclassing anything
of kvoffload: plain classes for its answers, ``bytes`` keys, its own
request context. ``tests/stateful/test_duck_typing.py`` checks that the
README's one-liners accept it under ``mypy --strict`` and that it passes
the audit."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from kvoffload.spec.contract import ManagerProtocol
from kvoffload.stateful import audit, conformance_test, machine_test_case


class IllegalCall(Exception):
    """A call the lifecycle table forbids (the backend's own error type)."""


@dataclass
class Context:
    req_id: str


@dataclass
class Slots:
    block_ids: list[int]

    @staticmethod
    def medium() -> str:
        return "CPU"


@dataclass
class Stored:
    keys_to_store: tuple[bytes, ...]
    store_spec: Slots
    evicted_keys: tuple[bytes, ...]


@dataclass
class Event:
    keys: tuple[bytes, ...]
    removed: bool
    block_size: int = 16
    medium: str = "CPU"


@dataclass
class DuckLRU:
    """LRU over a dict: slot and loads per key (-1 loads: pending)."""

    num_blocks: int
    blocks: OrderedDict[bytes, list[int]] = field(default_factory=OrderedDict)
    events: list[Event] = field(default_factory=list)
    block_size: int = 16

    def __post_init__(self) -> None:
        self.free = list(range(self.num_blocks))

    def lookup(self, key: bytes, ctx: Context) -> bool:
        entry = self.blocks.get(key)
        return entry is not None and entry[1] >= 0

    def lookup_prefix(self, keys: list[bytes], ctx: Context) -> int:
        hits = 0
        for key in keys:
            if not self.lookup(key, ctx):
                break
            hits += 1
        return hits

    def prepare_load(self, keys: list[bytes], ctx: Context) -> Slots:
        if not all(self.lookup(key, ctx) for key in keys):
            raise IllegalCall("load of a key that is not readable")
        for key in keys:
            self.blocks[key][1] += 1
        return Slots([self.blocks[key][0] for key in keys])

    def touch(self, keys: list[bytes], ctx: Context) -> None:
        for key in reversed(keys):
            if key in self.blocks:
                self.blocks.move_to_end(key)

    def complete_load(self, keys: list[bytes], ctx: Context) -> None:
        for key in set(keys):
            entry = self.blocks.get(key)
            if entry is None or entry[1] < keys.count(key):
                raise IllegalCall("no such load in flight")
        for key in keys:
            self.blocks[key][1] -= 1

    def prepare_store(self, keys: list[bytes], ctx: Context) -> Stored | None:
        if not all(isinstance(key, bytes) and len(key) >= 4 for key in keys):
            raise IllegalCall("malformed key")
        new = [key for key in dict.fromkeys(keys) if key not in self.blocks]
        need = len(new) - len(self.free)
        victims = [k for k, e in self.blocks.items() if e[1] == 0 and k not in keys][:max(need, 0)]
        if len(victims) < need:
            return None
        for key in victims:
            self.free.append(self.blocks.pop(key)[0])
        if victims:
            self.events.append(Event(tuple(victims), removed=True))
        slots = [self.free.pop(0) for _ in new]
        for key, slot in zip(new, slots):
            self.blocks[key] = [slot, -1]
        return Stored(tuple(new), Slots(slots), tuple(victims))

    def complete_store(self, keys: list[bytes], ctx: Context, success: bool = True) -> None:
        if any(key not in self.blocks for key in keys):
            raise IllegalCall("completing the store of an untracked key")
        pending = [key for key in dict.fromkeys(keys) if self.blocks[key][1] < 0]
        for key in pending:
            if success:
                self.blocks[key][1] = 0
            else:
                self.free.append(self.blocks.pop(key)[0])
        if success and pending:
            self.events.append(Event(tuple(pending), removed=False))

    def on_new_request(self, ctx: Context) -> None:
        pass

    def on_request_finished(self, ctx: Context) -> None:
        pass

    def on_schedule_end(self) -> None:
        pass

    def take_events(self) -> list[Event]:
        taken, self.events = self.events, []
        return taken

    def reset_cache(self) -> None:
        if any(entry[1] > 0 for entry in self.blocks.values()):
            raise IllegalCall("reset with a load in flight")
        readable = sorted((e[0], k) for k, e in self.blocks.items() if e[1] >= 0)
        if readable:
            self.events.append(Event(tuple(k for _, k in readable), removed=True))
        self.blocks.clear()
        self.free = list(range(self.num_blocks))


def make_duck(num_blocks: int) -> DuckLRU:
    return DuckLRU(num_blocks)


# the README's one-liners, type-checked by mypy --strict with this module
test_duck_conformance = conformance_test(
    make_duck, policy="lru", context_factory=Context, typed_errors=False, max_examples=100
)
TestDuckMachine = machine_test_case(make_duck, policy="lru", context_factory=Context,
                                    typed_errors=False)
REPORT_TYPE = type(audit)


_checked: ManagerProtocol = DuckLRU(1)  # mypy says which method does not fit, if one does
