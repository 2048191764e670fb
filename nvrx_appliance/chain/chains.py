"""`nvrx-appliance status` without a chain: every chain of the caller (or of every user)
at a glance, one row each.

Where the chains are found: in what Slurm says of the user's jobs, one squeue (the
generations queued or running) and one sacct (every task since ACCOUNTED_SINCE), two
calls whatever the number of chains. Every job names its work dir (submit passes
--chdir), and a work dir with a readable run.json is a chain; the jobs of any other
kind are left out, counted. A chain Slurm has forgotten (older than its accounting)
is not listed: `status --work-dir` still reads it. The rest comes from each work dir:
the ledger, the tracker, the cycle-info files and the goodput account, with Slurm's
rows already read (no call per chain).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from nvrx_appliance.chain.sources import ACCOUNTED_SINCE, generation_ids, view_of
from nvrx_appliance.chain.status import ChainView, Headline, action_words, slurm_answered
from nvrx_appliance.goodput import gather
from nvrx_appliance.goodput.account import account
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe import workdir
from nvrx_appliance.observe.slurm_output import CHAINS, AcctRow, ParseError
from nvrx_appliance.observe.slurmcli import Slurm, SlurmUnavailable
from nvrx_appliance.observe.types import PENDING_STATES, RUNNING_STATES, Task


@dataclass(frozen=True)
class ChainRow:
    job_name: str
    owner: str
    work_dir: str
    state: str  # running, queued, ended, unknown
    words: str  # the state in words: "ended: stopped by NVRx", ...
    generation: str  # the one running, else the first queued, else the newest
    checkpoint: int | None  # the tracker: the last iteration with a complete checkpoint
    goodput: float | None  # productive node-seconds / allocation so far; None: unknown
    headline: str  # status's opening line
    next_command: str
    problem: str = ""  # why the work dir could not be read ("" when it could)


@dataclass(frozen=True)
class Listing:
    chains: tuple[ChainRow, ...]  # the newest chain first
    blind: tuple[str, ...]  # Slurm's sources that did not answer
    others: int  # jobs left out: their work dir holds no run.json this user can read

    @property
    def slurm_reachable(self) -> bool:
        return slurm_answered(self.blind)


WHY_WORDS = {
    "exhausted": "exhausted",
    "completed": "completed",
    "cancelled": "cancelled",
    "stopped_by_nvrx": "stopped by NVRx",
    "burn_guard": "stopped by the burn guard",
}


def state_words(lead: Headline) -> str:
    """running, queued, unknown; or ended and why, in words (a ledger action's own, for
    one that is not among these)."""
    if lead.state != "ended":
        return lead.state
    return f"ended: {WHY_WORDS.get(lead.why) or action_words(lead.why)}"


def list_chains(*, user: str | None, slurm: Slurm | None = None) -> Listing:
    """The chains of `user` (None: of every user). Raises nothing for Slurm: a source
    that does not answer is named in `blind`."""
    slurm = slurm or Slurm()
    blind: list[str] = []
    queue: list[Task] = []
    acct: list[AcctRow] = []
    try:
        queue = slurm.squeue(user=user)
    except (SlurmUnavailable, ParseError) as exc:
        blind.append(f"squeue: {exc}")
    try:
        acct = slurm.sacct(user=user, all_users=user is None, since=ACCOUNTED_SINCE, fields=CHAINS)
    except (SlurmUnavailable, ParseError) as exc:
        blind.append(f"sacct: {exc}")
    groups: dict[tuple[str, str], tuple[list[Task], list[AcctRow]]] = {}
    for task in queue:
        if task.work_dir:
            groups.setdefault(_key(task), ([], []))[0].append(task)
    for row in acct:
        if row.work_dir:
            groups.setdefault(_key(row), ([], []))[1].append(row)
    now = time.time()
    rows: list[tuple[int, ChainRow]] = []
    others = 0
    for (work_dir, name), (live, accounted) in groups.items():
        found = _row(Path(work_dir), name, live, accounted, blind, now)
        if found is None:
            others += 1
        else:
            rows.append((_newest([*live, *accounted]), found))
    rows.sort(key=lambda pair: pair[0], reverse=True)
    return Listing(tuple(row for _, row in rows), tuple(blind), others)


def _key(row: Task | AcctRow) -> tuple[str, str]:
    return row.work_dir.rstrip("/") or "/", row.name


def _newest(rows: list[Task | AcctRow]) -> int:
    return max((int(r.array_job_id) for r in rows if r.array_job_id.isdigit()), default=0)


def _row(
    folder: Path,
    name: str,
    live: list[Task],
    accounted: list[AcctRow],
    blind: list[str],
    now: float,
) -> ChainRow | None:
    both: list[Task | AcctRow] = [*live, *accounted]
    owner = next((r.user for r in both if r.user), "")
    try:
        manifest = workdir.load_manifest(folder)
    except workdir.Unreadable as exc:
        return _from_slurm_alone(folder, name, owner, live, accounted, str(exc))
    except workdir.NotFound:
        return None  # not a chain of this tool's, or a work dir this user cannot read
    if manifest["spec"]["job_name"] != name:
        return None  # another job run from the chain's work dir
    layout = Layout(folder)
    ledger = workdir.ledger(layout)
    cycles = workdir.cycles(layout, generation_ids(live, accounted, ledger))
    view = view_of(folder, manifest, live, accounted, blind, now=now, ledger=ledger, cycles=cycles)
    ratio = None
    if "sacct" not in {b.split(":")[0] for b in blind}:
        inputs = gather.read(folder, lambda query: accounted, now=now, cycles=cycles)
        ratio = account(inputs).goodput_ratio
    return ChainRow(
        job_name=name,
        owner=owner or view.user,
        work_dir=view.work_dir,
        state=view.headline.state,
        words=state_words(view.headline),
        generation=_current(view),
        checkpoint=view.checkpoint_now,
        goodput=ratio,
        headline=view.headline.text,
        next_command=view.headline.next_command,
    )


def _current(view: ChainView) -> str:
    for state in ("running", "queued"):
        found = [g.array_job_id for g in view.generations if g.state == state]
        if found:
            return found[-1] if state == "running" else found[0]
    return view.generations[-1].array_job_id if view.generations else ""


def _from_slurm_alone(
    folder: Path, name: str, owner: str, live: list[Task], accounted: list[AcctRow], why: str
) -> ChainRow:
    """A chain whose run.json was edited beyond reading: what Slurm says of it."""
    running = sorted({t.array_job_id for t in live if t.state in RUNNING_STATES})
    queued = sorted({t.array_job_id for t in live if t.state in PENDING_STATES})
    both: list[Task | AcctRow] = [*live, *accounted]
    ids = sorted({r.array_job_id for r in both}, key=lambda i: (len(i), i))
    state = "running" if running else "queued" if queued else "ended"
    current = running[-1] if running else queued[0] if queued else ids[-1] if ids else ""
    return ChainRow(
        job_name=name,
        owner=owner,
        work_dir=str(folder),
        state=state,
        words=state,
        generation=current,
        checkpoint=None,
        goodput=None,
        headline=f"{state}: its run.json cannot be read",
        next_command=f"nvrx-appliance cancel {name}" if state != "ended" else "",
        problem=why,
    )
