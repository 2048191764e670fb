"""The one loop that follows a chain: `status --watch`, the demo and qualify tick on it.

Each tick reads what it needs through one shared, rate-limited Slurm view, so however
many things a tick looks at, slurmctld sees at most one of each question per poll.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from nvrx_appliance.observe.slurmcli import Slurm

T = TypeVar("T")


@dataclass(frozen=True)
class Followed(Generic[T]):
    last: T  # what the last tick saw
    timed_out: bool


def follow(
    tick: Callable[[Slurm], T],
    finished: Callable[[T], bool],
    *,
    deadline_s: float,
    poll_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Followed[T]:
    """Call `tick` every `poll_s` until `finished` says so or `deadline_s` has passed.

    `tick` reads (and may report) what it needs; the Slurm view it is handed answers a
    repeated question within one poll from its last answer.
    """
    slurm = Slurm(min_interval_s=poll_s, clock=clock)
    started = clock()
    while True:
        seen = tick(slurm)
        if finished(seen):
            return Followed(seen, timed_out=False)
        if clock() - started > deadline_s:
            return Followed(seen, timed_out=True)
        sleep(poll_s)
