"""A checkpoint that cannot be loaded is set aside; the tracker points at the one before.

A torn save or a storage fault leaves a tracked checkpoint that no restart can load.
NVRx only sees cycles that make no progress, and after --max-no-progress-cycles it
exits 93: the chain ends with good checkpoints never tried. Here, the first worker whose
guard finds evidence of a failed load (workload_exit.load_failure) does this, once for
all of them, holding the fall-back lock of the checkpoint directory:

1. the tracker still names the bad iteration (else another rank did it already);
2. the target is the newest earlier checkpoint that was once complete (the tracked
   record, tracked_record.py: a torn iter_ directory the tracker never named is none),
   still on disk, never one older than the chain started from (run.json's
   checkpoint_start); the tracker is read again, then pointed at it by rename;
3. only then is the bad checkpoint renamed beside the others, out of the iter_ names
   (`iter_0000035.unloadable-<time>`): never deleted, someone will want to look at it;
4. a line goes to the fall-back record (Layout.fallbacks), which bounds how often a
   chain does this (--checkpoint-fallbacks), and one to the tracked record.

Every step leaves a state a restart can load: before 2 the old one, after it the
earlier checkpoint (the bad directory, newer than the tracker, is what a save in
progress looks like; Megatron writes over it). Any error of the file system (ENOSPC,
EACCES, a lock that cannot be had) stops there and says so: the worker exits with its
own code, and NVRx restarts it as without the fall-back.

The lock (lockfile.py) is a file created exclusively in the checkpoint directory.
A holder that lost it to a waiter (it was slower than the lock's staleness) stops before
the steps that cannot be repeated; and a fall-back from a checkpoint the chain has
already set aside, for the same save of it, is recognised in the fall-back
record and neither done nor counted again.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from nvrx_appliance import files
from nvrx_appliance.checkpoints import checkpoint_dir, tracked_record
from nvrx_appliance.checkpoints.lockfile import locked
from nvrx_appliance.clock import now_iso
from nvrx_appliance.jobhost import hostlib
from nvrx_appliance.layout import TRACKER_FILE
from nvrx_appliance.observe import run_files

# The fall-back record is a few lines per chain; more than this is not one.
MAX_RECORD_BYTES = 1 << 20


@dataclass(frozen=True)
class Outcome:
    fell_back_to: int | None  # the iteration the tracker names now; None: nothing done
    message: str  # what happened, in one line
    # Past the chain's bound, at its floor, or nothing complete before it: no restart
    # can help, the chain stops. False where nothing was done for want of knowing which
    # checkpoint, or of a file system that let it: the worker is restarted as before.
    stop: bool = False


def earlier(found: Iterable[int], bad: int, floor: int | None) -> int | None:
    """The newest checkpoint before `bad`, never one older than `floor`. Pure."""
    candidates = [i for i in found if i < bad and (floor is None or i >= floor)]
    return max(candidates) if candidates else None


def _entries(record_text: str, chain: str) -> list[dict]:
    found = []
    for line in record_text.splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and entry.get("chain") == chain:
                found.append(entry)
    return found


def count(record_text: str, chain: str) -> int:
    """How many checkpoints this chain has set aside. Pure."""
    return len(_entries(record_text, chain))


def done_before(record_text: str, chain: str, bad: int, times: int) -> dict | None:
    """This chain's entry for setting `bad` aside when the tracker had been recorded
    naming it `times` times, if one is written: the same fall-back, which is never done
    or counted twice. Pure."""
    for entry in _entries(record_text, chain):
        if entry.get("from") == bad and entry.get("times_tracked") == times:
            return entry
    return None


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
    unless the chain's bound or floor forbids it, or the file system does not let it:
    never raises."""
    if bad is None:
        return Outcome(None, "which checkpoint failed to load is unknown: nothing set aside")
    try:
        with locked(checkpoints) as still_held:
            plan = _plan(checkpoints, record, bad, chain=chain, limit=limit, floor=floor)
            if isinstance(plan, Outcome):
                return plan
            return _fall_back(
                checkpoints, record, plan, chain=chain, who=who, reason=reason, held=still_held
            )
    except OSError as exc:
        return Outcome(
            None,
            f"checkpoint {bad} could not be loaded ({reason}), but nothing was set aside: "
            f"{exc}; the tracker is left as it was",
        )


@dataclass(frozen=True)
class _Plan:
    bad: int
    to: int  # the newest complete checkpoint before it
    name: str  # the bad one's name in the directory
    done: int  # fall-backs of this chain before this one
    limit: int
    times: int  # how often the tracker was recorded naming `bad` (tracked_record.times_tracked)


def _tracked(checkpoints: Path) -> int | None:
    return run_files.tracker_value(files.read_text(checkpoints / TRACKER_FILE, 64) or "")


def _plan(
    checkpoints: Path, record: Path, bad: int, *, chain: str, limit: int, floor: int | None
) -> _Plan | Outcome:
    """What a fall-back from `bad` would do, or why none is done (under the lock)."""
    tracked = _tracked(checkpoints)
    if tracked != bad:
        # Another rank's guard got here first (or the workload tried an untracked one).
        return Outcome(tracked, _moved_on(checkpoints, tracked))
    record_text = files.read_text(record, MAX_RECORD_BYTES) or ""
    history = tracked_record.read_text(checkpoints / tracked_record.FILE)
    times = tracked_record.times_tracked(history, bad)
    repeat = done_before(record_text, chain, bad, times)
    if repeat is not None:
        return Outcome(repeat.get("to"), f"checkpoint {bad} was set aside already "
                       f"({repeat.get('set_aside')}): nothing done or counted twice")  # fmt: skip
    done = count(record_text, chain)
    if done >= limit:
        return Outcome(
            None,
            f"checkpoint {bad} cannot be loaded and this chain has set aside {done} "
            f"already (--checkpoint-fallbacks {limit})",
            stop=True,
        )
    names = {
        n: name
        for name in os.listdir(checkpoints)
        if (n := checkpoint_dir.checkpoint_name(name)) is not None
    }
    complete = tracked_record.complete(history)
    to = earlier([n for n in names if n in complete], bad, floor)
    if to is None:
        since = f" (the chain started from {floor})" if floor is not None else ""
        return Outcome(
            None,
            f"checkpoint {bad} cannot be loaded and no checkpoint before it that was ever "
            f"complete (tracked) is on disk{since}"
            + (_removed_by_retention(history, bad, floor) or _unrecorded(names, bad, floor)),
            stop=True,
        )
    return _Plan(bad, to, names.get(bad, checkpoint_dir.iteration_dir(bad)), done, limit, times)


def _removed_by_retention(history: str, bad: int, floor: int | None) -> str:
    """The cause, when retention removed the checkpoints a fall-back needed: only a
    --save-retention that keeps more saves the next chain from stopping here."""
    removed = sorted(
        {
            n
            for kind, n in tracked_record.entries(history)
            if kind == tracked_record.REMOVED and n < bad and (floor is None or n >= floor)
        }
    )
    if not removed:
        return ""
    shown = ", ".join(map(str, removed[-3:]))
    return (
        f"; retention had removed the complete one(s) before it ({shown}): --save-retention "
        "keeps too few for this fall-back; resubmit with a --save-retention of at least "
        "--checkpoint-fallbacks + 1 (0 keeps all)"
    )


def _unrecorded(names: dict[int, str], bad: int, floor: int | None) -> str:
    """What to do when earlier checkpoints lie there that the tracked record never named
    (a work dir from before the record, or torn saves: from here they look the same)."""
    older = sorted(n for n in names if n < bad and (floor is None or n >= floor))
    if not older:
        return ""
    shown = ", ".join(names[n] for n in older[-3:])
    newest = older[-1]
    return (
        f"; {shown} lie there, but checkpoints/{tracked_record.FILE} never recorded them "
        "complete (a work dir from before the record, or saves cut short, look alike). If "
        f'you know one is complete, add a line {{"tracked": {newest}}} to '
        f"checkpoints/{tracked_record.FILE}, write {newest} into "
        f"checkpoints/{TRACKER_FILE}, and resubmit"
    )


def _moved_on(checkpoints: Path, tracked: int | None) -> str:
    """Why there is nothing to do: the tracker names another checkpoint, or none."""
    if tracked is not None:
        return f"the tracker already names iteration {tracked}"
    try:
        text = (files.read_text(checkpoints / TRACKER_FILE, 64) or "").strip()
    except OSError:
        text = ""
    said = f"reads {text!r}" if text else "is empty or missing"
    return f"the tracker names no iteration (it {said}): nothing to fall back from"


def _fall_back(
    checkpoints: Path,
    record: Path,
    plan: _Plan,
    *,
    chain: str,
    who: dict[str, str],
    reason: str,
    held: Callable[[], bool],
) -> Outcome:
    """The tracker to the earlier checkpoint first, then the bad one aside: a state a
    restart can load at every step."""
    moved_on = _tracked(checkpoints)
    if moved_on != plan.bad:  # a writer that holds no lock (the workload) moved it
        return Outcome(moved_on, "the tracker moved meanwhile: nothing set aside")
    files.write_atomic(checkpoints / TRACKER_FILE, checkpoint_dir.tracker_text(plan.to))
    if not held():
        # Slower than the lock's staleness: a waiter broke it and redoes this fall-back
        # (the same tracker text); only one of us may set aside and count.
        return Outcome(plan.to, f"checkpoint {plan.bad}: the tracker names {plan.to}; "
                       "another guard took the fall-back lock meanwhile and finishes it")  # fmt: skip
    aside = f"{plan.name}.unloadable-{now_iso().replace(':', '')}"
    moved = f"set aside as {aside}"
    try:
        os.rename(checkpoints / plan.name, checkpoints / aside)
    except FileNotFoundError:
        moved = "missing whole"
    except OSError as exc:
        # The tracker names the earlier one already: a loadable state. The bad directory
        # stays under its name, newer than the tracker, as a save in progress would.
        moved = f"left in place ({exc})"
    with contextlib.suppress(OSError):
        tracked_record.append(checkpoints / tracked_record.FILE, tracked_record.SET_ASIDE, plan.bad)
    entry = {"chain": chain, "from": plan.bad, "to": plan.to, "set_aside": aside,
             "times_tracked": plan.times, "time": now_iso(), "reason": reason,
             **who}  # fmt: skip
    try:
        hostlib.append_lines(str(record), [entry])
    except OSError as exc:
        moved += f"; not written to {record.name} ({exc}): this one is not counted"
    return Outcome(
        plan.to,
        f"checkpoint {plan.bad} cannot be loaded ({reason}); {moved}, resuming from checkpoint "
        f"{plan.to} ({plan.done + 1} of {plan.limit} fall-backs of this chain)",
    )
