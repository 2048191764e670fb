"""2b. Task 0's batch shell SIGKILLed -> the next generation's first training step.

Like the hand-off (handoff.py), but the node lives on: task 0's batch script dies by
SIGKILL, so no trap runs and no closed flag is written. Slurm ends task 0's job (its
batch step is gone) and stops its ft_launcher, whose lease then goes stale; the first
peer to see it fences the generation, and the pending cold spares leave or are
cancelled instead of starting one after another.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from bench import handoff
from bench.harness import BenchError, Harness
from bench.report import Result

NAME = "sigkill"
TITLE = "2b task 0 SIGKILLed"


@contextlib.contextmanager
def batch_shell_killed(h: Harness, gen: str, _victim: str) -> Iterator[float]:
    pid = h.batch_shell_pid(gen, 0)
    if pid is None:
        raise BenchError(f"the batch shell of {gen}_0 is not to be found in /proc")
    yield h.kill_process(pid)


def collect(h: Harness, repeat: int, result: Result) -> None:
    handoff.run(h, repeat, result, NAME, fault=batch_shell_killed)


def finish(result: Result, floor: float | None) -> None:
    result.metrics = handoff.metrics(
        result.samples, floor, "batch shell SIGKILLed", handoff.target(floor)
    )
