"""Who this node is in the generation, from the Slurm environment srun hands us.

Pure: reads a mapping, not os.environ.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


class NodeError(ValueError):
    """The environment does not say which job and task this is."""


@dataclass(frozen=True)
class Node:
    array_job_id: str  # the generation: SLURM_ARRAY_JOB_ID (SLURM_JOB_ID outside an array)
    task_id: int  # SLURM_ARRAY_TASK_ID; 0 is task 0
    node_id: int  # SLURM_NODEID: this node's index within its array task
    job_id: str  # SLURM_JOB_ID of this array task
    hostname: str

    @property
    def hosts_rendezvous(self) -> bool:
        # Task 0 is the generation's rendezvous host; within a multi-node task 0 only its
        # first node hosts, the others join like any peer.
        return self.task_id == 0 and self.node_id == 0

    @property
    def label(self) -> str:
        return f"task {self.task_id} node {self.node_id} ({self.hostname})"


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, "")
    if not value:
        return default
    if not value.isdigit():
        raise NodeError(f"{name}={value!r} is not a number; is this running under srun?")
    return int(value)


def from_env(env: Mapping[str, str], hostname: str) -> Node:
    job_id = env.get("SLURM_JOB_ID", "")
    array_job_id = env.get("SLURM_ARRAY_JOB_ID", "") or job_id
    if not array_job_id:
        raise NodeError(
            "SLURM_ARRAY_JOB_ID and SLURM_JOB_ID are unset: nvrx-entrypoint runs under srun "
            "inside a generation (use --dry-run to inspect it elsewhere)"
        )
    return Node(
        array_job_id=array_job_id,
        task_id=_int(env, "SLURM_ARRAY_TASK_ID", 0),
        node_id=_int(env, "SLURM_NODEID", 0),
        job_id=job_id or array_job_id,
        hostname=hostname,
    )


def array_throttle(env: Mapping[str, str]) -> int | None:
    """NVRX_ARRAY_THROTTLE, which the sbatch reads from the controller; None if unset."""
    value = env.get("NVRX_ARRAY_THROTTLE", "")
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise NodeError(f"NVRX_ARRAY_THROTTLE={value!r} is not a task count >= 1")
    return int(value)


def term_drain(env: Mapping[str, str]) -> float:
    """NVRX_TERM_DRAIN: how long task 0's batch shell lets the workload finish after
    Slurm's TERM (two thirds of KillWait); 0 when unset or unreadable, as before."""
    value = env.get("NVRX_TERM_DRAIN", "")
    return float(value) if value.isdecimal() else 0.0
