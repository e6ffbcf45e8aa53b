"""Tests that kill the non-equivalent survivors of mutation testing.

Each test names the production behaviour the kit's audits did not pin down
(docs/KIT.md lists the survivors and why each is equivalent or a gap).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

import pytest

from kvoffload.impl.backend import Backend
from kvoffload.impl.block import BlockStatus
from kvoffload.impl.manager import CPUOffloadingManager, LRUOffloadingManager
from kvoffload.impl.reuse import FilterReusedOffloadingManager
from kvoffload.spec.contract import (
    LoadStoreSpec,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
)
from kvoffload.spec.errors import ConfigurationError
from kvoffload.spec.keys import OffloadKey, make_offload_key
from kvoffload.stateful import audit
from tests.stateful.thirdparty import DictLRUManager, SlotSpec

CTX = ReqContext(req_id="gap")
KEYS = [make_offload_key(b"gap%02d" % i, 0) for i in range(6)]


class StackBackend(Backend):
    """A third-party backend: a LIFO free list, and the base class's
    ``reset`` (which frees every block in descending slot order)."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(16, "CPU")
        self.free_slots = list(range(num_blocks - 1, -1, -1))

    def get_num_free_blocks(self) -> int:
        return len(self.free_slots)

    def allocate_blocks(self, keys: Sequence[OffloadKey]) -> list[BlockStatus]:
        return [BlockStatus(self.free_slots.pop()) for _ in keys]

    def free(self, block: BlockStatus) -> None:
        self.free_slots.append(block.block_id)

    def get_load_store_spec(
        self, keys: Sequence[OffloadKey], blocks: Sequence[BlockStatus]
    ) -> LoadStoreSpec:
        return SlotSpec(block.block_id for block in blocks)


def stack_backend_lru(num_blocks: int) -> OffloadingManager:
    return LRUOffloadingManager(StackBackend(num_blocks), enable_events=True)


def test_custom_backend_with_default_reset_passes_the_kit() -> None:
    report = audit(stack_backend_lru, policy="lru", max_examples=60)
    assert report.passed, report.render()


def test_default_reset_frees_in_descending_slot_order() -> None:
    manager = stack_backend_lru(3)
    manager.prepare_store(KEYS[:3], CTX)
    manager.reset_cache()
    output = manager.prepare_store(KEYS[3:6], CTX)
    assert output is not None
    assert getattr(output.store_spec, "block_ids") == (0, 1, 2)


def test_recency_survives_many_touches_and_loads() -> None:
    """Long runs of touches and load cycles (beyond the kit's 40 steps, where
    a recency structure compacts or parks) keep the LRU order exact."""
    manager = CPUOffloadingManager(16, 3, "lru")
    manager.prepare_store(KEYS[:3], CTX)
    manager.complete_store(KEYS[:3], CTX)
    for _ in range(200):
        manager.touch([KEYS[1], KEYS[0]], CTX)  # KEYS[1] ends most recent
        manager.prepare_load([KEYS[1], KEYS[2]], CTX)
        manager.complete_load([KEYS[1], KEYS[2]], CTX)
    first = manager.prepare_store([KEYS[3]], CTX)
    second = manager.prepare_store([KEYS[4]], CTX)
    assert first is not None and second is not None
    assert (first.evicted_keys, second.evicted_keys) == ((KEYS[2],), (KEYS[0],))


def test_filter_count_of_reports_lookups() -> None:
    manager = FilterReusedOffloadingManager(CPUOffloadingManager(16, 2), 2, 4)
    assert manager.count_of(KEYS[0]) == 0
    manager.lookup(KEYS[0], CTX)
    manager.lookup_prefix([KEYS[0], KEYS[1]], CTX)
    assert (manager.count_of(KEYS[0]), manager.count_of(KEYS[1])) == (2, 1)


class ContextCheckingManager(DictLRUManager):
    """Fails any call that does not carry the caller's request context."""

    def check(self, req_context: ReqContext) -> None:
        assert req_context is CTX, f"request context lost: {req_context!r}"

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool:
        self.check(req_context)
        return super().lookup(key, req_context)

    def lookup_prefix(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> int | None:
        self.check(req_context)
        return super().lookup_prefix(keys, req_context)

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        self.check(req_context)
        return super().prepare_load(keys, req_context)

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.check(req_context)
        super().touch(keys, req_context)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.check(req_context)
        super().complete_load(keys, req_context)

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        self.check(req_context)
        return super().prepare_store(keys, req_context)

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        self.check(req_context)
        super().complete_store(keys, req_context, success)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self.check(req_context)


def test_filter_forwards_the_request_context() -> None:
    manager = FilterReusedOffloadingManager(ContextCheckingManager(2), 2, 4)
    for _ in range(2):
        manager.lookup(KEYS[0], CTX)
        manager.lookup_prefix([KEYS[1]], CTX)
    assert manager.prepare_store([KEYS[0], KEYS[1]], CTX) is not None
    manager.complete_store([KEYS[0], KEYS[1]], CTX)
    manager.touch([KEYS[0]], CTX)
    manager.prepare_load([KEYS[0]], CTX)
    manager.complete_load([KEYS[0]], CTX)
    assert manager.prepare_store([KEYS[0]], CTX) is not None
    # a key below the threshold: the filter asks the backing whether it is stored
    assert manager.prepare_store([KEYS[5]], CTX) is not None
    manager.on_request_finished(CTX)


def test_events_are_off_by_default() -> None:
    for manager in (
        CPUOffloadingManager(16, 2),
        LRUOffloadingManager(StackBackend(2)),
    ):
        manager.prepare_store([KEYS[0]], CTX)
        manager.complete_store([KEYS[0]], CTX)
        assert list(manager.take_events()) == []


def test_touch_accepts_any_collection() -> None:
    manager = CPUOffloadingManager(16, 2, enable_events=True)
    manager.prepare_store([KEYS[0], KEYS[1]], CTX)
    manager.complete_store([KEYS[0], KEYS[1]], CTX)
    manager.touch({KEYS[0]: None}.keys(), CTX)  # not a Sequence
    output = manager.prepare_store([KEYS[2]], CTX)
    assert output is not None and output.evicted_keys == (KEYS[1],)


def test_unhashable_policy_name_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        CPUOffloadingManager(16, 2, ["lru"])  # type: ignore[arg-type]


def test_cpu_manager_names_its_policy() -> None:
    assert CPUOffloadingManager(16, 2, "arc").cache_policy == "arc"
