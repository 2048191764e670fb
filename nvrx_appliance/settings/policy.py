"""What the chain's mode means, decided once at submit and written to run.json.

The mode (train, no-restart, handoff) switches several things at once: the iteration
file NVRx judges progress by, how many cycles without progress it tolerates, whether
the workload injects faults, and the GPU-failure schedule; the workload decides who
keeps checkpoints to --save-retention. Submit computes them here; the entrypoint and
the workload builders read the values from run.json and never ask which mode or
workload they are in. Pure.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from nvrx_appliance.settings import exit_actions
from nvrx_appliance.settings.chain import DEMO_MODES, ChainSpec, faults_active, flag, to_dict

# The hand-off demo fails task 0's node (infra rank 0) at cycles 1 and 2, after the
# workload fault has advanced the cycle and a checkpoint exists (the reference deployment's default).
HANDOFF_GPU_FAILURE = "1:0,2:0"


# Workloads that keep --save-retention themselves (the built-in trainer is given it);
# for the others (Megatron, a script) task 0's keeper does (checkpoints/retention.py).
SELF_PRUNING = ("cpu",)

# A count in the policy: run.json's reader refuses a negative one.
_COUNT = {"minimum": 0}


@dataclass(frozen=True)
class Policy:
    progress_file: str  # the iteration file NVRx's progress tracker watches
    # True when progress_file is a file that never moves, which task 0 seeds once: the
    # first fault then scores as "no progress" and ft_launcher exits 93 (no-restart demo).
    progress_frozen: bool
    # ft_launcher's --ft-max-no-progress-cycles
    max_no_progress_cycles: int = field(metadata=_COUNT)
    faults_active: bool  # the workload injects its faults (demo modes, when asked)
    gpu_failure: str | None  # NVRX_INJECT_GPU_FAILURE; None leaves it unset
    # Task 0's entrypoint keeps this many newest complete checkpoints (0: it removes
    # none). Megatron has no keep-N of its own, and a script is told nothing of it; the
    # built-in trainer prunes its own.
    checkpoints_kept: int = field(metadata=_COUNT)
    # What a worker's exit code means to the chain (settings/exit_actions.py), code as
    # text (JSON's keys) -> action; the workload guard reads it on every rank.
    exit_actions: dict[str, str]
    # Checkpoints the chain may set aside as unloadable (checkpoints/fallback.py).
    checkpoint_fallbacks: int = field(metadata=_COUNT)


def decide(spec: ChainSpec, *, tracker: Path, static_tracker: Path) -> Policy:
    """The policy of a validated spec; the two paths are the work dir's (Layout)."""
    frozen = spec.mode == "no-restart"
    return Policy(
        progress_file=str(static_tracker if frozen else tracker),
        progress_frozen=frozen,
        max_no_progress_cycles=_max_no_progress_cycles(spec),
        faults_active=faults_active(spec),
        gpu_failure=_gpu_failure(spec),
        checkpoints_kept=0 if spec.workload in SELF_PRUNING else spec.save_retention,
        exit_actions={
            str(code): action
            for code, action in exit_actions.resolve(spec.workload_exits, spec.workload).items()
        },
        checkpoint_fallbacks=spec.checkpoint_fallbacks,
    )


def _max_no_progress_cycles(spec: ChainSpec) -> int:
    """The no-restart demo needs NVRx to give up at the first cycle without progress."""
    return 1 if spec.mode == "no-restart" else spec.max_no_progress_cycles


def _gpu_failure(spec: ChainSpec) -> str | None:
    """Handoff only; an unset schedule takes the default, an empty one turns it off."""
    if spec.mode != "handoff":
        return None
    if spec.gpu_failure is None:
        return HANDOFF_GPU_FAILURE
    return spec.gpu_failure or None


def _types() -> dict[str, tuple[type, ...]]:
    """Each field's types as run.json holds them, read off the declaration above: a
    union's members, else the plain type (dict for dict[str, str])."""

    def plain(hint: Any) -> type:
        return typing.get_origin(hint) or hint

    found = {}
    for f in fields(Policy):
        hint = typing.get_type_hints(Policy)[f.name]
        union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
        found[f.name] = tuple(map(plain, typing.get_args(hint))) if union else (plain(hint),)
    return found


def from_dict(data: Any) -> Policy:
    """A policy as run.json holds it. Raises ValueError naming the first bad field."""
    types_of = _types()
    if not isinstance(data, dict) or set(data) != set(types_of):
        raise ValueError(f"policy must be an object with exactly {', '.join(sorted(types_of))}")
    for name, allowed in types_of.items():
        value = data[name]
        # bool is an int to isinstance: a count must not be true or false.
        if not isinstance(value, allowed) or (bool not in allowed and isinstance(value, bool)):
            raise ValueError(f"policy field {name!r} has the wrong type ({value!r})")
    for f in fields(Policy):
        low = f.metadata.get("minimum")
        if low is not None and data[f.name] < low:
            raise ValueError(f"policy field {f.name!r} cannot be negative")
    try:
        table = exit_actions.parse(
            ",".join(f"{code}={action}" for code, action in data["exit_actions"].items())
        )
    except (exit_actions.TableError, AttributeError) as exc:
        raise ValueError(f"policy field 'exit_actions' is not an exit table ({exc})") from None
    data = {**data, "exit_actions": {str(c): a for c, a in table.items()}}
    return Policy(**data)


# --- what the mode does to the settings, said where a person reads them ---------------

# Settings only the demo modes read: in train mode nothing is ever injected.
DEMO_SETTINGS = ("fault_inject", "fault_ranks", "fault_delay", "fault_types", "gpu_failure")


def overrides(spec: ChainSpec) -> dict[str, tuple[Any, str]]:
    """Settings whose value is not what the chain will do, because its mode decides:
    name -> (what it will do, why)."""
    found: dict[str, tuple[Any, str]] = {}
    if spec.fault_inject and not faults_active(spec):
        found["fault_inject"] = (False, f"mode {spec.mode} never injects a fault")
    cycles = _max_no_progress_cycles(spec)
    if cycles != spec.max_no_progress_cycles:
        found["max_no_progress_cycles"] = (
            cycles,
            "the no-restart demo ends the chain (exit 93) at the first cycle without progress",
        )
    gpu_failure = _gpu_failure(spec)
    if gpu_failure != (spec.gpu_failure or None):  # "" is off, as None is
        why = (
            "the hand-off demo's schedule"
            if spec.mode == "handoff"
            else f"only the hand-off demo fails a node (mode {spec.mode})"
        )
        found["gpu_failure"] = (gpu_failure, why)
    return found


def unused(spec: ChainSpec, origins: Mapping[str, str]) -> list[str]:
    """One warning for each setting the user gave (not a default) that the chain will
    not use as given: the demo settings in train mode, and what a demo mode replaces."""
    given = {n for n, origin in origins.items() if not origin.startswith("default")}
    if spec.mode not in DEMO_MODES:
        return [
            f"{flag(name)} ({origins[name]}) applies to the demo modes only; this chain "
            "trains (--mode train), which never injects a fault, so it is ignored"
            for name in DEMO_SETTINGS
            if name in given
        ]
    values = to_dict(spec)
    return [
        f"{flag(name)} {json.dumps(values[name])} ({origins[name]}) is not used: {why}; "
        f"it will be {'off' if value is None else json.dumps(value)}"
        for name, (value, why) in overrides(spec).items()
        if name in given
    ]


def config_rows(spec: ChainSpec, origins: Mapping[str, str]) -> list[tuple[str, Any, str]]:
    """(setting, value, where it came from) as --print-config shows them: for a setting
    the mode decides, what the chain will do and why, with what was given beside it."""
    values, decided = to_dict(spec), overrides(spec)
    rows = []
    for name, value in values.items():
        if name in decided:
            will, why = decided[name]
            rows.append((name, will, f"{why} (given {json.dumps(value)} by {origins[name]})"))
        else:
            rows.append((name, value, origins[name]))
    return rows
