"""The built-in trainer for machines without GPUs (and a GPU smoke test where there are).

    python -m nvrx_appliance.workloads.cpu --save DIR --load DIR \\
        --save-interval 20 --train-iters 200 --progress-log FILE ...

A small GPT-style model on mock data, under ft_launcher, keeping Megatron's contract:
--save/--load, iter_XXXXXXX checkpoints (torch.distributed.checkpoint) with optimizer
state and data position, latest_checkpointed_iteration.txt moved only after a
checkpoint is complete, resume from it; NVRx setup/step/checkpointing sections; and
Megatron-named fault-injector flags with this trainer's own kinds (faults.py). It keeps
the appliance's workload contract too: on the save signal it saves at the end of the
step and exits 0, and when training is done it writes the training-done marker.

This module holds the command line (settings/program_argv.py, the argv submit gives it);
importing it does not import torch.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

from nvrx_appliance.settings.generation_end import SAVE_SIGNAL
from nvrx_appliance.settings.program_argv import CPU_MODULE as MODULE
from nvrx_appliance.workloads import faults
from nvrx_appliance.workloads.launchenv import Rank
from nvrx_appliance.workloads.save_request import SaveRequest


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    # Like any script under the appliance (docs/workload-contract.md), the trainer falls
    # back to the checkpoint directory the entrypoint names in its environment.
    contract_dir = os.environ.get("NVRX_APPLIANCE_CHECKPOINT_DIR")
    ckpt = p.add_argument_group("checkpoints (Megatron's names)")
    ckpt.add_argument(
        "--save", type=Path, default=contract_dir and Path(contract_dir),
        help="Checkpoint directory to write (default: $NVRX_APPLIANCE_CHECKPOINT_DIR).",
    )  # fmt: skip
    ckpt.add_argument(
        "--load", type=Path, default=contract_dir and Path(contract_dir),
        help="Checkpoint directory to resume from (default: $NVRX_APPLIANCE_CHECKPOINT_DIR).",
    )  # fmt: skip
    ckpt.add_argument("--save-interval", type=int, default=0, help="Iterations between saves.")
    ckpt.add_argument(
        "--save-retention", type=int, default=3, help="Complete checkpoints kept (0: all)."
    )
    train = p.add_argument_group("training")
    length = train.add_mutually_exclusive_group(required=True)
    length.add_argument("--train-iters", type=int, help="Iterations to train in total.")
    length.add_argument(
        "--train-samples", type=int, help="Samples to train in total (rounded up to iterations)."
    )
    train.add_argument("--micro-batch-size", type=int, default=4)
    train.add_argument("--global-batch-size", type=int, help="Default: micro batch x world size.")
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--seed", type=int, default=1234)
    train.add_argument("--log-interval", type=int, default=1)
    train.add_argument(
        "--step-pause", type=float, default=0.0,
        help="Seconds each step sleeps after its all-reduce (0: none): paces many ranks "
        "sharing few cores, so that a benchmark of many nodes on one machine measures "
        "recovery rather than CPU contention.",
    )  # fmt: skip
    train.add_argument("--progress-log", type=Path, help="Append structured events here.")
    model = p.add_argument_group("model (small defaults, fast on two CPU cores)")
    model.add_argument("--num-layers", type=int, default=2)
    model.add_argument("--hidden-size", type=int, default=64)
    model.add_argument("--num-attention-heads", type=int, default=4)
    model.add_argument("--seq-length", type=int, default=64)
    model.add_argument("--vocab-size", type=int, default=512)
    fault = p.add_argument_group("fault injection (Megatron's flag names, this trainer's kinds)")
    fault.add_argument("--fault-injector-ranks", default="", help="Global ranks, comma list.")
    fault.add_argument(
        "--fault-injector-fault-types", default="exception",
        help=f"Comma list of {', '.join(faults.KINDS)}; rotated by cycle.",
    )  # fmt: skip
    fault.add_argument(
        "--fault-injector-fault-delay", type=float, default=0.0,
        help="Seconds after the training loop starts.",
    )  # fmt: skip
    fault.add_argument(
        "--fault-injector-cycles", type=int, default=0,
        help="Inject only in cycles below this (0: every cycle).",
    )  # fmt: skip
    return p


def resolve(args: argparse.Namespace, world: int) -> str | None:
    """Fill in derived values; return one line naming the bad option, or None."""
    for name in ("micro_batch_size", "log_interval", "num_layers", "hidden_size", "seq_length"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1"
    for name in ("save_interval", "save_retention"):
        if getattr(args, name) < 0:
            return f"--{name.replace('_', '-')} cannot be negative"
    if args.hidden_size % args.num_attention_heads:
        return "--hidden-size must be divisible by --num-attention-heads"
    if args.global_batch_size is None:
        args.global_batch_size = args.micro_batch_size * world
    if args.global_batch_size < 1 or args.global_batch_size % (args.micro_batch_size * world):
        return (
            f"--global-batch-size {args.global_batch_size} is not divisible by micro batch x "
            f"world size = {args.micro_batch_size} x {world}; use a multiple of "
            f"{args.micro_batch_size * world}"
        )
    if args.train_iters is None:
        args.train_iters = math.ceil(args.train_samples / args.global_batch_size)
    if args.train_iters < 1:
        return "--train-iters / --train-samples must be positive"
    if args.save_interval and args.save is None:
        return "--save-interval needs --save DIR"
    return None


def main(argv: list[str] | None = None) -> int:
    launched = time.time()
    save = SaveRequest()
    save.install(SAVE_SIGNAL)
    parser = build_parser()
    args = parser.parse_args(argv)
    me = Rank.from_env(os.environ)
    problem = resolve(args, me.world)
    if problem:
        parser.error(problem)
    try:
        plan = faults.parse_plan(
            args.fault_injector_ranks,
            args.fault_injector_fault_types,
            args.fault_injector_fault_delay,
            args.fault_injector_cycles,
        )
    except ValueError as exc:
        parser.error(str(exc))
    # torch is imported only now, so a bad flag is refused in a fraction of a second.
    from nvrx_appliance.workloads.trainer import run

    return run(args, me, plan, save, launched=launched)


if __name__ == "__main__":
    sys.exit(main())
