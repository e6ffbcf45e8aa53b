"""An illegal call that raises but changes the manager (vLLM's loads that
pin keys one by one and assert at the bad one) is reported as such, and
does not hide the rest: the audit goes on with illegal calls set aside."""

from __future__ import annotations

from collections.abc import Callable, Collection

import attrs
import pytest

from kvoffload.spec.contract import LoadStoreSpec, ReqContext
from kvoffload.spec.invariants import Invariant
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.profile import DEFAULT, ErrorStyle
from kvoffload.stateful import audit
from kvoffload.stateful.shrink import failure_kind
from tests.stateful.test_kit_power import Uncopyable
from tests.stateful.thirdparty import DictLRUManager, SlotSpec, UnprotectedLRUManager

ANY_ERRORS = attrs.evolve(DEFAULT, name="any-errors", errors=ErrorStyle.ANY)
EXAMPLES = 120


class PinsBeforeChecking(DictLRUManager):
    """Defect: ``prepare_load`` pins its keys one by one and asserts at the
    first one that is not readable, leaving the keys before it pinned for
    good (the shape of vLLM's ``cpu/manager.py``)."""

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        keys = list(keys)
        for key in keys:
            entry = self.blocks.get(key)
            if entry is None or entry.ref_cnt < 0:
                raise AssertionError(f"block {key!r} is not ready")
            entry.ref_cnt += 1
        return SlotSpec(self.blocks[key].slot for key in keys)


class PinsBeforeCheckingThenUnprotected(PinsBeforeChecking):
    """Both defects: the damaging load, and from a manager's sixth eviction
    on, victims chosen among the offered keys too (a defect that shows late
    in a run, so the damage usually shows first)."""

    evictions = 0

    def victims(self, need: int, offered: Collection[OffloadKey]) -> list[OffloadKey] | None:
        self.evictions += 1
        if self.evictions >= 6:
            return UnprotectedLRUManager.victims(self, need, offered)  # type: ignore[arg-type]
        return super().victims(need, offered)


def test_damage_seen_at_once_through_introspection() -> None:
    report = audit(PinsBeforeChecking, policy="lru", profile=ANY_ERRORS, seed=1)
    assert report.invariant is Invariant.ERRORS, report.render()
    assert report.illegal_call_damage
    assert report.message is not None and "raised but changed the manager" in report.message
    assert report.without_illegal_calls is not None
    assert report.without_illegal_calls.passed, report.render()
    assert report.verdict() == (
        "FAIL: invariant errors (an illegal call changed the manager); "
        "without illegal calls: PASS"
    )


def test_damage_seen_calls_later_is_traced_back_to_the_illegal_call() -> None:
    report = audit(
        lambda n: Uncopyable(PinsBeforeChecking(n)), policy="lru", profile=ANY_ERRORS, seed=1
    )
    assert report.invariant is Invariant.ERRORS and report.illegal_call_damage, report.render()
    # the culprit is named, and what it broke later is still said
    assert report.message is not None and "] m.prepare_load(" in report.message
    assert "What the calls after it show: [" in report.message
    assert report.script is not None and "# illegal: must raise" in report.script
    # the replay holds the damaged manager to the specification, and its
    # correct twin passes it (the illegal call raises and changes nothing)
    namespace: dict[str, object] = {"factory": lambda n: Uncopyable(PinsBeforeChecking(n))}
    body = report.script.replace("from your_module import factory", "pass  #")
    with pytest.raises(AssertionError):
        exec(body, dict(namespace))
    exec(body, {"factory": lambda n: Uncopyable(DictLRUManager(n))})
    assert report.without_illegal_calls is not None and report.without_illegal_calls.passed


def test_what_the_damage_hid_is_found_with_illegal_calls_set_aside() -> None:
    hidden = 0
    for seed in range(1, 9):
        report = audit(PinsBeforeCheckingThenUnprotected, policy="lru", profile=ANY_ERRORS, seed=seed)
        follow_up = report.without_illegal_calls
        if not report.illegal_call_damage:  # the late defect showed first
            assert follow_up is None
            assert report.invariant in (Invariant.PROTECTION, Invariant.EVICTION), report.render()
            continue
        hidden += 1
        assert follow_up is not None and not follow_up.passed, report.render()
        assert follow_up.invariant in (Invariant.PROTECTION, Invariant.EVICTION)
        assert follow_up.script is not None and "# illegal:" not in follow_up.script
        assert "without illegal calls: FAIL: invariant" in report.verdict()
    assert hidden >= 2  # seeds 4 and 5 find the damage first


def test_a_failure_that_stays_without_the_illegal_calls_is_not_blamed_on_them() -> None:
    for seed in (1, 2, 3):
        report = audit(UnprotectedLRUManager, policy="lru", seed=seed)
        assert report.invariant in (Invariant.PROTECTION, Invariant.EVICTION), report.render()
        assert not report.illegal_call_damage and report.without_illegal_calls is None


class Raises(DictLRUManager):
    """Counts the calls that raised."""

    raised = 0

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        try:
            return super().prepare_load(keys, req_context)
        except Exception:
            Raises.raised += 1
            raise

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        try:
            super().complete_load(keys, req_context)
        except Exception:
            Raises.raised += 1
            raise

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        try:
            super().complete_store(keys, req_context, success)
        except Exception:
            Raises.raised += 1
            raise


def test_illegal_calls_can_be_left_out_from_the_start() -> None:
    report = audit(
        PinsBeforeChecking, policy="lru", profile=ANY_ERRORS, illegal_calls=False,
        max_examples=EXAMPLES, seed=1,
    )
    assert report.passed and report.without_illegal_calls is None, report.render()
    Raises.raised = 0
    assert audit(Raises, policy="lru", illegal_calls=False, max_examples=EXAMPLES, seed=1).passed
    assert Raises.raised == 0  # no call the specification refuses was made
    assert audit(Raises, policy="lru", max_examples=EXAMPLES, seed=1).passed
    assert Raises.raised > 0  # by default it makes them


def _raise(message: str) -> None:
    raise KeyError(message)


def _raise_elsewhere(message: str) -> None:
    raise KeyError(message)


def _caught(fn: Callable[[str], None], message: str) -> BaseException:
    try:
        fn(message)
    except KeyError as error:
        return error
    raise AssertionError("did not raise")


def test_a_crash_is_known_by_its_type_and_where_it_was_raised() -> None:
    """The shrinker keeps a candidate only if it fails the same way: a crash
    must not shrink into another crash of the same type raised elsewhere."""
    here = failure_kind(_caught(_raise, "a"))
    assert here == failure_kind(_caught(_raise, "b"))  # the message may change
    assert here != failure_kind(_caught(_raise_elsewhere, "a"))
    assert here.startswith("crash:KeyError@") and here.endswith(
        f":{_raise.__code__.co_firstlineno + 1}"
    )
