"""The work directory's layout: the one place that names its files (SEAMS.md lists who
writes and who reads each), and one generation's control directory.

Shared vocabulary: it imports nothing of the package, so every layer (the settings
that build the workload's argv included) can name a file through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TRACKER_FILE = "latest_checkpointed_iteration.txt"  # Megatron's name; NVRx reads it too
# Beside the tracker, in its format: the final iteration, once training is done.
TRAINING_DONE_FILE = "training_done.txt"
# One spelling for the batch log's name: sbatch expands the %-pattern, `logs` the values.
_BATCH_LOG = "slurm-{job_name}-{array_job_id}_{task}.out"


@dataclass(frozen=True)
class ControlFiles:
    """One generation's control directory (Layout.control) and the files in it; the
    rules a peer applies before it trusts them are in node/control.py."""

    directory: Path

    @property
    def record(self) -> Path:
        # Task 0's rendezvous record, published by rename.
        return self.directory / "rdzv.json"

    @property
    def lease(self) -> Path:
        # Task 0's liveness lease; its mtime is refreshed while task 0 lives.
        return self.directory / "task0.lease"

    @property
    def closed(self) -> Path:
        # The closed flag: task 0's teardown trap, or a peer that fenced task 0.
        return self.directory / "closed"

    @property
    def fence(self) -> Path:
        # The fence claim: created exclusively by the one peer that ends the generation
        # on behalf of a task 0 whose lease went stale; whoever fails to create it
        # leaves quietly.
        return self.directory / "fence"

    @property
    def time_limit(self) -> Path:
        # The time-limit notice: a batch shell that Slurm's --signal reached, or task 0's
        # entrypoint at the exit duration, says the generation must save and end. Every
        # entrypoint then sends its workload the save signal (settings/generation_end.py).
        return self.directory / "time_limit"

    @property
    def relay(self) -> Path:
        # The relay claim: created exclusively by the first peer that leaves because the
        # generation ended; its batch script cancels the array's other tasks.
        return self.directory / "relay"

    @property
    def no_restart(self) -> Path:
        # Written by an entrypoint whose ft_launcher exited 93, before it exits: where
        # the site kills a step on the first bad exit, srun can hand the trap 143
        # instead of 93, and this file is the witness that survives that.
        return self.directory / "no_restart"

    @property
    def verdict(self) -> Path:
        # The workload's verdict (rank/guard.py): a worker's exit code that its
        # table maps to "resume elsewhere" or "stop the chain", or a checkpoint that
        # could not be loaded with nothing left to fall back to. Created exclusively by
        # the first worker's guard; every entrypoint then stops its ft_launcher, and
        # task 0's teardown acts on it.
        return self.directory / "verdict"


# Stands for the array job id in a generation's path that run.json carries (Layout.
# host_paths): the host code fills it in.
ARRAY_JOB_ID_FIELD = "{array_job_id}"


@dataclass(frozen=True)
class Layout:
    work_dir: Path

    @property
    def run_json(self) -> Path:
        return self.work_dir / "run.json"

    @property
    def teardown(self) -> Path:
        # Task 0's teardown, run by the batch script's EXIT trap on the host (stdlib-only
        # Python: the host need not have this package). Submit copies it here.
        return self.work_dir / "teardown.py"

    @property
    def drain_poller(self) -> Path:
        # Task 0's drain poller, started in the background by its batch script on the
        # host, where Slurm's commands are (stdlib-only Python, like the teardown).
        return self.work_dir / "drain_poller.py"

    @property
    def node_memory(self) -> Path:
        # What the teardown loads to judge a generation's bad nodes and keep them out of
        # the queued generations (stdlib-only Python, beside the teardown).
        return self.work_dir / "node_memory.py"

    @property
    def hostlib(self) -> Path:
        # The one helper module the three above import (bounded reads, Slurm calls,
        # appends, the trust check, the log line), beside them.
        return self.work_dir / "hostlib.py"

    @property
    def host_code(self) -> tuple[Path, ...]:
        # What runs on the job's host (nvrx_appliance/jobhost/), copied beside run.json:
        # the three above, their helper module, and the pure halves of the teardown
        # (ending.py) and the node memory (bad_nodes.py).
        pure = (self.work_dir / "ending.py", self.work_dir / "bad_nodes.py")
        return (self.teardown, self.drain_poller, self.node_memory, self.hostlib, *pure)

    @property
    def exclusions(self) -> Path:
        # The exclusion record: JSON lines, appended; which nodes are kept out of the
        # chain's queued generations, why, until when, and what was applied to which job.
        return self.work_dir / "exclusions.jsonl"

    def sbatch(self, job_name: str) -> Path:
        return self.work_dir / f"{job_name}.sbatch"

    @property
    def ledger(self) -> Path:
        return self.work_dir / "chain.jsonl"

    @property
    def chain_marker(self) -> Path:
        # Present while the chain is expected to live; the watcher's chain_exhausted
        # detector fires when nothing is queued or running but this still exists.
        return self.work_dir / "chain.active"

    @property
    def submitted(self) -> Path:
        # The job ids submit queued. sacct lists a generation cancelled before it ever
        # started only when asked by id, never by name and time window.
        return self.work_dir / "submitted.json"

    @property
    def checkpoints(self) -> Path:
        return self.work_dir / "checkpoints"

    @property
    def tracker(self) -> Path:
        return self.checkpoints / TRACKER_FILE

    @property
    def training_done(self) -> Path:
        # The training-done marker: the workload (or, for Megatron, task 0's entrypoint)
        # writes the final iteration here by rename; task 0's teardown then ends the chain.
        return self.checkpoints / TRAINING_DONE_FILE

    @property
    def static_tracker(self) -> Path:
        # no-restart mode points NVRx at a tracker that never moves, so a fault is
        # judged "no progress" and ft_launcher exits 93 (the reference deployment's demo).
        return self.work_dir / "static_iteration.txt"

    @property
    def logs(self) -> Path:
        return self.work_dir / "logs"

    @property
    def progress_log(self) -> Path:
        # The cpu workload's structured events (resume, steps, checkpoints).
        return self.logs / "progress.jsonl"

    @property
    def batch_log_pattern(self) -> Path:
        """sbatch --output: one file per array task, the batch script's and srun's output."""
        return self.logs / _BATCH_LOG.format(job_name="%x", array_job_id="%A", task="%a")

    def batch_log(self, job_name: str, array_job_id: str | int, task: int) -> Path:
        return self.logs / _BATCH_LOG.format(
            job_name=job_name, array_job_id=array_job_id, task=task
        )

    def app_log_base(self, job_name: str, array_job_id: str | int) -> Path:
        """ft_launcher's --ft-per-cycle-applog-prefix: one per generation, named so a
        person can find it; NVRx writes each cycle's workload output beside it."""
        return self.logs / f"{job_name}_{array_job_id}.log"

    def app_log(self, job_name: str, array_job_id: str | int, cycle: int) -> Path:
        # NVRx 0.7.0 (PipeBasedLogsSpecs.get_cycle_log_file): <stem>_cycle<N><suffix>.
        base = self.app_log_base(job_name, array_job_id)
        return base.with_name(f"{base.stem}_cycle{cycle}{base.suffix}")

    def launcher_log(self, array_job_id: str | int) -> Path:
        """ft_launcher's own log (--ft-nvrx-logfile), per generation."""
        return self.nvrx_logs(array_job_id) / "ft_launcher.log"

    @property
    def qualification(self) -> Path:
        # What `qualify` found, when this chain was a qualification run.
        return self.work_dir / "qualification.json"

    @property
    def goodput_picture(self) -> Path:
        # The demo's goodput picture (`report` writes its own where it is run).
        return self.work_dir / "goodput.svg"

    @property
    def generations_root(self) -> Path:
        return self.work_dir / "nvrx"

    def generation(self, array_job_id: str | int) -> Path:
        return self.generations_root / str(array_job_id)

    def control(self, array_job_id: str | int) -> Path:
        return self.generation(array_job_id) / "control"

    def control_files(self, array_job_id: str | int) -> ControlFiles:
        return ControlFiles(self.control(array_job_id))

    def drain(self, array_job_id: str | int) -> Path:
        """The drain poller's markers, one per running array task (owner-only)."""
        return self.generation(array_job_id) / "drain"

    def drain_marker(self, array_job_id: str | int, task: str | int) -> Path:
        # key=value lines naming the task's allocation and its drained nodes, if any.
        return self.drain(array_job_id) / f"task_{task}"

    def drain_poll(self, array_job_id: str | int) -> Path:
        # The poller's last pass: when, and whether Slurm answered.
        return self.drain(array_job_id) / "last_poll"

    def host_paths(self) -> dict[str, str]:
        """What the host code (jobhost/) reads and writes, for run.json's `paths`, so that
        its command line carries only what changes per generation. A generation's paths
        hold ARRAY_JOB_ID_FIELD."""
        control = self.control_files(ARRAY_JOB_ID_FIELD)
        return {
            "ledger": str(self.ledger),
            "tracker": str(self.tracker),
            "training_done": str(self.training_done),
            "chain_marker": str(self.chain_marker),
            "exclusions": str(self.exclusions),
            "submitted": str(self.submitted),
            "no_restart": str(control.no_restart),
            "time_limit": str(control.time_limit),
            "fence": str(control.fence),
            "relay": str(control.relay),
            "launcher_log": str(self.launcher_log(ARRAY_JOB_ID_FIELD)),
            "drain_poll": str(self.drain_poll(ARRAY_JOB_ID_FIELD)),
            "verdict": str(control.verdict),
            "workload_exits": str(self.exit_records(ARRAY_JOB_ID_FIELD)),
            "hangs": str(self.hangs(ARRAY_JOB_ID_FIELD)),
            "deaths": str(self.deaths(ARRAY_JOB_ID_FIELD)),
            "stragglers": str(self.stragglers(ARRAY_JOB_ID_FIELD)),
        }

    def cycle_infos(self, array_job_id: str | int) -> Path:
        return self.generation(array_job_id) / "cycle_infos"

    def nvrx_logs(self, array_job_id: str | int) -> Path:
        return self.generation(array_job_id) / "logs"

    def stragglers(self, array_job_id: str | int) -> Path:
        """Task 0's word on the generation's slow nodes (node/straggler_leave.py)."""
        return self.generation(array_job_id) / "stragglers"

    def straggler_leave(self, array_job_id: str | int, node: str) -> Path:
        """Task 0's decision that a straggler leaves at the next checkpoint
        (`--straggler-action replace`): key=value lines, owner-only; the node's own
        entrypoint acts on it and its health check answer says so."""
        return self.stragglers(array_job_id) / f"leave.{node}"

    def straggler_named(self, array_job_id: str | int, node: str) -> Path:
        """A straggler task 0 named in the generation and what it did about it, for the
        ledger (the teardown reads it): JSON, owner-only, rewritten as it changes."""
        return self.stragglers(array_job_id) / f"named.{node}"

    def exit_records(self, array_job_id: str | int) -> Path:
        """The first failed worker of each cycle, one JSON file per cycle (its guard's
        account: exit code, iteration, what it means), owner-only."""
        return self.generation(array_job_id) / "exits"

    def stacks(self, array_job_id: str | int) -> Path:
        """Each rank's last stack, per cycle (`cycle<N>/<node>.rank<R>.json`), kept by its
        guard's sampler (rank/sampler.py), owner-only."""
        return self.generation(array_job_id) / "stacks"

    def hangs(self, array_job_id: str | int) -> Path:
        """The hang records (`cycle<N>.json`: the judgement and the stacks grouped) and the
        markers of the nodes a verdict named (`hung.<node>`, `withdrawn.<node>`)."""
        return self.generation(array_job_id) / "hangs"

    def deaths(self, array_job_id: str | int) -> Path:
        """The nodes task 0's liveness judge found dead (`dead.<node>`: JSON, the words)
        and its marks that it ended its own ranks for one (`stopped.<node>.cycle<N>`),
        owner-only (node/dead_node.py)."""
        return self.generation(array_job_id) / "deaths"

    @property
    def fallbacks(self) -> Path:
        # JSON lines: each checkpoint set aside because it could not be loaded, and the
        # one the tracker was pointed back to (checkpoints/fallback.py).
        return self.checkpoints / "fallbacks.jsonl"
