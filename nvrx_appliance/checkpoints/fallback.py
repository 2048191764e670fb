"""A checkpoint that cannot be loaded is set aside; the tracker points at the one before.

A torn save or a storage fault leaves a tracked checkpoint that no restart can load.
NVRx only sees cycles that make no progress, and after --max-no-progress-cycles it
exits 93: the chain ends with good checkpoints never tried. Here, the first worker whose
guard finds evidence of a failed load (workload_exit.load_failure) does this, once for
all of them, under a lock in the checkpoint directory:

1. the tracker still names the bad iteration (else another rank did it already);
2. the bad checkpoint is renamed beside the others, out of the iter_ names
   (`iter_0000035.unloadable-<time>`): never deleted, someone will want to look at it;
3. the tracker is pointed, by rename, at the newest earlier checkpoint on disk, never
   one older than the chain started from (run.json's checkpoint_start);
4. a line goes to the fall-back record (Layout.fallbacks), which bounds how often a
   chain does this (--checkpoint-fallbacks).

The worker then exits as it would have, and the next cycle (or the next generation)
loads the earlier checkpoint. Complete: every iter_ directory older than the tracked one
was tracked once (retention.py says why for Megatron; the cpu trainer renames a
checkpoint into its iter_ name only when complete), and the default retention keeps two.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nvrx_appliance import files
from nvrx_appliance.checkpoints import checkpoint_dir
from nvrx_appliance.clock import now_iso
from nvrx_appliance.layout import TRACKER_FILE
from nvrx_appliance.observe import run_files

LOCK_FILE = ".fallback.lock"
# The fall-back record is a few lines per chain; more than this is not one.
MAX_RECORD_BYTES = 1 << 20


# Megatron's and the built-in trainer's iter_NNNNNNN directories, and a script's
# checkpoint files of the same name with an extension (iter_0000040.pt).
_CHECKPOINT = re.compile(r"^iter_(\d{7,})(\.[A-Za-z0-9]+)?$")


def checkpoint_name(name: str) -> int | None:
    match = _CHECKPOINT.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Outcome:
    fell_back_to: int | None  # the iteration the tracker names now; None: refused
    message: str  # what happened, in one line


def earlier(found: Iterable[int], bad: int, floor: int | None) -> int | None:
    """The newest checkpoint before `bad`, never one older than `floor`. Pure."""
    candidates = [i for i in found if i < bad and (floor is None or i >= floor)]
    return max(candidates) if candidates else None


def count(record_text: str, chain: str) -> int:
    """How many checkpoints this chain has set aside. Pure."""
    total = 0
    for line in record_text.splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and entry.get("chain") == chain:
                total += 1
    return total


@contextlib.contextmanager
def _locked(checkpoints: Path) -> Iterator[None]:
    fd = os.open(checkpoints / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def set_aside(
    checkpoints: Path,
    record: Path,
    bad: int | None,
    *,
    chain: str,
    limit: int,
    floor: int | None,
    who: dict[str, str],
    reason: str,
) -> Outcome:
    """Set the unloadable checkpoint `bad` aside and point the tracker at the one before,
    unless the chain's bound or floor forbids it."""
    if bad is None:
        return Outcome(None, "which checkpoint failed to load is unknown: nothing set aside")
    with _locked(checkpoints):
        tracked = run_files.tracker_value(files.read_text(checkpoints / TRACKER_FILE, 64) or "")
        if tracked != bad:
            # Another rank's guard got here first (or the workload tried an untracked one).
            return Outcome(tracked, f"the tracker already names iteration {tracked}")
        done = count(files.read_text(record, MAX_RECORD_BYTES) or "", chain)
        if done >= limit:
            return Outcome(
                None,
                f"checkpoint {bad} cannot be loaded and this chain has set aside {done} "
                f"already (--checkpoint-fallbacks {limit})",
            )
        names = {
            n: name for name in os.listdir(checkpoints) if (n := checkpoint_name(name)) is not None
        }
        found = list(names)
        to = earlier(found, bad, floor)
        if to is None:
            since = f" (the chain started from {floor})" if floor is not None else ""
            return Outcome(
                None,
                f"checkpoint {bad} cannot be loaded and no complete checkpoint before it is "
                f"on disk{since}",
            )
        name = names.get(bad, checkpoint_dir.iteration_dir(bad))
        aside = f"{name}.unloadable-{now_iso().replace(':', '')}"
        with contextlib.suppress(FileNotFoundError):  # a checkpoint missing whole is bad too
            os.rename(checkpoints / name, checkpoints / aside)
        files.write_atomic(checkpoints / TRACKER_FILE, checkpoint_dir.tracker_text(to))
        entry = {"chain": chain, "from": bad, "to": to, "set_aside": aside,
                 "time": now_iso(), "reason": reason, **who}  # fmt: skip
        _append(record, entry)
        return Outcome(
            to,
            f"checkpoint {bad} cannot be loaded ({reason}); set aside as {aside}, resuming "
            f"from checkpoint {to} ({done + 1} of {limit} fall-backs of this chain)",
        )


def _append(path: Path, entry: dict) -> None:
    line = (json.dumps(entry, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        if os.write(fd, line) != len(line):
            raise OSError(f"short write to {path}")
    finally:
        os.close(fd)
