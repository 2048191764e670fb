"""Reads what the chain commands need: which chain a job id, a name or a work dir is
(`resolve`, the one way every command finds it, the watcher's included), and its state.

A job id or a job name leads to the chain's work dir (Slurm records it: submit passes
--chdir), and the work dir to run.json, the ledger, the cycle-info files and the
checkpoint tracker. Two Slurm calls per look (one squeue, one sacct), whatever the depth.
"""

from __future__ import annotations

import difflib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvrx_appliance.chain.status import ChainView, assemble
from nvrx_appliance.goodput import gather, straggler
from nvrx_appliance.goodput.straggler import Straggler
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe import workdir
from nvrx_appliance.observe.slurm_output import AcctRow, ParseError
from nvrx_appliance.observe.slurmcli import Slurm, SlurmUnavailable
from nvrx_appliance.observe.types import Cycle, Task

# How far back a chain named by name, or listed, is looked for in Slurm's accounting.
ACCOUNTED_SINCE = "now-30days"


@dataclass(frozen=True)
class Located:
    """The chain a job id, a name or a work dir leads to."""

    work_dir: Path
    job_name: str  # as Slurm knows it, else as run.json says; "" when neither does
    generation: str | None  # the generation (array job id) a job id names
    job_ids: tuple[str, ...]  # the chain's generations Slurm knows, oldest first
    owner: str


def resolve(
    target: str | None,
    *,
    user: str,
    work_dir: str | Path | None = None,
    slurm: Slurm | None = None,
) -> Located:
    """The one way every command that takes a chain finds it: a job id (any of its
    generations, a task's own id too), a job name (the newest chain of that name), or
    its work dir (which needs no Slurm, for a chain Slurm has forgotten). Two Slurm calls
    at most. Raises NotFound (naming near names), or SlurmUnavailable when Slurm could
    not be asked."""
    if work_dir:
        return _by_work_dir(target, Path(work_dir), user)
    if not target:
        raise workdir.NotFound(
            "name a chain: its name, a job id of it, or its work dir with --work-dir"
        )
    slurm = slurm or Slurm()
    failures: list[str] = []
    live: list[Task] = _live_rows(slurm, user, failures)
    seen: list[Task | AcctRow] = [*live]
    match = _matching(live, target)
    if not match:
        accounted = _accounted(slurm, target, user, failures)
        seen += accounted
        match = _matching(accounted, target)
    if not match and failures:
        # Not "no such chain": Slurm was not asked. Say why.
        raise SlurmUnavailable(failures[0])
    if not match:
        raise workdir.NotFound(_not_found(target, user, seen))
    newest = max(match, key=lambda r: _numeric(r.array_job_id))
    here = os.path.realpath(newest.work_dir)
    ids = {
        r.array_job_id
        for r in seen
        if r.name == newest.name and os.path.realpath(r.work_dir or "/") == here
    }
    return Located(
        work_dir=Path(newest.work_dir),
        job_name=newest.name,
        generation=newest.array_job_id if target.isdigit() else None,
        job_ids=tuple(sorted(ids, key=_numeric)),
        owner=newest.user or user,
    )


def _by_work_dir(target: str | None, folder: Path, user: str) -> Located:
    folder = folder.resolve()
    try:
        name = workdir.load_manifest(folder)["spec"]["job_name"]
    except workdir.NotFound:
        name = ""  # what reads the chain next says why it cannot (cancel needs no run.json)
    if target and not target.isdigit() and name and target != name:
        raise workdir.NotFound(
            f"{folder} holds chain {name!r}, not {target!r}; name that chain, or drop --work-dir"
        )
    return Located(folder, name, target if target and target.isdigit() else None, (), user)


def _numeric(job_id: str) -> tuple[int, str]:
    return (int(job_id), "") if job_id.isdigit() else (1 << 62, job_id)


def _matching(rows: Sequence[Task | AcctRow], target: str) -> list[Task | AcctRow]:
    if target.isdigit():
        found = [r for r in rows if target in (r.array_job_id, r.job_id)]
    else:
        found = [r for r in rows if r.name == target]
    return [r for r in found if r.work_dir]


def near_names(target: str, names: Sequence[str]) -> list[str]:
    """The names a person may have meant: close in spelling, or holding what was typed."""
    known = sorted({n for n in names if n})
    close = difflib.get_close_matches(target, known, n=5, cutoff=0.6)
    holding = [n for n in known if target.lower() in n.lower() and n not in close]
    return (close + holding)[:5]


def _not_found(target: str, user: str, seen: Sequence[Task | AcctRow]) -> str:
    what = "job" if target.isdigit() else "chain"
    said = f"no {what} {target!r} of user {user} in squeue or sacct (the last 30 days)"
    near = [] if target.isdigit() else near_names(target, [r.name for r in seen])
    if near:
        said += f"; near names: {', '.join(near)}"
    return (
        f"{said}. `nvrx-appliance status` lists your chains; pass a chain name, a job id "
        "of it, or its work dir with --work-dir"
    )


def _live_rows(slurm: Slurm, user: str, failures: list[str]) -> list[Task]:
    try:
        return slurm.squeue(user=user)
    except (SlurmUnavailable, ParseError) as exc:
        failures.append(str(exc))
        return []


def _accounted(slurm: Slurm, target: str, user: str, failures: list[str]) -> list[AcctRow]:
    """A job id's rows; or, for a name, every job of the user's since ACCOUNTED_SINCE: the
    same one call finds the chain and, when it is not there, the names that are."""
    try:
        if target.isdigit():
            return slurm.sacct(jobs=[target])
        return slurm.sacct(user=user, since=ACCOUNTED_SINCE)
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
    cycles = workdir.cycles(layout, generation_ids(queue, acct, workdir.ledger(layout)))
    found, unnamed = _stragglers(work_dir, cycles)
    return view_of(
        work_dir, manifest, queue, acct, blind, now=time.time(), cycles=cycles,
        stragglers=found, unnamed=unnamed,
    )  # fmt: skip


def _stragglers(
    work_dir: Path, cycles: dict[str, list[Cycle]]
) -> tuple[tuple[Straggler, ...], tuple[tuple[str, str], ...]]:
    """The newest cycle's stragglers, and (generation, why) where its figures name nobody
    though a node lagged, from the training record (read whole: one chain)."""
    try:
        work = gather.training_record(work_dir, cycles, gather.LogMemo())
    except (workdir.NotFound, OSError):
        return (), ()
    newest = max(work.values(), key=lambda w: w.last_sign or 0.0, default=None)
    if newest is None:
        return (), ()
    unnamed = tuple((newest.generation, why) for why in straggler.withheld(newest))
    return tuple(straggler.judge(newest)), unnamed


def view_of(
    work_dir: Path,
    manifest: dict[str, Any],
    queue: list[Task] | None,
    acct: list[AcctRow] | None,
    blind: Sequence[str],
    *,
    now: float,
    ledger: list[dict[str, Any]] | None = None,
    cycles: dict[str, list[Cycle]] | None = None,
    stragglers: tuple[Straggler, ...] = (),
    unnamed: tuple[tuple[str, str], ...] = (),
) -> ChainView:
    """The chain at a glance from what Slurm said (None: it did not) and its work dir.
    `ledger`, `cycles`: already read by the caller (the chain list, for the account too)."""
    layout = Layout(work_dir)
    if ledger is None:
        ledger = workdir.ledger(layout)
    ids = generation_ids(queue, acct, ledger)
    if cycles is None:
        cycles = workdir.cycles(layout, ids)
    return assemble(
        manifest=manifest,
        queue=queue,
        acct=acct,
        ledger=ledger,
        cycles=cycles,
        checkpoint_now=workdir.checkpoint_iteration(layout),
        chain_marker=workdir.chain_marker(layout),
        qualify_record=workdir.read_json(layout.qualification),
        blind=blind,
        now=now,
        exclusions=workdir.exclusions(layout),
        hangs=workdir.hangs(layout, ids),
        stragglers=stragglers,
        deaths=workdir.deaths(layout, ids),
        named=workdir.stragglers_named(layout, str(manifest.get("created", "")), ids),
        unnamed=unnamed,
    )


def generation_ids(
    queue: Sequence[Task] | None, acct: Sequence[AcctRow] | None, ledger: Sequence[dict[str, Any]]
) -> list[str]:
    """Every generation Slurm or the ledger knows of."""
    ids = {r.array_job_id for r in queue or []} | {r.array_job_id for r in acct or []}
    return sorted(ids | {str(e["array_job_id"]) for e in ledger})
