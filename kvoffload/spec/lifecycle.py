"""The block lifecycle as data: phases, calls and the transition table.

One key is in exactly one :class:`Phase`. :data:`TRANSITIONS` lists every
legal ``(phase kind, call)`` pair; :func:`apply` is the only way to move a
phase, and anything not in the table raises :class:`IllegalTransitionError`.
``LOADING`` carries the number of loads in flight; it counts down to
``READY``. ``reset_cache`` is illegal while any key is LOADING: the slot a
load reads must not be handed to the next store before the load completes
(a profile with ``reset_with_loads`` allows it; see
:class:`~kvoffload.spec.profile.Profile`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

import attrs

from kvoffload.spec.errors import IllegalTransitionError


class PhaseKind(enum.Enum):
    """The four phases of a key, without LOADING's count."""

    ABSENT = "ABSENT"
    PENDING = "PENDING"
    READY = "READY"
    LOADING = "LOADING"


class Call(enum.Enum):
    """Everything that can move a key's phase."""

    PREPARE_STORE = "prepare_store"
    COMPLETE_STORE_OK = "complete_store(success=True)"
    COMPLETE_STORE_FAILED = "complete_store(success=False)"
    PREPARE_LOAD = "prepare_load"
    COMPLETE_LOAD = "complete_load"
    TOUCH = "touch"
    EVICT = "evicted by another key's prepare_store"
    RESET = "reset_cache"


class EventKind(enum.Enum):
    """What a transition announces to event consumers."""

    STORED = "stored"
    REMOVED = "removed"
    REMOVED_IF_ANNOUNCED = "removed, if the key was announced"


@attrs.frozen(order=False)
class Phase:
    """A key's phase; ``loads`` is the number of loads in flight (LOADING only)."""

    kind: PhaseKind
    loads: int = 0

    @classmethod
    def from_ref_cnt(cls, ref_cnt: int | None) -> Phase:
        """Map a ``BlockStatus.ref_cnt`` (``None`` for untracked) to a phase."""
        if ref_cnt is None:
            return ABSENT
        if ref_cnt < 0:
            return PENDING
        if ref_cnt == 0:
            return READY
        return cls(PhaseKind.LOADING, ref_cnt)

    @property
    def ref_cnt(self) -> int | None:
        """The ``BlockStatus.ref_cnt`` of this phase (``None`` for ABSENT)."""
        return _REF_CNT[self.kind] if self.kind is not PhaseKind.LOADING else self.loads

    @property
    def readable(self) -> bool:
        """Whether ``lookup`` answers True for a key in this phase."""
        return self.kind in (PhaseKind.READY, PhaseKind.LOADING)

    @property
    def evictable(self) -> bool:
        """Whether a key in this phase may be chosen as a victim."""
        return self.kind is PhaseKind.READY

    def __str__(self) -> str:
        if self.kind is PhaseKind.LOADING:
            return f"LOADING({self.loads})"
        return str(self.kind.value)


_REF_CNT: Mapping[PhaseKind, int | None] = {
    PhaseKind.ABSENT: None,
    PhaseKind.PENDING: -1,
    PhaseKind.READY: 0,
}

ABSENT = Phase(PhaseKind.ABSENT)
PENDING = Phase(PhaseKind.PENDING)
READY = Phase(PhaseKind.READY)


def loading(n: int) -> Phase:
    """``LOADING(n)`` for ``n >= 1``."""
    if n < 1:
        raise ValueError(f"LOADING needs at least one load in flight, got {n}")
    return Phase(PhaseKind.LOADING, n)


@attrs.frozen
class Transition:
    """One row of the table: the target kind, the change of the load count,
    and the event announced."""

    target: PhaseKind
    load_delta: int = 0
    event: EventKind | None = None
    note: str = ""


_A, _P, _R, _L = PhaseKind.ABSENT, PhaseKind.PENDING, PhaseKind.READY, PhaseKind.LOADING

TRANSITIONS: Mapping[tuple[PhaseKind, Call], Transition] = MappingProxyType(
    {
        # storing
        (_A, Call.PREPARE_STORE): Transition(_P, note="admitted, room found"),
        (_P, Call.PREPARE_STORE): Transition(_P, note="already tracked: not stored again"),
        (_R, Call.PREPARE_STORE): Transition(_R, note="already stored: protected"),
        (_L, Call.PREPARE_STORE): Transition(_L, note="already stored: protected"),
        (_P, Call.COMPLETE_STORE_OK): Transition(_R, event=EventKind.STORED),
        (_P, Call.COMPLETE_STORE_FAILED): Transition(_A, note="never announced"),
        (_R, Call.COMPLETE_STORE_OK): Transition(_R, note="no-op"),
        (_R, Call.COMPLETE_STORE_FAILED): Transition(_R, note="no-op"),
        (_L, Call.COMPLETE_STORE_OK): Transition(_L, note="no-op"),
        (_L, Call.COMPLETE_STORE_FAILED): Transition(_L, note="no-op"),
        # loading
        (_R, Call.PREPARE_LOAD): Transition(_L, load_delta=+1),
        (_L, Call.PREPARE_LOAD): Transition(_L, load_delta=+1),
        (_L, Call.COMPLETE_LOAD): Transition(_L, load_delta=-1, note="READY at zero"),
        # recency only
        (_A, Call.TOUCH): Transition(_A),
        (_P, Call.TOUCH): Transition(_P),
        (_R, Call.TOUCH): Transition(_R),
        (_L, Call.TOUCH): Transition(_L),
        # leaving the cache
        (_R, Call.EVICT): Transition(_A, event=EventKind.REMOVED),
        (_A, Call.RESET): Transition(_A),
        (_P, Call.RESET): Transition(_A, event=EventKind.REMOVED_IF_ANNOUNCED),
        (_R, Call.RESET): Transition(_A, event=EventKind.REMOVED_IF_ANNOUNCED),
    }
)


def is_legal(phase: Phase, call: Call) -> bool:
    """Whether ``call`` is in the table for ``phase``."""
    return (phase.kind, call) in TRANSITIONS


def apply(key: bytes, phase: Phase, call: Call) -> tuple[Phase, EventKind | None]:
    """The phase ``key`` moves to under ``call``, and the event it announces.

    Raises :class:`IllegalTransitionError` (naming ``key`` and ``phase``) when
    the pair is not in :data:`TRANSITIONS`.
    """
    row = TRANSITIONS.get((phase.kind, call))
    if row is None:
        raise IllegalTransitionError(key, phase, call)
    loads = phase.loads + row.load_delta
    if row.target is PhaseKind.LOADING:
        return (loading(loads) if loads > 0 else READY), row.event
    return Phase(row.target), row.event


_MERMAID_NAMES: Mapping[PhaseKind, str] = {
    PhaseKind.ABSENT: "ABSENT",
    PhaseKind.PENDING: "PENDING",
    PhaseKind.READY: "READY",
    PhaseKind.LOADING: "LOADING(n)",
}


def _edge_label(
    source: PhaseKind, call: Call, row: Transition, *, last_load: bool = False
) -> str:
    """The text on one arrow of the diagram: the call, then the event if any."""
    if call is Call.PREPARE_LOAD:
        text = "prepare_load (n+1)" if source is PhaseKind.LOADING else "prepare_load (n=1)"
    elif call is Call.COMPLETE_LOAD:
        text = "complete_load (last load)" if last_load else "complete_load (loads remain)"
    else:
        text = call.value
    if row.event is not None:
        text += f" / {row.event.value}"
    return text


def render_mermaid() -> str:
    """Render :data:`TRANSITIONS` as a Mermaid ``stateDiagram-v2``.

    One arrow per ``(from, to)`` pair, its label listing every call (and the
    event it announces) that takes a key along it, in table order. The row
    ``(LOADING, complete_load)`` is drawn as two arrows: to LOADING while
    loads remain, and to READY for the last one. The output ends with a
    newline and is what ``docs/SPEC.md`` shows (a test keeps the two equal).
    """
    edges: dict[tuple[PhaseKind, PhaseKind], list[str]] = {}
    for (source, call), row in TRANSITIONS.items():
        targets = [(row.target, False)]
        if row.load_delta < 0:
            targets.append((PhaseKind.READY, True))
        for target, last_load in targets:
            label = _edge_label(source, call, row, last_load=last_load)
            edges.setdefault((source, target), []).append(label)
    lines = ["stateDiagram-v2"]
    for kind in PhaseKind:
        lines.append(f'    state "{_MERMAID_NAMES[kind]}" as {kind.name}')
    lines.append(f"    [*] --> {PhaseKind.ABSENT.name}")
    for (source, target), labels in edges.items():
        lines.append(f"    {source.name} --> {target.name}: {'<br/>'.join(labels)}")
    return "\n".join(lines) + "\n"
