"""Task 0 keeps the newest N complete checkpoints of Megatron or a script (--save-retention N).

Megatron has no "keep the newest N": its only thinning, --save-retain-interval, keeps
the newest plus every multiple of an interval. So task 0's entrypoint does it, beside
ft_launcher, for as long as the generation lives. What makes it safe is the order in
which Megatron writes (megatron/training/checkpointing.py at the pin): the files of a
save go into iter_NNNNNNN/ first, in the background with --async-save, and only once
every rank has finished does rank 0 rewrite latest_checkpointed_iteration.txt. So:

- the tracked checkpoint is complete, and so is every older one it tracked before;
  but an older directory it never tracked may be torn (a time-limit save cut short by
  Slurm's KILL, a node that died, a save interval changed between generations): only
  those the tracker once named count (the tracked record, which the keeper writes);
- a directory newer than the tracked one may be a save in progress, or one a dead
  generation left half-written (Megatron writes over it when training gets there);
- Megatron rewrites the tracker in place, so a reader can catch it empty.

A sweep therefore removes only checkpoints older than the tracked one, beyond the
newest N once-tracked ones up to it (checkpoint_dir.retired), and nothing at all when the tracker does
not read as an iteration (a tracker caught half-rewritten reads as a shorter, smaller
number, which can only retire less). A removal first renames the directory out of the iter_
names, so a sweep killed midway never leaves a half-deleted directory that looks like
a checkpoint; the delete itself runs apart from the looks (Keeper), and whatever a
killed one left renamed aside is deleted by the next.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nvrx_appliance import files
from nvrx_appliance.checkpoints import checkpoint_dir, tracked_record
from nvrx_appliance.layout import TRACKER_FILE
from nvrx_appliance.observe import run_files

# How often task 0 looks at the tracker (one stat): each iteration it names is written
# to the tracked record (tracked_record.py), and a sweep follows. A checkpoint superseded
# between two looks is never recorded, so never a fall-back target: at a look a second,
# saves 0.6 s apart (a small model saving every few steps) lost one in two. Five looks
# a second catch saves 0.2 s apart and cost the metadata server five stats a second.
LOOK_PERIOD_S = 0.2
_REMOVING = ".removing_"


@dataclass(frozen=True)
class Look:
    """What one look at the tracker did: whether what it names is settled (written down,
    or nothing to write), and the iterations renamed aside for removal."""

    settled: bool
    removed: list[int]


def look(checkpoints: Path, keep: int) -> Look:
    """Record the tracked iteration, then rename aside what retention retires now (keep
    0: nothing). Only renames: the slow part of a removal, the delete, is purge()'s, so
    a look takes a few metadata calls however large the checkpoints are."""
    record = checkpoints / tracked_record.FILE
    try:
        text = files.read_text(checkpoints / TRACKER_FILE, 64)
        names = os.listdir(checkpoints)
        complete = tracked_record.read(record)
    except OSError:
        return Look(False, [])  # the file system is away: look again
    tracked = run_files.tracker_value(text) if text is not None else None
    if tracked is None:
        # Empty is a tracker being rewritten: look again. Megatron's "release" names no
        # iteration to write down.
        return Look(bool(text and text.strip()), [])
    if tracked not in complete:
        # Only a tracker that names a checkpoint on disk: one caught half-rewritten
        # ("3" of "30") names none, and is looked at again.
        if tracked not in {checkpoint_dir.checkpoint_name(name) for name in names}:
            return Look(False, [])
        try:
            tracked_record.append(record, tracked_record.TRACKED, tracked)
        except OSError:
            return Look(False, [])  # not written down: remove nothing, and try again
        complete.add(tracked)
    # Megatron's iter_NNNNNNN directories, and a script's files of the same names with an
    # extension (iter_0000040.pt): one iteration may be both.
    found: dict[int, list[str]] = {}
    for name in names:
        n = checkpoint_dir.checkpoint_name(name)
        if n is not None:
            found.setdefault(n, []).append(name)
    removed = []
    for iteration in checkpoint_dir.retired(found, tracked, keep, complete):
        moved = []
        for name in found[iteration]:
            with contextlib.suppress(OSError):
                os.rename(checkpoints / name, checkpoints / (_REMOVING + name))
                moved.append(name)
        if not moved:
            continue
        with contextlib.suppress(OSError):
            tracked_record.append(record, tracked_record.REMOVED, iteration)
        removed.append(iteration)
    return Look(True, removed)


def remove_checkpoint(path: Path) -> None:
    """Delete one checkpoint renamed aside: a directory (Megatron's) or a file (a
    script's); a symlink is removed, never followed."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def purge(checkpoints: Path, remove: Callable[[Path], None] = remove_checkpoint) -> None:
    """Delete what looks renamed aside (and what a killed keeper left renamed aside)."""
    try:
        names = os.listdir(checkpoints)
    except OSError:
        return
    for name in names:
        if name.startswith(_REMOVING):
            with contextlib.suppress(OSError):
                remove(checkpoints / name)


def sweep(checkpoints: Path, keep: int) -> list[int]:
    """One look and its deletes, in line (for a caller with nothing else to watch);
    returns the iterations removed."""
    removed = look(checkpoints, keep).removed
    purge(checkpoints)
    return removed


class Keeper:
    """Watches the tracker on a thread of its own, so a slow delete never holds task 0's
    supervision; at start, then whenever the tracker has changed or the last look could
    not write it down, it records the tracked iteration and renames aside what retention
    retires (keep 0: records only). The deletes run on a second thread: on Lustre one
    takes minutes, and a look held behind it would miss every checkpoint tracked and
    superseded meanwhile, which a fall-back then skips. `remove` deletes one checkpoint
    (remove_checkpoint; a test hands in a slow one)."""

    def __init__(
        self,
        checkpoints: Path,
        keep: int,
        log: Callable[[str], None],
        remove: Callable[[Path], None] = remove_checkpoint,
    ):
        self.checkpoints = checkpoints
        self.keep = keep
        self.log = log
        self.remove = remove
        self._stop = threading.Event()
        self._renamed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="checkpoint-retention", daemon=True)
        self._deleter = threading.Thread(
            target=self._delete, name="checkpoint-removal", daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        self._deleter.start()

    def stop(self) -> None:
        self._stop.set()
        self._renamed.set()
        self._thread.join(timeout=LOOK_PERIOD_S * 5)
        # A delete still running is left to the daemon thread; the next keeper finishes
        # whatever it leaves renamed aside.
        self._deleter.join(timeout=LOOK_PERIOD_S * 5)

    def _tracker_stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.checkpoints / TRACKER_FILE)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def _run(self) -> None:
        seen: tuple[int, int] | None = (-1, -1)  # never a real stamp: look at once
        self._renamed.set()  # and finish what a keeper before this one left aside
        while True:
            stamp = self._tracker_stamp()
            if stamp is not None and stamp != seen:
                done = look(self.checkpoints, self.keep)
                if done.removed:
                    self._renamed.set()
                    self.log(f"retention (newest {self.keep} kept): removed checkpoint(s) "
                             f"of iteration {', '.join(map(str, done.removed))}")  # fmt: skip
                if done.settled:
                    seen = stamp
            if self._stop.wait(LOOK_PERIOD_S):
                return

    def _delete(self) -> None:
        while True:
            self._renamed.wait()
            self._renamed.clear()
            if self._stop.is_set():
                return
            purge(self.checkpoints, self.remove)
