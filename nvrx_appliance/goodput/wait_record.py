"""Each rank's time inside collectives, read back from the nodes' published stacks
(node/stack_publisher.py) into the training record's cycles, so that the straggler rule
(goodput/straggler.py) sees who the others wait for, whatever the workload.

Only the newest generation's newest cycle is read: what status, the watcher and task 0's
look judge (at 2,048 nodes, one file per node); earlier cycles' stragglers are in the
ledger (node/straggler_leave.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

from nvrx_appliance import files
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe import collective_waits
from nvrx_appliance.observe.training_log import CycleWork, Key

NODE_FILE_BYTES = 64 << 20  # one node's published file: samples and figures of its ranks
MAX_FILES = 100_000
SOURCE = "collective waits"  # a cycle known from these figures alone (no progress log)


def _newest_cycle(stacks: os.PathLike[str]) -> int | None:
    try:
        names = os.listdir(stacks)
    except OSError:
        return None
    cycles = [int(n[5:]) for n in names if n.startswith("cycle") and n[5:].isdecimal()]
    return max(cycles, default=None)


def read(layout: Layout, generation: str) -> tuple[int, list[collective_waits.RankWaits]] | None:
    """(the newest cycle, its ranks' figures) of a generation; None where none were
    published."""
    stacks = layout.stacks(generation)
    cycle = _newest_cycle(stacks)
    if cycle is None:
        return None
    directory = stacks / f"cycle{cycle}"
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))[:MAX_FILES]
    except OSError:
        return None
    found = []
    for name in names:
        if name.startswith(".") or ".rank" in name:  # a guard's own sample has no figures
            continue
        try:
            body = json.loads(files.read_text(directory / name, NODE_FILE_BYTES) or "")
        except (OSError, ValueError):
            continue
        found += collective_waits.parse(body, generation, cycle)
    return (cycle, found) if found else None


def _newest(generations: Iterable[str]) -> str | None:
    numbered = [g for g in generations if g.isdecimal()]
    return max(numbered, key=int, default=None)


def attach(
    layout: Layout, work: dict[Key, CycleWork], generations: Iterable[str], create: bool = True
) -> None:
    """Put the newest generation's figures into its newest cycle's record (made from the
    figures alone where the workload logs no progress, as a user's script may, unless
    `create` is false: the goodput account counts only what the workload recorded)."""
    generation = _newest({g for g, _ in work} | set(generations))
    if generation is None:
        return
    read_back = read(layout, generation)
    if read_back is None:
        return
    cycle, waits = read_back
    key = (generation, cycle)
    if key not in work and not create:
        return
    if key not in work:  # its only sign of life: the figures (a workload's record is
        # never moved by them, so that the goodput account reads what the workload said)
        work[key] = CycleWork(generation, cycle, SOURCE)
        work[key].seen(max(w.history[-1][0] for w in waits))
    work[key].waits = waits
