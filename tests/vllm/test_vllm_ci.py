"""Opt-in (``KVOFFLOAD_VLLM_DIRS``): auditing a vLLM release the way a CI
does. Each line says which documented finding it matches (F3 is reached
only by illegal calls); ``--fail-on engine`` and ``--no-illegal-calls`` pass
a release whose only findings need illegal calls; ``--fail-on new`` passes
a release whose findings are all documented; the JUnit XML and JSON reports
parse and agree with the lines; the release's own wrapper is copied, so
its targets are not audited "outputs only"."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.vllm.test_vllm_releases import DIRS, run, version_of

LATEST = [d for d in DIRS if version_of(d) >= (0, 31)]
"""Releases whose findings with illegal calls set aside are none (F3 only)."""


@pytest.mark.skipif(not LATEST, reason="set KVOFFLOAD_VLLM_DIRS to a release 0.31 or newer")
@pytest.mark.parametrize("directory", LATEST, ids=[d.name for d in LATEST])
def test_a_ci_audits_a_release(directory: Path, tmp_path: Path) -> None:
    junit, report = tmp_path / "audit.xml", tmp_path / "audit.json"
    base = ("-m", "kvoffload", "audit", "--vllm", str(directory), "--seed", "0",
            "--examples", "150")
    full = run(*base, "--junit-xml", str(junit), "--json", str(report))
    assert full.returncode == 1, full.stdout + full.stderr
    lines = [line for line in full.stdout.splitlines() if line.startswith(("PASS ", "FAIL "))]
    managers = [line for line in lines if " tier " not in line and " tiered" not in line]
    tiers = [line for line in lines if " tier " in line]
    tiered_rows = [line for line in lines if line.startswith(("PASS tiered", "FAIL tiered"))]
    assert len(managers) == 4, full.stdout
    for line in managers:
        assert "[F3, defect: " in line and "without illegal calls: PASS (150 examples" in line
    # a release with tiering (0.33 on) audits its example and fs tiers too
    tiered = version_of(directory) >= (0, 33)
    assert len(tiers) == (2 if tiered else 0), full.stdout
    for line in tiers:
        assert line.startswith("PASS tier fs") or (
            line.startswith("FAIL tier example") and "[F8, defect: " in line
        ), line
    # and its tiering manager: F3 with illegal calls, F10 (at a reset) without
    assert len(tiered_rows) == (1 if tiered else 0), full.stdout
    for line in tiered_rows:
        assert "[F3, defect: " in line and "without illegal calls: FAIL" in line, line
        assert "[F10, defect: " in line, line
    tiers += tiered_rows
    assert "outputs only" not in full.stdout  # the kit copies its own wrapper

    document = json.loads(report.read_text())
    assert document["passed"] is False and len(document["targets"]) == 4 + len(tiers)
    for target in document["targets"]:
        if target["name"].startswith("tier "):
            assert target["finding"] == ("F8" if target["name"] == "tier example" else None)
            continue
        if target["name"] == "tiered":
            assert target["finding"] == "F3" and target["failed"] is True
            assert "make_tiered_factory(" in target["replay"]
            continue
        assert target["finding"] == "F3" and target["kind"] == "defect"
        assert target["failed"] is True and target["seed"] == 0
        assert target["observability"] == "copy"
        assert target["replay"].rstrip().endswith("# --- end of the replay script ---")
    suites = ET.parse(junit).getroot()
    cases = suites.findall("./testsuite/testcase")
    assert len(cases) == 4 + len(tiers)
    assert sum(c.find("failure") is not None for c in cases) == 4 + (2 if tiered else 0)
    failure = cases[0].find("failure")
    assert failure is not None and failure.get("type") == "errors"
    assert "make_factory(" in (failure.text or "") and "seed: 0" in (failure.text or "")

    # F3 needs illegal calls, which an engine never makes; F8 is met by an
    # engine that uses the example tier and F10 by one that uses the tiering
    # manager, so they fail the run unless only new findings do
    for option, expected in (
        (("--fail-on", "engine"), 1 if tiered else 0),
        (("--fail-on", "new"), 0),
        (("--no-illegal-calls",), 1 if tiered else 0),
    ):
        ci = run(*base, *option)
        assert ci.returncode == expected, f"{option}: {ci.stdout}"
