"""The lifecycle table, pair by pair, and the diagram in docs/SPEC.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvoffload.spec.errors import IllegalTransitionError
from kvoffload.spec.lifecycle import (
    ABSENT,
    PENDING,
    READY,
    TRANSITIONS,
    Call,
    EventKind,
    Phase,
    apply,
    is_legal,
    loading,
    render_mermaid,
)

KEY = b"\x00\x00\x00\x01"

# (phase, call) -> (phase after, event); every pair not listed is illegal.
EXPECTED: dict[tuple[Phase, Call], tuple[Phase, EventKind | None]] = {
    (ABSENT, Call.PREPARE_STORE): (PENDING, None),
    (PENDING, Call.PREPARE_STORE): (PENDING, None),
    (READY, Call.PREPARE_STORE): (READY, None),
    (loading(2), Call.PREPARE_STORE): (loading(2), None),
    (PENDING, Call.COMPLETE_STORE_OK): (READY, EventKind.STORED),
    (PENDING, Call.COMPLETE_STORE_FAILED): (ABSENT, None),
    (READY, Call.COMPLETE_STORE_OK): (READY, None),
    (READY, Call.COMPLETE_STORE_FAILED): (READY, None),
    (loading(2), Call.COMPLETE_STORE_OK): (loading(2), None),
    (loading(2), Call.COMPLETE_STORE_FAILED): (loading(2), None),
    (READY, Call.PREPARE_LOAD): (loading(1), None),
    (loading(2), Call.PREPARE_LOAD): (loading(3), None),
    (loading(2), Call.COMPLETE_LOAD): (loading(1), None),
    (loading(1), Call.PREPARE_STORE): (loading(1), None),
    (loading(1), Call.COMPLETE_STORE_OK): (loading(1), None),
    (loading(1), Call.COMPLETE_STORE_FAILED): (loading(1), None),
    (loading(1), Call.PREPARE_LOAD): (loading(2), None),
    (loading(1), Call.COMPLETE_LOAD): (READY, None),
    (loading(1), Call.TOUCH): (loading(1), None),
    (ABSENT, Call.TOUCH): (ABSENT, None),
    (PENDING, Call.TOUCH): (PENDING, None),
    (READY, Call.TOUCH): (READY, None),
    (loading(2), Call.TOUCH): (loading(2), None),
    (READY, Call.EVICT): (ABSENT, EventKind.REMOVED),
    (ABSENT, Call.RESET): (ABSENT, None),
    (PENDING, Call.RESET): (ABSENT, EventKind.REMOVED_IF_ANNOUNCED),
    (READY, Call.RESET): (ABSENT, EventKind.REMOVED_IF_ANNOUNCED),
}

PHASES = (ABSENT, PENDING, READY, loading(1), loading(2))


@pytest.mark.parametrize("phase", PHASES, ids=str)
@pytest.mark.parametrize("call", list(Call), ids=lambda c: c.name)
def test_every_pair_is_legal_with_its_target_or_raises(phase: Phase, call: Call) -> None:
    expected = EXPECTED.get((phase, call))
    if expected is None:
        assert not is_legal(phase, call)
        with pytest.raises(IllegalTransitionError) as raised:
            apply(KEY, phase, call)
        assert (raised.value.key, raised.value.phase, raised.value.call) == (KEY, phase, call)
    else:
        assert is_legal(phase, call)
        assert apply(KEY, phase, call) == expected


def test_table_has_exactly_the_expected_rows() -> None:
    assert set(TRANSITIONS) == {(p.kind, c) for p, c in EXPECTED}


def test_phases_round_trip_ref_cnt() -> None:
    for phase in PHASES:
        assert Phase.from_ref_cnt(phase.ref_cnt) == phase
    assert [p.readable for p in PHASES] == [False, False, True, True, True]
    assert [p.evictable for p in PHASES] == [False, False, True, False, False]
    assert str(loading(3)) == "LOADING(3)"
    with pytest.raises(ValueError):
        loading(0)


def test_mermaid_lists_every_row_once_per_arrow() -> None:
    diagram = render_mermaid()
    assert diagram.startswith("stateDiagram-v2\n") and diagram.endswith("\n")
    arrows = [line for line in diagram.splitlines() if "-->" in line and "[*]" not in line]
    assert len(arrows) == len(set(a.split(":")[0] for a in arrows))
    labels = sum(a.split(": ", 1)[1].count("<br/>") + 1 for a in arrows)
    assert labels == len(TRANSITIONS) + 1  # complete_load draws two arrows
    assert "LOADING --> READY: complete_load (last load)" in diagram


def test_spec_doc_shows_exactly_the_rendered_diagram() -> None:
    spec = (Path(__file__).resolve().parents[2] / "docs" / "SPEC.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```mermaid\n(.*?)```", spec, flags=re.DOTALL)
    assert blocks[0] == render_mermaid(), (
        "docs/SPEC.md's mermaid block is stale: paste the output of "
        "`python -c 'from kvoffload.spec.lifecycle import render_mermaid; "
        "print(render_mermaid(), end=\"\")'`"
    )
