"""The kit takes any output that has the contract's attributes: its own
classes are never required."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Collection, Iterable
from types import SimpleNamespace

import attrs

from kvoffload.spec.contract import OffloadingManager, ReqContext
from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.profile import DEFAULT, LookupAnswer
from kvoffload.stateful import audit
from tests.stateful.test_kit_profiles import Delegating, lru


class Medium(enum.Enum):
    CPU = "CPU"


class Result(enum.Enum):
    MISS = 0
    HIT = 1
    HIT_PENDING = 2


@dataclasses.dataclass
class StoreOutput:
    """A store answer of the backend's own type, with lists, and a spec
    without ``block_ids``."""

    keys_to_store: list[OffloadKey]
    store_spec: object
    evicted_keys: list[OffloadKey]


class OwnTypes(Delegating):
    """Answers with its own types, as vLLM 0.33 does: a result enum for
    ``lookup``, a dataclass for ``prepare_store`` whose spec names no slots,
    events with an enum ``medium``, no ``block_size`` and extra fields."""

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> object:  # type: ignore[override]
        phase = self.inner.phase(key)
        if phase.readable:
            return Result.HIT
        return Result.HIT_PENDING if phase.kind.value == "PENDING" else Result.MISS

    def lookup_prefix(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> int | None:
        return self.inner.lookup_prefix(keys, req_context)

    def prepare_store(  # type: ignore[override]
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> StoreOutput | None:
        output = self.inner.prepare_store(keys, req_context)
        if output is None:
            return None
        return StoreOutput(list(output.keys_to_store), object(), list(output.evicted_keys))

    def take_events(self) -> Iterable[object]:  # type: ignore[override]
        return [
            SimpleNamespace(
                keys=list(event.keys), medium=Medium.CPU, removed=event.removed, ownership=None
            )
            for event in self.inner.take_events()
        ]


def own_types(num_blocks: int) -> OffloadingManager:
    return OwnTypes(lru(num_blocks))


def test_outputs_are_judged_by_their_attributes() -> None:
    profile = attrs.evolve(
        DEFAULT, name="own-types", lookup_answer=LookupAnswer.RESULT, event_block_size=False
    )
    report = audit(own_types, policy="lru", profile=profile, max_examples=60)
    assert report.passed, report.render()
