"""Every bad input raises a typed ``OffloadingError`` and changes
nothing: phases, lookup answers, slots, recency/ARC state, the event queue
and (through a probe of later stores) the hidden eviction and slot order."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvoffload.impl.backend import CPUBackend
from kvoffload.impl.manager import CPUOffloadingManager, LRUOffloadingManager, OffloadingManagerCore
from kvoffload.impl.policies import ARCCachePolicy, LRUCachePolicy, make_cache_policy
from kvoffload.impl.reuse import FilterReusedOffloadingManager
from kvoffload.spec.contract import OffloadingManager
from kvoffload.spec.errors import (
    ConfigurationError,
    IllegalTransitionError,
    InvalidKeyError,
    OffloadingError,
)
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.lifecycle import Call, Phase, is_legal
from tests.impl.impl_helpers import (
    ABSENT,
    BLOCK_SIZE,
    CTX,
    PENDING,
    READY,
    cpu_manager,
    drive_to,
    key,
    keys,
    loading,
    observe,
    probe,
)

NUM_BLOCKS = 6
POLICIES = ["lru", "arc"]

# one key per phase, plus history for ARC (a ghost, a T2 member)
NAMES = "absent pending ready loading1 loading2 ghost twice"
ABSENT_KEY, PENDING_KEY, READY_KEY, LOADING1_KEY, LOADING2_KEY, GHOST_KEY, TWICE_KEY = keys(NAMES)
UNIVERSE = keys(NAMES)


def populated(policy: str) -> OffloadingManagerCore:
    """A full manager with a key in every phase, a T2 member and a ghost.

    Deterministic: two calls build managers in identical states.
    """
    manager = cpu_manager(NUM_BLOCKS, policy)
    drive_to(manager, GHOST_KEY, READY)
    drive_to(manager, TWICE_KEY, READY)
    manager.touch([TWICE_KEY], CTX)
    drive_to(manager, READY_KEY, READY)
    drive_to(manager, LOADING1_KEY, loading(1))
    drive_to(manager, LOADING2_KEY, loading(2))
    drive_to(manager, PENDING_KEY, PENDING)
    # the cache is full: this store evicts GHOST_KEY (least recent READY)
    output = manager.prepare_store([key("filler")], CTX)
    assert output is not None and output.evicted_keys == (GHOST_KEY,)
    manager.complete_store([key("filler")], CTX)
    manager.touch([READY_KEY], CTX)
    assert manager.events, "keep unread events: a failed call must not drop them"
    return manager


def assert_raises_and_changes_nothing(
    policy: str,
    call: Callable[[OffloadingManagerCore], object],
    error_type: type[OffloadingError],
) -> OffloadingError:
    manager, twin = populated(policy), populated(policy)
    before = observe(manager, UNIVERSE)
    with pytest.raises(error_type) as raised:
        call(manager)
    assert observe(manager, UNIVERSE) == before
    assert probe(manager, NUM_BLOCKS) == probe(twin, NUM_BLOCKS)
    return raised.value


def assert_transition_error(
    error: OffloadingError, bad_key: OffloadKey, phase: Phase, call: Call
) -> None:
    assert isinstance(error, IllegalTransitionError)
    assert (error.key, error.phase, error.call) == (bad_key, phase, call)
    assert not is_legal(error.phase, error.call)
    assert repr(bad_key) in str(error)


# --- prepare_load -------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(
    ("bad_key", "phase"), [(ABSENT_KEY, ABSENT), (PENDING_KEY, PENDING), (GHOST_KEY, ABSENT)]
)
def test_prepare_load_of_unreadable_key(policy: str, bad_key: OffloadKey, phase: Phase) -> None:
    # legal keys before and after the bad one must not be pinned either
    error = assert_raises_and_changes_nothing(
        policy,
        lambda m: m.prepare_load([READY_KEY, LOADING1_KEY, bad_key, TWICE_KEY], CTX),
        IllegalTransitionError,
    )
    assert_transition_error(error, bad_key, phase, Call.PREPARE_LOAD)


# --- complete_load ------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(
    ("bad_key", "phase"),
    [(READY_KEY, READY), (ABSENT_KEY, ABSENT), (PENDING_KEY, PENDING)],
)
def test_complete_load_without_a_load_in_flight(
    policy: str, bad_key: OffloadKey, phase: Phase
) -> None:
    error = assert_raises_and_changes_nothing(
        policy,
        lambda m: m.complete_load([LOADING2_KEY, LOADING1_KEY, bad_key], CTX),
        IllegalTransitionError,
    )
    assert_transition_error(error, bad_key, phase, Call.COMPLETE_LOAD)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(
    "call_keys",
    [
        [LOADING1_KEY, LOADING1_KEY],
        [LOADING2_KEY, LOADING1_KEY, LOADING2_KEY, LOADING2_KEY],
        [LOADING1_KEY, LOADING2_KEY, LOADING1_KEY],
    ],
    ids=["loading1-twice", "loading2-thrice", "loading1-twice-interleaved"],
)
def test_complete_load_duplicates_exceeding_the_load_count(
    policy: str, call_keys: list[OffloadKey]
) -> None:
    # the repeated key has run out of loads when its extra occurrence is
    # reached: it is READY at that point of the call, and the error says so
    error = assert_raises_and_changes_nothing(
        policy, lambda m: m.complete_load(call_keys, CTX), IllegalTransitionError
    )
    assert_transition_error(error, call_keys[-1], READY, Call.COMPLETE_LOAD)


@pytest.mark.parametrize("policy", POLICIES)
def test_complete_load_duplicates_within_the_load_count_are_fine(policy: str) -> None:
    manager = populated(policy)
    manager.complete_load([LOADING2_KEY, LOADING1_KEY, LOADING2_KEY], CTX)
    assert manager.phase(LOADING2_KEY) == READY
    assert manager.phase(LOADING1_KEY) == READY


# --- prepare_store: malformed keys ---------------------------------------------

BAD_KEYS: list[object] = [
    "text-key",
    bytearray(b"abcdefgh"),
    memoryview(b"abcdefgh"),
    12345,
    None,
    b"",
    b"abc",
]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("bad_key", BAD_KEYS, ids=repr)
def test_prepare_store_rejects_malformed_key(policy: str, bad_key: object) -> None:
    # a new key and an already-stored key are offered alongside: neither is
    # stored nor protected-by-eviction, nothing is evicted
    offered = [key("new"), READY_KEY, bad_key, key("new2")]
    error = assert_raises_and_changes_nothing(
        policy,
        lambda m: m.prepare_store(offered, CTX),  # type: ignore[arg-type]
        InvalidKeyError,
    )
    assert isinstance(error, InvalidKeyError)
    assert error.key is bad_key
    assert isinstance(error, ValueError)


@pytest.mark.parametrize("bad_key", BAD_KEYS, ids=repr)
def test_reuse_filter_prepare_store_rejects_malformed_key(bad_key: object) -> None:
    def filtered() -> FilterReusedOffloadingManager:
        filter_ = FilterReusedOffloadingManager(populated("lru"), store_threshold=2)
        for _ in range(2):
            filter_.lookup(key("new"), CTX)
        filter_.lookup(READY_KEY, CTX)
        return filter_

    filter_, twin = filtered(), filtered()
    backing = filter_.backing
    twin_backing = twin.backing
    assert isinstance(backing, OffloadingManagerCore)
    assert isinstance(twin_backing, OffloadingManagerCore)
    counts_before = list(filter_.counts.items())
    before = observe(backing, UNIVERSE + [key("new")])

    with pytest.raises(InvalidKeyError) as raised:
        filter_.prepare_store([key("new"), bad_key], CTX)  # type: ignore[list-item]

    assert raised.value.key is bad_key
    assert list(filter_.counts.items()) == counts_before
    assert observe(backing, UNIVERSE + [key("new")]) == before
    assert probe(backing, NUM_BLOCKS) == probe(twin_backing, NUM_BLOCKS)


@pytest.mark.parametrize("bad_key", [*BAD_KEYS, [1, 2], {"k": 1}], ids=repr)
def test_phase_and_slot_of_answer_absent_for_any_untracked_object(bad_key: object) -> None:
    # queries: a malformed or unhashable key is simply not tracked, in the
    # pure and the compiled build alike (no TypeError from a typed signature)
    managers: list[OffloadingManagerCore | FilterReusedOffloadingManager] = [
        populated("lru"),
        populated("arc"),
        LRUOffloadingManager(CPUBackend(BLOCK_SIZE, NUM_BLOCKS)),
        FilterReusedOffloadingManager(populated("arc"), store_threshold=2),
    ]
    for manager in managers:
        assert manager.phase(bad_key) == ABSENT  # type: ignore[arg-type]
        assert manager.slot_of(bad_key) is None  # type: ignore[arg-type]
    for manager in (managers[0], managers[1], managers[3]):
        assert manager.phase(READY_KEY) == READY
        assert manager.slot_of(READY_KEY) is not None


def test_prepare_store_accepts_the_shortest_valid_key() -> None:
    manager = cpu_manager(2)
    shortest = OffloadKey(b"\x00\x00\x00\x00")
    output = manager.prepare_store([shortest], CTX)
    assert output is not None and output.keys_to_store == (shortest,)


# --- constructors ---------------------------------------------------------------

BAD_SIZES: list[object] = [0, -1, -16, True, False, 2.0, "4", None]


@pytest.mark.parametrize("bad_size", BAD_SIZES, ids=repr)
def test_bad_block_size(bad_size: object) -> None:
    for build in (
        lambda: CPUOffloadingManager(bad_size, 4),  # type: ignore[arg-type]
        lambda: CPUOffloadingManager(bad_size, 4, "arc"),  # type: ignore[arg-type]
        lambda: CPUBackend(bad_size, 4),  # type: ignore[arg-type]
    ):
        with pytest.raises(ConfigurationError) as raised:
            build()
        assert isinstance(raised.value, OffloadingError)
        assert "block_size" in str(raised.value)


@pytest.mark.parametrize("bad_size", BAD_SIZES, ids=repr)
def test_bad_num_blocks(bad_size: object) -> None:
    for build in (
        lambda: CPUOffloadingManager(BLOCK_SIZE, bad_size),  # type: ignore[arg-type]
        lambda: CPUOffloadingManager(BLOCK_SIZE, bad_size, "arc"),  # type: ignore[arg-type]
        lambda: CPUBackend(BLOCK_SIZE, bad_size),  # type: ignore[arg-type]
    ):
        with pytest.raises(ConfigurationError) as raised:
            build()
        assert "num_blocks" in str(raised.value)


@pytest.mark.parametrize("bad_size", BAD_SIZES, ids=repr)
def test_bad_policy_capacity(bad_size: object) -> None:
    for policy_cls in (LRUCachePolicy, ARCCachePolicy):
        with pytest.raises(ConfigurationError):
            policy_cls(bad_size)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        make_cache_policy("lru", bad_size)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["fifo", "LRU", "Arc", "", " lru", None, 1])
def test_unknown_policy_name(name: object) -> None:
    with pytest.raises(ConfigurationError) as raised:
        CPUOffloadingManager(BLOCK_SIZE, 4, name)  # type: ignore[arg-type]
    assert repr(name) in str(raised.value)
    with pytest.raises(ConfigurationError):
        make_cache_policy(name, 4)  # type: ignore[arg-type]


@pytest.mark.parametrize("threshold", [1, 0, -2, True, 2.0, None])
def test_store_threshold_below_two(threshold: object) -> None:
    with pytest.raises(ConfigurationError):
        FilterReusedOffloadingManager(cpu_manager(2), store_threshold=threshold)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [0, -1, False, 1.0, None])
def test_max_tracker_size_below_one(size: object) -> None:
    with pytest.raises(ConfigurationError):
        FilterReusedOffloadingManager(cpu_manager(2), max_tracker_size=size)  # type: ignore[arg-type]


def test_smallest_valid_configuration_is_accepted() -> None:
    backing: OffloadingManager = CPUOffloadingManager(1, 1, "arc")
    FilterReusedOffloadingManager(backing, store_threshold=2, max_tracker_size=1)
    LRUOffloadingManager(CPUBackend(1, 1))
