"""run.json: the run manifest, and the work directory's layout.

The manifest is the contract between submit (which writes it once), the entrypoint
(which reads it on every node of every generation), `status` and the watcher. It is
versioned; a reader refuses a version it does not know rather than guess.

Layout is the one place that names files in the work directory (DESIGN.md).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nvrx_appliance import ENTRYPOINT_PROTOCOL, __version__
from nvrx_appliance.files import write_atomic
from nvrx_appliance.settings import policy as mode_policy
from nvrx_appliance.settings.chain import ChainSpec, Shape, check, derive, from_dict, to_dict
from nvrx_appliance.settings.policy import Policy

SCHEMA = "nvrx-appliance/run"
# 2: the workload's program argv, computed once at submit, is in run.json.
# 3: so is the mode's policy (settings/policy.py): the entrypoint reads it, never the mode.
VERSION = 3
TRACKER_FILE = "latest_checkpointed_iteration.txt"  # Megatron's name; NVRx reads it too
# One spelling for the batch log's name: sbatch expands the %-pattern, `logs` the values.
_BATCH_LOG = "slurm-{job_name}-{array_job_id}_{task}.out"


@dataclass(frozen=True)
class ControlFiles:
    """One generation's control directory (Layout.control) and the files in it; the
    rules a peer applies before it trusts them are in entrypoints/control.py."""

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
    def no_restart(self) -> Path:
        # Written by an entrypoint whose ft_launcher exited 93, before it exits: where
        # the site kills a step on the first bad exit, srun can hand the trap 143
        # instead of 93, and this file is the witness that survives that.
        return self.directory / "no_restart"


class ManifestError(Exception):
    """run.json is missing, unreadable, of an unknown version, or inconsistent."""


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
    def static_tracker(self) -> Path:
        # no-restart mode points NVRx at a tracker that never moves, so a fault is
        # judged "no progress" and ft_launcher exits 93 (the seeds' demo).
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
    def generations_root(self) -> Path:
        return self.work_dir / "nvrx"

    def generation(self, array_job_id: str | int) -> Path:
        return self.generations_root / str(array_job_id)

    def control(self, array_job_id: str | int) -> Path:
        return self.generation(array_job_id) / "control"

    def control_files(self, array_job_id: str | int) -> ControlFiles:
        return ControlFiles(self.control(array_job_id))

    def cycle_infos(self, array_job_id: str | int) -> Path:
        return self.generation(array_job_id) / "cycle_infos"

    def nvrx_logs(self, array_job_id: str | int) -> Path:
        return self.generation(array_job_id) / "logs"


@dataclass(frozen=True)
class Manifest:
    spec: ChainSpec
    shape: Shape
    policy: Policy  # what the mode means, decided at submit
    image: dict[str, Any] | None  # the image's own manifest, when there is an image
    created: str  # ISO-8601 UTC, at submit
    user: str
    tool_version: str = __version__
    protocol: int = ENTRYPOINT_PROTOCOL
    # What ft_launcher runs on every rank after the interpreter (submit computes it with
    # entrypoints.workloads.program_argv; the entrypoint only reads it).
    workload: tuple[str, ...] = ()

    @property
    def layout(self) -> Layout:
        return Layout(Path(self.spec.work_dir))

    @property
    def chain_id(self) -> str:
        """What tells this submission from any other in the same work dir: the ledger
        files entries under it, and every control file of its generations names it."""
        return self.created

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "version": VERSION,
            "protocol": self.protocol,
            "tool_version": self.tool_version,
            "created": self.created,
            "user": self.user,
            "spec": to_dict(self.spec),
            "shape": asdict(self.shape),
            "policy": asdict(self.policy),
            "image": self.image,
            "workload": list(self.workload),
        }


def build(
    spec: ChainSpec, *, created: str, user: str, image: dict[str, Any] | None = None
) -> Manifest:
    layout = Layout(Path(spec.work_dir))
    return Manifest(
        spec=spec,
        shape=derive(spec),
        policy=mode_policy.decide(
            spec, tracker=layout.tracker, static_tracker=layout.static_tracker
        ),
        image=image,
        created=created,
        user=user,
    )


def parse(data: Any) -> Manifest:
    """Validate a decoded run.json. Raises ManifestError with one readable line."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ManifestError("not an nvrx-appliance run manifest (schema field missing or wrong)")
    if data.get("version") != VERSION:
        raise ManifestError(
            f"run manifest version {data.get('version')!r} is not supported (this tool reads "
            f"version {VERSION}); resubmit with nvrx-appliance {__version__}"
        )
    if data.get("protocol") != ENTRYPOINT_PROTOCOL:
        raise ManifestError(
            f"run manifest speaks entrypoint protocol {data.get('protocol')!r}, this entrypoint "
            f"speaks {ENTRYPOINT_PROTOCOL}; use an image built with the same nvrx-appliance version"
        )
    try:
        spec = from_dict(data["spec"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"run manifest spec is malformed: {exc}") from None
    problems = check(spec)
    if problems:
        raise ManifestError(f"run manifest is inconsistent: {problems[0]}")
    shape = derive(spec)
    if data.get("shape") != asdict(shape):
        raise ManifestError(
            "run manifest shape does not match its spec (edited by hand?); resubmit"
        )
    if not spec.work_dir:
        raise ManifestError("run manifest has no work_dir")
    try:
        policy = mode_policy.from_dict(data.get("policy"))
    except ValueError as exc:
        raise ManifestError(f"run manifest {exc}; resubmit") from None
    workload = data.get("workload")
    if not isinstance(workload, list) or not all(isinstance(w, str) for w in workload):
        raise ManifestError("run manifest workload is not a list of arguments; resubmit")
    return Manifest(
        spec=spec,
        shape=shape,
        policy=policy,
        image=data.get("image"),
        created=str(data.get("created", "")),
        user=str(data.get("user", "")),
        tool_version=str(data.get("tool_version", "")),
        protocol=data["protocol"],
        workload=tuple(workload),
    )


def trust_problem(path: Path, uid: int) -> str | None:
    """Why run.json at `path` must not be obeyed, or None: it names the code every node
    runs (megatron_path, python), so only its owner may be able to change it, or replace
    it through its directory. (The teardown carries its own copy: it runs without
    this package.)"""
    try:
        seen = [("", os.lstat(path)), (" its directory", os.stat(path.parent))]
    except OSError:
        return None  # missing or unreadable: load() says so in its own words
    if not stat.S_ISREG(seen[0][1].st_mode):
        return f"{path} is not a regular file"
    for what, st in seen:
        if st.st_uid != uid:
            return f"{path}{what} is owned by uid {st.st_uid}, not by this job's user (uid {uid})"
        if st.st_mode & 0o022:
            return (
                f"{path}{what} is writable by group or others (mode {st.st_mode & 0o777:04o}); "
                "chmod go-w it and resubmit"
            )
    return None


def load(path: Path) -> Manifest:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ManifestError(f"run manifest {path} does not exist") from None
    except OSError as exc:
        raise ManifestError(f"run manifest {path} is unreadable: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError(f"run manifest {path} is not valid JSON: {exc}") from None
    return parse(data)


def save(manifest: Manifest) -> Path:
    path = manifest.layout.run_json
    write_atomic(path, json.dumps(manifest.to_json(), indent=2, sort_keys=True) + "\n", 0o600)
    return path
