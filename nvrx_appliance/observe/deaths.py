"""The node deaths of a generation (Layout.deaths; node/dead_node.py writes them): each
node task 0's liveness judge found dead, in words, for `status`, `report` and the
watcher. Pure parsing; workdir.deaths reads the files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# What the node was doing when it died (node/dead_node.py says how each is told).
SILENT = "silent"  # it trained in the current cycle: nothing but its silence told
CRASHED = "crashed"  # its ranks had failed first; NVRx had restarted without it
SPARE = "spare"  # a hot spare that never trained in the generation
KINDS = (SILENT, CRASHED, SPARE)

DEAD_PREFIX = "dead."


def dead_name(node: str) -> str:
    return f"{DEAD_PREFIX}{node}"


def stopped_name(node: str, cycle: int) -> str:
    """Task 0's mark that it ended its own ranks in `cycle` because a node died."""
    return f"stopped.{node}.cycle{cycle}"


@dataclass(frozen=True)
class Death:
    node: str
    kind: str
    cycle: int
    last_heard: str  # ISO-8601 UTC: the node's last liveness beat
    time: str  # when task 0 judged it
    hand_off: bool
    words: str  # what was seen; sentence() adds what was done about it

    @classmethod
    def of(cls, data: dict[str, Any]) -> Death:
        kind, cycle = data.get("kind"), data.get("cycle")
        return cls(
            node=str(data["node"]),
            kind=kind if kind in KINDS else SILENT,
            cycle=cycle if isinstance(cycle, int) and not isinstance(cycle, bool) else -1,
            last_heard=str(data.get("last_heard") or ""),
            time=str(data.get("time") or ""),
            hand_off=bool(data.get("hand_off")),
            words=str(data.get("words") or f"{data['node']} stopped answering"),
        )


def parse(text: str, generation: str | None = None) -> Death | None:
    """One death record; None for a torn or foreign file (of another generation, when
    `generation` is given)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("node"), str):
        return None
    if generation is not None and data.get("generation") != generation:
        return None
    return Death.of(data)


def sentence(death: Death, exclude_for: int = 0) -> str:
    """What a person reads: what was seen, what was done about it, and how long the
    chain keeps the node out (the teardown's node memory)."""
    done = ""
    if death.kind == SILENT:
        done = (
            "; no hot spare was free, so the generation handed off and the next one starts "
            "without it"
            if death.hand_off
            else "; a hot spare took its place in the next cycle"
        )
    if exclude_for <= 0:
        return death.words + done
    span = f"{exclude_for / 3600:g} h" if exclude_for >= 3600 else f"{exclude_for} s"
    return f"{death.words}{done}; kept out of this chain's generations for {span}"
