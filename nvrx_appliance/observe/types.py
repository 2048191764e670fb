"""The shared vocabulary of observation: Slurm job states, array tasks, generations,
how a generation ended, NVRx cycles, the checkpoint tracker and the ledger.

Every observe module and every reader above imports from here and nothing here
imports them. Times are seconds since the epoch (float) throughout: callers only
subtract them, and floats keep a 10,000-cycle pass cheap.

Word use: a *generation* is one job array of the chain (its id is the array job id,
Slurm's own term); a *cycle* is one NVRx in-job restart cycle inside a generation. The
`generation` field inside a cycle-info file is NVRx's compare-and-swap counter and is
not read here.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

# --- Slurm job states, by what they mean for a generation ------------------------------
PENDING_STATES = frozenset(
    {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
)
RUNNING_STATES = frozenset(
    {
        "RUNNING",
        "CONFIGURING",
        "COMPLETING",
        "SUSPENDED",
        "STOPPED",
        "SIGNALING",
        "STAGE_OUT",
        "RESIZING",
    }
)
LIVE_STATES = PENDING_STATES | RUNNING_STATES


def terminal(state: str) -> bool:
    """Slurm is done with a job in this state (an empty state is not known yet)."""
    return bool(state) and state not in LIVE_STATES


@dataclass(frozen=True)
class Task:
    """One array task as squeue lists it (only the fields the caller asked squeue for)."""

    task_id: int | None  # None for a job that is not an array task
    job_id: str  # the task's own Slurm job id
    state: str  # PENDING, RUNNING, COMPLETING, ...
    user: str
    nodes: str = ""  # "" while pending
    array_job_id: str = ""  # the generation: every task of one array shares it
    name: str = ""
    reason: str = ""  # why it is pending
    work_dir: str = ""
    submitted: float | None = None

    @property
    def running(self) -> bool:
        return self.state in RUNNING_STATES

    @property
    def pending(self) -> bool:
        return self.state in PENDING_STATES


@dataclass(frozen=True)
class Generation:
    """One job array of the chain with at least one task still in the queue, or one plain
    job of a chain that does not use arrays (a generation of one task)."""

    array_job_id: str
    tasks: tuple[Task, ...]
    submitted: float | None = None  # submit time; successors queued before an ending

    @property
    def task0(self) -> Task | None:
        """The task that speaks for the generation: task 0 of an array, or the job itself
        when the chain is made of plain jobs (no array, so squeue gives no task id)."""
        return next((t for t in self.tasks if t.task_id in (0, None)), None)

    @property
    def pending(self) -> tuple[Task, ...]:
        return tuple(t for t in self.tasks if t.pending)

    @property
    def running(self) -> tuple[Task, ...]:
        return tuple(t for t in self.tasks if t.running)

    @property
    def alive(self) -> bool:
        return any(t.running for t in self.tasks)


@dataclass(frozen=True)
class Ending:
    """How a generation's task 0 ended, as Slurm (sacct or scontrol) recorded it."""

    array_job_id: str
    state: str  # terminal Slurm state: COMPLETED, FAILED, CANCELLED, ...
    exit_code: int | None
    end: float | None
    source: str  # "sacct" or "scontrol"


class Cycle(NamedTuple):
    """One NVRx cycle-info file. A named tuple, not a dataclass: a pass over a long run
    builds tens of thousands of them from the cycle cache, and a tuple is built fastest."""

    job_id: str  # the generation (array job id) whose task 0 wrote it
    attempt: int
    number: int
    start: float
    end: float | None  # None: still running, *or* ended without recording it
    active_nodes: str = ""
    standby_nodes: str = ""
    log_file: str = ""

    @property
    def key(self) -> str:
        return f"{self.job_id}.{self.attempt}.{self.number}"


@dataclass(frozen=True)
class Checkpoint:
    """The checkpoint-iteration tracker: its value, when it was written, and since when
    this value has been seen (the state file remembers across passes)."""

    value: int | None  # None: no tracker yet (or unreadable content)
    mtime: float | None
    since: float | None = None  # first time this value was observed


# The ledger's action for a generation whose workload finished training (the teardown
# writes it; a test keeps the two spellings in step).
COMPLETED = "completed"
# The workload's own verdict stopped the chain (rank/guard.py, the teardown).
STOPPED_BY_WORKLOAD = "stopped_by_workload"


@dataclass(frozen=True)
class LedgerEntry:
    array_job_id: str
    end: float | None
    exit_code: int | None
    action: str
    reason: str
    final_iteration: int | None = None  # set when action is COMPLETED
