"""What the chain's mode means, decided once at submit and written to run.json.

The mode (train, no-restart, handoff) switches several things at once: the iteration
file NVRx judges progress by, how many cycles without progress it tolerates, whether
the workload injects faults, and the GPU-failure schedule; the workload decides who
keeps checkpoints to --save-retention. Submit computes them here; the entrypoint and
the workload builders read the values from run.json and never ask which mode or
workload they are in. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvrx_appliance.settings.chain import ChainSpec, faults_active

# The hand-off demo fails task 0's node (infra rank 0) at cycles 1 and 2, after the
# workload fault has advanced the cycle and a checkpoint exists (the reference deployment's default).
HANDOFF_GPU_FAILURE = "1:0,2:0"


@dataclass(frozen=True)
class Policy:
    progress_file: str  # the iteration file NVRx's progress tracker watches
    # True when progress_file is a file that never moves, which task 0 seeds once: the
    # first fault then scores as "no progress" and ft_launcher exits 93 (no-restart demo).
    progress_frozen: bool
    max_no_progress_cycles: int  # ft_launcher's --ft-max-no-progress-cycles
    faults_active: bool  # the workload injects its faults (demo modes, when asked)
    gpu_failure: str | None  # NVRX_INJECT_GPU_FAILURE; None leaves it unset
    # Task 0's entrypoint keeps this many newest complete checkpoints (0: it removes
    # none). Megatron has no keep-N of its own; the cpu trainer and scripts prune theirs.
    checkpoints_kept: int


def decide(spec: ChainSpec, *, tracker: Path, static_tracker: Path) -> Policy:
    """The policy of a validated spec; the two paths are the work dir's (Layout)."""
    frozen = spec.mode == "no-restart"
    return Policy(
        progress_file=str(static_tracker if frozen else tracker),
        progress_frozen=frozen,
        max_no_progress_cycles=1 if frozen else spec.max_no_progress_cycles,
        faults_active=faults_active(spec),
        gpu_failure=_gpu_failure(spec),
        checkpoints_kept=spec.save_retention if spec.workload == "megatron" else 0,
    )


def _gpu_failure(spec: ChainSpec) -> str | None:
    """Handoff only; an unset schedule takes the default, an empty one turns it off."""
    if spec.mode != "handoff":
        return None
    if spec.gpu_failure is None:
        return HANDOFF_GPU_FAILURE
    return spec.gpu_failure or None


_TYPES: dict[str, tuple[type, ...]] = {
    "progress_file": (str,),
    "progress_frozen": (bool,),
    "max_no_progress_cycles": (int,),
    "faults_active": (bool,),
    "gpu_failure": (str, type(None)),
    "checkpoints_kept": (int,),
}


def from_dict(data: Any) -> Policy:
    """A policy as run.json holds it. Raises ValueError naming the first bad field."""
    if not isinstance(data, dict) or set(data) != set(_TYPES):
        raise ValueError(f"policy must be an object with exactly {', '.join(sorted(_TYPES))}")
    for name, types in _TYPES.items():
        value = data[name]
        # bool is an int to isinstance: a count must not be true or false.
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            raise ValueError(f"policy field {name!r} has the wrong type ({value!r})")
    if data["max_no_progress_cycles"] < 1:
        raise ValueError("policy field 'max_no_progress_cycles' must be at least 1")
    if data["checkpoints_kept"] < 0:
        raise ValueError("policy field 'checkpoints_kept' cannot be negative")
    return Policy(**data)
