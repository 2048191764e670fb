"""What a user's Megatron arguments may say in a chain, judged before anything is
written. Pure.

Each rule is one line naming what to do instead: the flags the appliance owns or that
break resuming (workload_args), a length and a learning-rate schedule measured in one
unit (Megatron's validate_args asserts it), asynchronous checkpoints in a format that
has them, W&B's experiment name, retention, and paths (paths.py). The parallel
and batch sizes are parallel.py's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nvrx_appliance.settings.megatron import paths as megatron_paths
from nvrx_appliance.settings.workload_args import flags_in, refused, values_of

if TYPE_CHECKING:  # chain.py imports this module: only the type is needed here
    from nvrx_appliance.settings.chain import ChainSpec

# A run is measured in iterations (--train-iters) or in samples (--train-samples, the
# appliance's default); Megatron asserts that the schedule uses the same unit.
ITERATION_FLAGS = ("--lr-decay-iters", "--lr-warmup-iters")
SAMPLE_FLAGS = ("--lr-decay-samples", "--lr-warmup-samples")
# A preset's schedule gives way, group by group, to any of the user's.
SCHEDULE_GROUPS = (
    ("--lr-decay-samples", "--lr-decay-iters"),
    ("--lr-warmup-samples", "--lr-warmup-iters", "--lr-warmup-fraction"),
)
# The one checkpoint format Megatron saves asynchronously through NVRx.
ASYNC_FORMAT = "torch_dist"


@dataclass(frozen=True)
class Run:
    """The settings the rules read, beside the user's arguments."""

    args: list[str]
    profile: str  # effective: small, 8b or none
    train_samples: int
    save_retention: int
    async_save: bool


def in_iterations(args: list[str]) -> bool:
    return "--train-iters" in flags_in(args)


def preset_schedule_gives_way(args: list[str]) -> set[str]:
    """The preset's schedule flags to leave out for these user arguments: all of them
    when the run is measured in iterations, else each group the user states."""
    present = set(flags_in(args))
    dropped: set[str] = set()
    for group in SCHEDULE_GROUPS:
        if in_iterations(args) or present & set(group):
            dropped |= set(group)
    return dropped


def problems(run: Run) -> list[tuple[str, str]]:
    """(setting, line) for everything the user's arguments may not say in this chain."""
    args, present = run.args, set(flags_in(run.args))
    found = [("megatron_args", line) for line in refused(args)]
    if run.profile == "none" and not args:
        found.append(
            ("profile", "none passes only your arguments, and there are none: pass "
             "--megatron-args FILE, or a demo preset (--profile small)")
        )  # fmt: skip
    found += _length(run, present)
    found += _checkpointing(run, present)
    if "--wandb-project" in present and "--wandb-exp-name" not in present:
        found.append(
            ("megatron_args", "--wandb-project needs --wandb-exp-name too (Megatron's "
             "logging rank stops without one); add it")
        )  # fmt: skip
    found += _paths(args)
    return found


def _length(run: Run, present: set[str]) -> list[tuple[str, str]]:
    iterations = in_iterations(run.args)
    if run.profile == "none" and run.args and not (run.train_samples or iterations):
        return [
            ("train_samples", "your run needs a length (it drives the learning-rate "
             "schedule): set --train-samples N, or --train-iters N in your arguments")
        ]  # fmt: skip
    if iterations and run.train_samples:
        return [("megatron_args", "--train-iters conflicts with --train-samples; Megatron "
                 "takes one of them: drop one")]  # fmt: skip
    other = SAMPLE_FLAGS if iterations else ITERATION_FLAGS
    unit, fix = (
        ("iterations (--train-iters)", "measure it in iterations too, or drop --train-iters")
        if iterations
        else ("samples (--train-samples)", "measure it in samples too, or set --train-iters")
    )
    return [
        ("megatron_args", f"{f} does not match a run measured in {unit}: Megatron refuses "
         f"the mix; {fix}")
        for f in other if f in present
    ]  # fmt: skip


def _checkpointing(run: Run, present: set[str]) -> list[tuple[str, str]]:
    found = []
    formats = values_of(run.args, "--ckpt-format")
    if run.async_save and formats and formats[-1] != ASYNC_FORMAT:
        found.append(
            ("megatron_args", f"--ckpt-format {formats[-1]} cannot save asynchronously "
             f"through NVRx ({ASYNC_FORMAT} only); remove it, or pass --no-async-save")
        )  # fmt: skip
    if "--save-retain-interval" in present and run.save_retention:
        found.append(
            ("megatron_args", "--save-retain-interval (Megatron's own thinning) and "
             f"--save-retention {run.save_retention} would both remove checkpoints; pass "
             "--save-retention 0 to keep Megatron's, or remove the line")
        )  # fmt: skip
    if "--exit-on-missing-checkpoint" in present and "--pretrained-checkpoint" not in present:
        found.append(
            ("megatron_args", "--exit-on-missing-checkpoint stops the first generation, "
             "which starts with no checkpoint; remove it (or start from "
             "--pretrained-checkpoint DIR)")
        )  # fmt: skip
    return found


def _paths(args: list[str]) -> list[tuple[str, str]]:
    return [
        ("megatron_args", f"{arg.flag} {arg.path}: use an absolute path (the workload "
         "does not run in the directory you submit from)")
        for arg in megatron_paths.path_args(args)
        if not arg.path.startswith("/") and not megatron_paths.hub_id(arg, args)
    ]  # fmt: skip


def notes(args: list[str]) -> list[str]:
    """What submit says about accepted arguments a run may still trip over."""
    return [
        f"{arg.flag} {arg.path} is a HuggingFace hub id: compute nodes without internet "
        "access need it in a HuggingFace cache under a container mount (HF_HOME, HF_HUB_OFFLINE=1)"
        for arg in megatron_paths.path_args(args)
        if megatron_paths.hub_id(arg, args)
    ]


# What W&B accepts as a run id, narrowed to what a job name and a timestamp make.
WANDB_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def wandb_run_id(spec: ChainSpec, created: str, previous: str = "") -> str:
    """The chain's one W&B run ("" when the run does not log to W&B). Every generation
    and in-job restart resumes it, so a user sees one curve; a chain resubmitted into
    the same work dir (its checkpoints continue) continues the run recorded there."""
    if spec.workload != "megatron" or "--wandb-project" not in flags_in(spec.megatron_args):
        return ""
    if previous and WANDB_RUN_ID.fullmatch(previous):
        return previous
    return f"{spec.job_name[:48]}-{re.sub(r'[^0-9]', '', created)}"
