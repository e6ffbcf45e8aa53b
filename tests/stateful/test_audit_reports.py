"""``audit --junit-xml FILE --json FILE``: one testcase/row per target, a
failure carrying the invariant, the message, the seed and the replay; the
documents parse (xml.etree, json) and agree with the exit status. Also:
``conformance_test(seed=...)``, and replays from pytest import the real
factory."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvoffload.spec.contract import OffloadingManager
from kvoffload.stateful import audit, conformance_test
from kvoffload.stateful.audit_cli import main
from kvoffload.stateful.reports import TargetResult, json_report, junit_xml
from tests.stateful import replay_twins


def cli(tmp_path: Path, target: str, policy: str, *extra: str) -> tuple[int, Path, Path]:
    xml_path, json_path = tmp_path / "audit.xml", tmp_path / "audit.json"
    status = main([
        "--target", target, "--policy", policy, "--seed", "3", "--examples", "60",
        "--junit-xml", str(xml_path), "--json", str(json_path), *extra,
    ])
    return status, xml_path, json_path


def test_a_failing_target_is_a_failed_testcase(tmp_path: Path) -> None:
    status, xml_path, json_path = cli(tmp_path, "tests.stateful.replay_twins:unprotected", "any")
    assert status == 1
    suites = ET.parse(xml_path).getroot()
    assert suites.tag == "testsuites"
    suite = suites.find("testsuite")
    assert suite is not None and suite.get("tests") == "1" and suite.get("failures") == "1"
    case = suite.find("testcase")
    assert case is not None and case.get("name") == "tests.stateful.replay_twins:unprotected [any]"
    failure = case.find("failure")
    assert failure is not None and failure.get("type") == "2/3/5 eviction"
    assert (failure.get("message") or "").startswith("FAIL: invariant 2/3/5 eviction")
    text = failure.text or ""
    assert "seed: 3" in text and "replay = Replay(factory, " in text
    assert "from tests.stateful.replay_twins import unprotected as factory" in text

    document = json.loads(json_path.read_text())
    assert document["passed"] is False
    [row] = document["targets"]
    assert row["failed"] is True and row["invariant"] == "2/3/5 eviction" and row["seed"] == 3
    assert row["replay"] == text.split("\n\n", 1)[1].rstrip("\n") + "\n"


def test_a_passing_target_is_a_passing_testcase(tmp_path: Path) -> None:
    status, xml_path, json_path = cli(tmp_path, "tests.stateful.replay_twins:correct", "lru")
    assert status == 0
    case = ET.parse(xml_path).getroot().find("./testsuite/testcase")
    assert case is not None and case.find("failure") is None
    assert "verdict: PASS" in (case.findtext("system-out") or "")
    document = json.loads(json_path.read_text())
    assert document["passed"] is True and document["targets"][0]["verdict"] == "PASS"


def test_a_tolerated_finding_is_reported_but_does_not_fail() -> None:
    rows = [
        TargetResult("vllm 0.33.0", "lru", "lru", "FAIL: invariant errors", False, 1.0, 0, 2, 9,
                     invariant="errors", finding="F3", kind="defect"),
        TargetResult("vllm 0.33.0", "arc", "arc", "PASS", False, 2.0, 0, 500, 9000),
    ]
    suite = ET.fromstring(junit_xml(rows)).find("testsuite")
    assert suite is not None and suite.get("failures") == "0" and suite.get("tests") == "2"
    outs = [c.findtext("system-out") or "" for c in suite.findall("testcase")]
    assert "finding: F3 (defect)" in outs[0] and "verdict: FAIL" in outs[0]
    assert json.loads(json_report(rows))["passed"] is True


def test_conformance_test_takes_a_seed() -> None:
    test = conformance_test(replay_twins.unprotected, policy="any", seed=3, max_examples=60)
    with pytest.raises(AssertionError) as first:
        test()
    with pytest.raises(AssertionError) as again:
        test()
    assert "seed 3" in str(first.value)
    assert str(first.value).split("\n", 1)[1] == str(again.value).split("\n", 1)[1]
    # the replay imports the real factory, not a placeholder
    assert "from tests.stateful.replay_twins import unprotected as factory" in str(first.value)
    assert "your_module" not in str(first.value)


def test_a_local_factory_keeps_the_placeholder() -> None:
    def local(num_blocks: int) -> OffloadingManager:
        return replay_twins.Unprotected(num_blocks)

    report = audit(local, policy="any", seed=3, max_examples=60)
    assert report.script is not None and "from your_module import factory" in report.script


@pytest.mark.parametrize(("fail_on", "status"), [("any", 1), ("engine", 0)])
def test_fail_on_engine_judges_damage_by_the_audit_without_illegal_calls(
    tmp_path: Path, fail_on: str, status: int
) -> None:
    # pins keys before it asserts: an illegal load damages it; without
    # illegal calls it is a correct LRU
    got, _, json_path = cli(
        tmp_path, "tests.stateful.test_illegal_call_damage:PinsBeforeChecking", "lru",
        "--no-typed-errors", "--fail-on", fail_on,
    )
    assert got == status
    [row] = json.loads(json_path.read_text())["targets"]
    assert row["verdict"].startswith("FAIL: invariant errors (an illegal call changed the manager)")
    assert row["verdict"].endswith("without illegal calls: PASS")
    assert row["failed"] is (status == 1)
