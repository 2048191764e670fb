"""The watcher's vocabulary: what one pass observes and what it concludes.

Every other watch module imports from here and nothing here imports them, so the
module graph is a DAG rooted at this file. Times are seconds since the epoch (float)
throughout: detectors only subtract them, and floats keep a 10,000-cycle pass cheap.

Word use: a *generation* is one job array of the chain (its id is the array job id);
a *cycle* is one NVRx in-job restart cycle inside a generation. The `generation` field
inside a cycle-info file is NVRx's compare-and-swap counter and is not read here.

Pure: no I/O.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import NamedTuple

# --- severities: what reaches a person -------------------------------------------------
INFO = "info"  # logged and counted, never paged
WARNING = "warning"  # paged non-urgently
CRITICAL = "critical"  # paged; the pass exits 2
SEVERITIES = (INFO, WARNING, CRITICAL)

# --- sources: each one is observed, unavailable (a failure: the pass is degraded), or
# not configured (nothing to observe: its detectors are skipped, the pass stays clean).
SLURM = "slurm"  # the chain's squeue and its windowed sacct
# sacct -j / scontrol for a task 0 neither of those accounts for. Without it an ending is
# missing, which can only hide a finding, never invent one: what the rest shows stands.
FOLLOW_UP = "slurm_follow_up"
CYCLES = "cycles"  # NVRx cycle-info files
CHECKPOINT = "checkpoint"  # the checkpoint-iteration tracker file
LEDGER = "ledger"  # <work>/chain.jsonl
MARKER = "marker"  # <work>/chain.active
SOURCES = (SLURM, FOLLOW_UP, CYCLES, CHECKPOINT, LEDGER, MARKER)

OBSERVED = "observed"
UNAVAILABLE = "unavailable"
NOT_CONFIGURED = "not configured"

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

# --- actions: the only two things the watcher may ever do, and only with --act -----------
RELEASE_SPARES = "release_spares"  # scancel the PENDING tasks of one generation
CANCEL_GENERATION = "cancel_generation"  # scancel every remaining task of one generation
ACTION_KINDS = (RELEASE_SPARES, CANCEL_GENERATION)


@dataclass(frozen=True)
class SourceStatus:
    state: str  # OBSERVED, UNAVAILABLE or NOT_CONFIGURED
    reason: str = ""  # why it is unavailable / not configured, for the person on call


@dataclass(frozen=True)
class Task:
    """One array task as squeue lists it."""

    task_id: int | None  # None for a job that is not an array task
    job_id: str  # the task's own Slurm job id
    state: str
    user: str
    nodes: str = ""

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

    array_id: str
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

    array_id: str
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


@dataclass(frozen=True)
class LedgerEntry:
    array_id: str
    end: float | None
    exit_code: int | None
    action: str
    reason: str


@dataclass(frozen=True)
class Run:
    """What the watcher knows about the run it watches, resolved once per invocation."""

    job_name: str
    owner: str
    work_dir: str = ""
    cycle_glob: str = ""
    tracker: str = ""
    max_restarts: int | None = None  # ft_launcher --max-restarts, for restart_budget_low
    train_tasks: int | None = None  # from run.json: tasks beyond these are spares
    origin: str = ""  # how the paths were found: "run.json", "batch script", "flags"


@dataclass(frozen=True)
class Snapshot:
    """Everything one pass observed. Detectors read this and nothing else."""

    run: Run
    observed_at: float
    caller: str  # the user running the watcher: actions only on their own jobs
    sources: dict[str, SourceStatus]
    generations: tuple[Generation, ...] = ()
    endings: tuple[Ending, ...] = ()  # task 0 endings Slurm reports (sacct, scontrol)
    cycles: tuple[Cycle, ...] = ()  # every cycle of the run, oldest first
    checkpoint: Checkpoint = field(default_factory=lambda: Checkpoint(None, None))
    ledger: tuple[LedgerEntry, ...] = ()
    chain_marker: bool = False

    def has(self, *sources: str) -> bool:
        return all(
            self.sources.get(s, SourceStatus(NOT_CONFIGURED)).state == OBSERVED for s in sources
        )

    def generation(self, array_id: str) -> Generation | None:
        return next((g for g in self.generations if g.array_id == array_id), None)

    def ending(self, array_id: str) -> Ending | None:
        return next((e for e in self.endings if e.array_id == array_id), None)

    @property
    def latest_cycle(self) -> Cycle | None:
        return self.cycles[-1] if self.cycles else None

    @functools.cached_property
    def current_cycles(self) -> tuple[Cycle, ...]:
        """The cycles of the generation that wrote the newest cycle."""
        latest = self.latest_cycle
        if latest is None:
            return ()
        return tuple(c for c in self.cycles if c.job_id == latest.job_id)

    def closed(self, cycle: Cycle) -> bool:
        """A cycle is over if it recorded its end or anything started after it.

        Only the newest cycle of the run can be open: a SIGKILL or node death leaves the
        last cycle of a generation without an end time forever, but a later cycle (in
        the same generation or the next) proves it ended.
        """
        return cycle.end is not None or cycle is not self.latest_cycle


@dataclass(frozen=True)
class Action:
    kind: str  # RELEASE_SPARES or CANCEL_GENERATION
    array_id: str
    argv: tuple[str, ...]  # the exact command, printed in observe-only mode

    @property
    def command(self) -> str:
        return " ".join(self.argv)


@dataclass(frozen=True)
class Finding:
    key: str  # deterministic dedup key: same condition, same key, every pass
    detector: str
    severity: str
    summary: str  # one line: what happened, to which job
    detail: str = ""  # what to do next
    action: Action | None = None
