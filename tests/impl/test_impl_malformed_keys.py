"""Malformed keys in every call: ``InvalidKeyError``, nothing changed, nothing
counted, in the managers, the reuse filter and the specification alike."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvoffload.impl.manager import OffloadingManagerCore
from kvoffload.impl.reuse import FilterReusedOffloadingManager
from kvoffload.spec.contract import OffloadingManager
from kvoffload.spec.errors import InvalidKeyError
from kvoffload.spec.keys import OffloadKey, validate_offload_keys
from kvoffload.spec.model import ManagerModel
from kvoffload.spec.reuse import ReuseFilterModel
from tests.impl.impl_helpers import CTX, READY, cpu_manager, drive_to, key, keys, observe, probe

NUM_BLOCKS = 4
STORED = keys("s0 s1 s2")
UNIVERSE = STORED + keys("fresh")

# hashable and unhashable, wrong type and too short
MALFORMED: list[object] = [
    "text-key",
    bytearray(b"abcdefgh"),
    memoryview(b"abcdefgh"),
    12345,
    None,
    b"",
    b"abc",
    [b"abcdefgh"],
    {"k": 1},
]

# a bare key, a string or a non-iterable where a list of keys is expected
NOT_A_LIST: list[object] = [key("s0"), b"", "s0-as-text", bytearray(b"abcdefgh"), 7, None]


def stored(policy: str) -> OffloadingManagerCore:
    manager = cpu_manager(NUM_BLOCKS, policy)
    for stored_key in STORED:
        drive_to(manager, stored_key, READY)
    return manager


def list_calls(keys_arg: object) -> dict[str, Callable[[OffloadingManager], object]]:
    """Every call that takes a list of keys, given ``keys_arg``."""
    arg: list[OffloadKey] = keys_arg  # type: ignore[assignment]
    return {
        "lookup_prefix": lambda m: m.lookup_prefix(arg, CTX),
        "touch": lambda m: m.touch(arg, CTX),
        "prepare_load": lambda m: m.prepare_load(arg, CTX),
        "complete_load": lambda m: m.complete_load(arg, CTX),
        "prepare_store": lambda m: m.prepare_store(arg, CTX),
        "complete_store": lambda m: m.complete_store(arg, CTX),
        "complete_store(failed)": lambda m: m.complete_store(arg, CTX, False),
    }


def assert_rejected(policy: str, call: Callable[[OffloadingManager], object]) -> None:
    manager, twin = stored(policy), stored(policy)
    before = observe(manager, UNIVERSE)
    events_before = len(manager.events or [])
    with pytest.raises(InvalidKeyError):
        call(manager)
    assert observe(manager, UNIVERSE) == before
    assert len(manager.events or []) == events_before
    assert probe(manager, NUM_BLOCKS) == probe(twin, NUM_BLOCKS)


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("bad", MALFORMED, ids=repr)
def test_lookup_rejects_a_malformed_key(policy: str, bad: object) -> None:
    assert_rejected(policy, lambda m: m.lookup(bad, CTX))  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("bad", MALFORMED, ids=repr)
@pytest.mark.parametrize("position", ["first", "after-stored", "last"])
@pytest.mark.parametrize("call", sorted(list_calls([])))
def test_every_list_call_rejects_a_malformed_key(
    policy: str, bad: object, position: str, call: str
) -> None:
    arg: list[object] = {
        "first": [bad, STORED[0]],
        "after-stored": [STORED[0], STORED[1], bad],
        "last": [STORED[0], key("fresh"), bad],
    }[position]
    assert_rejected(policy, list_calls(arg)[call])


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("not_a_list", NOT_A_LIST, ids=repr)
@pytest.mark.parametrize("call", sorted(list_calls([])))
def test_every_list_call_rejects_a_bare_key(policy: str, not_a_list: object, call: str) -> None:
    assert_rejected(policy, list_calls(not_a_list)[call])


def test_lookup_prefix_answers_hits_before_a_valid_miss() -> None:
    manager = stored("lru")
    assert manager.lookup_prefix([STORED[0], STORED[1], key("fresh")], CTX) == 2
    assert manager.lookup_prefix((k for k in STORED), CTX) == 3


# --- the reuse filter: a malformed key is never counted -----------------------


def filtered(table: int = 3) -> FilterReusedOffloadingManager:
    return FilterReusedOffloadingManager(stored("lru"), 2, max_tracker_size=table)


@pytest.mark.parametrize("bad", MALFORMED, ids=repr)
def test_filter_lookup_counts_no_malformed_key(bad: object) -> None:
    filter_ = filtered()
    real = keys("r0 r1 r2")
    for real_key in real:
        filter_.lookup(real_key, CTX)
    with pytest.raises(InvalidKeyError):
        filter_.lookup(bad, CTX)  # type: ignore[arg-type]
    assert list(filter_.counts) == real


@pytest.mark.parametrize("bad", MALFORMED, ids=repr)
def test_filter_lookup_prefix_counts_nothing_when_any_key_is_malformed(bad: object) -> None:
    filter_ = filtered()
    filter_.lookup(key("r0"), CTX)
    before = list(filter_.counts.items())
    with pytest.raises(InvalidKeyError):
        filter_.lookup_prefix([key("r0"), bad], CTX)  # type: ignore[list-item]
    assert list(filter_.counts.items()) == before


@pytest.mark.parametrize("not_a_list", NOT_A_LIST, ids=repr)
@pytest.mark.parametrize("call", sorted(list_calls([])))
def test_filter_rejects_a_bare_key_everywhere(not_a_list: object, call: str) -> None:
    filter_ = filtered()
    backing = filter_.backing
    assert isinstance(backing, OffloadingManagerCore)
    before = (list(filter_.counts.items()), observe(backing, UNIVERSE))
    with pytest.raises(InvalidKeyError):
        list_calls(not_a_list)[call](filter_)
    assert (list(filter_.counts.items()), observe(backing, UNIVERSE)) == before


# --- the specification agrees -------------------------------------------------


def model() -> ManagerModel:
    state = ManagerModel.create(NUM_BLOCKS, "lru")
    state, _ = state.prepare_store(list(STORED))
    state, _ = state.complete_store(list(STORED))
    return state


MODEL_CALLS: dict[str, Callable[[ManagerModel, object], object]] = {
    "lookup_prefix": lambda m, a: m.lookup_prefix(a),  # type: ignore[arg-type]
    "touch": lambda m, a: m.touch(a),  # type: ignore[arg-type]
    "prepare_load": lambda m, a: m.prepare_load(a),  # type: ignore[arg-type]
    "complete_load": lambda m, a: m.complete_load(a),  # type: ignore[arg-type]
    "prepare_store": lambda m, a: m.prepare_store(a),  # type: ignore[arg-type]
    "complete_store": lambda m, a: m.complete_store(a),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("bad", MALFORMED, ids=repr)
@pytest.mark.parametrize("call", sorted(MODEL_CALLS))
def test_model_rejects_what_the_managers_reject(bad: object, call: str) -> None:
    with pytest.raises(InvalidKeyError):
        MODEL_CALLS[call](model(), [STORED[0], bad])
    with pytest.raises(InvalidKeyError):
        MODEL_CALLS[call](model(), key("s0"))
    with pytest.raises(InvalidKeyError):
        model().lookup(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", MALFORMED, ids=repr)
def test_filter_model_counts_no_malformed_key(bad: object) -> None:
    state = ReuseFilterModel(model(), store_threshold=2, max_tracker_size=3)
    state, _ = state.lookup(key("r0"))
    with pytest.raises(InvalidKeyError):
        state.lookup(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidKeyError):
        state.lookup_prefix([key("r0"), bad])  # type: ignore[list-item]
    assert state.count(key("r0")) == 1


def test_the_shared_validator_returns_a_list_unchanged() -> None:
    listed = keys("a b")
    assert validate_offload_keys(listed) is listed
    assert validate_offload_keys(iter(listed)) == listed
    with pytest.raises(InvalidKeyError):
        validate_offload_keys(listed[0])
