"""The exclusion record (Layout.exclusions): which nodes the chain keeps out of its queued
generations, why and until when, and what was last applied to which job. Pure.

Task 0's teardown judges and applies it (jobhost/node_memory.py, which runs on the host
without this package and so reads and writes the same lines itself; a test keeps the two
in step); `status` reads it; `nvrx-watch --act` adds to it (excluded_line).

One JSON object per line, appended: `kind` is "excluded" (a node, its reason, `since`
and `until`, who added it) or "applied" (the queued jobs, the nodes put in their
ExcNodeList, the nodes the cap left eligible). The latest "excluded" line of a node
wins; a line whose `until` has passed is history.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from nvrx_appliance.observe.run_files import json_lines

RECORD_VERSION = 1
EXCLUDED, APPLIED = "excluded", "applied"


@dataclass(frozen=True)
class Exclusion:
    node: str
    reason: str
    since: str  # ISO 8601 UTC
    until: str
    by: str  # "teardown" or "nvrx-watch"
    generation: str  # the array job id it was judged in
    evidence: str = ""  # "hung": a hang verdict (docs/hangs.md); "" for the others
    stacks: str = ""  # the hang record with the stacks, for a hung node


@dataclass(frozen=True)
class Applied:
    """The last time the record was put on the chain's queued generations."""

    time: str
    jobs: tuple[str, ...]
    nodes: tuple[str, ...]  # now in their ExcNodeList
    capped: tuple[str, ...]  # left eligible so that the array still fits the partition
    need: int | None  # the usable nodes the cap kept free


@dataclass(frozen=True)
class Record:
    active: tuple[Exclusion, ...]  # in force, oldest first
    applied: Applied | None


def _strings(value: object) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def read(text: str, now: str) -> Record:
    """The record as of `now` (ISO 8601 UTC: such times compare as text)."""
    latest: dict[str, Exclusion] = {}
    applied = None
    for row in json_lines(text):
        if row.get("kind") == EXCLUDED and isinstance(row.get("node"), str):
            latest.pop(row["node"], None)
            latest[row["node"]] = Exclusion(
                node=row["node"],
                reason=str(row.get("reason", "")),
                since=str(row.get("since", "")),
                until=str(row.get("until", "")),
                by=str(row.get("by", "")),
                generation=str(row.get("generation", "")),
                evidence=str(row.get("evidence", "")),
                stacks=str(row.get("stacks", "")),
            )
        elif row.get("kind") == APPLIED:
            need = row.get("need")
            applied = Applied(
                time=str(row.get("time", "")),
                jobs=_strings(row.get("jobs")),
                nodes=_strings(row.get("nodes")),
                capped=_strings(row.get("capped")),
                need=need if isinstance(need, int) and not isinstance(need, bool) else None,
            )
    active = tuple(e for e in latest.values() if e.until > now)
    return Record(active=active, applied=applied)


def excluded_line(
    node: str, reason: str, *, since: str, until: str, chain: str, generation: str, by: str
) -> str:
    """One "excluded" line, as the teardown writes them."""
    entry = {
        "kind": EXCLUDED,
        "version": RECORD_VERSION,
        "node": node,
        "reason": reason,
        "since": since,
        "until": until,
        "chain": chain,
        "generation": generation,
        "by": by,
    }
    return json.dumps(entry, sort_keys=True) + "\n"
