"""The two ordinary ends of a generation, decided at submit: its time limit, and the end
of training. Pure.

The time limit. Slurm signals every task's batch shell `margin` seconds before the
generation's limit (sbatch `--signal=B:URG@margin`); the shell writes the control
directory's time-limit notice; every node's entrypoint then sends the save signal to
each worker its ft_launcher runs (node/time_limit.py: not to ft_launcher); the
workload saves a complete checkpoint at the end of its step and exits 0, and each
ft_launcher exits 0 as at the end of a run. The save
signal is SIGURG because its default action is to be ignored: a process that never asked
for it (a script that ignores the contract, a checkpoint writer a worker spawned) goes on
untouched, where SIGUSR1 would kill it. `--exit-duration-min` uses the same path,
measured by task 0's entrypoint from the generation's start, so an in-job restart (new
worker processes) cannot reset it.

The end of training: the workload writes the training-done marker beside the tracker
(docs/workload-contract.md; for Megatron, task 0's entrypoint does once the tracker
reaches the final iteration computed below), and task 0's teardown ends the chain.
"""

from __future__ import annotations

import re
import signal

from nvrx_appliance.settings import workload_args
from nvrx_appliance.settings.chain import ChainSpec, Problem, flag, is_count, train_samples

SAVE_SIGNAL = signal.SIGURG
AUTO, OFF = "auto", "off"
# sbatch --signal's sig_time is at most this (Slurm's own limit).
MAX_MARGIN_S = 0xFFFF
# Megatron settings that change the global batch during training: only Megatron then
# knows at which iteration the length is reached.
_BATCH_RAMPS = ("--rampup-batch-size", "--step-batch-size-schedule")

_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def slurm_seconds(text: str) -> int | None:
    """A Slurm time limit in seconds: "M", "M:S", "H:M:S", "D-H", "D-H:M", "D-H:M:S"."""
    match = _SLURM_TIME.match(text.strip())
    if not match:
        return None
    days, first, second, third = match.groups()
    if days is None:
        parts = [int(first), int(second or 0), int(third or 0)]
        # Without days: M, M:S or H:M:S.
        hours, minutes, seconds = [0, *parts[:2]] if third is None else parts
        return hours * 3600 + minutes * 60 + seconds
    return int(days) * 86400 + int(first) * 3600 + int(second or 0) * 60 + int(third or 0)


# --- the time limit ------------------------------------------------------------------


def margin_s(spec: ChainSpec) -> int | None:
    """Seconds before --time at which each generation is told to save and end; None: off
    (and with no time limit, --time 0, there is nothing to save before).

    auto is the checkpointing timeout, NVRx's bound on one save, so the slowest save the
    chain allows still fits; at most a quarter of --time, so a short generation trains
    for most of its allocation. Slurm sends the signal up to its timer period (30 s)
    earlier than asked, never later."""
    limit = slurm_seconds(spec.time_limit)
    if spec.time_limit_margin == OFF or not limit:
        return None
    if spec.time_limit_margin == AUTO:
        return max(1, min(spec.checkpointing_timeout, limit // 4))
    return int(spec.time_limit_margin)


def sbatch_signal(spec: ChainSpec) -> str | None:
    """The sbatch argument that asks Slurm for the notice. B: signals the batch shell
    only, which writes the notice: a signal to the job's steps would reach every
    process in them where Slurm tracks processes by cgroup, and a worker still starting
    would lose it; the notice stays, is acted on as soon as each worker can, and tells
    the teardown why the generation ended."""
    margin = margin_s(spec)
    if margin is None:
        return None
    return f"--signal=B:{SAVE_SIGNAL.name.removeprefix('SIG')}@{margin}"


def problems(spec: ChainSpec) -> list[Problem]:
    option = flag("time_limit_margin")
    value = spec.time_limit_margin
    if value in (AUTO, OFF):
        return []
    if not is_count(value) or not 1 <= int(value) <= MAX_MARGIN_S:
        return [
            Problem(option, f"{value!r} is not auto, off, or a number of seconds 1-{MAX_MARGIN_S}")
        ]
    limit = slurm_seconds(spec.time_limit)
    if limit and int(value) * 2 > limit:
        return [
            Problem(
                option,
                f"{value} s leaves less than half of --time {spec.time_limit} ({limit} s) to "
                "train; lower it, raise --time, or use auto",
            )
        ]
    return []


def warnings(spec: ChainSpec) -> list[str]:
    """What submit says about the margin before it queues the chain."""
    margin = margin_s(spec)
    if margin is None or margin >= spec.checkpointing_timeout:
        return []
    return [
        f"{flag('time_limit_margin')}: {margin} s before the time limit is less than "
        f"{flag('checkpointing_timeout')} ({spec.checkpointing_timeout} s): a final save "
        f"slower than {margin} s is cut off by the limit, and the next generation resumes "
        "from the save before it"
    ]


# --- the end of training -------------------------------------------------------------


def length(spec: ChainSpec) -> tuple[str, int] | None:
    """How long the chain trains, in the unit it was given; None when only the user's
    script knows (its length is in its own arguments)."""
    if spec.workload == "script":
        return None
    if spec.workload == "megatron":
        iterations = workload_args.values_of(spec.megatron_args, "--train-iters")
        if iterations and iterations[-1].isdecimal():
            return ("iterations", int(iterations[-1]))
    return ("samples", train_samples(spec))


def megatron_final_iteration(spec: ChainSpec, global_batch: int) -> int | None:
    """The iteration at which Megatron ends training: --train-iters, or --train-samples
    over the global batch, rounded down as its update_train_iters does for a constant
    batch size. None under a batch-size ramp-up or schedule, which only Megatron can
    count through."""
    if any(f in _BATCH_RAMPS for f in workload_args.flags_in(spec.megatron_args)):
        return None
    found = length(spec)
    if found is None or global_batch < 1:
        return None
    unit, value = found
    return value if unit == "iterations" else value // global_batch


def resubmit_problem(old: ChainSpec | None, new: ChainSpec, done_at: int) -> str | None:
    """Why a new chain in the work dir of one that completed would only load its final
    checkpoint and stop, or None when it trains further (a longer run of the same unit)."""
    before = length(old) if old is not None else None
    after = length(new)
    if before is not None and after is not None and before[0] == after[0]:
        if after[1] > before[1]:
            return None
        raise_it = (
            "--train-iters in your arguments" if after[0] == "iterations" else flag("train_samples")
        )
        return (
            f"the chain trained in {new.work_dir} completed at iteration {done_at} after "
            f"{before[1]} {before[0]}; this one asks for {after[1]}, so it would only load "
            f"the final checkpoint and stop. Raise {raise_it} to train further, or pass --force"
        )
    return (
        f"the chain trained in {new.work_dir} completed at iteration {done_at}; a new chain "
        "there would only load the final checkpoint and stop unless it trains longer "
        "(raise the length in your arguments), which this submit cannot tell: pass --force "
        "to queue it anyway"
    )
