"""Timestamps out of recorded artefacts, and the durations between them. Pure.

Every figure the benchmarks report is a difference between two moments that some
part of the system wrote down on its own: Slurm (sacct, slurmctld's log), the
entrypoint (control-dir files), NVRx (cycle-info files), the cpu trainer (progress
log), the file system (a checkpoint's first read). Nothing here reads a file or a
clock; the harness hands the texts and stat results in.

Resolution matters when the floor is a second: sacct stamps whole seconds, so a
task's start and end are taken from slurmctld's log (milliseconds) where it has them,
and from sacct otherwise; each boundary says where it came from.
"""

from __future__ import annotations

import datetime
import itertools
import json
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from nvrx_appliance.observe import run_files
from nvrx_appliance.observe.slurm_output import AcctRow

# --- clocks ----------------------------------------------------------------------------


def local_epoch(text: str) -> float | None:
    """sacct / slurmctld time ('2026-11-30T18:28:35[.989]', the controller's local
    time) as epoch seconds; None for Slurm's 'Unknown' / empty."""
    if not text or text in ("Unknown", "None"):
        return None
    return datetime.datetime.fromisoformat(text).timestamp()


def utc_epoch(text: str) -> float | None:
    """An ISO-8601 UTC stamp ('...Z' or '+00:00', as NVRx and the entrypoint write)."""
    if not text:
        return None
    stamp = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.timezone.utc)
    return stamp.timestamp()


# --- slurmctld's log ---------------------------------------------------------------------

# "[2026-11-30T18:28:36.926] sched/backfill: _start_job: Started JobId=1_0(4) in main on node1"
# "[2026-11-30T18:28:44.774] sched: Allocate JobId=8_0(10) NodeList=node2 #CPUs=1 ..."
# "[2026-11-30T18:28:40.042] _job_complete: JobId=1_0(4) done"
# "[2026-11-30T18:28:44.641] _slurm_rpc_kill_job: REQUEST_KILL_JOB JobId=2_[0-4%2] uid 0"
# "[2026-11-30T19:36:58.111] Killing JobId=354_0(360) on failed node node1" (NODE_FAIL)
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)\] (.*)$")
_STARTED = re.compile(r"(?:Started|Allocate) JobId=(\d+)_(\d+)\(\d+\)")
_DONE = re.compile(
    r"(?:_job_complete: JobId=(\d+)_(\d+)\(\d+\) done|Killing JobId=(\d+)_(\d+)\(\d+\) on failed node)"
)
_KILL = re.compile(r"REQUEST_KILL_JOB JobId=(\d+)(?:_(\S+))? uid")
# slurmd's log, per node: "[2026-11-30T18:41:16.399] [41.0] done with job" (a job's step
# 0, i.e. its srun, ended) and "[41.batch] done with job" (the batch script's step).
_STEP_DONE = re.compile(r"^\[(\d+)\.(\w+)\] done with job")


@dataclass(frozen=True)
class CtldEvent:
    time: float
    kind: str  # "start", "end" (a task), or "kill" (a scancel RPC, task None for a range)
    array_job_id: str
    task_id: int | None


def ctld_events(text: str) -> list[CtldEvent]:
    """The task starts, ends and cancel requests in slurmctld's log, in log order."""
    events: list[CtldEvent] = []
    for line in text.splitlines():
        stamped = _STAMP.match(line)
        if not stamped:
            continue
        when, body = local_epoch(stamped.group(1)), stamped.group(2)
        for kind, pattern in (("start", _STARTED), ("end", _DONE)):
            found = pattern.search(body)
            if found:
                array_job_id, task = [g for g in found.groups() if g is not None]
                events.append(CtldEvent(when, kind, array_job_id, int(task)))
                break
        else:
            found = _KILL.search(body)
            if found:
                task = found.group(2)
                task_id = int(task) if task and task.isdigit() else None
                events.append(CtldEvent(when, "kill", found.group(1), task_id))
    return events


@dataclass(frozen=True)
class StepEnd:
    time: float
    raw_id: str  # the task's own job id (sacct's JobIDRaw)
    step: str  # "batch", or a step number ("0": the generation's srun)


def step_ends(text: str) -> list[StepEnd]:
    """When each job step ended on a node, from that node's slurmd log."""
    ends = []
    for line in text.splitlines():
        stamped = _STAMP.match(line)
        found = stamped and _STEP_DONE.match(stamped.group(2))
        if found:
            ends.append(StepEnd(local_epoch(stamped.group(1)), found.group(1), found.group(2)))
    return ends


def step_end(ends: Iterable[StepEnd], raw_id: str, step: str = "0") -> float | None:
    times = [e.time for e in ends if e.raw_id == raw_id and e.step == step]
    return max(times) if times else None


# --- NVRx's own log (ft_launcher --ft-nvrx-logfile) -----------------------------------------

# "... profiling.py:93   - Cycle: 2 Event: failure_detected Node: node1_16270_0 Rank: 0
#  Time: 2026-11-30 19:14:31.779 UTC". The cycle is the one being entered: a failure of
# cycle 1 is logged as cycle 2's failure_detected.
_PROFILE = re.compile(
    r"Cycle: (\d+) Event: (\w+) Node: (\S+) Rank: \S+ Time: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) UTC"
)


@dataclass(frozen=True)
class NvrxEvent:
    cycle: int
    event: str  # failure_detected, worker_terminated, rendezvous_started, ...
    host: str
    time: float


def nvrx_events(text: str) -> list[NvrxEvent]:
    events = []
    for line in text.splitlines():
        found = _PROFILE.search(line)
        if found:
            cycle, event, node, when = found.groups()
            host = node.rsplit("_", 2)[0]  # node1_16270_0: host, launcher pid, local id
            events.append(NvrxEvent(int(cycle), event, host, utc_epoch(when.replace(" ", "T"))))
    return events


def nvrx_event(events: Iterable[NvrxEvent], event: str, cycle: int, host: str) -> float | None:
    """When one node's launcher logged an event while entering a cycle (the first time)."""
    times = [e.time for e in events if (e.event, e.cycle, e.host) == (event, cycle, host)]
    return min(times) if times else None


# --- array tasks ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One array task as Slurm saw it, with the best start and end known."""

    array_job_id: str
    task_id: int
    state: str
    exit_code: int | None
    node: str
    start: float | None
    end: float | None
    start_from: str  # "slurmctld" (ms) or "sacct" (s)
    end_from: str
    raw_id: str = ""  # the task's own job id, which slurmd's log names

    @property
    def ran(self) -> bool:
        return self.start is not None and bool(self.node)


def tasks(rows: Iterable[AcctRow], events: Sequence[CtldEvent] = ()) -> list[Task]:
    """One Task per array task in sacct's rows (a folded pending range is expanded),
    start and end refined from slurmctld's log where it recorded them."""
    starts = {(e.array_job_id, e.task_id): e.time for e in events if e.kind == "start"}
    ends = {(e.array_job_id, e.task_id): e.time for e in events if e.kind == "end"}
    out: list[Task] = []
    for row in rows:
        for task_id in row.task_ids:
            key = (row.array_job_id, task_id)
            start, start_from = _best(starts.get(key), row.start)
            end, end_from = _best(ends.get(key), row.end)
            if not row.nodes:  # never ran: sacct's Start of a cancelled pending task is its end
                start, start_from = None, "sacct"
            out.append(
                Task(
                    array_job_id=row.array_job_id,
                    task_id=task_id,
                    state=row.state,
                    exit_code=row.exit_code,
                    node=row.nodes,
                    start=start,
                    end=end,
                    start_from=start_from,
                    end_from=end_from,
                    raw_id=row.job_id if len(row.task_ids) == 1 else "",
                )
            )
    return sorted(out, key=lambda t: (int(t.array_job_id), t.task_id))


def _best(logged: float | None, acct: str) -> tuple[float | None, str]:
    seconds = local_epoch(acct)
    # The log's stamp is the same moment to the millisecond; a stale one (a task id
    # reused after a controller restart) would lie more than a second away.
    if logged is not None and (seconds is None or abs(logged - seconds) < 1.5):
        return logged, "slurmctld"
    return seconds, "sacct"


def generation(all_tasks: Iterable[Task], array_job_id: str) -> list[Task]:
    return [t for t in all_tasks if t.array_job_id == array_job_id]


def task0(gen: Sequence[Task]) -> Task | None:
    return next((t for t in gen if t.task_id == 0), None)


def generation_end(gen: Sequence[Task]) -> tuple[float, str] | None:
    """When the last task that ran ended: what the singleton dependency waits for."""
    ended = [t for t in gen if t.ran and t.end is not None]
    if not ended or any(t.ran and t.end is None for t in gen):
        return None
    last = max(ended, key=lambda t: t.end or 0.0)
    return last.end or 0.0, last.end_from


# --- timelines -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mark:
    """A moment on a timeline, the artefact it was read from, and the name of the
    phase that ends at it (the first mark of a timeline ends none)."""

    name: str
    time: float
    source: str
    phase: str = ""


def segments(marks: Sequence[Mark]) -> list[tuple[str, float]]:
    """(phase, seconds) between consecutive marks. They add up to last - first by
    construction, so a breakdown always sums to its total."""
    return [(b.phase or b.name, b.time - a.time) for a, b in itertools.pairwise(marks)]


# --- the progress log and cycle-info files ---------------------------------------------------


def progress_events(text: str) -> list[dict]:
    """The cpu trainer's events; a torn last line (being appended) is skipped."""
    return [e for e in run_files.json_lines(text) if "event" in e and "time" in e]


def first_event(events: Iterable[dict], event: str, after: float = float("-inf"), **match):
    """The first event of this kind after a moment whose fields equal `match`."""
    for e in events:
        if (
            e["event"] == event
            and e["time"] > after
            and all(e.get(k) == v for k, v in match.items())
        ):
            return e
    return None


@dataclass(frozen=True)
class Cycle:
    array_job_id: str
    number: int
    start: float | None
    end: float | None
    active_nodes: str


def cycle(text: str) -> Cycle:
    """One NVRx cycle-info file (cycle_info.<job>.<attempt>.<cycle>)."""
    data = json.loads(text)
    return Cycle(
        array_job_id=str(data.get("job_id", "")),
        number=int(data["cycle_number"]),
        start=utc_epoch(data.get("cycle_start_time", "")),
        end=utc_epoch(data.get("cycle_end_time", "")),
        active_nodes=str(data.get("active_nodes", "")),
    )


# --- checkpoint restore, from the file system's access times --------------------------------


@dataclass(frozen=True)
class FileTimes:
    atime: float
    mtime: float


def first_read(files: Iterable[FileTimes]) -> tuple[float, float] | None:
    """(first, last) read of a checkpoint's files after they were written.

    A file's access time moves on its first read after a write, relatime included, so
    in a checkpoint read exactly once (the restore) the earliest access time is when
    the restore began reading, the latest when it read its last file. None when any
    file was never read after it was written (no restore, or a noatime mount).
    """
    files = list(files)
    if not files or any(f.atime <= f.mtime for f in files):
        return None
    return min(f.atime for f in files), max(f.atime for f in files)


# --- statistics --------------------------------------------------------------------------------


def summary(samples: Sequence[float]) -> dict[str, float | int | None]:
    if not samples:
        return {"n": 0, "median_s": None, "min_s": None, "max_s": None}
    return {
        "n": len(samples),
        "median_s": statistics.median(samples),
        "min_s": min(samples),
        "max_s": max(samples),
    }


def ratio(value: float | None, floor: float | None) -> float | None:
    if value is None or not floor:
        return None
    return value / floor
