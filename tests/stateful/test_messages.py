"""What a finding says: an eviction names the rule and the victim's role or
phase; keys read ``K[i]`` in the header as in the body; a reuse filter
audited without its parameters is told so; long messages are cut."""

from __future__ import annotations

import re

from kvoffload.spec.invariants import Invariant
from kvoffload.stateful import audit
from kvoffload.stateful.auditing import MESSAGE_LIMIT, cut
from kvoffload.stateful.targets import filtered_lru
from tests.stateful import replay_twins


def test_an_offered_victim_is_named_with_its_rule() -> None:
    report = audit(replay_twins.unprotected, policy="any", seed=3, max_examples=100)
    assert report.invariant is Invariant.EVICTION and report.message is not None
    assert re.search(r"K\[\d+\] was offered in this call \(rule 3: ", report.message), report.message
    assert "b'blk" not in report.message  # the header's key is K[i] too
    assert re.match(r"\[2/3/5 eviction\] \(key K\[\d+\]\) ", report.message)


def test_a_loading_victim_is_named_with_its_phase() -> None:
    report = audit(replay_twins.evicts_readers, policy="any", seed=3, max_examples=200)
    assert report.invariant is Invariant.EVICTION and report.message is not None
    assert re.search(r"K\[\d+\] was LOADING\(\d+\) \(rule 2: only READY blocks", report.message), (
        report.message
    )


def test_a_filter_audited_without_its_parameters_gets_a_hint() -> None:
    report = audit(filtered_lru, policy="lru", seed=3, max_examples=100)
    assert not report.passed and report.message is not None
    assert "if it is a reuse filter" in report.message
    assert "--reuse-threshold K --tracker-size N" in report.message


def test_a_long_message_is_cut_in_the_middle() -> None:
    text = "start " + "K[1], " * 500 + " end"
    short = cut(text)
    assert short.startswith("start ") and short.endswith(" end")
    assert len(short) < MESSAGE_LIMIT + 60 and "characters cut" in short
    assert cut("short") == "short"
