"""The tracked record: which checkpoints were once complete.

An iter_ directory proves nothing: Megatron writes into it before the save is complete,
and a save cut short (a time-limit or exit-duration save killed by Slurm, a node that
died, a save interval changed between generations) leaves a torn directory that may sit
below the tracker for ever. What proves a checkpoint complete is that the tracker once
named it. So whoever sees the tracker move appends the iteration here: task 0's keeper
(retention.Keeper, which watches the tracker for every workload) and the built-in
trainer, the moment it moves it. The fall-back and retention append what they take
away, so a later torn directory of the same iteration is not taken for the old one.

Retention counts only these among the checkpoints it keeps; the fall-back goes back only
to one of these. JSON lines, appended (O_APPEND, one write per line):

    {"tracked": 200}   the tracker named iteration 200
    {"set_aside": 200} the fall-back renamed 200 aside as unloadable
    {"removed": 100}   retention removed 100
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from nvrx_appliance import files
from nvrx_appliance.jobhost import hostlib

FILE = "tracked.jsonl"  # in the checkpoint directory, beside the tracker
TRACKED, SET_ASIDE, REMOVED = "tracked", "set_aside", "removed"
# A line per save and per removal: at a save every 10 minutes, a year is ~50,000 lines.
MAX_RECORD_BYTES = 8 << 20


def complete(text: str) -> set[int]:
    """The iterations that were once tracked and are not known to be gone since. Pure:
    lines replayed in order; a torn or foreign line is skipped."""
    found: set[int] = set()
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or len(entry) != 1:
            continue
        [(kind, iteration)] = entry.items()
        if not isinstance(iteration, int) or isinstance(iteration, bool):
            continue
        if kind == TRACKED:
            found.add(iteration)
        elif kind in (SET_ASIDE, REMOVED):
            found.discard(iteration)
    return found


def read(path: Path) -> set[int]:
    """complete() of the record at `path`, its newest part; empty when there is none.
    Raises OSError when it cannot be read."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return set()
    text = files.read_text(path, MAX_RECORD_BYTES) if size <= MAX_RECORD_BYTES else _tail(path)
    return complete(text or "")


def _tail(path: Path) -> str:
    with open(path, "rb") as fh:
        fh.seek(-MAX_RECORD_BYTES, os.SEEK_END)
        return fh.read().decode("utf-8", "replace").split("\n", 1)[-1]


def append(path: Path, kind: str, iteration: int) -> None:
    """One line, one write with O_APPEND (hostlib.append_lines): a concurrent writer
    never splits it. Raises OSError."""
    hostlib.append_lines(str(path), [{kind: iteration}])
