"""Reads what `status` and `cancel` need: which chain a job id or name is, and its state.

A job id or a job name leads to the chain's work dir (Slurm records it: submit passes
--chdir), and the work dir to run.json, the ledger, the cycle-info files and the
checkpoint tracker. Two Slurm calls per look (one squeue, one sacct), whatever the depth.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nvrx_appliance.layout import Layout
from nvrx_appliance.observe import workdir
from nvrx_appliance.observe.slurm_output import AcctRow, ParseError
from nvrx_appliance.observe.slurmcli import Slurm, SlurmUnavailable
from nvrx_appliance.observe.types import Task
from nvrx_appliance.slurm.status import ChainView, assemble


def locate_job(target: str, *, user: str, slurm: Slurm | None = None) -> tuple[Path, str | None]:
    """(work dir, array job id) of the chain `target` (a job id or a job name) belongs
    to: the generation a job id names (a task's own id too); None for a job name.
    Raises NotFound, or SlurmUnavailable when Slurm could not be asked."""
    slurm = slurm or Slurm()
    failures: list[str] = []
    rows: Sequence[Task | AcctRow] = _live_rows(slurm, user, failures)
    match: Sequence[Task | AcctRow]
    if target.isdigit():
        match = [r for r in rows if target in (r.array_job_id, r.job_id)]
    else:
        match = [r for r in rows if r.name == target]
    if not match:
        match = _accounted(slurm, target, user, failures)
    dirs = [r.work_dir for r in match if r.work_dir]
    if not dirs and failures:
        # Not "no such job": Slurm was not asked. Say why.
        raise SlurmUnavailable(failures[0])
    if not dirs:
        raise workdir.NotFound(
            f"no job {target!r} of user {user} in squeue or sacct; pass a job id or name of "
            "your chain, or its work dir with --work-dir"
        )
    # The newest job wins: a name reused by a later chain means that chain.
    generation = match[-1].array_job_id if target.isdigit() else None
    return Path(dirs[-1]), generation


def _live_rows(slurm: Slurm, user: str, failures: list[str]) -> list[Task]:
    try:
        return slurm.squeue(user=user)
    except (SlurmUnavailable, ParseError) as exc:
        failures.append(str(exc))
        return []


def _accounted(slurm: Slurm, target: str, user: str, failures: list[str]) -> list[AcctRow]:
    try:
        if target.isdigit():
            return slurm.sacct(jobs=[target])
        return slurm.sacct(user=user, name=target, since="now-30days")
    except (SlurmUnavailable, ParseError) as exc:
        failures.append(str(exc))
        return []


def _accounting(slurm: Slurm, layout: Layout, manifest: dict[str, Any], user: str) -> list[AcctRow]:
    return slurm.sacct(user=user, **workdir.accounting_query(layout, manifest))


def read_chain(work_dir: Path, *, user: str, slurm: Slurm | None = None) -> ChainView:
    """The chain at a glance. `slurm`: a shared, rate-limited view for a loop that
    follows the chain; each call asks Slurm afresh without one."""
    slurm = slurm or Slurm()
    manifest = workdir.load_manifest(work_dir)
    spec = manifest["spec"]
    layout = Layout(work_dir)
    # Blindness is a state, not a crash: a source that fails is named, the rest shown.
    blind: list[str] = []
    queue: list[Task] | None = None
    acct: list[AcctRow] | None = None
    try:
        queue = slurm.squeue(user=user, name=spec["job_name"])
    except (SlurmUnavailable, ParseError) as exc:
        blind.append(f"squeue: {exc}")
    try:
        acct = _accounting(slurm, layout, manifest, user)
    except (SlurmUnavailable, ParseError) as exc:
        blind.append(f"sacct: {exc}")
    ledger = workdir.ledger(layout)
    ids = {r.array_job_id for r in queue or []} | {r.array_job_id for r in acct or []}
    ids |= {str(e["array_job_id"]) for e in ledger}
    return assemble(
        manifest=manifest,
        queue=queue,
        acct=acct,
        ledger=ledger,
        cycles=workdir.cycles(layout, sorted(ids)),
        checkpoint_now=workdir.checkpoint_iteration(layout),
        chain_marker=workdir.chain_marker(layout),
        qualify_record=workdir.read_json(layout.qualification),
        blind=blind,
        now=time.time(),
        exclusions=workdir.exclusions(layout),
    )
