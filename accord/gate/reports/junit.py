"""junit.xml for CI systems: one testcase per (op, case) and per deploy check, a
testsuite per node, and for merged reports one per cross-vendor comparison. Refused
illegal calls pass (the refusal is the expected behaviour); unsupported cases and
skipped checks are `<skipped>` with the reason, never passes."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from ...conformance.results import Status
from .document import CheckStatus, Disagreement, GateReport, MergedReport


def _testcase(suite: ET.Element, classname: str, name: str) -> ET.Element:
    return ET.SubElement(suite, "testcase", classname=classname, name=name)


def _mark(testcase: ET.Element, outcome: str, message: str) -> None:
    """Attach a `failure` or `skipped` child; the first line is the attribute (CI UIs
    show it in lists), the whole message the body."""
    element = ET.SubElement(testcase, outcome, message=message.splitlines()[0] if message else outcome)
    element.text = message


def _suite(parent: ET.Element, name: str, report: GateReport) -> ET.Element:
    """A testsuite stamped with the node's host and run time, as CI readers show them."""
    environment = report.environment
    return ET.SubElement(
        parent, "testsuite", name=name,
        hostname=str(environment.get("hostname", "")), timestamp=str(environment.get("created", "")),
    )


def _node_suites(parent: ET.Element, label: str, report: GateReport) -> None:
    """A node's op cases, then its checks."""
    cases = _suite(parent, f"conformance.{label}", report)
    for result in report.results:
        testcase = _testcase(cases, f"{label}.{result.op}", f"[{result.combo}] {result.case}")
        if result.status is Status.FAIL:
            _mark(testcase, "failure", result.message)
        elif result.status is Status.UNSUPPORTED:
            _mark(testcase, "skipped", f"unsupported: {result.message}")
        elif result.status is Status.SHARED:
            _mark(testcase, "skipped", "shared with reference: the reference's own kernel, not checked")
    checks = _suite(parent, f"gate.{label}", report)
    for check in report.checks:
        testcase = _testcase(checks, f"{label}.{check.group}", check.name)
        if check.status is CheckStatus.FAIL:
            _mark(testcase, "failure", check.message)
        elif check.status is CheckStatus.SKIPPED:
            _mark(testcase, "skipped", check.message)
        elif check.status is CheckStatus.WARN:
            # JUnit has no warning outcome: the case passes and carries the finding.
            ET.SubElement(testcase, "system-out").text = f"warning: {check.message}"


def _cross_suite(parent: ET.Element, merged: MergedReport) -> None:
    """A testcase per case two or more nodes ran on the same inputs; failed where
    vendors disagree."""
    suite = ET.SubElement(parent, "testsuite", name="conformance.cross-vendor")
    disagreements: dict[tuple[str, str, str], list[Disagreement]] = {}
    for d in merged.disagreements:
        disagreements.setdefault((d.op, d.combo, d.case), []).append(d)
    for op, combo, case in merged.compared:
        testcase = _testcase(suite, f"cross-vendor.{op}", f"[{combo}] {case}")
        found = disagreements.get((op, combo, case))
        if found:
            _mark(testcase, "failure", "\n".join(
                f"{d.first} and {d.second} differ by {d.between:.3g}, more than either differs from the "
                f"reference ({d.first_vs_reference:.3g}, {d.second_vs_reference:.3g})"
                for d in found
            ))


def _count(root: ET.Element) -> None:
    """Fill the tests / failures / skipped attributes every JUnit reader expects."""
    totals = {"tests": 0, "failures": 0, "skipped": 0}
    for suite in root.iter("testsuite"):
        counts = {
            "tests": len(suite.findall("testcase")),
            "failures": len(suite.findall("testcase/failure")),
            "skipped": len(suite.findall("testcase/skipped")),
        }
        suite.attrib.update({key: str(value) for key, value in counts.items()}, errors="0")
        for key, value in counts.items():
            totals[key] += value
    root.attrib.update({key: str(value) for key, value in totals.items()}, errors="0")


def _serialise(root: ET.Element) -> str:
    _count(root)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def render_report_junit(report: GateReport) -> str:
    """junit.xml for one node's gate run."""
    root = ET.Element("testsuites", name=f"accord conformance gate ({report.backend})")
    _node_suites(root, report.backend, report)
    return _serialise(root)


def render_merged_junit(merged: MergedReport) -> str:
    """junit.xml for a merged report: every node's suites, then the cross-vendor suite."""
    root = ET.Element("testsuites", name=f"accord cross-vendor conformance ({', '.join(merged.columns)})")
    for label, source in zip(merged.columns, merged.sources):
        _node_suites(root, label, source)
    _cross_suite(root, merged)
    return _serialise(root)
