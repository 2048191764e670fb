"""Driving one chain from the host: submit a resolved spec, then follow it.

The demo, qualify and the benchmarks all do both; the submit goes through submit's own
code (the same checks, run.json and sbatch as `nvrx-appliance submit`), and the follow
loop asks Slurm through one shared, rate-limited view, so however many things a tick
looks at, slurmctld sees at most one squeue per poll.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from nvrx_appliance.observe.slurmcli import Slurm
from nvrx_appliance.slurm import resolve
from nvrx_appliance.slurm import submit as submitting

T = TypeVar("T")


@dataclass(frozen=True)
class Submission:
    plan: submitting.Plan
    job_ids: list[str]  # the generations, oldest first


def submit_resolved(
    resolved: resolve.Resolved,
    *,
    user: str,
    extra: Sequence[str] = (),
    vet: Callable[[submitting.Plan], None] = lambda plan: None,
) -> Submission:
    """Plan and submit a chain. `vet` sees the plan before anything is queued and may
    refuse it by raising. Raises submit's Refused (nothing written, nothing queued) or
    SubmitFailed; the caller words them for its own command."""
    plan = submitting.plan(resolved, dry_run=False, force=False, user=user, extra=extra)
    vet(plan)
    done = submitting.submit(plan)
    return Submission(plan=plan, job_ids=list(done.job_ids))


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
