"""The ft_launcher command line, from the run manifest and task 0's record.

Every flag here was checked against NVRx 0.7.0's `ft_launcher --help`. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nvrx_appliance.manifest import Manifest
from nvrx_appliance.node.control import Record

# With --ft-nvrx-logfile, the store host runs a gRPC log server that, told to stop, waits
# up to this long for connected clients (the other nodes' ft_launchers) to send their
# last lines and disconnect (NVRx default 60 s), then up to 5 s more, hard-coded, for a
# stream still open. It ends early once every client is gone, and the store host has
# already waited 3 s before it is told to stop, so a peer that ended with its workers
# has had those seconds to flush: a client still connected after them is a peer still in
# the rendezvous, waiting on task 0's store, with nothing to say. Task 0's exit is the
# hand-off, and every node idles meanwhile; task 0 closes the generation as soon as its
# launcher decides to leave (launcher_end.py), so the peers are normally gone before the
# wait begins. This bounds it when one is not.
LOG_SERVER_DRAIN_S = 2


def applog_prefix(manifest: Manifest, array_job_id: str) -> Path:
    return manifest.layout.app_log_base(manifest.spec.job_name, array_job_id)


def nvrx_logfile(manifest: Manifest, array_job_id: str) -> Path:
    return manifest.layout.launcher_log(array_job_id)


class ShapeError(ValueError):
    """The array throttle on the controller cannot hold the world the chain trains."""


def nnodes(manifest: Manifest, active_tasks: int | None = None) -> str:
    """--nnodes MIN:MAX. MAX must equal the tasks Slurm runs at once (the array
    throttle): a larger one makes the rendezvous wait for tasks that cannot start.
    The sbatch reads the throttle from the controller, since an operator may change it
    after submit; without it, the manifest's active tasks."""
    spec, shape = manifest.spec, manifest.shape
    if active_tasks is None:
        return f"{shape.min_nodes}:{shape.max_nodes}"
    if active_tasks < spec.train_tasks:
        raise ShapeError(
            f"the array throttle admits {active_tasks} tasks at once but the chain trains on "
            f"{spec.train_tasks}; no generation can form. Raise it with scontrol update "
            f"JobId=<array job id> ArrayTaskThrottle={shape.active_tasks}"
        )
    return f"{shape.min_nodes}:{active_tasks * spec.nodes_per_task}"


def ft_launcher_argv(
    manifest: Manifest,
    record: Record,
    *,
    hosts_rendezvous: bool,
    launcher: Sequence[str],
    active_tasks: int | None = None,
    health_endpoint: str | None = None,
) -> list[str]:
    """ft_launcher and its own flags; the workload's argv goes after them.
    health_endpoint: the node health check service to name instead of the spec's (the
    entrypoint's drain check, which asks the spec's in turn)."""
    spec, shape, layout = manifest.spec, manifest.shape, manifest.layout
    array_job_id = record.array_job_id
    rdzv_conf = ",".join(
        [
            f"join_timeout={spec.join_timeout}",
            f"store_connect_wait_seconds={spec.store_connect_wait}",
            # Said outright, not left to NVRx's host-name match: a cold spare that Slurm
            # places on task 0's old node would otherwise host the store itself and
            # train on as a generation without task 0.
            f"is_host={'true' if hosts_rendezvous else 'false'}",
        ]
    )
    argv = [
        *launcher,
        "--nnodes", nnodes(manifest, active_tasks),
        "--nproc-per-node", str(shape.nproc_per_node),
        "--rdzv-backend", "c10d",
        "--rdzv-id", array_job_id,
        "--rdzv-endpoint", record.endpoint,
        "--rdzv-conf", rdzv_conf,
        "--max-restarts", str(spec.max_restarts),
        "--ft-cycle-info-dir", str(layout.cycle_infos(array_job_id)),
        "--ft-per-cycle-applog-prefix", str(applog_prefix(manifest, array_job_id)),
        "--ft-nvrx-logfile", str(nvrx_logfile(manifest, array_job_id)),
        "--ft-log-server-graceful-shutdown-timeout", str(LOG_SERVER_DRAIN_S),
        "--ft-checkpoint-iteration-file", manifest.policy.progress_file,
        "--ft-max-no-progress-cycles", str(manifest.policy.max_no_progress_cycles),
        "--ft-rank-section-timeouts",
        f"setup:{spec.setup_timeout},step:{spec.step_timeout},"
        f"checkpointing:{spec.checkpointing_timeout}",
        "--ft-rank-out-of-section-timeout", str(spec.out_of_section_timeout),
    ]  # fmt: skip
    if record.segment is not None:
        argv += ["--ft-segment", str(record.segment)]
    endpoint = spec.health_check_endpoint if health_endpoint is None else health_endpoint
    if endpoint:
        argv += ["--ft-node-health-check-endpoint", endpoint]
    # The workload's argv starts with its own interpreter (SEAMS.md), so ft_launcher must
    # not prepend another.
    argv.append("--no-python")
    return argv


def command(
    manifest: Manifest,
    record: Record,
    workload: Sequence[str],
    *,
    hosts_rendezvous: bool,
    launcher: Sequence[str],
    active_tasks: int | None = None,
    health_endpoint: str | None = None,
) -> list[str]:
    head = ft_launcher_argv(
        manifest,
        record,
        hosts_rendezvous=hosts_rendezvous,
        launcher=launcher,
        active_tasks=active_tasks,
        health_endpoint=health_endpoint,
    )
    return [*head, *workload]
