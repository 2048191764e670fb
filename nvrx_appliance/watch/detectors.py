"""Detectors: pure functions of (Snapshot, Thresholds) -> findings.

Two families. The chain detectors need Slurm and catch what the job cannot fix itself
because the actor that should have fixed it (task 0 and its teardown trap) is gone.
The restart-anomaly detectors read NVRx cycle-info files and the checkpoint tracker
and catch failures that are a pattern rather than an event; they work wherever
ft_launcher runs.

Two findings carry a cancelling action, and both only release what a dead task 0 can no
longer release itself; suspect_node offers to add its nodes to the chain's exclusion
record (never a cancel, never a drain). Everything else reports: a watcher that cancels
jobs on a heuristic is a new failure mode.

Pure: imports only the vocabulary, the thresholds and the pure parsers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nvrx_appliance.exitcodes import NVRX_NO_RESTART
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe.deaths import sentence as death_sentence
from nvrx_appliance.observe.hangs import sentence
from nvrx_appliance.observe.slurm_output import expand_nodelist
from nvrx_appliance.observe.times import age_text
from nvrx_appliance.observe.types import COMPLETED, STOPPED_BY_WORKLOAD, Cycle, Ending, Generation
from nvrx_appliance.watch.config import Thresholds
from nvrx_appliance.watch.findings import (
    CANCEL_GENERATION,
    CHECKPOINT,
    CRITICAL,
    CYCLES,
    DEATHS,
    EXCLUDE_NODES,
    EXCLUSIONS,
    FOLLOW_UP,
    HANGS,
    INFO,
    MARKER,
    RELEASE_SPARES,
    SLURM,
    TRAINING,
    UNAVAILABLE,
    WARNING,
    Action,
    Finding,
    Snapshot,
)

DetectorFn = Callable[[Snapshot, Thresholds], list[Finding]]


@dataclass(frozen=True, kw_only=True)
class Detector:
    name: str
    family: str  # "chain", "restart", "training" or "watch"
    severity: str
    needs: tuple[str, ...]  # sources that must have been observed, or it is skipped
    fn: DetectorFn
    uses: tuple[str, ...] = ()  # sources it consults when configured: skipped if they failed
    thresholds: tuple[str, ...] = ()  # the Thresholds fields it reads
    # Sources whose loss can only hide a finding: it still runs on the rest, but what it
    # does not find then is not taken as resolved.
    hidden_by: tuple[str, ...] = ()

    @property
    def summary(self) -> str:
        return (self.fn.__doc__ or "").strip().splitlines()[0]


def _finding(
    snap: Snapshot,
    detector: str,
    subject: str,
    severity: str,
    summary: str,
    detail: str,
    action: Action | None = None,
    nodes: tuple[str, ...] = (),
) -> Finding:
    """A finding whose dedup key names the chain, the detector and what it is about, so
    the same condition yields the same key on every pass and every login node."""
    key = f"nvrx/{snap.run.owner}/{snap.run.job_name}/{detector}/{subject}"
    return Finding(key, detector, severity, summary, detail, action, nodes)


# --- chain --------------------------------------------------------------------------------


def _task0_gone(snap: Snapshot, t: Thresholds) -> Iterator[tuple[Generation, Ending, float]]:
    """Generations whose task 0 Slurm reports ended at least the grace period ago.

    Task 0 still in the queue means its trap owns the pool. Task 0 absent from the
    queue with no terminal record from sacct or scontrol is *unknown*, never gone.
    """
    for gen in snap.generations:
        ending = snap.ending(gen.array_job_id)
        if gen.task0 is not None or ending is None or ending.end is None:
            continue
        age = snap.observed_at - ending.end
        if age >= t.grace:
            yield gen, ending, age


def orphaned_generation(snap: Snapshot, t: Thresholds) -> list[Finding]:
    """Task 0 ended (per Slurm) past the grace period, but cold spares are still pending."""
    findings = []
    for gen, ending, age in _task0_gone(snap, t):
        if not gen.pending:
            continue
        action = Action(
            RELEASE_SPARES,
            gen.array_job_id,
            (
                "scancel",
                "--state=PENDING",
                f"--user={snap.run.owner}",
                f"--name={snap.run.job_name}",
                gen.array_job_id,
            ),
        )
        findings.append(
            _finding(
                snap,
                "orphaned_generation",
                gen.array_job_id,
                WARNING,
                summary=(
                    f"generation {gen.array_job_id} of {snap.run.job_name}: task 0 ended "
                    f"{ending.state} {age_text(age)} ago, but "
                    f"{len(gen.pending)} cold spare(s) are still pending"
                ),
                detail=(
                    "Task 0's teardown never released them (SIGKILL or node death kills the "
                    "trap; its scancel can fail). Each would start, find no rendezvous host "
                    "and hold a node until it gives up, while the successor waits. "
                    f"Release them: {action.command}"
                ),
                action=action,
            )
        )
    return findings


def stranded_generation(snap: Snapshot, t: Thresholds) -> list[Finding]:
    """Task 0 ended (per Slurm) past the grace period while other tasks of its array still run."""
    findings = []
    for gen, _ending, age in _task0_gone(snap, t):
        if not gen.running:
            continue
        action = Action(
            CANCEL_GENERATION,
            gen.array_job_id,
            (
                "scancel",
                f"--user={snap.run.owner}",
                f"--name={snap.run.job_name}",
                gen.array_job_id,
            ),
        )
        names = sorted({n for task in gen.running for n in expand_nodelist(task.nodes)})
        nodes = ",".join(sorted({task.nodes for task in gen.running if task.nodes}))
        findings.append(
            _finding(
                snap,
                "stranded_generation",
                gen.array_job_id,
                CRITICAL,
                summary=(
                    f"generation {gen.array_job_id} of {snap.run.job_name}: task 0 ended "
                    f"{age_text(age)} ago but {len(gen.running)} task(s) still run"
                    + (f" on {nodes}" if nodes else "")
                ),
                detail=(
                    "Without task 0 there is no rendezvous host and no teardown trap: these "
                    "tasks dial a dead store or train without the trap that ends the chain, "
                    "and the singleton successor cannot start until they end. Under "
                    "--no-requeue task 0 cannot come back, so ending them is safe: "
                    f"{action.command}"
                ),
                action=action,
                nodes=tuple(names),
            )
        )
    return findings


def chain_exhausted(snap: Snapshot, t: Thresholds) -> list[Finding]:
    """Nothing of the chain is running or queued, yet its chain marker says it should be."""
    if not snap.chain_marker or snap.generations or snap.completed is not None:
        return []  # a chain whose training completed has ended as it should
    last = snap.ledger[-1] if snap.ledger else None
    history = (
        f" The last generation recorded, {last.array_job_id}, ended with exit {last.exit_code}"
        f" ({last.reason or last.action})."
        if last
        else ""
    )
    return [
        _finding(
            snap,
            "chain_exhausted",
            snap.run.work_dir or snap.run.job_name,
            CRITICAL,
            summary=f"chain {snap.run.job_name} has no generation left, running or queued: "
            "training has stopped",
            detail=(
                f"Resubmit with `nvrx-appliance submit`, or remove the chain marker "
                f"{snap.run.work_dir}/chain.active if the run is finished.{history}"
            ),
        )
    ]


def chain_stopped(snap: Snapshot, t: Thresholds) -> list[Finding]:
    """The chain ended on a decision about the training itself: the workload's verdict,
    or NVRx's 93 after the workload failed the same way again and again. No machine is
    at fault and nothing will resume it: a person must read why and resubmit."""
    last = snap.ledger[-1] if snap.ledger else None
    if last is None or snap.generations:
        return []
    if last.action != STOPPED_BY_WORKLOAD and "after the workload failed" not in last.reason:
        return []
    return [
        _finding(
            snap,
            "chain_stopped",
            last.array_job_id,
            CRITICAL,
            summary=f"chain {snap.run.job_name} stopped in generation {last.array_job_id}: "
            f"{last.reason.split('; ')[0]}",
            detail=(
                f"{last.reason}. The chain's checkpoints are kept (see nvrx-appliance status "
                f"{snap.run.job_name}); fix the cause, then resubmit with `nvrx-appliance "
                "submit`."
            ),
        )
    ]


def _final_endings(snap: Snapshot) -> dict[str, tuple[float | None, str]]:
    """Generations after which the chain must end, and why: task 0 ended with NVRx's
    do-not-restart code (by Slurm or ledger), or its teardown found training done."""
    ended: dict[str, tuple[float | None, str]] = {}
    no_restart = f"ended {NVRX_NO_RESTART} (NVRx: do not restart)"
    for ending in snap.endings:
        if ending.exit_code == NVRX_NO_RESTART:
            ended[ending.array_job_id] = (ending.end, no_restart)
    for entry in snap.ledger:
        if entry.action == STOPPED_BY_WORKLOAD:
            ended[entry.array_job_id] = (entry.end, "was stopped by the workload's verdict")
        elif entry.exit_code == NVRX_NO_RESTART or entry.action == COMPLETED:
            why = no_restart if entry.action != COMPLETED else "completed training"
            ended[entry.array_job_id] = (
                ended.get(entry.array_job_id, (None, ""))[0] or entry.end,
                why,
            )
    return ended


def chain_not_cancelled(snap: Snapshot, t: Thresholds) -> list[Finding]:
    """A generation ended 93 (NVRx: do not restart) or completed training, but successors are still queued or running."""
    findings = []
    for array_job_id, (end, why) in _final_endings(snap).items():
        successors = [
            g.array_job_id
            for g in snap.generations
            if g.array_job_id != array_job_id
            # Queued before that verdict: a chain resubmitted afterwards is a new decision.
            and (end is None or g.submitted is None or g.submitted <= end)
        ]
        if not successors:
            continue
        command = f"scancel --state=PENDING --user={snap.run.owner} --name={snap.run.job_name}"
        findings.append(
            _finding(
                snap,
                "chain_not_cancelled",
                array_job_id,
                CRITICAL,
                summary=(
                    f"generation {array_job_id} of {snap.run.job_name} {why} but "
                    f"generation(s) {', '.join(successors)} are still queued"
                ),
                detail=(
                    "The teardown's cancel of the chain did not happen (its scancel failed, or "
                    "the exit code was rewritten on the way), so the next generation would "
                    "repeat what NVRx refused to restart, or start only to find training "
                    f"done. Cancel them: {command}"
                ),
            )
        )
    return findings


def generation_churn(snap: Snapshot, t: Thresholds) -> list[Finding]:
    """More generations of the chain ended within the churn window than the threshold allows."""
    cutoff = snap.observed_at - t.churn_window
    ends: dict[str, float] = {}
    for array_job_id, end in [(e.array_job_id, e.end) for e in snap.endings] + [
        (e.array_job_id, e.end) for e in snap.ledger
    ]:
        if end is not None and end >= cutoff:
            ends[array_job_id] = end
    if len(ends) <= t.max_generations_per_window:
        return []
    recent = sorted(ends, key=ends.__getitem__)
    return [
        _finding(
            snap,
            "generation_churn",
            snap.run.job_name,
            WARNING,
            summary=(
                f"{len(ends)} generations of {snap.run.job_name} ended in the last "
                f"{age_text(t.churn_window)} (threshold {t.max_generations_per_window})"
            ),
            detail=(
                "Each one restarted from checkpoint: the chain spends its time on recovery. "
                f"Ended: {', '.join(recent[-8:])}. Check the ledger and the per-cycle logs."
            ),
        )
    ]


# --- restart anomalies -----------------------------------------------------------------


def _alive(snap: Snapshot, array_job_id: str) -> bool:
    """Whether the generation that wrote a cycle still runs; without Slurm, assume so."""
    if not snap.has(SLURM):
        return True
    gen = snap.generation(array_job_id)
    return gen is not None and gen.alive


def restart_storm(snap: Snapshot, t: Thresholds) -> list[Finding]:
    """Too many NVRx cycles started within the storm window in the current generation."""
    cutoff = snap.observed_at - t.storm_window
    recent = [c for c in snap.current_cycles if c.start >= cutoff]
    if len(recent) < t.storm_cycles:
        return []
    gen = recent[-1].job_id
    return [
        _finding(
            snap,
            "restart_storm",
            gen,
            WARNING,
            summary=(
                f"{len(recent)} NVRx cycles started in the last {age_text(t.storm_window)} "
                f"in generation {gen} (threshold {t.storm_cycles})"
            ),
            detail="Cycles "
            + ", ".join(str(c.number) for c in recent[-10:])
            + ". A fault recurs faster than restarts can fix it; read the per-cycle logs.",
        )
    ]


def _no_iteration(snap: Snapshot) -> str:
    tracker = snap.run.tracker or "the checkpoint tracker"
    if snap.checkpoint.mtime is not None:
        return (
            f"{tracker} exists but holds no iteration number (last written "
            f"{age_text(snap.observed_at - snap.checkpoint.mtime)} ago). Whatever writes it "
            "does not write Megatron's format; find out what wrote it."
        )
    return (
        f"Expected {tracker} to exist. Either the workload never reaches its first save, or "
        "the tracker path does not point where it writes."
    )


def stalled_progress(snap: Snapshot, t: Thresholds) -> list[Finding]:
    """Cycles keep completing but the checkpoint iteration never moves."""
    if snap.has(SLURM) and not any(g.tasks for g in snap.generations):
        return []  # nothing left to make progress: chain_exhausted's to report
    closed = [c for c in snap.cycles if snap.closed(c)]
    value = snap.checkpoint.value
    if value is None:
        if len(closed) < t.stall_cycles:
            return []
        return [
            _finding(
                snap,
                "stalled_progress",
                "none",
                CRITICAL,
                summary=f"{len(closed)} cycles of {snap.run.job_name} completed and no "
                "checkpoint iteration was ever recorded",
                detail=_no_iteration(snap),
            )
        ]
    since = snap.checkpoint.since or snap.checkpoint.mtime
    if since is None:
        return []
    unproductive = [c for c in closed if c.start >= since]
    if len(unproductive) < t.stall_cycles:
        return []
    return [
        _finding(
            snap,
            "stalled_progress",
            str(value),
            CRITICAL,
            summary=(
                f"{len(unproductive)} cycles of {snap.run.job_name} completed since iteration "
                f"{value} was checkpointed {age_text(snap.observed_at - since)} ago, "
                "without advancing it"
            ),
            detail=(
                "Restarts succeed but training does not progress: every cycle dies before the "
                "next save. Look at what ends each cycle; lower the save interval or fix the "
                "fault before the chain burns its nodes."
            ),
        )
    ]


def cycle_stalled(snap: Snapshot, t: Thresholds) -> list[Finding]:
    """The newest cycle is open and neither it nor the checkpoint has moved for too long."""
    latest = snap.latest_cycle
    if latest is None or latest.end is not None or not _alive(snap, latest.job_id):
        return []  # a dead generation's last cycle never gets an end time: not a stall
    moved = max(latest.start, snap.checkpoint.mtime or 0.0)
    idle = snap.observed_at - moved
    if idle < t.stall_seconds:
        return []
    return [
        _finding(
            snap,
            "cycle_stalled",
            latest.key,
            CRITICAL,
            summary=(
                f"cycle {latest.number} of generation {latest.job_id} has been open "
                f"{age_text(idle)} with no new cycle and no checkpoint"
            ),
            detail=(
                "Section timeouts should have caught a hang; either one is too loose or the "
                f"launcher is wedged. Cycle log: {latest.log_file or 'not recorded'}."
            ),
        )
    ]


def restart_budget_low(snap: Snapshot, t: Thresholds) -> list[Finding]:
    """The running generation has used most of ft_launcher's --max-restarts."""
    latest = snap.latest_cycle
    budget = snap.run.max_restarts
    if latest is None or not budget or not _alive(snap, latest.job_id):
        return []
    if latest.number < budget * t.budget_fraction:
        return []
    return [
        _finding(
            snap,
            "restart_budget_low",
            latest.job_id,
            WARNING,
            summary=(
                f"generation {latest.job_id} is on cycle {latest.number} of {budget} allowed "
                "restarts"
            ),
            detail="Past the budget the generation ends and the chain restarts from checkpoint "
            "in a new one: the last cheap moment to look at what keeps failing.",
        )
    ]


def spares_exhausted(snap: Snapshot, t: Thresholds) -> list[Finding]:
    """The running generation has no standby node and no cold spare left. Only a chain
    known to have been given spares can run out of them: one submitted with none runs
    so by design, and without run.json a running hot spare cannot be told from a
    training task (NVRx 0.7.0 does not always list it as standby), so nothing is said."""
    latest = snap.latest_cycle
    if not snap.run.spares or latest is None or not _alive(snap, latest.job_id):
        return []
    if expand_nodelist(latest.standby_nodes):
        return []
    gen = snap.generation(latest.job_id)
    if gen is not None:
        if gen.pending:
            return []  # cold spares are queued behind the throttle
        # NVRx 0.7.0 does not always list a hot spare in standby_nodes (measured); a task
        # running beyond the training tasks is one.
        if snap.run.train_tasks is not None and len(gen.running) > snap.run.train_tasks:
            return []
    return [
        _finding(
            snap,
            "spares_exhausted",
            latest.job_id,
            INFO,
            summary=f"generation {latest.job_id} runs with no standby node and no queued spare",
            detail="Healthy for now; the next node failure ends the generation instead of "
            f"costing one restart cycle. Active nodes: {latest.active_nodes or 'unknown'}.",
        )
    ]


def _trailing_short(cycles: list[Cycle], t: Thresholds) -> list[Cycle]:
    trailing = []
    for cycle in reversed(cycles):
        if cycle.end is None or cycle.end - cycle.start >= t.short_cycle_seconds:
            break
        trailing.append(cycle)
    return trailing


def suspect_node(snap: Snapshot, t: Thresholds) -> list[Finding]:
    """A node was active in every one of the last few short cycles (a candidate for exclusion)."""
    closed = [c for c in snap.current_cycles if snap.closed(c)]
    trailing = _trailing_short(closed, t)
    if len(trailing) < t.suspect_cycles:
        return []
    common = set(expand_nodelist(trailing[0].active_nodes))
    for cycle in trailing[1:]:
        common &= set(expand_nodelist(cycle.active_nodes))
    # The chain's exclusion record already keeps these out of its queued generations.
    nodes = sorted(common - snap.excluded)
    if not nodes:
        return []
    gen = trailing[0].job_id
    action = None
    if snap.run.work_dir and snap.run.exclude_for > 0:
        record = str(Layout(Path(snap.run.work_dir)).exclusions)
        action = Action(EXCLUDE_NODES, gen, (record,), nodes=tuple(nodes))
    return [
        _finding(
            snap,
            "suspect_node",
            f"{gen}/{','.join(nodes)}",
            WARNING,
            summary=(
                f"{', '.join(nodes[:5])}{' ...' if len(nodes) > 5 else ''} took part in each "
                f"of the last {len(trailing)} cycles of generation {gen}, all shorter than "
                f"{age_text(t.short_cycle_seconds)}"
            ),
            detail="Correlation only: cycle-info files do not say why a cycle ended. Read the "
            "per-cycle logs; with --act the node goes into the chain's exclusion record, "
            "and the queued generations exclude it from the running one's end (never a drain).",
            action=action,
            nodes=tuple(nodes),
        )
    ]


def node_hung(snap: Snapshot, t: Thresholds) -> list[Finding]:
    """A hang verdict of the newest generation named a node (docs/hangs.md)."""
    return [
        _finding(
            snap,
            "node_hung",
            f"{hang.record.get('generation', '')}/cycle{hang.cycle}",
            WARNING,
            summary=sentence(hang, snap.run.exclude_for),
            detail="Named from every rank's last stack: its ranks stood outside any "
            "collective while the others waited in one. It leaves at the next rendezvous; "
            "`nvrx-appliance logs <chain> --stacks` shows the stacks.",
            nodes=hang.standing,
        )
        for hang in snap.hangs
        if hang.standing
    ]


def node_dead(snap: Snapshot, t: Thresholds) -> list[Finding]:
    """Task 0's liveness judge found a node of the newest generation dead (docs/liveness.md)."""
    return [
        _finding(
            snap,
            "node_dead",
            f"{death.node}/{death.time}",
            WARNING,
            summary=death_sentence(death, snap.run.exclude_for),
            detail="The node sent task 0 no liveness beat for the silence timeout and its "
            "host did not answer a probe: a power loss, a kernel panic, a dead NIC, or a "
            "node frozen. The cycle went on without it (or the generation handed off) and "
            "the chain keeps it out of later generations; Slurm marks it down after its "
            "SlurmdTimeout. Look at the node's console and BMC.",
            nodes=(death.node,),
        )
        for death in snap.deaths
    ]


def workload_stalled(snap: Snapshot, t: Thresholds) -> list[Finding]:
    """A hang of the newest generation was the workload's own stall (docs/hangs.md)."""
    return [
        _finding(
            snap,
            "workload_stalled",
            f"{hang.record.get('generation', '')}/cycle{hang.cycle}",
            WARNING,
            summary=sentence(hang, snap.run.exclude_for),
            detail="The ranks the others waited for stood in the workload's own code (or a "
            "file-system call), neither stopped nor stuck in the kernel: the code's stall, "
            "no node's. Nothing is kept out; `nvrx-appliance logs <chain> --stacks` shows "
            "where they stood.",
        )
        for hang in snap.hangs
        if hang.record.get("verdict") == "workload"
    ]


def straggler(snap: Snapshot, t: Thresholds) -> list[Finding]:
    """A node of the running generation is persistently slower than its peers, who wait for it at every step."""
    findings = []
    for found in snap.stragglers:
        if snap.has(SLURM) and snap.generation(found.generation) is None:
            continue  # that generation has ended: the verdict was about it
        act = (
            "Nobody acts on a rank: find its node from the launcher's log."
            if found.by_rank
            else "Look at the node (GPU clocks and temperature, its NIC, a neighbour's load); "
            "under --straggler-action replace the chain replaces it at a checkpoint when "
            "that pays; `nvrx-appliance status` names it too."
        )
        findings.append(
            _finding(
                snap,
                "straggler",
                found.node,
                WARNING,
                summary=found.words,
                detail=(
                    "In data-parallel training every rank waits for the slowest at each "
                    "step's collective, so the whole run trains at this node's pace "
                    f"(docs/stragglers.md). {act}"
                ),
                nodes=(found.node,),
            )
        )
    return findings


def source_unavailable(snap: Snapshot, t: Thresholds) -> list[Finding]:
    """A source could not be observed: its detectors were skipped and no heartbeat is sent."""
    return [
        _finding(
            snap,
            "source_unavailable",
            name,
            WARNING,
            summary=f"nvrx-watch cannot observe {name} for {snap.run.job_name}: {status.reason}",
            detail="The detectors that need it were skipped this pass, and the dead-man "
            "heartbeat was withheld so that blindness pages too.",
        )
        for name, status in snap.sources.items()
        if status.state == UNAVAILABLE
    ]


ALL: tuple[Detector, ...] = (
    Detector(
        name="orphaned_generation",
        family="chain",
        severity=WARNING,
        needs=(SLURM,),
        thresholds=("grace",),
        hidden_by=(FOLLOW_UP,),
        fn=orphaned_generation,
    ),
    Detector(
        name="stranded_generation",
        family="chain",
        severity=CRITICAL,
        needs=(SLURM,),
        thresholds=("grace",),
        hidden_by=(FOLLOW_UP,),
        fn=stranded_generation,
    ),
    Detector(
        name="chain_exhausted",
        family="chain",
        severity=CRITICAL,
        needs=(SLURM, MARKER),
        fn=chain_exhausted,
    ),
    Detector(
        name="chain_stopped",
        family="chain",
        severity=CRITICAL,
        needs=(SLURM,),
        fn=chain_stopped,
    ),
    Detector(
        name="chain_not_cancelled",
        family="chain",
        severity=CRITICAL,
        needs=(SLURM,),
        hidden_by=(FOLLOW_UP,),
        fn=chain_not_cancelled,
    ),
    Detector(
        name="generation_churn",
        family="chain",
        severity=WARNING,
        needs=(SLURM,),
        thresholds=("churn_window", "max_generations_per_window"),
        hidden_by=(FOLLOW_UP,),
        fn=generation_churn,
    ),
    Detector(
        name="restart_storm",
        family="restart",
        severity=WARNING,
        needs=(CYCLES,),
        thresholds=("storm_cycles", "storm_window"),
        fn=restart_storm,
    ),
    Detector(
        name="stalled_progress",
        family="restart",
        severity=CRITICAL,
        needs=(CYCLES, CHECKPOINT),
        uses=(SLURM,),
        thresholds=("stall_cycles",),
        fn=stalled_progress,
    ),
    Detector(
        name="cycle_stalled",
        family="restart",
        severity=CRITICAL,
        needs=(CYCLES,),
        uses=(SLURM,),
        thresholds=("stall_seconds",),
        fn=cycle_stalled,
    ),
    Detector(
        name="restart_budget_low",
        family="restart",
        severity=WARNING,
        needs=(CYCLES,),
        uses=(SLURM,),
        thresholds=("budget_fraction",),
        fn=restart_budget_low,
    ),
    Detector(
        name="spares_exhausted",
        family="restart",
        severity=INFO,
        needs=(CYCLES,),
        uses=(SLURM,),
        fn=spares_exhausted,
    ),
    Detector(
        name="suspect_node",
        family="restart",
        severity=WARNING,
        needs=(CYCLES,),
        uses=(EXCLUSIONS,),
        thresholds=("short_cycle_seconds", "suspect_cycles"),
        fn=suspect_node,
    ),
    Detector(
        name="node_hung",
        family="restart",
        severity=WARNING,
        needs=(HANGS,),
        fn=node_hung,
    ),
    Detector(
        name="node_dead",
        family="restart",
        severity=WARNING,
        needs=(DEATHS,),
        fn=node_dead,
    ),
    Detector(
        name="workload_stalled",
        family="restart",
        severity=WARNING,
        needs=(HANGS,),
        fn=workload_stalled,
    ),
    Detector(
        name="straggler",
        family="training",
        severity=WARNING,
        needs=(TRAINING,),
        uses=(SLURM,),
        fn=straggler,
    ),
    Detector(
        name="source_unavailable",
        family="watch",
        severity=WARNING,
        needs=(),
        fn=source_unavailable,
    ),
)
NAMES = [d.name for d in ALL]


def runnable(detector: Detector, snap: Snapshot) -> bool:
    """Skipped, never run on partial data: a failed squeue must not read as 'nothing queued'."""
    if not snap.has(*detector.needs):
        return False
    return all(snap.sources[s].state != UNAVAILABLE for s in detector.uses if s in snap.sources)


def complete(detector: Detector, snap: Snapshot) -> bool:
    """It ran on everything it consults, so what it did not find this pass is gone."""
    return runnable(detector, snap) and all(
        snap.sources[s].state != UNAVAILABLE for s in detector.hidden_by if s in snap.sources
    )


def blind_to(snap: Snapshot) -> frozenset[str]:
    """The detectors a source that could not be observed this pass kept from judging
    (none once the chain is over: nothing of it is left to find). What such a detector
    did not find is hidden, not gone: the PagerDuty sink resolves none of its pages (it
    resolves only what complete() detectors no longer find), and the findings gauges
    carry its last count (finding_counts.py). A source that is not configured is no
    blindness: its detectors never run, and their gauges say 0."""
    if snap.finished:
        return frozenset()
    return frozenset(
        d.name
        for d in ALL
        if any(
            snap.sources[s].state == UNAVAILABLE
            for s in (*d.needs, *d.uses, *d.hidden_by)
            if s in snap.sources
        )
    )


def run(snap: Snapshot, t: Thresholds, disabled: frozenset[str] = frozenset()) -> list[Finding]:
    if snap.finished:
        return []  # training completed and Slurm holds nothing of the chain: all is well
    findings: list[Finding] = []
    for detector in ALL:
        if detector.name not in disabled and runnable(detector, snap):
            findings.extend(detector.fn(snap, t))
    return findings
