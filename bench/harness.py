"""The imperative shell of the benchmarks: the local cluster, Slurm, the CLI, the disk.

One Harness per `python -m bench` run. It is used inside the machine-wide cluster lock
(bench/__main__.py takes it), so no test session builds, kills or tears down the
cluster meanwhile. It remembers every job name it submitted and every node it killed,
and `cleanup` cancels the former and revives the latter, whatever happened.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from bench import timing
from bench.chains import ARRAY_SIZE, START_TIMEOUT_S
from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.chain import job_control
from nvrx_appliance.checkpoints.checkpoint_dir import iteration_dir
from nvrx_appliance.devcluster.poll import Timeout, wait_until
from nvrx_appliance.layout import Layout
from nvrx_appliance.node.launch import nvrx_logfile
from nvrx_appliance.observe import slurm_output, slurmcli, workdir

# How long a sample waits for NVRx's log to catch up (see Harness.nvrx_events_with).
NVRX_LOG_LAG_S = 30.0

T = TypeVar("T")
CLI = str(Path(sys.executable).parent / "nvrx-appliance")
UP_TIMEOUT_S = 600  # a first `cluster up` on a fresh machine installs Debian packages
REVIVE_TIMEOUT_S = 180
POLL_S = 0.1  # the harness's own observations (an empty queue) are this fine


class BenchError(Exception):
    """A benchmark could not take its measurement; the message says what and where."""


class Harness:
    def __init__(self, say: Callable[[str], None], run_id: str | None = None):
        self.say = say
        self.run_id = run_id or uuid.uuid4().hex[:6]
        self.names: list[str] = []
        self.killed: set[str] = set()
        self.status: dict[str, Any] = {}
        self.shape: tuple[str, ...] = ()  # `cluster up` options of the current shape

    # --- the cluster ------------------------------------------------------------------

    def up(self, *cluster_args: str) -> None:
        """`cluster up` (idempotent; our child, so it proceeds under our lock), in the
        default shape or the one `cluster_args` ask for."""
        done = self.appliance("cluster", "up", *cluster_args, timeout=UP_TIMEOUT_S)
        if done.returncode != 0:
            raise BenchError(
                f"nvrx-appliance cluster up {' '.join(cluster_args)} failed:\n{done.stderr[-2000:]}"
            )
        self.status = json.loads(self.appliance("cluster", "status", "--json").stdout)
        if not self.status.get("up"):
            raise BenchError(f"the cluster is not up: {self.status.get('reason')}")
        self._offsets = {path: path.stat().st_size for path in self.daemon_logs()}
        self.shape = cluster_args

    def reshape(self, *cluster_args: str) -> None:
        """Rebuild the cluster in another shape (`cluster up` options; none: the default
        shape) once the queue is empty, and read it afresh. A rebuild keeps every run's
        work dir; the scenarios that need a shape of their own restore the default."""
        for node in sorted(self.killed):
            self.revive_node(node)
        self.wait(
            lambda: not self.slurm("squeue", "-h", "-o", "%i").split(), 300,
            "the queue to empty before the rebuild", interval=1.0,
        )  # fmt: skip
        self.up(*cluster_args)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, **self.status["env"]}

    @property
    def work_root(self) -> Path:
        return Path(self.status["work_root"])

    @property
    def nodes(self) -> list[str]:
        return [n["name"] for n in self.status["nodes"]]

    @property
    def ctld_log(self) -> Path:
        return Path(self.status["root"]) / "log" / "slurmctld.log"

    def slurmd_logs(self) -> list[Path]:
        return [Path(self.status["root"]) / "log" / f"slurmd-{n}.log" for n in self.nodes]

    def daemon_logs(self) -> list[Path]:
        return [self.ctld_log, *self.slurmd_logs()]

    def _since_up(self, path: Path) -> str:
        """What a daemon wrote to its log since this run brought the cluster up."""
        with path.open("rb") as fh:
            offset = self._offsets.get(path, 0)
            # A log that shrank was started afresh (a node revived into a new file).
            fh.seek(offset if os.fstat(fh.fileno()).st_size >= offset else 0)
            return fh.read().decode(errors="replace")

    def appliance(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        env = {**os.environ, **self.status["env"]} if self.status else None
        return subprocess.run(
            [CLI, *args], env=env, capture_output=True, text=True, timeout=timeout
        )

    def kill_node(self, node: str, silent: bool = False) -> float:
        """Crash a node (`silent`: its link goes first, so its peers hear nothing);
        returns the moment just before its processes were killed."""
        self.killed.add(node)
        at = time.time()
        done = self.appliance("cluster", "kill-node", node, *(["--silent"] if silent else []))
        if done.returncode != 0:
            raise BenchError(f"kill-node {node} failed: {done.stderr.strip()}")
        return at

    def revive_node(self, node: str) -> None:
        done = self.appliance("cluster", "revive-node", node, timeout=REVIVE_TIMEOUT_S)
        if done.returncode != 0:
            raise BenchError(f"revive-node {node} failed: {done.stderr.strip()}")
        self.killed.discard(node)

    # --- Slurm --------------------------------------------------------------------------

    def slurm(self, *argv: str, timeout: float = 30) -> str:
        return slurmcli.run(list(argv), env=self.env, timeout=timeout)

    def sbatch(self, args: Sequence[str], script: Path) -> str:
        return job_control.sbatch(args, str(script), env=self.env)

    def squeue_ids(self, name: str) -> list[str]:
        return self.slurm("squeue", "-h", "-r", "--name", name, "-o", "%i").split()

    def sacct(self, job_ids: Sequence[str]) -> list[slurm_output.AcctRow]:
        return slurmcli.Slurm(env=self.env).sacct(jobs=job_ids)

    def ctld_events(self) -> list[timing.CtldEvent]:
        return timing.ctld_events(self._since_up(self.ctld_log))

    def step_ends(self) -> list[timing.StepEnd]:
        return [e for path in self.slurmd_logs() for e in timing.step_ends(self._since_up(path))]

    def tasks(self, job_ids: Sequence[str]) -> list[timing.Task]:
        return timing.tasks(self.sacct(job_ids), self.ctld_events())

    def wait_final(
        self, job_ids: Sequence[str], timeout: float, array_size: int = ARRAY_SIZE
    ) -> list[timing.Task]:
        """Until accounting holds every task of these jobs, each ended (or cancelled
        before it ran); slurmdbd lags slurmctld, so a partial answer comes first."""
        expected = {(j, t) for j in job_ids for t in range(array_size)}

        def final() -> list[timing.Task] | None:
            found = self.tasks(job_ids)
            ended = {(t.array_job_id, t.task_id) for t in found if t.end is not None}
            return found if ended >= expected else None

        return self.wait(final, timeout, f"jobs {', '.join(job_ids)} to end")

    def wait_started(self, array_job_id: str, timeout: float = 60) -> list[timing.Task]:
        """Until accounting has recorded task 0 of a generation as started."""

        def started() -> list[timing.Task] | None:
            found = self.tasks([array_job_id])
            zero = timing.task0(found)
            return found if zero is not None and zero.start is not None else None

        return self.wait(started, timeout, f"accounting to record {array_job_id}_0's start")

    # --- chains ---------------------------------------------------------------------------

    def job_name(self, scenario: str) -> str:
        name = f"bench-{scenario}-{self.run_id}-{len(self.names)}"
        self.names.append(name)
        return name

    def workdir(self, scenario: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"bench-{scenario}-", dir=self.work_root))

    def submit(self, work: Path, name: str, *flags: str) -> list[str]:
        done = self.appliance(
            "submit", "--work-dir", str(work), "--job-name", name, *flags, "--json"
        )
        if done.returncode != 0:
            raise BenchError(f"submit of {name} refused: {done.stderr.strip()}")
        return json.loads(done.stdout)["job_ids"]

    def cancel(self, name: str) -> None:
        """scancel every job of a name, queued or running (our own names only)."""
        try:
            self.slurm("scancel", "--name", name, "--user", slurmcli.current_user())
        except slurmcli.SlurmUnavailable as exc:
            self.say(f"warning: scancel of {name} failed: {exc}")

    def drain(self, name: str, timeout: float = 120) -> None:
        self.cancel(name)
        self.wait(lambda: not self.squeue_ids(name), timeout, f"chain {name} to leave the queue")

    def cleanup(self) -> None:
        for name in self.names:
            self.cancel(name)
        for node in sorted(self.killed):
            try:
                self.revive_node(node)
            except (BenchError, subprocess.TimeoutExpired) as exc:
                self.say(f"ERROR: could not revive {node}: {exc}; run `nvrx-appliance "
                         f"cluster revive-node {node}`")  # fmt: skip
        if self.shape:
            try:  # every later user of the cluster (tests, the next run) expects the default
                self.reshape()
            except (BenchError, Timeout, subprocess.TimeoutExpired) as exc:
                self.say(f"ERROR: could not restore the default cluster: {exc}; run "
                         "`nvrx-appliance cluster up`")  # fmt: skip

    # --- the disk ---------------------------------------------------------------------------

    @staticmethod
    def progress(work: Path) -> list[dict]:
        return timing.progress_events(workdir.read(Layout(work).progress_log))

    def wait_event(
        self, work: Path, what: str, timeout: float, event: str, after: float = float("-inf"),
        **match: Any,
    ) -> dict:  # fmt: skip
        return self.wait(
            lambda: timing.first_event(self.progress(work), event, after, **match), timeout, what
        )

    def wait_checkpointed(self, work: Path, what: str, **match: Any) -> dict:
        """Until the workload trains (its "start" event, matching) and has written a
        checkpoint since, so that a failure now has progress to lose and to restore."""
        started = self.wait_event(work, f"{what} to train", START_TIMEOUT_S, "start", **match)
        self.wait_event(
            work, f"a checkpoint of {what}", 60, "checkpoint", after=started["time"], **match
        )
        return started

    def wait_resumed(self, work: Path, what: str, timeout: float, **match: Any):
        """Until the workload is back: its "start" event (after the restore) and the
        first step after it."""
        resumed = self.wait_event(work, f"{what} to resume", timeout, "start", **match)
        step = self.wait_event(
            work, f"the first step of {what}", 60, "step", after=resumed["time"], **match
        )
        return resumed, step

    def restored(self, work: Path, resumed: dict) -> list[timing.FileTimes]:
        """The files of the checkpoint a resumed workload read."""
        return self.file_times(Layout(work).checkpoints / iteration_dir(resumed["iteration"]))

    @staticmethod
    def mtime(path: Path) -> float | None:
        try:
            return path.stat().st_mtime
        except FileNotFoundError:
            return None

    @staticmethod
    def file_times(directory: Path) -> list[timing.FileTimes]:
        """Access and modification times of every file under a directory."""
        out = []
        for path in directory.rglob("*"):
            if path.is_file():
                st = path.stat()
                out.append(timing.FileTimes(atime=st.st_atime, mtime=st.st_mtime))
        return out

    @staticmethod
    def nvrx_events(work: Path, array_job_id: str) -> list[timing.NvrxEvent]:
        """NVRx's profiling events from a generation's ft_launcher log."""
        path = nvrx_logfile(run_manifest.load(Layout(work).run_json), array_job_id)
        return timing.nvrx_events(path.read_text(errors="replace")) if path.exists() else []

    def nvrx_events_with(
        self, work: Path, array_job_id: str, needed: Sequence[tuple[str, int, str]]
    ) -> list[timing.NvrxEvent]:
        """The generation's NVRx events once every (event, cycle, host) in `needed` is
        there, or as they are after NVRX_LOG_LAG_S (the sample then names what is
        missing). Each launcher's lines reach the shared log through NVRx's log server,
        which its client dials once a second until it answers: a launcher that started
        a few seconds ago may have trained already while its lines are still queued."""

        def complete() -> list[timing.NvrxEvent] | None:
            events = self.nvrx_events(work, array_job_id)
            have = {(e.event, e.cycle, e.host) for e in events}
            return events if all(n in have for n in needed) else None

        try:
            return self.wait(complete, NVRX_LOG_LAG_S, "NVRx's log", interval=0.2)
        except Timeout:
            return self.nvrx_events(work, array_job_id)

    @staticmethod
    def cycle(work: Path, array_job_id: str, number: int) -> timing.Cycle | None:
        path = Layout(work).cycle_infos(array_job_id) / f"cycle_info.{array_job_id}.0.{number}"
        try:
            return timing.cycle(path.read_text())
        except (FileNotFoundError, ValueError, KeyError):
            return None

    # --- processes ---------------------------------------------------------------------------

    @staticmethod
    def _find_process(marker: bytes, environ: set[bytes]) -> int | None:
        """A process whose command line holds `marker` and whose environment holds
        every entry of `environ` (the nodes share this PID namespace)."""
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                found = set((entry / "environ").read_bytes().split(b"\0"))
            except OSError:
                continue
            if marker in cmdline and environ <= found:
                return int(entry.name)
        return None

    @staticmethod
    def entrypoints(array_job_id: str) -> dict[int, tuple[int, int]]:
        """Every nvrx-entrypoint of a generation (not srun's own process, which names it
        too): {pid: (array task, node within the task)}."""
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                env = dict(
                    item.split(b"=", 1)
                    for item in (entry / "environ").read_bytes().split(b"\0")
                    if b"=" in item
                )
            except OSError:
                continue
            script = argv[1] if len(argv) > 1 else b""
            if not (Path(argv[0].decode()).name.startswith("python")
                    and script.endswith(b"/nvrx-entrypoint")):  # fmt: skip
                continue
            if env.get(b"SLURM_ARRAY_JOB_ID") != array_job_id.encode():
                continue
            task = int(env.get(b"SLURM_ARRAY_TASK_ID", b"0"))
            found[int(entry.name)] = (task, int(env.get(b"SLURM_NODEID", b"0")))
        return found

    @classmethod
    def worker_pid(cls, run_json: Path, rank: int) -> int | None:
        """The training process of one global rank of this chain."""
        want = {f"NVRX_RUN_MANIFEST={run_json}".encode(), f"RANK={rank}".encode()}
        return cls._find_process(b"workloads.cpu", want)

    @classmethod
    def batch_shell_pid(cls, array_job_id: str, task: int) -> int | None:
        """The batch script's shell of one array task."""
        want = {f"SLURM_ARRAY_JOB_ID={array_job_id}".encode(),
                f"SLURM_ARRAY_TASK_ID={task}".encode()}  # fmt: skip
        return cls._find_process(b"slurm_script", want)

    @staticmethod
    def kill_process(pid: int) -> float:
        at = time.time()
        os.kill(pid, signal.SIGKILL)
        return at

    # --- waiting ---------------------------------------------------------------------------

    @staticmethod
    def wait(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.5) -> T:
        return wait_until(predicate, timeout, what, interval)
