"""How an ``audit --vllm`` line names its finding (no release needed): a
failure matches a documented defect by invariant, target and release; one
that matches none says so, or names the options where the profile departs
from the release's preset (the conventions F4, F5, F7)."""

from __future__ import annotations

from kvoffload.spec.invariants import Invariant
from kvoffload.spec.profile import profile_named
from kvoffload.stateful.auditing import AuditReport
from kvoffload.stateful.vllm_targets import differing_options, known_finding, release_line


def failing(invariant: Invariant, damage: bool = False, follow_up: AuditReport | None = None) -> AuditReport:
    return AuditReport("t", "lru", False, 3, 90, 0.5, invariant=invariant,
                       illegal_call_damage=damage, without_illegal_calls=follow_up)


def passing() -> AuditReport:
    return AuditReport("t", "lru", True, 500, 30_000, 4.0)


def test_documented_defects_match_by_invariant_target_and_release() -> None:
    liveness = failing(Invariant.LIVENESS)
    found = known_finding("0.21.0", "arc", liveness)
    assert found is not None and found.id == "F1"
    assert known_finding("0.30.0", "arc", liveness) is None  # fixed in 0.30
    assert known_finding("0.21.0", "lru", liveness) is None  # F1 is ARC's
    eviction = failing(Invariant.EVICTION)
    f2 = known_finding("0.24.1", "filter lru threshold=2 tracker=2", eviction)
    assert f2 is not None and f2.id == "F2"
    f3 = known_finding("0.33.0", "lru", failing(Invariant.ERRORS, damage=True))
    assert f3 is not None and f3.id == "F3" and f3.illegal_calls


def test_a_line_names_the_finding_and_gives_the_follow_up_its_own_counts() -> None:
    line = release_line("0.33.0", "lru", failing(Invariant.ERRORS, True, passing()))
    assert line.startswith("FAIL lru: invariant errors (an illegal call changed the manager) [F3, defect: ")
    assert line.endswith("(3 examples, 90 steps, 0.5 s); without illegal calls: PASS "
                         "(500 examples, 30000 steps, 4.0 s)")
    unknown = release_line("0.33.0", "lru", failing(Invariant.EVICTION))
    assert "[matches no documented finding: a new defect]" in unknown


def test_a_departure_from_the_preset_is_named_as_the_likely_convention() -> None:
    options = differing_options(profile_named("vllm-0.24"), profile_named("vllm-0.33"))
    assert "lru_rank (F7)" in options and "private_events" in options
    line = release_line("0.33.0", "lru", failing(Invariant.EVICTION), options)
    assert "likely a convention" in line and "lru_rank (F7)" in line
    assert differing_options(profile_named("vllm-0.27"), profile_named("vllm-0.25")) == []
