"""The cpu trainer's run: set up, resume, train, checkpoint, inject the planned fault.

One code path for CPUs (gloo) and GPUs (NCCL), picked by torch.cuda.is_available().
Started once per rank by ft_launcher (or torchrun); see launchenv.py for what it tells
each rank.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

from nvrx_appliance.checkpoints import checkpoint_dir
from nvrx_appliance.clock import log_stamp
from nvrx_appliance.workloads import checkpointing, faults
from nvrx_appliance.workloads.events import ProgressLog
from nvrx_appliance.workloads.gpt import TinyGPT, loss_fn, mock_batch
from nvrx_appliance.workloads.launchenv import Rank
from nvrx_appliance.workloads.monitor import CHECKPOINTING, SETUP, STEP, Sections
from nvrx_appliance.workloads.own_step import OwnStepClock, node_name
from nvrx_appliance.workloads.save_request import SaveRequest


class InjectedFault(RuntimeError):
    """The planned workload fault of kind 'exception'."""


@dataclass
class Position:
    iteration: int = 0
    consumed_samples: int = 0  # the data position: mock sample i is a function of i


@dataclass
class Job:
    """What one rank trains: the model, its optimizer and where in the data it is."""

    args: argparse.Namespace
    me: Rank
    device: torch.device
    model: torch.nn.Module
    ddp: DistributedDataParallel
    optimizer: torch.optim.Optimizer
    pos: Position
    sections: Sections
    log: ProgressLog
    clock: OwnStepClock


def run(
    args: argparse.Namespace,
    me: Rank,
    plan: faults.FaultPlan | None,
    save: SaveRequest,
    launched: float | None = None,
) -> NoReturn:
    """Train to the end, or until the save signal, and exit 0 (see leave); `launched`:
    the wall time the process began, before torch was imported."""
    # The start event carries when each step of the setup ended, so a benchmark can tell
    # the process's start and torch's import from joining the process group and building.
    setup = {"launched": launched, "imported": time.time()}
    sections = Sections()
    sections.start(SETUP)
    job = _build(args, me, sections, setup)
    _resume(job)
    job.log.emit(
        "start", iteration=job.pos.iteration, host=socket.gethostname(), world_size=me.world,
        consumed_samples=job.pos.consumed_samples,
        optimizer_step=_optimizer_step(job.optimizer), backend=dist.get_backend(),
        monitored=sections.monitored,
        setup={k: round(v, 3) for k, v in setup.items() if v is not None},
    )  # fmt: skip
    sections.end(SETUP)
    stopped = _train(job, faults.fault_for(plan, me.rank, me.cycle), plan, save)
    if stopped:
        job.log.emit("saved_at_time_limit", iteration=job.pos.iteration, signalled=save.at)
        _say(me, f"saved at iteration {job.pos.iteration} on the save signal; ending")
    else:
        if args.save and me.rank == 0:
            checkpointing.mark_done(args.save, job.pos.iteration)
        job.log.emit("done", iteration=job.pos.iteration)
        _say(me, f"training done at iteration {job.pos.iteration}")
    sections.shutdown()
    dist.destroy_process_group()
    job.log.close()
    leave(0)


def leave(code: int) -> NoReturn:
    """End this rank now, with everything durable already written and closed.

    The interpreter's own teardown is skipped on purpose: freeing DDP's reducer destroys
    its gloo process group while holding the GIL, and that destructor joins gloo's
    worker thread, which may still be dropping the last reference to a finished
    collective's tensors, for which it needs the GIL. The rank then never exits after
    "training done" (caught on the local cluster: ft_launcher waited, the generation
    held its node; the same race can abort the rank instead, "terminate called without
    an active exception", and NVRx restarts a finished run). Call it while the job's
    objects are still referenced, so that none is freed before the process ends.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _build(
    args: argparse.Namespace, me: Rank, sections: Sections, setup: dict[str, float | None]
) -> Job:
    device = _init_distributed(me)
    setup["joined"] = time.time()
    torch.manual_seed(args.seed)
    model = TinyGPT(
        args.vocab_size, args.seq_length, args.hidden_size, args.num_layers,
        args.num_attention_heads,
    ).to(device)  # fmt: skip
    # No buffer broadcast: the model's one buffer, its causal mask, is a constant every rank
    # builds alike, and the broadcast would be a collective inside the forward pass, where
    # a rank's own step time (own_step.py) must not wait for its peers.
    ddp = DistributedDataParallel(
        model, device_ids=[me.local] if device.type == "cuda" else None, broadcast_buffers=False
    )
    clock = OwnStepClock(_nodes_of_ranks(me), on_gpu=device.type == "cuda")
    clock.watch(ddp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    log = _progress_log(args.progress_log if me.rank == 0 else None, me)
    setup["built"] = time.time()
    return Job(args, me, device, model, ddp, optimizer, Position(), sections, log, clock)


def _nodes_of_ranks(me: Rank) -> list[str]:
    """Each rank's node, by rank: one collective at the start, so that the step times
    every rank measures can be told by node."""
    nodes: list[str] = [""] * me.world
    dist.all_gather_object(nodes, node_name())
    return nodes


def _progress_log(path: Path | None, me: Rank) -> ProgressLog:
    return ProgressLog(
        path, cycle=me.cycle, slurm_array_job_id=os.environ.get("SLURM_ARRAY_JOB_ID"),
        slurm_job_id=os.environ.get("SLURM_JOB_ID"),
    )  # fmt: skip


def _resume(job: Job) -> None:
    """Load the tracked checkpoint, if there is one; otherwise start from nothing."""
    iteration = checkpointing.tracked_iteration(job.args.load) if job.args.load else None
    if not iteration:
        return
    state = _state(job)
    try:
        checkpointing.load(job.args.load, iteration, state)
    except (Exception, CheckpointException):
        # The workload contract's line (docs/workload-contract.md): the guard sets this
        # checkpoint aside and the next cycle resumes from the one before. What
        # torch.distributed.checkpoint raises on a torn shard derives from BaseException
        # alone: named here, or the line is never printed.
        print(
            f"{checkpoint_dir.LOAD_FAILED_MARK} iteration={iteration}", file=sys.stderr, flush=True
        )
        raise
    set_state_dict(
        job.model, job.optimizer,
        model_state_dict=state["model"], optim_state_dict=state["optimizer"],
    )  # fmt: skip
    progress = state["progress"]
    job.pos = Position(int(progress["iteration"]), int(progress["consumed_samples"]))
    _say(job.me, f"resumed from iteration {job.pos.iteration}")


def _train(job: Job, kind: str | None, plan: faults.FaultPlan | None, save: SaveRequest) -> bool:
    """Train to args.train_iters; True when the save signal ended it first. Either way the
    last iteration trained is checkpointed before this returns."""
    args, pos = job.args, job.pos
    first, saved = pos.iteration, pos.iteration
    train_start = time.monotonic()
    stopped = False
    while pos.iteration < args.train_iters:
        job.sections.start(STEP)
        if kind and plan and faults.due(plan, time.monotonic() - train_start):
            _inject(kind, job.me, args.progress_log)
        step_start = time.monotonic()
        loss, stopped = _train_step(job, save.requested)
        pos.iteration += 1
        pos.consumed_samples += args.global_batch_size
        job.sections.end(STEP)
        if pos.iteration == first + 1 or pos.iteration % args.log_interval == 0:
            millis = (time.monotonic() - step_start) * 1000
            _say(
                job.me,
                f"iteration {pos.iteration}/{args.train_iters} | loss {loss:.4f} | {millis:.1f} ms",
            )
            own = job.clock.drain()  # every rank: the steps since the last event
            job.log.emit("step", iteration=pos.iteration, loss=round(loss, 5), **own)
        if args.step_pause:
            time.sleep(args.step_pause)  # outside the step section: an idle rank, not a slow one
        if args.save and args.save_interval and pos.iteration % args.save_interval == 0:
            _checkpoint(job)
            saved = pos.iteration
        if stopped:
            break
    if args.save and pos.iteration != saved:
        _checkpoint(job)
    return stopped


def _init_distributed(me: Rank) -> torch.device:
    if torch.cuda.is_available():
        torch.cuda.set_device(me.local)
        dist.init_process_group("nccl")
        return torch.device("cuda", me.local)
    dist.init_process_group("gloo")
    return torch.device("cpu")


def _train_step(job: Job, asked: bool) -> tuple[float, bool]:
    """One optimizer step over the global batch; returns the loss averaged over ranks, and
    whether any rank got the save signal. Every rank must stop at the same iteration and
    the signal may reach them a moment apart (or, when one task's time limit comes
    first, only some of them), so the request rides on the loss's all-reduce."""
    args, me, pos = job.args, job.me, job.pos
    micro = args.micro_batch_size
    accumulation = args.global_batch_size // (micro * me.world)
    job.clock.start()
    job.optimizer.zero_grad(set_to_none=True)
    # [loss, ranks asked to save, each rank's own step time]
    total = torch.zeros(2 + me.world, device=job.device)
    for m in range(accumulation):
        first = pos.consumed_samples + (m * me.world + me.rank) * micro
        inputs, labels = mock_batch(
            range(first, first + micro), args.seq_length, args.vocab_size, args.seed
        )
        last = m == accumulation - 1
        with contextlib.nullcontext() if last else job.ddp.no_sync():
            logits = job.ddp(inputs.to(job.device))
            loss = loss_fn(logits, labels.to(job.device)) / accumulation
            loss.backward()
        total[0] += loss.detach()
    total[2 + me.rank] = job.clock.own_seconds()
    job.optimizer.step()
    total[1] = float(asked)
    dist.all_reduce(total)
    job.clock.record(total[2:].tolist())
    return float(total[0]) / me.world, bool(total[1] > 0)


def _checkpoint(job: Job) -> None:
    begin = time.monotonic()
    job.sections.start(CHECKPOINTING)
    checkpointing.save(job.args.save, job.pos.iteration, _state(job), job.args.save_retention)
    job.sections.end(CHECKPOINTING)
    seconds = time.monotonic() - begin
    _say(job.me, f"saved checkpoint at iteration {job.pos.iteration} ({seconds * 1000:.0f} ms)")
    job.log.emit("checkpoint", iteration=job.pos.iteration, seconds=round(seconds, 3))


def _state(job: Job) -> dict[str, Any]:
    model_state, optimizer_state = get_state_dict(job.model, job.optimizer)
    return {
        "model": model_state,
        "optimizer": optimizer_state,
        "progress": {
            "iteration": job.pos.iteration,
            "consumed_samples": job.pos.consumed_samples,
        },
    }


def _optimizer_step(optimizer: torch.optim.Optimizer) -> int:
    """Adam's step counter: how many optimizer steps the state has seen (0 when fresh)."""
    for param_state in optimizer.state.values():
        if "step" in param_state:
            return int(param_state["step"])
    return 0


def _inject(kind: str, me: Rank, progress_log: Path | None) -> None:
    fault_log = _progress_log(progress_log, me)
    fault_log.emit("fault", kind=kind, rank=me.rank)
    fault_log.close()
    print(f"{log_stamp()} [rank {me.rank}] injecting fault: {kind} (cycle {me.cycle})", flush=True)
    if kind == "exit":
        os._exit(faults.EXIT_CODE)
    if kind == "hang":
        # Block inside the open step section until NVRx's section timeout kills us.
        threading.Event().wait()
    raise InjectedFault(f"injected fault on rank {me.rank} in cycle {me.cycle}")


def _say(me: Rank, line: str) -> None:
    if me.rank == 0:
        print(f"{log_stamp()} {line}", flush=True)
