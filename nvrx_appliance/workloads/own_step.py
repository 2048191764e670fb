"""Each rank's own step time: its compute, without the wait for its peers.

In data-parallel training a fast rank waits for the slowest inside the step's gradient
all-reduce, so a step's wall time is the same on every rank and names nobody. What
tells a slow node from its peers is the time each rank took before it could hand its
last gradients to the collective: DDP calls its communication hook for a bucket of
gradients as soon as this rank has computed them, and never waits for a peer before
the last one. The hook registered here is PyTorch's plain all-reduce (same results as
no hook) that notes the time of each call; the step's own time is from its start to
the last call, its forward and backward passes.

Every rank's own time rides on the all-reduce the step already makes (its loss), so
rank 0 knows them all at no extra collective; it logs, for each node, the mean over the
logged interval's steps of its slowest rank's time (docs/stragglers.md): the mean, not
the median, since a node paused now and then loses its time in a few long steps, and
the run waits for every one of them. Imported
by the trainer only, after torch.
"""

# No `from __future__ import annotations`: DDP checks the hook's `bucket` annotation at
# run time, and a string there is refused.
import os
import socket
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel


def node_name() -> str:
    """Slurm's name for this node (what status and the exclusion record print); the
    host name outside Slurm."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


class OwnStepClock:
    def __init__(self, nodes_of_ranks: list[str], *, on_gpu: bool = False) -> None:
        self.nodes = nodes_of_ranks  # index: rank
        # On a GPU the hook runs when the CPU has queued a bucket's kernels, not when the
        # GPU has run them: its clock would time the launches and name nobody (or the
        # wrong rank). Nothing is logged there; Megatron's --log-straggler (CUDA events)
        # is the GPU's evidence (docs/stragglers.md).
        self.on_gpu = on_gpu
        self._started = 0.0
        self._ready: float | None = None  # the last gradient bucket handed over, this step
        self._steps: list[dict[str, float]] = []  # node -> its slowest rank's seconds

    def watch(self, ddp: DistributedDataParallel) -> None:
        ddp.register_comm_hook(self, _timed_allreduce)

    def start(self) -> None:
        self._started, self._ready = time.monotonic(), None

    def own_seconds(self) -> float:
        """This step's compute so far, up to its last gradient bucket (or now, had no
        bucket been handed over)."""
        end = self._ready if self._ready is not None else time.monotonic()
        return end - self._started

    def record(self, by_rank: list[float]) -> None:
        """Every rank's own time of the step just reduced."""
        slowest: dict[str, float] = {}
        for node, seconds in zip(self.nodes, by_rank, strict=True):
            slowest[node] = max(seconds, slowest.get(node, 0.0))
        self._steps.append(slowest)

    def drain(self) -> dict[str, Any]:
        """The step event's fields for the steps since the last one; empty when none."""
        steps, self._steps = self._steps, []
        if not steps or self.on_gpu:
            return {}
        nodes = sorted({n for step in steps for n in step})
        return {
            "own_step_s": {
                n: round(statistics.fmean(s[n] for s in steps if n in s), 6) for n in nodes
            },
            "own_steps": len(steps),
        }


def _timed_allreduce(
    clock: OwnStepClock, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    clock._ready = time.monotonic()
    return allreduce_hook(None, bucket)  # type: ignore[arg-type]
