"""A training script of your own, run by the appliance (`submit --workload script`).

It keeps the contract in docs/workload-contract.md and nothing more: a data-parallel
model, a checkpoint every --save-interval iterations into NVRX_APPLIANCE_CHECKPOINT_DIR,
the tracker file moved there by rename only after the checkpoint is complete, resume
from whatever the tracker names, a checkpoint and exit 0 on the save signal (the time
limit is near), the training-done marker at the end, and NVRx's sections when
ft_launcher offers them. Plain PyTorch: on GPUs with NCCL, on CPUs with gloo.

    nvrx-appliance submit --workload script --script /shared/train_script.py \\
        --script-args args.txt --work-dir /shared/run ...
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import NoReturn

import torch
import torch.distributed as dist
from torch import nn

TRACKER = "latest_checkpointed_iteration.txt"  # the name NVRx and the chain read
SAVE_REQUESTED: list[float] = []  # set by the save signal's handler


def on_save_signal(_signum, _frame) -> None:
    SAVE_REQUESTED.append(time.time())


class Sections:
    """NVRx's setup/step/checkpointing sections; nothing when not under ft_launcher."""

    def __init__(self) -> None:
        self.client = None
        if os.environ.get("FT_RANK_MONITOR_IPC_SOCKET"):
            from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

            self.client = RankMonitorClient()
            self.client.init_workload_monitoring()

    def start(self, name: str) -> None:
        if self.client:
            self.client.start_section(name)

    def end(self, name: str) -> None:
        if self.client:
            self.client.end_section(name)


def log(rank: int, line: str) -> None:
    if rank == 0:
        print(line, flush=True)


def read_tracker(directory: str) -> int:
    try:
        with open(os.path.join(directory, TRACKER)) as fh:
            return int(fh.read().strip())
    except (FileNotFoundError, ValueError):
        return 0


def write_by_rename(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(path + ".tmp", path)


def save(directory: str, iteration: int, model: nn.Module, optimizer, rank: int) -> None:
    """Rank 0 writes iter_N, then moves the tracker to it; no rank goes on before that."""
    if rank == 0:
        path = os.path.join(directory, f"iter_{iteration:07d}.pt")
        torch.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path + ".tmp"
        )
        os.replace(path + ".tmp", path)
        write_by_rename(os.path.join(directory, TRACKER), f"{iteration}\n")
    dist.barrier()


def anyone_asked(device: torch.device) -> bool:
    """Did any rank get the save signal? All ranks must stop at the same iteration."""
    flag = torch.tensor([1 if SAVE_REQUESTED else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def main() -> NoReturn:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument(
        "--save-interval", type=int,
        default=int(os.environ.get("NVRX_APPLIANCE_SAVE_INTERVAL", "20")),
    )  # fmt: skip
    parser.add_argument("--step-seconds", type=float, default=0.05, help="Pace the demo.")
    args = parser.parse_args()
    directory = os.environ["NVRX_APPLIANCE_CHECKPOINT_DIR"]
    # First: the appliance sends the save signal to a rank only once it catches it.
    signal.signal(
        signal.Signals[os.environ.get("NVRX_APPLIANCE_SAVE_SIGNAL", "SIGURG")], on_save_signal
    )

    sections = Sections()
    sections.start("setup")
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 1).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    os.makedirs(directory, exist_ok=True)

    # Every rank reads rank 0's view of the tracker, so all resume from one checkpoint.
    start = [read_tracker(directory) if rank == 0 else 0]
    dist.broadcast_object_list(start)
    iteration = start[0]
    if iteration:
        try:
            state = torch.load(
                os.path.join(directory, f"iter_{iteration:07d}.pt"), map_location=device
            )
        except Exception:
            # The contract's line: the appliance sets this checkpoint aside and the next
            # cycle resumes from the one before (docs/workload-contract.md).
            print(f"NVRX_APPLIANCE_LOAD_FAILED iteration={iteration}", file=sys.stderr, flush=True)
            raise
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        log(rank, f"resumed from iteration {iteration}")
    sections.end("setup")

    while iteration < args.iterations:
        sections.start("step")
        inputs = torch.randn(32, 16, device=device)
        loss = (model(inputs) - inputs.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        iteration += 1
        time.sleep(args.step_seconds)
        sections.end("step")
        log(rank, f"iteration {iteration} loss {loss.item():.4f} world {world}")
        stopping = anyone_asked(device)
        if iteration % args.save_interval == 0 or stopping or iteration == args.iterations:
            sections.start("checkpointing")
            save(directory, iteration, model.module, optimizer, rank)
            sections.end("checkpointing")
            log(rank, f"saved checkpoint at iteration {iteration}")
        if stopping:
            log(rank, f"the time limit is near: saved at iteration {iteration}, ending")
            break
    if iteration == args.iterations and rank == 0:
        # Training done (its last iteration is saved): the marker beside the tracker.
        write_by_rename(os.environ["NVRX_APPLIANCE_TRAINING_DONE"], f"{iteration}\n")
    dist.destroy_process_group()
    # Leave while `model` is still referenced: freeing DDP at exit can hang or abort
    # the rank (docs/workload-contract.md, "Exit 0 when training is done").
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
