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
to one of these. JSON lines, appended one at a time under the record lock
(lockfile.py), so that writers on several NFS clients never write over each other:

    {"tracked": 200}   the tracker named iteration 200
    {"set_aside": 200} the fall-back renamed 200 aside as unloadable
    {"removed": 100}   retention removed 100
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from nvrx_appliance import files
from nvrx_appliance.checkpoints import lockfile
from nvrx_appliance.jobhost import hostlib

FILE = "tracked.jsonl"  # in the checkpoint directory, beside the tracker
TRACKED, SET_ASIDE, REMOVED = "tracked", "set_aside", "removed"
# A line per save and per removal: at a save every 10 minutes, a year is ~50,000 lines.
MAX_RECORD_BYTES = 8 << 20


def entries(text: str) -> Iterator[tuple[str, int]]:
    """(kind, iteration) of each line, in order; a torn or foreign line is skipped. Pure."""
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or len(entry) != 1:
            continue
        [(kind, iteration)] = entry.items()
        if isinstance(iteration, int) and not isinstance(iteration, bool):
            yield kind, iteration


def times_tracked(text: str, iteration: int) -> int:
    """How often the tracker was recorded naming `iteration`: the same for every guard
    that sees one save of it, one more for each save of it after a fall-back set it
    aside. With the chain, what tells a repeat of a fall-back from a new one. Pure."""
    return sum(1 for kind, n in entries(text) if kind == TRACKED and n == iteration)


def complete(text: str) -> set[int]:
    """The iterations that were once tracked and are not known to be gone since. Pure:
    lines replayed in order."""
    found: set[int] = set()
    for kind, iteration in entries(text):
        if kind == TRACKED:
            found.add(iteration)
        elif kind in (SET_ASIDE, REMOVED):
            found.discard(iteration)
    return found


def read(path: Path) -> set[int]:
    """complete() of the record at `path`, its newest part; empty when there is none.
    Raises OSError when it cannot be read."""
    return complete(read_text(path))


def read_text(path: Path) -> str:
    """The record's newest part ("" when there is none). Raises OSError."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return ""
    text = files.read_text(path, MAX_RECORD_BYTES) if size <= MAX_RECORD_BYTES else _tail(path)
    return text or ""


def _tail(path: Path) -> str:
    with open(path, "rb") as fh:
        fh.seek(-MAX_RECORD_BYTES, os.SEEK_END)
        return fh.read().decode("utf-8", "replace").split("\n", 1)[-1]


def append(path: Path, kind: str, iteration: int) -> None:
    """One line, under the record lock. The writers run on several nodes (task 0's
    keeper, the trainer's rank 0, any rank's guard), and O_APPEND from different NFS
    clients is no exclusion: each client writes at the size it last knew, over another's
    line. Under the lock, the open after taking it sees the size the last writer left
    (NFS's close-to-open consistency). Raises OSError (lockfile.LockUnavailable too)."""
    with lockfile.exclusive(path.with_name(lockfile.RECORD_LOCK_FILE)):
        hostlib.append_lines(str(path), [{kind: iteration}])
