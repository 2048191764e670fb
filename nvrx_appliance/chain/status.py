"""`nvrx-appliance status`: the chain at a glance, assembled from what was read. Pure.

Inputs: Slurm's view (squeue for live tasks, sacct for every task since the chain was
submitted), run.json (with the image's manifest and the qualification status submit
found for it), the ledger task 0's teardown appends, the NVRx cycle-info files of each
generation, the checkpoint tracker, and the work dir's qualification record when the
chain was a qualify run. A source that could not be read is passed as None and named in
`blind`; the rest of the picture is still assembled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from nvrx_appliance.goodput.straggler import Straggler
from nvrx_appliance.image import qualification, qualification_status
from nvrx_appliance.jsondoc import iso_utc
from nvrx_appliance.observe.deaths import Death
from nvrx_appliance.observe.deaths import sentence as death_words
from nvrx_appliance.observe.exclusions import Applied, Exclusion, Record
from nvrx_appliance.observe.hangs import Hang
from nvrx_appliance.observe.hangs import sentence as hang_words
from nvrx_appliance.observe.slurm_output import AcctRow
from nvrx_appliance.observe.times import parse_time
from nvrx_appliance.observe.types import LIVE_STATES, PENDING_STATES, RUNNING_STATES, Cycle, Task
from nvrx_appliance.settings.generation_end import slurm_seconds

IMAGE_FILE, REGISTRY, BARE_METAL = "image file", "registry image", "bare metal"


@dataclass(frozen=True)
class CycleView:
    number: int
    start: float
    end: float | None
    active_nodes: str
    standby_nodes: str


@dataclass(frozen=True)
class GenerationView:
    array_job_id: str
    state: str  # queued, running, ended
    running: int
    pending: int
    done: int
    task0_node: str
    task0_state: str  # Slurm's state of task 0 ("" before it started)
    exit_code: int | None
    checkpoint_start: int | None  # where it resumed (ledger)
    checkpoint_end: int | None  # the iteration it handed off (ledger)
    action: str  # what its teardown did (ledger): released_spares, cancelled_chain, ...
    reason: str
    admission: str  # non-empty while active tasks are still waiting to be admitted
    cycles: tuple[CycleView, ...] = ()
    started: float | None = None  # task 0's start (sacct)
    elapsed_s: float | None = None  # task 0's run so far, or in all once it ended
    time_left_s: float | None = None  # to the time limit, while it runs
    pending_reason: str = ""  # squeue's %r for a task 0 not started yet
    drained: tuple[str, ...] = ()  # its nodes Slurm drained (ledger: the drain poller's)
    hangs: tuple[str, ...] = ()  # each hung cycle's judgement, in words (docs/hangs.md)
    deaths: tuple[str, ...] = ()  # each node task 0 found dead, in words (docs/liveness.md)
    # Each straggler task 0 named and what it did about it (ledger), in words.
    stragglers: tuple[str, ...] = ()
    # Cancelled before any of its tasks started (sacct), and by whom where Slurm says.
    never_ran: bool = False
    cancelled_by: str = ""


@dataclass(frozen=True)
class ImageView:
    kind: str  # image file, registry image, bare metal
    name: str  # the file name or the registry reference; "" on bare metal
    versions: dict[str, str]  # from the image's manifest: NVRx, Megatron-LM, PyTorch, ...
    qualification: str  # passed, failed, none; unknown when submit recorded none
    qualified_on: str = ""
    qualified_cluster: str = ""
    why: str = ""


def straggler_words(named: Mapping[str, Any]) -> str:
    """A straggler the ledger keeps, for a person: who, how slow, what it cost, and what
    task 0 did about it (docs/stragglers.md)."""
    slowdown, lost = named.get("slowdown"), named.get("lost_s")
    how = [f"{slowdown:.2f}x its peers' own step" if isinstance(slowdown, int | float) else "",
           f"the run lost {lost:.0f} s waiting for it" if isinstance(lost, int | float) else ""]  # fmt: skip
    said = "; ".join(h for h in how if h)
    return (
        f"{named.get('node', '?')} was a straggler in cycle {named.get('cycle', '?')}"
        + (f" ({said})" if said else "")
        + f": {named.get('action') or 'what was done about it is unknown'}"
    )


def bare_metal() -> ImageView:
    return ImageView(BARE_METAL, "", {}, qualification="none", why="no image")


@dataclass(frozen=True)
class QualifyRunView:
    """<work>/qualification.json: this chain was a qualify run, and what it found."""

    result: str  # passed, failed, pending
    image: str
    finished: str
    cluster: str
    checks: tuple[qualification.Check, ...]


@dataclass(frozen=True)
class Headline:
    """Where the chain stands, in one line, and the next command to run."""

    state: str  # running, queued, ended, unknown (Slurm did not answer)
    # Why an ended chain ended: exhausted, completed, cancelled, stopped_by_nvrx,
    # burn_guard, or the ledger's own action for one this tool has no words of its own for
    # (a workload verdict, say). "" while it lives.
    why: str
    text: str
    next_command: str


@dataclass(frozen=True)
class ChainView:
    job_name: str
    user: str
    work_dir: str
    mode: str  # train, or the demo mode the chain was submitted in
    workload: str
    array_spec: str
    active_tasks: int
    checkpoint_now: int | None
    generations: tuple[GenerationView, ...]
    queued: tuple[str, ...]  # generations not started yet, oldest first
    chain_marker: bool
    # The final iteration, when a generation's teardown found training done (ledger).
    completed_at: int | None = None
    image: ImageView = field(default_factory=bare_metal)
    qualify_run: QualifyRunView | None = None
    parallelism: str = ""  # the shape submit validated, as shape_text says it
    wandb_run_id: str = ""  # the chain's one W&B run, if it logs to W&B
    blind: tuple[str, ...] = field(default_factory=tuple)  # sources that could not be read
    # The exclusion record: nodes kept out of the queued generations, and its last use.
    excluded: tuple[Exclusion, ...] = ()
    applied: Applied | None = None
    # The running generation's slow nodes, slowest first (goodput/straggler.py).
    stragglers: tuple[Straggler, ...] = ()
    # Where its figures name nobody though a node lagged: why, with what was seen
    unnamed: tuple[str, ...] = ()
    headline: Headline = field(default_factory=lambda: Headline("unknown", "", "", ""))

    @property
    def slurm_reachable(self) -> bool:
        """False when neither squeue nor sacct answered: the picture is the work dir's."""
        return slurm_answered(self.blind)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["slurm_reachable"] = self.slurm_reachable
        for g in doc["generations"]:
            g["started"] = iso_utc(g["started"])
            for c in g["cycles"]:
                c["start"], c["end"] = iso_utc(c["start"]), iso_utc(c["end"])
        return doc


def slurm_answered(blind: Sequence[str]) -> bool:
    """Did squeue or sacct answer? `blind` names each source that could not be read."""
    return not {"squeue", "sacct"} <= {b.split(":")[0] for b in blind}


def shape_text(shape: dict[str, Any], *, every_size: bool = False) -> str:
    """The parallel shape from run.json in one line: how the world splits, and a step.
    Sizes of 1 are left out unless `every_size` (the dry run, where each is checked)."""
    get = shape.get
    if get("data_parallel") is None:
        return ""
    sizes = [f"TP {get('tensor_parallel')}", f"PP {get('pipeline_parallel')}"]
    if every_size or get("context_parallel", 1) != 1:
        sizes.append(f"CP {get('context_parallel')}")
    text = f"{get('world_size')} ranks = {' x '.join(sizes)} x DP {get('data_parallel')}"
    if get("virtual_pipeline"):
        text += f", {get('virtual_pipeline')} virtual stages"
    if every_size or get("expert_parallel", 1) != 1:
        text += f" (experts: EP {get('expert_parallel')} x ETP {get('expert_tensor_parallel')})"
    return (
        f"{text}; global batch {get('global_batch')} = micro {get('micro_batch')} x DP "
        f"{get('data_parallel')} x {get('microbatches')} microbatches"
    )


def _ours(rows, work_dir: str):
    if rows is None:
        return None
    return [r for r in rows if not r.work_dir or r.work_dir.rstrip("/") == work_dir.rstrip("/")]


def _task_states(
    queue: Sequence[Task] | None, acct: Sequence[AcctRow] | None
) -> dict[str, dict[int, str]]:
    """array job id -> task id -> state; squeue (the live truth) over sacct."""
    states: dict[str, dict[int, str]] = {}
    for accounted in acct or ():
        for task in accounted.task_ids:
            states.setdefault(accounted.array_job_id, {})[task] = accounted.state
    for live in queue or ():
        if live.task_id is not None:
            states.setdefault(live.array_job_id, {})[live.task_id] = live.state
    return states


def _task0(
    array_job_id: str, queue: Sequence[Task] | None, acct: Sequence[AcctRow] | None
) -> tuple[str, str, int | None]:
    """(node, state, exit code) of task 0, from squeue while it lives, else sacct."""
    for live in queue or ():
        if live.array_job_id == array_job_id and live.task_id == 0:
            return live.nodes, live.state, None
    for accounted in acct or ():
        if accounted.array_job_id == array_job_id and accounted.task_ids == (0,):
            return accounted.nodes, accounted.state, accounted.exit_code
    return "", "", None


def _pending_reason(array_job_id: str, queue: Sequence[Task] | None) -> str:
    for row in queue or ():
        if row.array_job_id == array_job_id and row.task_id == 0 and row.state in PENDING_STATES:
            return row.reason
    return ""


def _clock(
    array_job_id: str, acct: Sequence[AcctRow] | None, now: float, limit_s: int | None
) -> tuple[float | None, float | None, float | None]:
    """(started, elapsed, time left) of a generation, by its task 0 (sacct's times are
    the controller's local time)."""
    row = next(
        (r for r in acct or () if r.array_job_id == array_job_id and r.task_ids == (0,)), None
    )
    started = parse_time(row.start) if row else None
    if row is None or started is None:
        return None, None, None
    ended = parse_time(row.end)
    elapsed = (ended if ended is not None else now) - started
    left = None if ended is not None or limit_s is None else max(limit_s - elapsed, 0.0)
    return started, elapsed, left


def _never_ran(array_job_id: str, acct: Sequence[AcctRow] | None) -> bool:
    """Every task of the generation cancelled before it started (sacct)."""
    rows = [r for r in acct or () if r.array_job_id == array_job_id]
    return bool(rows) and all(r.state == "CANCELLED" and not r.start for r in rows)


def _cancelled_by(array_job_id: str, acct: Sequence[AcctRow] | None) -> str:
    rows = [r for r in acct or () if r.array_job_id == array_job_id and r.cancelled_by]
    return rows[0].cancelled_by if rows else ""


def _state(tasks: dict[int, str]) -> str:
    if any(s in RUNNING_STATES for s in tasks.values()):
        return "running"
    if tasks and all(s in PENDING_STATES for s in tasks.values()):
        return "queued"
    return "ended"


def _admission(tasks: dict[int, str], active: int) -> str:
    """Array admission is not atomic, and the singleton dependency reserves nothing: a
    running generation can still wait for some of its active set to be scheduled."""
    running = sum(1 for s in tasks.values() if s in RUNNING_STATES)
    pending = sum(1 for s in tasks.values() if s in PENDING_STATES)
    if running and running < active and pending:
        return f"{running} of {active} active tasks admitted; waiting for the scheduler"
    return ""


def _cycles(cycles: Sequence[Cycle]) -> tuple[CycleView, ...]:
    ordered = sorted(cycles, key=lambda c: (c.attempt, c.number))
    return tuple(
        CycleView(c.number, c.start, c.end, c.active_nodes, c.standby_nodes) for c in ordered
    )


def image_view(manifest: dict[str, Any]) -> ImageView:
    """The image a chain runs, from run.json alone: what submit saw is what ran."""
    name = str(manifest["spec"].get("image") or "")
    recorded = manifest.get("image")
    if not name:
        return bare_metal()
    if not isinstance(recorded, dict):
        # A registry reference: no manifest to read, so nothing a record could vouch for.
        return ImageView(REGISTRY, name, {}, qualification="none", why="a registry image")
    found = recorded.get(qualification_status.KEY)
    versions = qualification_status.versions(qualification_status.image_manifest(recorded))
    file_name = name.rsplit("/", 1)[-1]
    if not isinstance(found, dict):
        why = "submitted by an nvrx-appliance that did not record it"
        return ImageView(IMAGE_FILE, file_name, versions, qualification="unknown", why=why)
    return ImageView(
        IMAGE_FILE,
        file_name,
        versions,
        qualification=str(found.get("status", "unknown")),
        qualified_on=str(found.get("date", "")),
        qualified_cluster=str(found.get("cluster", "")),
        why=str(found.get("why", "")),
    )


def qualify_run_view(record: Any) -> QualifyRunView | None:
    if not isinstance(record, dict) or record.get("schema") != qualification.SCHEMA:
        return None
    found = record.get("cluster")
    cluster = found if isinstance(found, dict) else {}
    checks = tuple(
        qualification.Check(str(c.get("name")), c.get("passed"), str(c.get("detail", "")))
        for c in record.get("checks") or ()
        if isinstance(c, dict)
    )
    return QualifyRunView(
        result=str(record.get("result", "")),
        image=str(record.get("image", "")),
        finished=str(record.get("finished", "")),
        cluster=str(cluster.get("cluster_name", qualification_status.UNKNOWN_CLUSTER)),
        checks=checks,
    )


def _wandb_run_id(manifest: dict[str, Any]) -> str:
    found = manifest.get("wandb")
    return str(found.get("run_id", "")) if isinstance(found, dict) else ""


def _completed_at(entries: Iterable[dict[str, Any]]) -> int | None:
    done = [e.get("final_iteration") for e in entries if e.get("action") == "completed"]
    return next((d for d in reversed(done) if isinstance(d, int)), None)


# The teardown's actions after which the chain goes on (the next generation starts):
# a chain that has nothing left after one of them either ran out or was cancelled.
GOES_ON = frozenset(
    {"released_spares", "saved_at_time_limit", "fenced", "resume_elsewhere", "none", ""}
)
STOPPED_BY_NVRX, BURN_GUARD, COMPLETED = "cancelled_chain", "burn_guard", "completed"


def action_words(action: str) -> str:
    """A ledger action as words: the teardown's own, and any other (a newer teardown's,
    a workload verdict's) read plainly from its name."""
    return ACTION_WORDS.get(action, action.replace("_", " ").strip() or "-")


ACTION_WORDS = {
    "released_spares": "released spares",
    "saved_at_time_limit": "saved at the time limit",
    COMPLETED: "training completed",
    STOPPED_BY_NVRX: "cancelled chain",
    BURN_GUARD: "burn guard",
    # A peer closed the generation for a task 0 whose lease went stale (issue 11).
    "fenced": "fenced dead task 0",
    "none": "nothing cancelled",
    # The workload's own verdicts (issue 29).
    "stopped_by_workload": "stopped by the workload",
    "resume_elsewhere": "resumed elsewhere",
}


def headline(
    *,
    name: str,
    generations: Sequence[GenerationView],
    chain_marker: bool,
    checkpoint_now: int | None,
    completed_at: int | None,
    slurm_reachable: bool,
    work_dir: str,
) -> Headline:
    """Where the chain stands. Pure: what status read, in; one line and a command, out."""
    at = "none yet" if checkpoint_now is None else str(checkpoint_now)
    running = [g for g in generations if g.state == "running"]
    queued = [g for g in generations if g.state == "queued"]
    if running:
        g = running[-1]
        on = f" (task 0 on {g.task0_node})" if g.task0_node else ""
        behind = f"; {len(queued)} more queued behind it" if queued else "; none queued behind it"
        text = f"running: generation {g.array_job_id}{on}, checkpoint iteration {at}{behind}"
        return Headline("running", "", text, f"nvrx-appliance logs {name} --follow")
    if queued:
        g = queued[0]
        why = f" ({g.pending_reason})" if g.pending_reason not in ("", "None") else ""
        text = (
            f"queued: generation {g.array_job_id} waits for Slurm{why}; "
            f"{len(queued)} generation(s) queued, checkpoint iteration {at}"
        )
        return Headline("queued", "", text, f"nvrx-appliance status {name} --watch")
    if not slurm_reachable:
        text = "unknown: Slurm could not be reached; below is what the work dir records"
        return Headline("unknown", "", text, f"nvrx-appliance status {name} (again, later)")
    return _ended(name, generations, chain_marker, at, completed_at, work_dir)


def _ended(
    name: str,
    generations: Sequence[GenerationView],
    chain_marker: bool,
    at: str,
    completed_at: int | None,
    work_dir: str,
) -> Headline:
    last = next((g for g in reversed(generations) if g.action), None)
    action, reason = (last.action, last.reason) if last else ("", "")
    of = f" (generation {last.array_job_id})" if last else ""
    resubmit = f"nvrx-appliance submit --work-dir {work_dir} --job-name {name} <its settings>"
    if completed_at is not None or action == COMPLETED:
        done = completed_at if completed_at is not None else at
        text = f"ended: completed, training reached iteration {done}"
        return Headline("ended", "completed", text, f"nvrx-appliance report {name}")
    if action == STOPPED_BY_NVRX:
        said = "ft_launcher exited 93 (do not restart)"
        if "after the workload" in reason:
            # NVRx's 93 answered the workload failing the same way again and again: the
            # teardown's reason says what the workload did, and that is the headline.
            said = reason.split("; ")[0]
        text = f"ended: stopped by NVRx{of}: {said}"
        return Headline("ended", "stopped_by_nvrx", text, f"nvrx-appliance logs {name} --launcher")
    if action == BURN_GUARD:
        text = (
            f"ended: stopped by the burn guard{of}: generations ended without training, "
            f"checkpoint iteration {at}"
        )
        return Headline("ended", BURN_GUARD, text, f"nvrx-appliance logs {name}")
    if action not in GOES_ON and not chain_marker:
        # The teardown ended the chain (it removes the marker) with an action this has no
        # words of its own for (a workload verdict, a newer teardown's): its name and
        # its reason say what happened.
        text = f"ended: {action_words(action)}{of}" + (f": {reason}" if reason else "")
        return Headline("ended", action, text, f"nvrx-appliance logs {name}")
    never = [g for g in generations if g.never_ran]
    if never or not chain_marker:
        # `cancel` removes the chain marker; a plain `scancel -n NAME` leaves it, and only
        # Slurm tells: generations cancelled before they ever ran.
        who = next((g.cancelled_by for g in never if g.cancelled_by), "")
        text = f"ended: cancelled{f' by {who}' if who else ''}, checkpoint iteration {at}"
        if never:
            ids = ", ".join(g.array_job_id for g in never)
            text += f"; {len(never)} generation(s) never ran ({ids})"
        return Headline("ended", "cancelled", text, resubmit)
    text = (
        f"ended: exhausted, every generation queued has run and none is left; "
        f"checkpoint iteration {at}"
    )
    return Headline("ended", "exhausted", text, resubmit)


def assemble(
    *,
    manifest: dict[str, Any],
    queue: Sequence[Task] | None,
    acct: Sequence[AcctRow] | None,
    ledger: Sequence[dict[str, Any]],
    cycles: Mapping[str, Sequence[Cycle]],
    checkpoint_now: int | None,
    chain_marker: bool,
    qualify_record: Any = None,
    blind: Sequence[str] = (),
    now: float = 0.0,
    exclusions: Record | None = None,
    hangs: Mapping[str, Sequence[Hang]] | None = None,
    stragglers: Sequence[Straggler] = (),
    deaths: Mapping[str, Sequence[Death]] | None = None,
    named: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    unnamed: Sequence[tuple[str, str]] = (),
) -> ChainView:
    """`named`: the stragglers task 0 named in each generation (workdir.stragglers_named);
    the ledger's, once the generation has a line, say the same and win."""
    spec, shape = manifest["spec"], manifest["shape"]
    limit_s = slurm_seconds(str(spec.get("time_limit", "")))
    chain = str(manifest.get("created", ""))
    # Another chain may reuse the name from another work dir: its jobs are not ours.
    queue = _ours(queue, spec["work_dir"])
    acct = _ours(acct, spec["work_dir"])
    by_array = {str(e["array_job_id"]): e for e in ledger if e.get("chain", chain) == chain}
    states = _task_states(queue, acct)
    ids = sorted(set(states) | set(by_array), key=lambda x: (len(x), x))
    generations = []
    for array_job_id in ids:
        tasks = states.get(array_job_id, {})
        entry = by_array.get(array_job_id, {})
        node, task0_state, code = _task0(array_job_id, queue, acct)
        state = _state(tasks) if tasks else "ended"
        started, elapsed, left = _clock(array_job_id, acct, now, limit_s)
        generations.append(
            GenerationView(
                array_job_id=array_job_id,
                state=state,
                running=sum(1 for s in tasks.values() if s in RUNNING_STATES),
                pending=sum(1 for s in tasks.values() if s in PENDING_STATES),
                done=sum(1 for s in tasks.values() if s not in LIVE_STATES),
                task0_node=entry.get("task0_node") or node,
                task0_state=task0_state,
                exit_code=entry.get("exit_code", code),
                checkpoint_start=entry.get("checkpoint_iteration_start"),
                checkpoint_end=entry.get("checkpoint_iteration"),
                action=entry.get("action", ""),
                reason=entry.get("reason", ""),
                admission=_admission(tasks, shape["active_tasks"]) if state == "running" else "",
                cycles=_cycles(cycles.get(array_job_id, ())),
                started=started,
                elapsed_s=elapsed,
                time_left_s=left,
                pending_reason=_pending_reason(array_job_id, queue),
                drained=tuple(str(n) for n in entry.get("drained") or ()),
                hangs=tuple(
                    hang_words(h, int(spec.get("exclude_for", 0)))
                    for h in (hangs or {}).get(array_job_id, ())
                ),
                deaths=tuple(
                    death_words(d, int(spec.get("exclude_for", 0)))
                    for d in (deaths or {}).get(array_job_id, ())
                ),
                stragglers=tuple(
                    straggler_words(s)
                    for s in entry.get("stragglers") or (named or {}).get(array_job_id, ())
                    if isinstance(s, dict)
                ),
                never_ran=not entry and _never_ran(array_job_id, acct),
                cancelled_by=_cancelled_by(array_job_id, acct),
            )
        )
    completed_at = _completed_at(by_array.values())
    reachable = slurm_answered(blind)
    lead = headline(
        name=spec["job_name"],
        generations=generations,
        chain_marker=chain_marker,
        checkpoint_now=checkpoint_now,
        completed_at=completed_at,
        slurm_reachable=reachable,
        work_dir=spec["work_dir"],
    )
    return ChainView(
        job_name=spec["job_name"],
        user=str(manifest.get("user", "")),
        work_dir=spec["work_dir"],
        mode=str(spec.get("mode", "")),
        workload=str(spec.get("workload", "")),
        array_spec=shape["array_spec"],
        active_tasks=shape["active_tasks"],
        checkpoint_now=checkpoint_now,
        generations=tuple(generations),
        queued=tuple(g.array_job_id for g in generations if g.state == "queued"),
        chain_marker=chain_marker,
        completed_at=completed_at,
        image=image_view(manifest),
        qualify_run=qualify_run_view(qualify_record),
        parallelism=shape_text(shape),
        wandb_run_id=_wandb_run_id(manifest),
        blind=tuple(blind),
        excluded=exclusions.active if exclusions else (),
        applied=exclusions.applied if exclusions else None,
        headline=lead,
        # A verdict is about the generation that trains now; one that ended is history
        # (report tells what it cost).
        stragglers=tuple(
            s for s in stragglers if any(
                g.array_job_id == s.generation and g.state == "running" for g in generations
            )
        ),
        unnamed=tuple(
            why for gen, why in unnamed if any(
                g.array_job_id == gen and g.state == "running" for g in generations
            )
        ),
    )  # fmt: skip
