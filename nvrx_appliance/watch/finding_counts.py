"""What the findings gauges say after a pass: a count for each detector that judged the
pass, and for one that could not, what it last said.

A detector kept from judging by a source it could not observe (Slurm unreachable during
a controller restart, cycle files unreadable) has not found the chain healthy: writing 0 for it would resolve
every alert it raised, and page again when the source came back. The PagerDuty sink
does not resolve a page in that case (watcher._resolve_cleared); the gauges agree with
it by carrying the detector's last counts through the blind pass, or writing no sample
when nothing was ever counted (an absent series is "no data", never "none").

Pure: the watcher keeps the counts in its state file between passes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from nvrx_appliance.watch import detectors
from nvrx_appliance.watch.findings import Finding

# (detector, severity) -> findings; (detector, node) -> findings naming the node.
Counts = dict[tuple[str, str], int]


@dataclass(frozen=True)
class FindingCounts:
    by_detector: Counts = field(default_factory=dict)
    by_node: Counts = field(default_factory=dict)

    def to_json(self) -> dict[str, list[list[Any]]]:
        return {
            "detectors": [[d, s, n] for (d, s), n in sorted(self.by_detector.items())],
            "nodes": [[d, node, n] for (d, node), n in sorted(self.by_node.items())],
        }


def from_json(data: Any) -> FindingCounts | None:
    """The counts a state file kept; None when absent or not of this shape (another
    version's, a hand edit): nothing is carried then."""
    if not isinstance(data, dict):
        return None
    tables = []
    for key in ("detectors", "nodes"):
        rows = data.get(key)
        if not isinstance(rows, list) or not all(_row(r) for r in rows):
            return None
        tables.append({(a, b): n for a, b, n in rows})
    return FindingCounts(*tables)


def _row(row: Any) -> bool:
    return (
        isinstance(row, list)
        and len(row) == 3
        and all(isinstance(x, str) for x in row[:2])
        and isinstance(row[2], int)
        and not isinstance(row[2], bool)
        and row[2] >= 0
    )


def count(
    findings: Iterable[Finding], blind: frozenset[str], last: FindingCounts | None
) -> FindingCounts:
    """This pass's counts. A detector counts what it found (0 when nothing), unless it
    was blind this pass (detectors.blind_to) and found nothing: a source that could not
    be observed can hide a finding, never make one up, so such a detector carries its
    last counts, or has none."""
    findings = list(findings)
    found = {f.detector for f in findings}
    last = last or FindingCounts()
    by_detector: Counts = {}
    by_node: Counts = {}
    for d in detectors.ALL:
        if d.name not in blind or d.name in found:
            by_detector[(d.name, d.severity)] = 0
            continue
        by_detector.update({k: n for k, n in last.by_detector.items() if k[0] == d.name})
        by_node.update({k: n for k, n in last.by_node.items() if k[0] == d.name})
    for f in findings:
        by_detector[(f.detector, f.severity)] = by_detector.get((f.detector, f.severity), 0) + 1
        for node in f.nodes:
            by_node[(f.detector, node)] = by_node.get((f.detector, node), 0) + 1
    return FindingCounts(by_detector, by_node)
