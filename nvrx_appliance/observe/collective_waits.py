"""Each rank's time inside collectives, as the flight-recorder watch measures it
(rank/flight_site/sitecustomize.py) and the node's publisher carries it
(node/stack_publisher.py): the evidence that names a node late for any reason
(goodput/late_node.py, docs/stragglers.md). Pure.

The watch asks the recorder, ten times a second, whether a collective of the rank is
enqueued and not completed; each rank keeps, per stack-sampling period, its cumulative
counts `[time, polls, polls inside a collective, collectives completed]` by its own
clock. A late node's ranks arrive last and barely wait; its peers wait for it. A rank
stopped by the OS takes no polls while stopped, so its figures are those of the time it
ran. The collectives completed tell a wait spread over many collectives (a slow node,
late to each one) from one long wait (a rank's own work: rank 0's save). Figures of a
rank whose collectives run on NCCL say so (`nccl`): there "enqueued and not completed"
means GPU work queued, not a CPU waiting, and the share means nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_RANKS = 4096  # ranks read from one node's file
MAX_HISTORY = 512  # snapshots kept of one rank


UNKNOWN = -1  # collectives completed, in figures that do not count them


@dataclass(frozen=True)
class RankWaits:
    """One rank's cumulative counts over time, by its own clock."""

    node: str
    rank: int
    # (time, polls, polls inside a collective, collectives completed or UNKNOWN),
    # cumulative since its watch began, oldest first
    history: tuple[tuple[float, int, int, int], ...]
    nccl: bool = False  # its collectives run on NCCL: the share is not measured


def _snapshot(value: Any) -> tuple[float, int, int, int] | None:
    if not isinstance(value, list) or len(value) not in (3, 4):
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return None
    at, polls, waiting, completed = [*value, UNKNOWN][:4]
    if polls < 0 or waiting < 0 or waiting > polls:
        return None
    return float(at), int(polls), int(waiting), int(completed) if completed >= 0 else UNKNOWN


def parse(body: Any, generation: str, cycle: int) -> list[RankWaits]:
    """The `waits` of one published node file, of this generation and cycle only; a
    malformed entry is skipped."""
    found = body.get("waits") if isinstance(body, dict) else None
    if not isinstance(found, list):
        return []
    out = []
    for entry in found[:MAX_RANKS]:
        if not isinstance(entry, dict) or entry.get("generation") != generation:
            continue
        if entry.get("cycle") != cycle:
            continue
        node, rank = entry.get("node"), entry.get("rank")
        if not isinstance(node, str) or not isinstance(rank, int) or isinstance(rank, bool):
            continue
        history = entry.get("history")
        snaps = [_snapshot(s) for s in (history if isinstance(history, list) else [])]
        kept = tuple(s for s in snaps[-MAX_HISTORY:] if s is not None)
        if kept:
            out.append(RankWaits(node, rank, kept, nccl=entry.get("nccl") is True))
    return out
