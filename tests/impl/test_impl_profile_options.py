"""The core's options named after profile options (vLLM 0.33's conventions),
audited by the kit against the models under the same options, and their
edges by hand."""

from __future__ import annotations

import attrs
import pytest

from kvoffload import ReqContext, make_offload_key
from kvoffload.impl.manager import CPUOffloadingManager
from kvoffload.impl.reuse import FilterReusedOffloadingManager
from kvoffload.spec.contract import OffloadingManager
from kvoffload.spec.errors import ConfigurationError, IllegalTransitionError
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.profile import (
    DEFAULT,
    FilterCounts,
    RecencyCommit,
    ResetAnnounce,
)
from kvoffload.stateful.auditing import audit
from kvoffload.stateful.harness import ReuseFilterParams

REQUEST_END = attrs.evolve(
    DEFAULT,
    name="kvoffload-0.33-options",
    recency_commit=RecencyCommit.REQUEST_END,
    reset_announce=ResetAnnounce.ENGINE,
    complete_store_ignores_absent=True,
    filter_counts=FilterCounts.OFFERS_KEEPING_OFFERED,
    filter_reset_clears=False,
)
"""kvoffload's contract with the core options vLLM 0.33's face sets."""


def options_manager(policy: str, num_blocks: int) -> CPUOffloadingManager:
    return CPUOffloadingManager(
        16,
        num_blocks,
        policy,
        enable_events=True,
        recency_commit=RecencyCommit.REQUEST_END,
        reset_announce=ResetAnnounce.ENGINE,
        complete_store_ignores_absent=True,
    )


def lru_options(num_blocks: int) -> OffloadingManager:
    return options_manager("lru", num_blocks)


def arc_options(num_blocks: int) -> OffloadingManager:
    return options_manager("arc", num_blocks)


def filter_options(num_blocks: int) -> OffloadingManager:
    return FilterReusedOffloadingManager(
        options_manager("lru", num_blocks),
        store_threshold=2,
        max_tracker_size=3,
        filter_counts=FilterCounts.OFFERS_KEEPING_OFFERED,
        filter_reset_clears=False,
    )


@pytest.mark.parametrize(
    ("factory", "policy"), [(lru_options, "lru"), (arc_options, "arc")], ids=["lru", "arc"]
)
@pytest.mark.parametrize("seed", [1, 2])
def test_the_kit_passes_the_core_under_request_scoped_options(
    factory: object, policy: str, seed: int
) -> None:
    report = audit(
        factory,  # type: ignore[arg-type]
        policy=policy,
        profile=REQUEST_END,
        seed=seed,
        max_examples=60,
    )
    assert report.passed, report.render()


@pytest.mark.parametrize("seed", [1, 2])
def test_the_kit_passes_the_filter_counting_offers(seed: int) -> None:
    report = audit(
        filter_options,
        policy="lru",
        profile=REQUEST_END,
        reuse_filter=ReuseFilterParams(store_threshold=2, max_tracker_size=3),
        seed=seed,
        max_examples=60,
    )
    assert report.passed, report.render()


def test_the_kit_finds_a_core_without_the_options_under_that_profile() -> None:
    """The options matter: the default core fails the request-scoped profile."""
    report = audit(
        lambda n: CPUOffloadingManager(16, n, "lru", enable_events=True),
        policy="lru",
        profile=REQUEST_END,
        seed=1,
        max_examples=100,
    )
    assert not report.passed


def key(name: str) -> OffloadKey:
    return make_offload_key(name.encode(), 0)


def test_recency_waits_for_the_request_to_finish() -> None:
    manager = options_manager("lru", 2)
    reader, writer = ReqContext(req_id="reader"), ReqContext(req_id="writer")
    a, b, c = key("a"), key("b"), key("c")
    manager.on_new_request(writer)
    manager.prepare_store([a, b], writer)
    manager.complete_store([a, b], writer)
    manager.on_request_finished(writer)
    assert manager.policy_state()["order"] == (b, a)  # committed: the first key ends MRU
    manager.on_new_request(reader)
    manager.prepare_load([b], reader)
    manager.complete_load([b], reader)
    assert manager.policy_state()["order"] == (b, a)  # not yet
    assert manager.open_requests() == 1
    manager.on_request_finished(reader)
    assert manager.policy_state()["order"] == (a, b)
    assert manager.open_requests() == 0
    output = manager.prepare_store([c], writer)
    assert output is not None and output.evicted_keys == (a,)


def test_reset_announces_nothing_and_keeps_requests_open() -> None:
    manager = options_manager("lru", 2)
    ctx = ReqContext(req_id="r")
    manager.on_new_request(ctx)
    manager.prepare_store([key("a")], ctx)
    manager.complete_store([key("a")], ctx)
    assert [e.removed for e in manager.take_events()] == [False]
    manager.reset_cache()
    assert manager.take_events() == []
    assert manager.open_requests() == 1
    manager.on_request_finished(ctx)  # its uses were forgotten: nothing to commit
    assert manager.open_requests() == 0


def test_complete_store_of_an_absent_key_is_skipped() -> None:
    manager = options_manager("lru", 2)
    ctx = ReqContext(req_id="r")
    manager.prepare_store([key("a")], ctx)
    manager.complete_store([key("gone"), key("a")], ctx)
    assert manager.lookup(key("a"), ctx)
    strict = CPUOffloadingManager(16, 2)
    with pytest.raises(IllegalTransitionError):
        strict.complete_store([key("gone")], ctx)


def test_an_empty_manager_refuses_every_store_with_a_new_key() -> None:
    manager = CPUOffloadingManager(16, 0, "arc", allow_empty=True)
    ctx = ReqContext(req_id="r")
    assert manager.prepare_store([key("a")], ctx) is None
    empty = manager.prepare_store([], ctx)
    assert empty is not None and empty.keys_to_store == ()
    assert not manager.lookup(key("a"), ctx)
    with pytest.raises(ConfigurationError):
        CPUOffloadingManager(16, 0)


def test_offers_feed_the_filter_and_survive_a_reset() -> None:
    backing = options_manager("lru", 4)
    manager = FilterReusedOffloadingManager(
        backing, filter_counts=FilterCounts.OFFERS_KEEPING_OFFERED, filter_reset_clears=False
    )
    ctx = ReqContext(req_id="r")
    a = key("a")
    assert not manager.lookup(a, ctx)
    assert manager.count_of(a) == 0  # lookups are not counted
    first = manager.prepare_store([a], ctx)
    assert first is not None and first.keys_to_store == ()  # one offer: below the threshold
    manager.reset_cache()
    assert manager.count_of(a) == 1
    second = manager.prepare_store([a], ctx)
    assert second is not None and second.keys_to_store == (a,)
