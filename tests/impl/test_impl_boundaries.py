"""Scheduler-side boundaries (issue "hard edges"): one key check for every
call, a reset that waits for loads in flight, real bools and contexts, and
constructors that refuse what their first call would trip on."""

from __future__ import annotations

import copy

import pytest

from kvoffload.impl.manager import CPUOffloadingManager
from kvoffload.impl.reuse import FilterReusedOffloadingManager
from kvoffload.spec.contract import ReqContext
from kvoffload.spec.errors import (
    ConfigurationError,
    IllegalTransitionError,
    InvalidArgumentError,
    InvalidKeyError,
)
from kvoffload.spec.keys import OffloadKey, make_offload_key
from kvoffload.spec.lifecycle import ABSENT, loading

CTX = ReqContext(req_id="r")
A, B = (make_offload_key(name, 0) for name in (b"a", b"b"))


def ready(manager: CPUOffloadingManager, *keys: OffloadKey) -> None:
    assert manager.prepare_store(list(keys), CTX) is not None
    manager.complete_store(list(keys), CTX)


def state_of(manager: CPUOffloadingManager) -> object:
    return (
        {k: (b.ref_cnt, b.block_id) for k, b in manager.policy.items()},
        manager.policy_state(),
        manager.backend.get_num_free_blocks(),
        list(manager.events or []),
    )


def managers() -> list[CPUOffloadingManager | FilterReusedOffloadingManager]:
    plain = CPUOffloadingManager(16, 4, enable_events=True)
    ready(plain, A)
    core = CPUOffloadingManager(16, 4, enable_events=True)
    ready(core, A)
    return [plain, FilterReusedOffloadingManager(core)]


def core_of(manager: object) -> CPUOffloadingManager:
    inner = getattr(manager, "backing", manager)
    assert isinstance(inner, CPUOffloadingManager)
    return inner


CALLS = {
    "lookup": lambda m, k, c: m.lookup(k, c),
    "lookup_prefix": lambda m, k, c: m.lookup_prefix([k], c),
    "prepare_load": lambda m, k, c: m.prepare_load([k], c),
    "complete_load": lambda m, k, c: m.complete_load([k], c),
    "touch": lambda m, k, c: m.touch([k], c),
    "prepare_store": lambda m, k, c: m.prepare_store([k], c),
    "complete_store": lambda m, k, c: m.complete_store([k], c),
}


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("which", ["core", "filter"])
def test_a_memoryview_key_is_refused_by_every_call(call: str, which: str) -> None:
    manager = managers()[0 if which == "core" else 1]
    core = core_of(manager)
    if call == "complete_load":
        core.prepare_load([A], CTX)
    before = state_of(core)
    with pytest.raises(InvalidKeyError):
        CALLS[call](manager, memoryview(A), CTX)
    assert state_of(core) == before


@pytest.mark.parametrize("ctx", [None, 42, object(), "r"], ids=repr)
@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("which", ["core", "filter"])
def test_a_context_without_a_req_id_is_refused_by_every_call(
    call: str, which: str, ctx: object
) -> None:
    manager = managers()[0 if which == "core" else 1]
    core = core_of(manager)
    counts = dict(getattr(manager, "counts", {}))
    before = state_of(core)
    with pytest.raises(InvalidArgumentError):
        CALLS[call](manager, A, ctx)
    assert state_of(core) == before and dict(getattr(manager, "counts", {})) == counts


class EngineContext:
    """An engine's own context type: any object with a str req_id."""

    def __init__(self, req_id: str) -> None:
        self.req_id = req_id


def test_an_engine_context_with_a_req_id_is_accepted() -> None:
    manager = managers()[0]
    ctx = EngineContext("e")
    assert manager.lookup(A, ctx) is True  # type: ignore[arg-type]
    assert manager.on_new_request(ctx).req_id == "e"  # type: ignore[arg-type]


@pytest.mark.parametrize("which", ["core", "filter"])
def test_request_hooks_refuse_a_context_without_a_req_id(which: str) -> None:
    manager = managers()[0 if which == "core" else 1]
    for ctx in (None, 42):
        with pytest.raises(InvalidArgumentError):
            manager.on_new_request(ctx)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            manager.on_request_finished(ctx)  # type: ignore[arg-type]


@pytest.mark.parametrize("success", ["no", None, 1, 0, "", [True]], ids=repr)
@pytest.mark.parametrize("which", ["core", "filter"])
def test_complete_store_demands_a_bool(which: str, success: object) -> None:
    manager = managers()[0 if which == "core" else 1]
    core = core_of(manager)
    assert core.prepare_store([B], CTX) is not None
    before = state_of(core)
    with pytest.raises(InvalidArgumentError):
        manager.complete_store([B], CTX, success)  # type: ignore[arg-type]
    assert state_of(core) == before


def test_reset_waits_for_loads_in_flight() -> None:
    manager = CPUOffloadingManager(16, 1, enable_events=True)
    ready(manager, A)
    spec = manager.prepare_load([A], CTX)
    assert spec.block_ids.tolist() == [0]  # type: ignore[attr-defined]
    before = copy.deepcopy(state_of(manager))
    with pytest.raises(IllegalTransitionError) as refused:
        manager.reset_cache()
    assert refused.value.key == A and refused.value.phase == loading(1)
    assert state_of(manager) == before
    # the slot being read is not handed to the next store: there is none free
    assert manager.prepare_store([B], CTX) is None
    manager.complete_load([A], CTX)
    manager.reset_cache()
    assert manager.phase(A) == ABSENT
    output = manager.prepare_store([B], CTX)
    assert output is not None and output.store_spec.block_ids.tolist() == [0]  # type: ignore[attr-defined]


def test_a_filter_reset_refused_keeps_its_counts() -> None:
    core = CPUOffloadingManager(16, 2)
    ready(core, A)
    manager = FilterReusedOffloadingManager(core)
    manager.lookup(B, CTX)
    core.prepare_load([A], CTX)
    with pytest.raises(IllegalTransitionError):
        manager.reset_cache()
    assert manager.count_of(B) == 1


@pytest.mark.parametrize("backing", [None, 42, object(), "manager"], ids=repr)
def test_a_filter_needs_a_manager_behind_it(backing: object) -> None:
    with pytest.raises(ConfigurationError, match="backing"):
        FilterReusedOffloadingManager(backing)  # type: ignore[arg-type]


@pytest.mark.parametrize("flag", ["no", 1, None, "True"], ids=repr)
def test_enable_events_must_be_a_bool(flag: object) -> None:
    with pytest.raises(ConfigurationError, match="enable_events"):
        CPUOffloadingManager(16, 4, enable_events=flag)  # type: ignore[arg-type]
