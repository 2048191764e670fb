"""The hang records of a generation (Layout.hangs; rank/stacks.py writes them): what each
hung cycle's judgement found, for `status`, `report`, `logs --stacks` and the watcher.
Pure parsing; workdir.hangs reads the files.

A record names the node(s) a hang waited on, or none and why; a `withdrawn.<node>`
marker beside it says a named node's ranks moved again after the verdict.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Hang:
    cycle: int
    nodes: tuple[str, ...]  # named by the verdict; () for none
    words: str  # the verdict, or why there is none
    hand_off: bool  # no free hot spare: the generation handed off
    withdrawn: tuple[str, ...]  # named nodes whose ranks moved again
    time: str
    record: dict[str, Any]  # the whole record: groups and stacks

    @property
    def standing(self) -> tuple[str, ...]:
        return tuple(n for n in self.nodes if n not in self.withdrawn)


def parse(text: str, withdrawn: set[str]) -> Hang | None:
    """One hang record (cycle<N>.json); None for a torn or foreign file."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("cycle"), int):
        return None
    nodes = tuple(str(n) for n in data.get("nodes") or [] if isinstance(n, str))
    return Hang(
        cycle=data["cycle"],
        nodes=nodes,
        words=str(data.get("words", "")),
        hand_off=bool(data.get("hand_off")),
        withdrawn=tuple(n for n in nodes if n in withdrawn),
        time=str(data.get("time", "")),
        record=data,
    )


def sentence(hang: Hang, exclude_for: int = 0) -> str:
    """What a person reads: "node3 hung in cycle 2: ...; kept out of the next rendezvous
    (...)", or the record's "no verdict ..." as it is."""
    if not hang.nodes:
        return hang.words
    if not hang.standing:
        return f"{hang.words}; withdrawn: its ranks moved again"
    where = (
        "no free hot spare, so the generation handed off and the next one starts without it"
        if hang.hand_off
        else "kept out of the next rendezvous (a hot spare takes its place)"
    )
    held = f" and of this chain's generations for {_span(exclude_for)}" if exclude_for > 0 else ""
    return f"{hang.words}; {where}{held}"


def _span(seconds: int) -> str:
    return f"{seconds / 3600:g} h" if seconds >= 3600 else f"{seconds} s"


def grouped(hang: Hang) -> list[str]:
    """The record's stacks, grouped, as lines for a person (`logs --stacks`)."""
    lines = [hang.words]
    for group in hang.record.get("groups") or []:
        if not isinstance(group, dict):
            continue
        ranks = [str(r) for r in group.get("ranks") or []]
        nodes = ", ".join(str(n) for n in group.get("nodes") or [])
        how = "waited in" if group.get("waiting") else "stood in"
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(ranks)}"
        lines.append(f"  {who} on {nodes} {how} `{group.get('where')}`:")
        for frame in group.get("frames") or []:
            if isinstance(frame, dict):
                lines.append(f"      {frame.get('name')} ({frame.get('file')}:{frame.get('line')})")
    return lines
