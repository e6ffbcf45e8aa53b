"""One vocabulary: invariants, policies and operations each have one
definition that the models, the production code, the kit and the docs share."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import kvoffload.stateful
from kvoffload.impl.policies import CACHE_POLICIES, make_cache_policy
from kvoffload.spec.contract import OffloadingManager
from kvoffload.spec.errors import ConfigurationError
from kvoffload.spec.invariants import STATE_INVARIANTS, STEP_INVARIANTS, Invariant
from kvoffload.spec.keys import make_offload_key
from kvoffload.spec.model import (
    CompleteLoad,
    CompleteStore,
    KeyListOperation,
    Lookup,
    LookupPrefix,
    ManagerModel,
    Operation,
    PrepareLoad,
    PrepareStore,
    RequestHook,
    ResetCache,
    TakeEvents,
    Touch,
)
from kvoffload.spec.policies import (
    IMPLEMENTABLE_POLICY_NAMES,
    POLICY_NAMES,
    POLICY_REGISTRY,
    make_policy,
)
from kvoffload.stateful.harness import POLICIES, SCRIPT_SPELLING

DOCS = Path(__file__).resolve().parents[2] / "docs"
K0, K1 = make_offload_key(b"blk00", 0), make_offload_key(b"blk01", 1)

ONE_OF_EACH: tuple[Operation, ...] = (
    Lookup(K0),
    LookupPrefix((K0, K1)),
    PrepareStore((K0,)),
    CompleteStore((K0,), False),
    PrepareLoad((K0,)),
    CompleteLoad((K0,)),
    Touch((K1, K0)),
    ResetCache(),
    TakeEvents(),
    RequestHook("on_schedule_end"),
)


def _concrete_operations() -> set[type[Operation]]:
    found: set[type[Operation]] = set()
    pending = [Operation]
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            pending.append(sub)
            if not getattr(sub, "__abstractmethods__", None) and sub is not KeyListOperation:
                found.add(sub)
    return found


def test_invariant_labels_are_unique_and_round_trip() -> None:
    labels = [member.label for member in Invariant]
    assert len(set(labels)) == len(labels)
    for member in Invariant:
        assert Invariant.from_label(member.label) is member
        assert str(member) == member.label and f"{member:>20}".strip() == member.label
    with pytest.raises(ValueError):
        Invariant.from_label("lifecycle")  # the old, bare name is gone


def test_every_predicate_is_keyed_by_an_invariant() -> None:
    assert set(STATE_INVARIANTS) == {
        Invariant.WELL_FORMED, Invariant.CAPACITY, Invariant.EVENTS,
    }
    assert Invariant.LIFECYCLE in STEP_INVARIANTS and Invariant.EVENTS in STEP_INVARIANTS


def test_the_docs_use_the_invariant_labels() -> None:
    spec = (DOCS / "SPEC.md").read_text()
    for member in Invariant:
        assert f"`{member.label}`" in spec, f"docs/SPEC.md does not name {member.label!r}"


def test_one_policy_registry() -> None:
    assert POLICY_NAMES == tuple(POLICY_REGISTRY) == ("lru", "arc", "any")
    assert POLICIES == POLICY_NAMES  # the kit reads the registry
    assert IMPLEMENTABLE_POLICY_NAMES == ("lru", "arc")
    # the production code implements exactly the implementable policies
    assert set(CACHE_POLICIES) == set(IMPLEMENTABLE_POLICY_NAMES)
    for name in IMPLEMENTABLE_POLICY_NAMES:
        assert make_policy(name, 4).name == name
        make_cache_policy(name, 4)
    with pytest.raises(ConfigurationError):
        make_cache_policy("any", 4)
    with pytest.raises(ConfigurationError, match="lru, arc, any"):
        make_policy("mru", 4)


def test_each_operation_class_is_covered_here() -> None:
    assert {type(op) for op in ONE_OF_EACH} == _concrete_operations()


@pytest.mark.parametrize("op", ONE_OF_EACH, ids=lambda op: type(op).__name__)
def test_each_operation_renders_applies_and_calls_itself(op: Operation) -> None:
    text = op.render(SCRIPT_SPELLING)
    assert re.match(r"(list\()?m\.\w+\(", text), text
    called = text.split("m.", 1)[1].split("(", 1)[0]
    assert hasattr(OffloadingManager, called)
    if op.method != "request_hook":
        assert called == op.method

    # A model stores K0 and K1 so that every call is legal on it.
    model = ManagerModel.create(4, "lru", enable_events=True)
    model = model.prepare_store((K0, K1))[0].complete_store((K0, K1))[0]
    if isinstance(op, CompleteStore):
        model = model.prepare_store((make_offload_key(b"blk09", 1),))[0]
        op = CompleteStore((make_offload_key(b"blk09", 1),), False)
    if isinstance(op, CompleteLoad):
        model = model.prepare_load((K0,))[0]
    after, result = op.apply_to(model)
    assert (after, result) == model.apply(op)

    # ... and is made on a manager as the rendered line says.
    calls: list[str] = []

    class Recorder:
        def __getattr__(self, name: str) -> object:
            def record(*args: object) -> object:
                calls.append(name)
                return []

            return record

    op.call(Recorder(), object())
    assert calls == [called]


def test_the_audit_module_is_not_shadowed() -> None:
    module = importlib.import_module("kvoffload.stateful.auditing")
    assert kvoffload.stateful.audit is module.audit
    assert callable(kvoffload.stateful.audit)
