"""Whether an action may run: the gate between detecting and acting.

The watcher acts only with --act, only on jobs the caller owns, and only on a
generation of the chain it is watching. Observing and paging are reads, so anyone
(an SRE without rights over the job) may watch; acting is for the owner.

Pure: no I/O.
"""

from __future__ import annotations

from pathlib import Path

from nvrx_appliance.layout import Layout
from nvrx_appliance.watch.findings import EXCLUDE_NODES, RELEASE_SPARES, Action, Snapshot


def refusal(action: Action, snap: Snapshot, caller: str) -> str | None:
    """None if the action may run; otherwise why not, in words for the log."""
    if caller != snap.run.owner:
        return f"chain {snap.run.job_name} belongs to {snap.run.owner}, not to {caller}"
    if action.kind == EXCLUDE_NODES:
        return _exclusion_refusal(action, snap)
    gen = snap.generation(action.array_job_id)
    if gen is None:
        return f"{action.array_job_id} is not a queued generation of chain {snap.run.job_name}"
    foreign = sorted({t.user for t in gen.tasks if t.user != caller})
    if foreign:
        return f"generation {action.array_job_id} has tasks of {', '.join(foreign)}"
    scoped = {f"--user={caller}", f"--name={snap.run.job_name}", action.array_job_id}
    if not scoped <= set(action.argv):
        return "the command is not scoped to this user, chain and generation"
    if action.kind == RELEASE_SPARES and not gen.pending:
        return f"generation {action.array_job_id} has no pending task left"
    return None


def _exclusion_refusal(action: Action, snap: Snapshot) -> str | None:
    """Only into this chain's own record, and only while the chain keeps one."""
    if not snap.run.work_dir or snap.run.exclude_for <= 0:
        return (
            f"chain {snap.run.job_name} keeps no exclusion record (no run.json, or exclude_for 0)"
        )
    record = str(Layout(Path(snap.run.work_dir)).exclusions)
    if action.argv != (record,) or not action.nodes:
        return "the exclusion is not scoped to this chain's own record"
    return None
