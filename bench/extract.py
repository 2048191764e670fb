"""What each scenario measures, from what its run left behind. Pure.

Each scenario's shell gathers the artefacts of one sample into a `...Seen` value; the
functions here turn it into a timeline of marks (every mark names the artefact it came
from) and the figures the table reports. A sample that lacks an artefact raises
Incomplete naming it, rather than reporting a number that is not one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.timing import (
    CtldEvent,
    Cycle,
    FileTimes,
    Mark,
    NvrxEvent,
    StepEnd,
    Task,
    first_read,
    generation_end,
    nvrx_event,
    segments,
    step_end,
    task0,
)

RESTORE = "checkpoint restore"  # the workload's own restore, the phase a target leaves out
DETECTION = "detection + teardown"  # a dead node's generation ending, which Slurm decides


class Incomplete(ValueError):
    """A sample is missing an artefact it needs; the message names it."""


def _need(**named: Any) -> None:
    absent = [name for name, value in named.items() if value is None]
    if absent:
        raise Incomplete("missing: " + ", ".join(absent))


def timeline(marks: Sequence[Mark]) -> dict[str, Any]:
    """A sample as the JSON keeps it: marks, per-phase seconds, and their total."""
    parts = segments(marks)
    return {
        "marks": [{"name": m.name, "time": m.time, "source": m.source} for m in marks],
        "phases": {name: seconds for name, seconds in parts},
        "total_s": marks[-1].time - marks[0].time,
    }


# The cpu trainer's start event says when each step of its setup ended (rank 0's
# process): they split "worker start" where the event has them.
WORKER_SETUP = (
    ("launched", "trainer's main() began", "spawn + interpreter"),
    ("imported", "torch imported", "import torch"),
    ("joined", "process group joined", "join the process group"),
    ("built", "model built", "build the model"),
)


def _worker_setup(resumed: dict, restore_began: float) -> list[Mark]:
    setup = resumed.get("setup") or {}
    marks, last = [], float("-inf")
    for key, name, phase in WORKER_SETUP:
        at = setup.get(key)
        if at is None or not last <= at <= restore_began:
            return []  # an older trainer, or clocks that disagree: keep one phase
        marks.append(Mark(name, at, f"progress log: start.setup.{key}", phase=phase))
        last = at
    return marks


def _resumed(reads: tuple[float, float], resumed: dict, first_step: dict) -> list[Mark]:
    """The workload's part of any recovery: its processes start, read the checkpoint,
    and take a step."""
    setup = _worker_setup(resumed, reads[0])
    return [
        *setup,
        Mark(
            "restore began", reads[0], "checkpoint files' first access time",
            phase="restore setup" if setup else "worker start",
        ),
        Mark("training resumed", resumed["time"], "progress log: start", phase=RESTORE),
        Mark("first step", first_step["time"], "progress log: step", phase="first step"),
    ]  # fmt: skip


# --- 1. scheduler floor ---------------------------------------------------------------------


def floor_sample(previous: Sequence[Task], successor: Sequence[Task]) -> dict[str, Any]:
    """Last task of generation N ended -> task 0 of N+1 started."""
    ended = generation_end(previous)
    first = task0(successor)
    _need(previous_end=ended, successor_task0_start=first and first.start)
    assert ended is not None and first is not None and first.start is not None
    marks = [
        Mark("generation ended", ended[0], f"{ended[1]}: last task of {previous[0].array_job_id}"),
        Mark(
            "successor task 0 started",
            first.start,
            f"{first.start_from}: {first.array_job_id}_0",
            phase="scheduler",
        ),
    ]
    return timeline(marks)


# --- 2. hand-off ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HandoffSeen:
    killed_at: float  # the harness's clock, just before kill-node
    victim: str  # task 0's node
    generation: list[Task]  # N, whose task 0 died
    successor: list[Task]  # N+1
    record_written: float | None  # N+1's rdzv.json mtime
    cycle0: Cycle | None  # N+1's first cycle-info file
    checkpoint: list[FileTimes]  # the files of the checkpoint N+1 restored
    resumed: dict | None  # N+1's "start" progress event
    first_step: dict | None  # the first "step" event after it
    first_cold: int  # task ids from here on are cold spares
    nvrx: list[NvrxEvent]  # N+1's ft_launcher log
    # N's closed flag: a node that dies hard leaves none; one here means task 0's batch
    # script outlived its srun long enough to run the trap.
    dead_closed: float | None


def handoff_sample(seen: HandoffSeen) -> dict[str, Any]:
    ended = generation_end(seen.generation)
    successor0 = task0(seen.successor)
    reads = first_read(seen.checkpoint)
    host = seen.resumed.get("host", "") if seen.resumed else ""
    launcher_up = nvrx_event(seen.nvrx, "rendezvous_started", 0, host)
    _need(
        generation_end=ended,
        successor_task0_start=successor0 and successor0.start,
        rendezvous_record=seen.record_written,
        task0_rendezvous_started=launcher_up,
        cycle0_start=seen.cycle0 and seen.cycle0.start,
        checkpoint_first_read=reads,
        start_event=seen.resumed,
        first_step_event=seen.first_step,
    )
    assert ended and successor0 and successor0.start and seen.cycle0 and seen.cycle0.start
    assert reads and seen.resumed and seen.first_step and seen.record_written and launcher_up
    gen_id, next_id = seen.generation[0].array_job_id, successor0.array_job_id
    marks = [
        Mark("node killed", seen.killed_at, f"harness clock, kill-node {seen.victim}"),
        Mark(
            "generation ended", ended[0], f"{ended[1]}: last task of {gen_id}",
            phase=DETECTION,
        ),
        Mark(
            "successor task 0 started", successor0.start, f"{successor0.start_from}: {next_id}_0",
            phase="scheduler",
        ),
        Mark(
            "rendezvous record published", seen.record_written, "rdzv.json mtime",
            phase="entrypoint start (task 0)",
        ),
        Mark(
            "task 0's ft_launcher joins", launcher_up, "NVRx log: rendezvous_started",
            phase="ft_launcher start (task 0)",
        ),
        Mark(
            "rendezvous closed", seen.cycle0.start, "cycle-info cycle 0 start",
            phase="rendezvous",
        ),
        *_resumed(reads, seen.resumed, seen.first_step),
    ]  # fmt: skip
    sample = timeline(marks)
    sample.update(_who_ended_last(seen.generation, seen.victim, seen.killed_at))
    sample["resumed_iteration"] = seen.resumed.get("iteration")
    sample["dead_generation_closed_s"] = _between(seen.killed_at, seen.dead_closed)
    # A cold spare the throttle admitted once a peer left: task 0 is dead, so no closed
    # flag will ever come; the stale lease is what must send it away.
    sample["cold_spares_held_s"] = [
        t.end - t.start
        for t in seen.generation
        if t.task_id >= seen.first_cold and t.ran and t.start is not None and t.end is not None
    ]
    return sample


def _who_ended_last(generation: Sequence[Task], victim: str, killed: float) -> dict[str, Any]:
    """Which ended the dead generation: Slurm declaring task 0's node dead, or its
    peers leaving (the last to go is what the successor waited for)."""
    zero = task0(generation)
    zero_end = zero.end if zero else None
    peers = [t for t in generation if t.task_id != 0 and t.ran and t.end is not None]
    peers_end = max((t.end for t in peers if t.end is not None), default=None)
    return {
        "victim": victim,
        "task0_state": zero.state if zero else None,
        "task0_end": zero_end,
        "peers_end": peers_end,
        "kill_to_task0_end_s": _between(killed, zero_end),
        "kill_to_peers_end_s": _between(killed, peers_end),
        "peer_exit_codes": sorted({t.exit_code for t in peers if t.exit_code is not None}),
        "ended_last": "task 0 (Slurm: node failure)"
        if peers_end is None or (zero_end or 0) >= peers_end
        else "peers (stale lease)",
    }


# --- 3. escaped cold spare -------------------------------------------------------------------------


@dataclass(frozen=True)
class SpareSeen:
    generation: list[Task]
    closed_at: float | None  # the closed flag's mtime
    step_ends: list[StepEnd]  # slurmd: when each task's srun step ended
    train_tasks: int
    hot_spares: int


def spare_samples(seen: SpareSeen) -> list[dict[str, Any]]:
    """Every cold spare of a generation that ran: when it was admitted, against the
    closed flag, and how long it held its node. 'escaped' = admitted before the flag
    (it passed the sbatch's own closed-flag check and started the entrypoint)."""
    first_cold = seen.train_tasks + seen.hot_spares
    out = []
    for t in seen.generation:
        if t.task_id < first_cold or not t.ran or t.start is None or t.end is None:
            continue
        closed = seen.closed_at
        srun_end = step_end(seen.step_ends, t.raw_id)
        out.append(
            {
                "task": f"{t.array_job_id}_{t.task_id}",
                "node": t.node,
                "admitted": t.start,
                "srun_ended": srun_end,
                "job_ended": t.end,
                "exit_code": t.exit_code,
                "closed_flag": closed,
                "escaped": closed is not None and t.start < closed,
                "held_s": t.end - t.start,
                "flag_to_srun_end_s": _between(closed, srun_end),
                "srun_end_to_job_end_s": _between(srun_end, t.end),
                "sources": f"{t.start_from}/{t.end_from}; closed flag mtime; slurmd step end",
            }
        )
    return out


def _between(earlier: float | None, later: float | None) -> float | None:
    return None if earlier is None or later is None else later - earlier


def spare_fates(generation: Sequence[Task], first_cold: int) -> dict[str, int]:
    """What became of the cold spares: ran (escaped or caught by the sbatch), or
    cancelled while pending by the teardown."""
    fates: dict[str, int] = {}
    for t in generation:
        if t.task_id >= first_cold:
            key = "ran" if t.ran else t.state.lower()
            fates[key] = fates.get(key, 0) + 1
    return fates


# --- 4. no-restart ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NoRestartSeen:
    decided: float | None  # NVRx's last cycle end (cycle-info): the launcher gave up
    exited_93: float | None  # the entrypoint's no-restart file mtime: ft_launcher exited 93
    closed: float | None  # the closed flag's mtime: task 0's trap began
    teardown_done: float | None  # chain.jsonl mtime: scancel returned, the ledger appended
    generation: list[Task]  # the generation that exited 93
    step_ends: list[StepEnd]
    queued: list[str]  # array job ids of the generations that were queued behind it
    queued_tasks: list[Task]
    kills: list[CtldEvent]  # scancel RPCs slurmctld logged
    queue_empty: float  # the harness: first squeue without a job of the chain
    nvrx: list[NvrxEvent]  # the generation's ft_launcher log


def cancelled_at(queued: Sequence[str], tasks: Sequence[Task], kills: Sequence[CtldEvent]):
    """When the last queued generation was cancelled: slurmctld's first kill RPC for
    each (milliseconds), else sacct's end of its tasks (seconds)."""
    moments = []
    for array_job_id in queued:
        rpcs = [k.time for k in kills if k.kind == "kill" and k.array_job_id == array_job_id]
        if rpcs:
            moments.append((min(rpcs), "slurmctld: REQUEST_KILL_JOB"))
            continue
        ends = [t.end for t in tasks if t.array_job_id == array_job_id and t.end is not None]
        if not ends:
            return None
        moments.append((max(ends), "sacct: End"))
    return max(moments) if moments else None


def norestart_sample(seen: NoRestartSeen) -> dict[str, Any]:
    cancelled = cancelled_at(seen.queued, seen.queued_tasks, seen.kills)
    ended = generation_end(seen.generation)
    _need(
        no_restart_file=seen.exited_93,
        closed_flag=seen.closed,
        ledger=seen.teardown_done,
        queued_cancelled=cancelled,
        generation_end=ended,
    )
    assert seen.exited_93 and seen.closed and seen.teardown_done and cancelled and ended
    marks = []
    if seen.decided is not None:
        marks.append(Mark("NVRx gave up", seen.decided, "cycle-info: last cycle end"))
        zero = task0(seen.generation)
        host = zero.node if zero else None
        stopped = [e.time for e in seen.nvrx if e.event == "worker_terminated" and e.host == host]
        if stopped:
            marks.append(
                Mark(
                    "surviving workers stopped", max(stopped), "NVRx log: worker_terminated",
                    phase="stop the surviving workers",
                )
            )  # fmt: skip
    marks += [
        Mark(
            "ft_launcher exited 93", seen.exited_93, "no_restart file mtime",
            phase="ft_launcher shutdown",
        ),
        Mark("closed flag written", seen.closed, "closed mtime", phase="srun return + trap"),
        Mark(
            "teardown done", seen.teardown_done, "chain.jsonl mtime",
            phase="teardown: scancel + ledger",
        ),
        Mark(
            "generation ended", ended[0], f"{ended[1]}: last task of the generation",
            phase="Slurm ends the generation's jobs",
        ),
        Mark(
            "queue empty", seen.queue_empty, "harness: first empty squeue answered (0.1 s polls)",
            phase="squeue reflects it",
        ),
    ]  # fmt: skip
    sample = timeline(marks)
    last = max((t for t in seen.generation if t.ran), key=lambda t: t.end or 0.0)
    sample.update(
        exit93_to_empty_s=seen.queue_empty - seen.exited_93,
        exit93_to_cancelled_s=cancelled[0] - seen.exited_93,
        last_task=f"{last.array_job_id}_{last.task_id}",
        last_task_srun_end_to_job_end_s=_between(step_end(seen.step_ends, last.raw_id), last.end),
    )
    return sample


# --- 5. in-job restart --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RestartSeen:
    fault_at: float  # the harness's clock, just before SIGKILL of the rank's process
    rank: int
    next: Cycle | None  # the cycle after it
    checkpoint: list[FileTimes]
    resumed: dict | None  # the "start" event of the next cycle
    first_step: dict | None
    nvrx: list[NvrxEvent]  # the generation's ft_launcher log
    # What the fault was, as the first mark names it (default: SIGKILL of `rank`).
    fault: str = ""


RESTART_EVENTS = ("failure_detected", "worker_terminated", "rendezvous_started")


def restart_host(events: Sequence[NvrxEvent], cycle: int, preferred: str) -> str:
    """Whose launcher tells the restart's story: rank 0's host when it trained before the
    failure (it logged every event of the restart), else the first host that did. Where
    NVRx moved the work to a spare domain, rank 0's new host was a standby that detected
    nothing."""
    complete = [
        h for h in sorted({e.host for e in events})
        if all(nvrx_event(events, e, cycle, h) is not None for e in RESTART_EVENTS)
    ]  # fmt: skip
    if preferred in complete or not complete:
        return preferred
    return min(complete, key=lambda h: nvrx_event(events, "rendezvous_started", cycle, h) or 0)


def restart_sample(seen: RestartSeen) -> dict[str, Any]:
    reads = first_read(seen.checkpoint)
    cycle = seen.next.number if seen.next else -1
    host = restart_host(seen.nvrx, cycle, seen.resumed.get("host", "") if seen.resumed else "")

    def logged(event: str) -> float | None:
        return nvrx_event(seen.nvrx, event, cycle, host)

    detected, stopped, rejoined = (logged(e) for e in RESTART_EVENTS)
    _need(
        failure_detected=detected,
        worker_terminated=stopped,
        rendezvous_started=rejoined,
        next_cycle_start=seen.next and seen.next.start,
        checkpoint_first_read=reads,
        start_event=seen.resumed,
        first_step_event=seen.first_step,
    )
    assert detected and stopped and rejoined and seen.next and seen.next.start
    assert reads and seen.resumed and seen.first_step
    marks = [
        Mark("fault", seen.fault_at, seen.fault)
        if seen.fault
        else Mark("rank killed", seen.fault_at, f"harness clock, SIGKILL of rank {seen.rank}"),
        Mark("failure detected", detected, "NVRx log: failure_detected", phase="detection"),
        Mark(
            "surviving workers stopped", stopped, "NVRx log: worker_terminated",
            phase="stop the surviving workers",
        ),
        Mark(
            "rendezvous started", rejoined, "NVRx log: rendezvous_started",
            phase="wait for the next round",
        ),
        Mark(
            "next cycle started", seen.next.start, f"cycle-info cycle {cycle} start",
            phase="rendezvous",
        ),
        *_resumed(reads, seen.resumed, seen.first_step),
    ]  # fmt: skip
    sample = timeline(marks)
    sample["nvrx_host"] = host
    sample["cycle"] = seen.next.number
    sample["resumed_iteration"] = seen.resumed.get("iteration")
    return sample
