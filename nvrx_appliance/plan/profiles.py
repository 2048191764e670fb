"""Cost profiles: which recovery steps measured on this machine hold on a real GPU
cluster, and a named profile for one. Pure.

The local profile is the committed benchmarks' (costs.MEASURED): a CPU stand-in for a
GPU (the built-in trainer), on a local Slurm cluster. Some of its figures are NVRx's
constants or timeouts, the appliance's own included, and hold anywhere; the rest are
what the stand-in does and do not. The cluster profile, the default, puts a published
figure in their place where one exists, and says plainly where none does: an
assumption, to be replaced with your own (`--cost NAME=SECONDS`).
"""

from __future__ import annotations

from dataclasses import dataclass

LOCAL = "local"
CLUSTER = "cluster"
NAMES = (LOCAL, CLUSTER)
DEFAULT = CLUSTER  # a plan is for the hardware a run will have; the stand-in on request
# How a headline names the profile it used.
SAID = {
    LOCAL: "the local cluster's CPU stand-in (--profile local)",
    CLUSTER: "a real GPU cluster's costs (--profile cluster)",
}

# Whether each step as measured here holds on real hardware, and why.
HOLDS = {
    "detect_crash": (True, "NVRx's monitor loop, the same code anywhere"),
    "detect_node_death": (True, "the appliance's own timeout, not Slurm's"),
    "detect_hang": (True, "the appliance's own timeout"),
    "nvrx_waits": (True, "NVRx's constants"),
    "worker_start": (False, "a CPU trainer's, no CUDA or NCCL"),
    "dying_path": (True, "NVRx's 3 s store-host wait and the teardown"),
    "scheduler": (True, "Slurm's floor on an idle controller"),
    "start_gate": (False, "a CPU trainer's process, no container"),
    "time_limit_end": (False, "the CPU trainer's shutdown"),
    "store_wait": (True, "NVRx's store_connect_wait, a timeout"),
}


@dataclass(frozen=True)
class Figure:
    seconds: float
    source: str
    published: bool  # False: no published figure was found; an assumption, said as one
    said: str = ""  # the same, in a few words


# The cluster profile: the steps that do not hold here, on a real GPU cluster.
CLUSTER_FIGURES = {
    "worker_start": Figure(
        300.0,
        "assumed, no published figure found: a Megatron rank's CUDA context, NCCL "
        "communicators and model build, minutes at scale; measure yours (--cost)",
        published=False,
        said="a Megatron rank's CUDA, NCCL and model start",
    ),
    "start_gate": Figure(
        300.0,
        "assumed, no published figure found: a cold node's container start (pyxis/enroot "
        "image import) and rendezvous; measure yours (--cost)",
        published=False,
        said="a cold node's container start and rendezvous",
    ),
}


def figures(profile: str) -> dict[str, Figure]:
    """The steps a profile replaces in the local measurements."""
    return CLUSTER_FIGURES if profile == CLUSTER else {}
