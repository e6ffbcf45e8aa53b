"""Reports a CI reads: JUnit XML and JSON, one entry per audited target.

Every ``audit`` run (built-in targets, ``--target``, ``--vllm``, and any
other kind of target that produces an :class:`AuditReport`-like result)
turns its results into :class:`TargetResult` rows and hands the list to
:func:`write_reports`: ``--junit-xml FILE`` writes one ``<testcase>`` per
target (a failure carries the invariant, the message, the seed and the
replay script), ``--json FILE`` the same rows as JSON objects.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

import attrs

from kvoffload.stateful.auditing import AuditReport


@attrs.frozen
class TargetResult:
    """One audited target as reported.

    ``suite``: what was audited (``kvoffload``, ``vllm 0.33.0``);
    ``name``: the target in it; ``failed``: whether it fails the run (a
    finding the run's policy tolerates is reported with ``failed`` False and
    its ``verdict`` still saying FAIL); ``finding``/``kind``: the documented
    finding it matches and whether that is a defect or a convention (None
    when unknown); ``replay``: the script that replays the failure.
    """

    suite: str
    name: str
    policy: str
    verdict: str
    failed: bool
    seconds: float
    seed: int | None
    runs: int
    calls: int
    invariant: str | None = None
    message: str | None = None
    replay: str | None = None
    finding: str | None = None
    kind: str | None = None
    observability: str | None = None
    warnings: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        """The row as plain JSON values."""
        row = attrs.asdict(self)
        row["warnings"] = list(self.warnings)
        return row


def result_of(
    report: AuditReport,
    suite: str,
    *,
    failed: bool | None = None,
    finding: str | None = None,
    kind: str | None = None,
) -> TargetResult:
    """``report`` as a row; ``failed`` defaults to the report's verdict."""
    seconds = report.seconds
    if report.without_illegal_calls is not None:
        seconds += report.without_illegal_calls.seconds
    return TargetResult(
        suite=suite,
        name=report.target,
        policy=report.policy,
        verdict=report.verdict(),
        failed=(not report.passed) if failed is None else failed,
        seconds=round(seconds, 3),
        seed=report.seed,
        runs=report.examples,
        calls=report.steps,
        invariant=None if report.invariant is None else str(report.invariant),
        message=report.message,
        replay=report.script,
        finding=finding,
        kind=kind,
        observability=report.observability,
        warnings=report.warnings,
    )


def junit_xml(results: Sequence[TargetResult]) -> str:
    """JUnit XML (the schema pytest's ``--junit-xml`` writes): one
    ``<testsuite>`` per suite, one ``<testcase>`` per target; a failing
    target has a ``<failure>`` whose ``message`` is the verdict and whose
    text is the message, the seed and the replay script; a finding the run
    tolerates is a passing testcase with the verdict in ``<system-out>``."""
    root = ET.Element("testsuites")
    suites: dict[str, list[TargetResult]] = {}
    for result in results:
        suites.setdefault(result.suite, []).append(result)
    for suite, rows in suites.items():
        element = ET.SubElement(
            root,
            "testsuite",
            name=f"kvoffload audit: {suite}",
            tests=str(len(rows)),
            failures=str(sum(r.failed for r in rows)),
            errors="0",
            skipped="0",
            time=f"{sum(r.seconds for r in rows):.3f}",
        )
        for row in rows:
            case = ET.SubElement(
                element,
                "testcase",
                classname=f"kvoffload.audit.{suite}",
                name=f"{row.name} [{row.policy}]",
                time=f"{row.seconds:.3f}",
            )
            out = [f"verdict: {row.verdict}", f"seed: {row.seed}"]
            if row.finding is not None:
                out.append(f"finding: {row.finding} ({row.kind})")
            out += [f"warning: {w}" for w in row.warnings]
            if row.failed:
                failure = ET.SubElement(
                    case, "failure", message=row.verdict, type=row.invariant or "violation"
                )
                failure.text = "\n".join(
                    [
                        row.message or "",
                        f"seed: {row.seed} (replay the audit with --seed {row.seed})",
                        "",
                        row.replay or "",
                    ]
                )
            ET.SubElement(case, "system-out").text = "\n".join(out)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def json_report(results: Sequence[TargetResult]) -> str:
    """The rows as a JSON document: ``{"passed": bool, "targets": [...]}``."""
    document = {
        "passed": not any(r.failed for r in results),
        "targets": [r.as_dict() for r in results],
    }
    return json.dumps(document, indent=2) + "\n"


def write_reports(
    results: Sequence[TargetResult], *, junit: str | None = None, json_path: str | None = None
) -> None:
    """Write the JUnit XML and/or JSON report of ``results`` where asked."""
    if junit is not None:
        Path(junit).write_text(junit_xml(results), encoding="utf-8")
    if json_path is not None:
        Path(json_path).write_text(json_report(results), encoding="utf-8")


__all__ = ["TargetResult", "json_report", "junit_xml", "result_of", "write_reports"]
