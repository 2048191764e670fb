"""The watcher's vocabulary: what one pass observes and what it concludes.

Every other watch module imports from here and nothing here imports them, so the
module graph is a DAG rooted at this file and at the observation vocabulary it builds on
(observe/types.py: tasks, generations, endings, cycles, the tracker, the ledger). Times
are seconds since the epoch (float) throughout.

Pure: no I/O.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from nvrx_appliance.goodput.straggler import Straggler
from nvrx_appliance.observe.deaths import Death
from nvrx_appliance.observe.hangs import Hang
from nvrx_appliance.observe.types import (
    COMPLETED,
    Checkpoint,
    Cycle,
    Ending,
    Generation,
    LedgerEntry,
)

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
EXCLUSIONS = "exclusions"  # <work>/exclusions.jsonl: nodes kept out of the queued generations
HANGS = "hangs"  # <work>/nvrx/<array>/hangs/: the newest generation's hang records
DEATHS = "deaths"  # <work>/nvrx/<array>/deaths/: nodes task 0's liveness judge found dead
# The training record: the progress log, or Megatron's lines in the per-cycle logs.
TRAINING = "training"
SOURCES = (
    SLURM, FOLLOW_UP, CYCLES, CHECKPOINT, LEDGER, MARKER, EXCLUSIONS, HANGS, DEATHS, TRAINING,
)  # fmt: skip

OBSERVED = "observed"
UNAVAILABLE = "unavailable"
NOT_CONFIGURED = "not configured"

# --- actions: the only things the watcher may ever do, and only with --act ---------------
RELEASE_SPARES = "release_spares"  # scancel the PENDING tasks of one generation
CANCEL_GENERATION = "cancel_generation"  # scancel every remaining task of one generation
# Add nodes to the chain's exclusion record; the teardown at the running generation's end
# puts them in the queued generations' ExcNodeList. Never a drain: that is the admin's.
EXCLUDE_NODES = "exclude_nodes"
ACTION_KINDS = (RELEASE_SPARES, CANCEL_GENERATION, EXCLUDE_NODES)


@dataclass(frozen=True)
class SourceStatus:
    state: str  # OBSERVED, UNAVAILABLE or NOT_CONFIGURED
    reason: str = ""  # why it is unavailable / not configured, for the person on call


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
    # From run.json: hot + cold spares the chain was submitted with (None: unknown, as
    # for a chain watched by --work-dir or its batch script without run.json).
    spares: int | None = None
    origin: str = ""  # how the paths were found: "run.json", "batch script", "flags"
    chain: str = ""  # run.json's chain id, which the exclusion record's lines name
    exclude_for: int = 0  # run.json: seconds a bad node stays excluded (0: no record)


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
    excluded: frozenset[str] = frozenset()  # nodes the exclusion record keeps out now
    hangs: tuple[Hang, ...] = ()  # the newest generation's hang records (docs/hangs.md)
    # The newest generation's node deaths (docs/liveness.md), as task 0 judged them.
    deaths: tuple[Death, ...] = ()
    # The newest cycle's stragglers, slowest first (goodput/straggler.py).
    stragglers: tuple[Straggler, ...] = ()

    def has(self, *sources: str) -> bool:
        return all(
            self.sources.get(s, SourceStatus(NOT_CONFIGURED)).state == OBSERVED for s in sources
        )

    @property
    def completed(self) -> LedgerEntry | None:
        """The newest ledger entry, when its generation found training done."""
        last = self.ledger[-1] if self.ledger else None
        return last if last is not None and last.action == COMPLETED else None

    @property
    def finished(self) -> bool:
        """Training is done and Slurm holds nothing of the chain: nothing left to watch."""
        return self.completed is not None and self.has(SLURM) and not self.generations

    def generation(self, array_job_id: str) -> Generation | None:
        return next((g for g in self.generations if g.array_job_id == array_job_id), None)

    def ending(self, array_job_id: str) -> Ending | None:
        return next((e for e in self.endings if e.array_job_id == array_job_id), None)

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
    kind: str  # one of ACTION_KINDS
    array_job_id: str
    argv: tuple[str, ...]  # the exact command, printed in observe-only mode
    nodes: tuple[str, ...] = ()  # EXCLUDE_NODES: the nodes; argv then names the record

    @property
    def command(self) -> str:
        if self.kind == EXCLUDE_NODES:
            return f"add {', '.join(self.nodes)} to the exclusion record {' '.join(self.argv)}"
        return " ".join(self.argv)


@dataclass(frozen=True)
class Finding:
    key: str  # deterministic dedup key: same condition, same key, every pass
    detector: str
    severity: str
    summary: str  # one line: what happened, to which job
    detail: str = ""  # what to do next
    action: Action | None = None
    # The nodes it is about, for the per-node gauge an alert names them from (() for none).
    nodes: tuple[str, ...] = ()
