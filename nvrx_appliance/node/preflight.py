"""What every node checks before it creates or publishes anything.

A refusal here leaves nothing behind: no control directory, no lease, no record.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from nvrx_appliance import exitcodes
from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.clock import log_stamp, now_iso
from nvrx_appliance.node import control, detect, launch, node_probe
from nvrx_appliance.node.identity import Node, NodeError, array_throttle, from_env
from nvrx_appliance.workloads import workload_argv as run_argv


class Refused(Exception):
    """We will not start, for the reason given, with our own exit code."""

    def __init__(self, exit_code: int, message: str):
        super().__init__(message)
        self.exit_code = exit_code


def say(message: str) -> None:
    """One line of the entrypoint's into the job's output, stamped as clock.log_stamp says."""
    print(f"{log_stamp()} nvrx-entrypoint: {message}", file=sys.stderr, flush=True)


def load(manifest_path: Path | None) -> run_manifest.Manifest:
    if manifest_path is None:
        raise Refused(
            exitcodes.MANIFEST_INVALID,
            "no run manifest: pass --manifest PATH or set NVRX_RUN_MANIFEST",
        )
    distrust = run_manifest.trust_problem(manifest_path, os.geteuid())
    if distrust:
        raise Refused(exitcodes.MANIFEST_INVALID, f"refusing the run manifest: {distrust}")
    try:
        manifest = run_manifest.load(manifest_path)
    except run_manifest.ManifestError as exc:
        raise Refused(exitcodes.MANIFEST_INVALID, str(exc)) from None
    if not Path(manifest.spec.work_dir).is_absolute():
        raise Refused(
            exitcodes.MANIFEST_INVALID,
            f"run manifest work_dir {manifest.spec.work_dir!r} is not an absolute path; resubmit",
        )
    return manifest


def workload_argv(manifest: run_manifest.Manifest) -> list[str]:
    """This node's interpreter, then the program argv submit recorded in run.json."""
    if not manifest.workload:
        raise Refused(
            exitcodes.MANIFEST_INVALID,
            f"run manifest {manifest.layout.run_json} names no workload to run; resubmit",
        )
    return run_argv(manifest.workload)


def find_ft_launcher() -> list[str]:
    # The one beside our own interpreter first: same environment, same NVRx.
    found = shutil.which("ft_launcher", path=str(Path(sys.executable).parent)) or shutil.which(
        "ft_launcher"
    )
    if found is None:
        raise Refused(
            exitcodes.LAUNCH_FAILED,
            f"ft_launcher is neither beside {sys.executable} nor on PATH; "
            "install nvidia-resiliency-ext 0.7.0 in this environment",
        )
    return [found]


def check_numactl(manifest: run_manifest.Manifest) -> None:
    if manifest.spec.gpus_per_numa and shutil.which("numactl") is None:
        raise Refused(
            exitcodes.LAUNCH_FAILED,
            f"gpus_per_numa is {manifest.spec.gpus_per_numa}, so NVRx wraps every rank in "
            "numactl, which is not installed on this node; install numactl (Debian package) "
            "or resubmit with --gpus-per-numa 0",
        )


def node_fabric() -> detect.Fabric:
    fabric = node_probe.node_fabric()
    if fabric.valid:
        say(f"ClusterUUID {fabric.cluster_uuid}")
    elif fabric.gpus:
        say(f"no ClusterUUID on this node: {fabric.reason}")
    else:  # nvidia-smi missing, failing or hanging
        say(f"warning: no ClusterUUID on this node: {fabric.reason}")
    return fabric


def decide(manifest: run_manifest.Manifest, fabric: detect.Fabric) -> detect.SegmentDecision:
    try:
        return detect.decide(manifest.spec.segment, fabric)
    except detect.SegmentError as exc:
        raise Refused(exitcodes.SEGMENT_MISMATCH, str(exc)) from None


# Set by the sbatch: when Slurm accepted this array (scontrol's SubmitTime), shared by
# every task of it; part of the generation's identity. Empty when scontrol failed.
SUBMITTED_ENV = "NVRX_ARRAY_SUBMITTED"


def generation(manifest: run_manifest.Manifest, node: Node) -> str:
    return control.generation(
        manifest.chain_id, node.array_job_id, os.environ.get(SUBMITTED_ENV, "")
    )


def task0_record(
    manifest: run_manifest.Manifest,
    node: Node,
    fabric: detect.Fabric,
    active_tasks: int | None,
) -> control.Record:
    decision = decide(manifest, fabric)
    return control.Record(
        host=node.hostname,
        port=manifest.spec.rdzv_port,
        segment=decision.segment,
        cluster_uuid=fabric.cluster_uuid,
        started=now_iso(),
        array_job_id=node.array_job_id,
        task_id=0,
        job_id=node.job_id,
        generation=generation(manifest, node),
        active_tasks=active_tasks,
    )


@dataclass(frozen=True)
class Preflight:
    """Everything checked before this node creates or publishes anything."""

    manifest: run_manifest.Manifest
    node: Node
    fabric: detect.Fabric
    workload: list[str]
    launcher: list[str]
    active_tasks: int | None


def preflight(manifest_path: Path | None) -> Preflight:
    manifest = load(manifest_path)
    try:
        node = from_env(os.environ, socket.gethostname())
        active_tasks = array_throttle(os.environ)
    except NodeError as exc:
        raise Refused(exitcodes.USAGE, str(exc)) from None
    try:
        launch.nnodes(manifest, active_tasks)
    except launch.ShapeError as exc:
        raise Refused(exitcodes.LAUNCH_FAILED, str(exc)) from None
    fabric = node_fabric()
    workload = workload_argv(manifest)
    launcher = find_ft_launcher()
    check_numactl(manifest)
    return Preflight(manifest, node, fabric, workload, launcher, active_tasks)
