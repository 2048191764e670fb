"""`nvrx-appliance cancel`: end a whole chain, only this user's jobs, only this chain's."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nvrx_appliance.chain import job_control
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe import slurmcli
from nvrx_appliance.observe.types import LIVE_STATES, PENDING_STATES, RUNNING_STATES
from nvrx_appliance.observe.workdir import Unreadable, load_manifest

# A generation whose tasks are completing is ending already: scancel can do nothing
# more to it (it answers "Invalid job id specified"), so it is left to end.
ENDING_STATES = frozenset({"COMPLETING"})


@dataclass(frozen=True)
class Cancelled:
    job_name: str
    queued: tuple[str, ...]  # generations cancelled before they started
    running: tuple[str, ...]


def cancel_chain(work_dir: Path, *, user: str, job_name: str = "") -> Cancelled:
    """`job_name`: the chain's name as Slurm knows it; it is enough when run.json was
    edited beyond reading, so that a broken file never keeps a chain from being ended."""
    try:
        name = load_manifest(work_dir)["spec"]["job_name"]
    except Unreadable as exc:
        if not job_name:
            raise Unreadable(
                f"{exc}; name the chain (its name or a job id) instead of --work-dir, and "
                "cancel ends it from what Slurm knows"
            ) from None
        name = job_name
    here = os.path.realpath(work_dir)
    rows = [
        r
        for r in slurmcli.squeue(user=user, name=name)
        # By array id, not by name: a chain forced onto the same name elsewhere is not ours.
        if os.path.realpath(r.work_dir) == here
    ]
    running = sorted(
        {r.array_job_id for r in rows if r.state in RUNNING_STATES - ENDING_STATES}, key=int
    )
    queued = sorted(
        {r.array_job_id for r in rows if r.state in PENDING_STATES} - set(running), key=int
    )
    # Queued generations first: once the running one ends, the singleton dependency
    # would otherwise let the next one start before our second call reached it.
    if queued:
        _scancel_live(user, name, queued)
    if running:
        _scancel_live(user, name, running)
    # Ended on purpose (also when nothing was left to cancel): the watcher must not page
    # "chain exhausted" for it.
    Layout(work_dir).chain_marker.unlink(missing_ok=True)
    return Cancelled(job_name=name, queued=tuple(queued), running=tuple(running))


def _scancel_live(user: str, name: str, job_ids: list[str]) -> None:
    """scancel these jobs. One may end between the listing and the cancel (its
    teardown ran, or its spares were released): scancel then fails on it ("Invalid job
    id", "already completing or completed") though nothing of it is left to end. Only a
    job still queued or running after the failure makes it one."""
    try:
        job_control.scancel(["--user", user, *job_ids])
    except slurmcli.SlurmTimeout:
        raise  # no answer: what it did is unknown, so say so
    except slurmcli.SlurmUnavailable:
        left = {r.array_job_id for r in slurmcli.squeue(user=user, name=name)
                if r.state in LIVE_STATES - ENDING_STATES}  # fmt: skip
        if left & set(job_ids):
            raise
