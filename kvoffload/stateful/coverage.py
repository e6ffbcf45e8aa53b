"""What an audit reached: every lifecycle row and every ARC branch, counted.

A random driver that never builds a state cannot find a defect that needs
it. :class:`Coverage` watches every legal step the harness makes (the model
before, the call, the model after) and counts

- each row of the lifecycle table (:data:`kvoffload.spec.lifecycle.TRANSITIONS`)
  taken by some key, with ``complete_load`` split into "loads remain" and
  "last load", plus refused stores;
- for ARC, the branches of its victim choice and adaptation that a defect
  hides in: a T1 and a T2 victim with ``target >= 1``, an eviction with
  ``|T1| = int(target) >= 1`` and T2 non-empty (the tie that prefers T1), an
  eviction with a fractional target, a fall-back to the other list, a ghost
  list trimmed to capacity, and ghost hits in B1 and in B2.

The counts come from the model, which follows the manager's observed
choices; they say what the audit exercised, not what the manager does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import attrs

from kvoffload.spec.keys import OffloadKey
from kvoffload.spec.lifecycle import TRANSITIONS, Call, PhaseKind
from kvoffload.spec.model import (
    CompleteLoad,
    CompleteStore,
    ManagerModel,
    Operation,
    PrepareLoad,
    PrepareStore,
    ResetCache,
    Touch,
    dedup,
)
from kvoffload.spec.policies import ARCModel
from kvoffload.spec.reuse import ReuseFilterModel

LAST_LOAD = "LOADING complete_load (last load)"
LOADS_REMAIN = "LOADING complete_load (loads remain)"
REFUSED = "prepare_store refused (no room)"


def _row_name(kind: PhaseKind, call: Call) -> str:
    return f"{kind.value} {call.value}"


def _lifecycle_rows() -> tuple[str, ...]:
    rows: list[str] = []
    for kind, call in TRANSITIONS:
        if call is Call.COMPLETE_LOAD:
            rows += [LOADS_REMAIN, LAST_LOAD]
        else:
            rows.append(_row_name(kind, call))
    return (*rows, REFUSED)


LIFECYCLE_ROWS: tuple[str, ...] = _lifecycle_rows()
"""Every lifecycle row the audit should take (names as reported)."""

ARC_T1_TARGET = "evict from T1 with target >= 1"
ARC_T2_TARGET = "evict from T2 with target >= 1"
ARC_TIE = "evict with |T1| = int(target) >= 1 and T2 non-empty"
ARC_FRACTIONAL = "evict with a fractional target"
ARC_FALLBACK = "evict from the other list (preferred one has no victim)"
ARC_TRIM = "ghost list trimmed to capacity"
ARC_B1_HIT = "ghost hit in B1 (target grows)"
ARC_B2_HIT = "ghost hit in B2 (target shrinks)"

ARC_BRANCHES: tuple[str, ...] = (
    ARC_T1_TARGET,
    ARC_T2_TARGET,
    ARC_TIE,
    ARC_FRACTIONAL,
    ARC_FALLBACK,
    ARC_TRIM,
    ARC_B1_HIT,
    ARC_B2_HIT,
)
"""Every ARC branch the audit should take (ARC audits only)."""


def _core(model: object) -> ManagerModel:
    if isinstance(model, ReuseFilterModel):
        return model.backing
    if not isinstance(model, ManagerModel):  # pragma: no cover - defensive
        raise TypeError(model)
    return model


@attrs.frozen
class CoverageSummary:
    """Counts per lifecycle row and ARC branch (``arc`` empty for other
    policies) and the names never reached."""

    lifecycle: tuple[tuple[str, int], ...]
    arc: tuple[tuple[str, int], ...]

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(name for name, count in (*self.lifecycle, *self.arc) if count == 0)

    def line(self) -> str:
        """One line: rows and branches reached, and which were not."""
        rows = sum(1 for _, c in self.lifecycle if c)
        text = f"coverage: {rows}/{len(self.lifecycle)} lifecycle rows"
        if self.arc:
            branches = sum(1 for _, c in self.arc if c)
            text += f", {branches}/{len(self.arc)} ARC branches"
        missing = self.missing
        if missing:
            text += "; never reached: " + "; ".join(missing)
        return text


class Coverage:
    """Counters fed by :meth:`observe` (see the module docstring)."""

    def __init__(self, arc: bool = False) -> None:
        self.arc = arc
        self.counts: Counter[str] = Counter()

    def summary(self) -> CoverageSummary:
        return CoverageSummary(
            tuple((name, self.counts[name]) for name in LIFECYCLE_ROWS),
            tuple((name, self.counts[name]) for name in ARC_BRANCHES) if self.arc else (),
        )

    def merge(self, other: Coverage) -> None:
        self.counts.update(other.counts)
        self.arc = self.arc or other.arc

    def observe(self, before_model: object, op: Operation, after_model: object) -> None:
        """Count the rows and branches the legal call ``op`` took."""
        before, after = _core(before_model), _core(after_model)
        count = self.counts
        if isinstance(op, PrepareStore):
            passed = getattr(before_model, "passed_keys", None)
            keys = tuple(passed(op.keys)) if callable(passed) else op.keys
            self._store(before, after, keys)
        elif isinstance(op, CompleteStore):
            call = Call.COMPLETE_STORE_OK if op.success else Call.COMPLETE_STORE_FAILED
            for key in dedup(op.keys):
                count[_row_name(before.phase(key).kind, call)] += 1
        elif isinstance(op, PrepareLoad):
            loads: Counter[OffloadKey] = Counter()
            for key in op.keys:
                kind = PhaseKind.LOADING if loads[key] else before.phase(key).kind
                count[_row_name(kind, Call.PREPARE_LOAD)] += 1
                loads[key] += 1
        elif isinstance(op, CompleteLoad):
            left = Counter({k: before.phase(k).loads for k in set(op.keys)})
            for key in op.keys:
                left[key] -= 1
                count[LAST_LOAD if left[key] == 0 else LOADS_REMAIN] += 1
        elif isinstance(op, Touch):
            for key in op.keys:
                count[_row_name(before.phase(key).kind, Call.TOUCH)] += 1
            if isinstance(before.policy, ARCModel):
                for key in op.keys:
                    if key in before.policy.b1:
                        count[ARC_B1_HIT] += 1
                    elif key in before.policy.b2:
                        count[ARC_B2_HIT] += 1
        elif isinstance(op, ResetCache):
            kinds = {b.phase.kind for b in before.blocks.values()}
            if len(before.blocks) < before.num_blocks:
                kinds.add(PhaseKind.ABSENT)
            for kind in kinds:
                count[_row_name(kind, Call.RESET)] += 1

    def _store(self, before: ManagerModel, after: ManagerModel, keys: Iterable[OffloadKey]) -> None:
        count = self.counts
        offered = dedup(keys)
        new = [k for k in offered if before.phase(k).kind is PhaseKind.ABSENT]
        if new and after is before:
            count[REFUSED] += 1
            return
        for key in offered:
            count[_row_name(before.phase(key).kind, Call.PREPARE_STORE)] += 1
        victims = [
            k for k, b in before.blocks.items()
            if k not in after.blocks and b.phase.kind is PhaseKind.READY
        ]
        count[_row_name(PhaseKind.READY, Call.EVICT)] += len(victims)
        if victims and isinstance(before.policy, ARCModel):
            self._arc_eviction(before.policy, victims)

    def _arc_eviction(self, arc: ARCModel, victims: list[OffloadKey]) -> None:
        count = self.counts
        target = arc.target
        if target != int(target):
            count[ARC_FRACTIONAL] += 1
        if len(arc.t1) == int(target) >= 1 and arc.t2:
            count[ARC_TIE] += 1
        # the victims in eviction order are not known here: replay the choice
        ordered = arc.choose_victims(len(victims), tuple(victims))
        virtual_t1 = len(arc.t1)
        for victim in ordered or ():
            prefer_t1 = virtual_t1 >= int(target)
            in_t1 = victim in arc.t1
            if target >= 1:
                count[ARC_T1_TARGET if in_t1 else ARC_T2_TARGET] += 1
            if in_t1 != prefer_t1:
                count[ARC_FALLBACK] += 1
            if in_t1:
                virtual_t1 -= 1
        from_t1 = sum(1 for v in victims if v in arc.t1)
        from_t2 = len(victims) - from_t1
        if len(arc.b1) + from_t1 > arc.capacity or len(arc.b2) + from_t2 > arc.capacity:
            count[ARC_TRIM] += 1


__all__ = [
    "ARC_BRANCHES",
    "LIFECYCLE_ROWS",
    "Coverage",
    "CoverageSummary",
]
