"""The scheduler, seen by the watcher: one chain's tasks and endings, through the Slurm
adapter.

Every call has a timeout and any failure surfaces as SlurmUnavailable: the runner marks
Slurm unavailable for the pass and skips the detectors that need it. Silence is never
read as "nothing is running". slurmctld is shared, so a pass costs one squeue for the
whole chain and one sacct for its recent endings; further calls only for a task 0
neither of those accounts for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from nvrx_appliance.observe import slurm_output
from nvrx_appliance.observe.slurm_output import (
    ALLOCATIONS,
    CHAIN_TASKS,
    ENDINGS,
    IDENTITY,
    AcctRow,
    ParseError,
)
from nvrx_appliance.observe.slurmcli import DEFAULT_TIMEOUT_S, Runner, Slurm, SlurmUnavailable
from nvrx_appliance.observe.types import Ending, Generation

__all__ = [
    "JobInfo",
    "NotConfigured",
    "NullPlatform",
    "Platform",
    "SlurmPlatform",
    "SlurmUnavailable",
]


@dataclass(frozen=True)
class JobInfo:
    """Who a job id belongs to and where it came from."""

    job_name: str
    owner: str
    work_dir: str = ""
    command: str = ""  # the batch script's path (scontrol's Command=, or sacct's SubmitLine)
    source: str = ""  # "scontrol", "sacct" or "state"


class NotConfigured(SlurmUnavailable):
    """No scheduler is asked (--platform none): not a failure, a choice."""


class Platform(Protocol):
    """What the watcher asks of the scheduler; every call raises SlurmUnavailable when
    it cannot answer (NotConfigured when nothing is to be asked)."""

    name: str

    def describe(self, job_id: str) -> JobInfo | None: ...

    def generations(self, job_name: str, owner: str) -> tuple[Generation, ...]: ...

    def endings(self, job_name: str, owner: str, window_s: float) -> tuple[Ending, ...]: ...

    def task0_endings(self, array_job_ids: Sequence[str]) -> tuple[Ending, ...]: ...

    def allocations(self, owner: str, query: dict[str, Any]) -> list[AcctRow]: ...

    def scancel(self, argv: Sequence[str]) -> None: ...


class NullPlatform:
    """--platform none: the watcher reads the chain's files only; the scheduler's
    source is "not configured" and the detectors that need it are skipped."""

    name = "none"
    why = "--platform none"

    def describe(self, job_id: str) -> JobInfo | None:
        return None

    def generations(self, job_name: str, owner: str) -> tuple[Generation, ...]:
        raise NotConfigured(self.why)

    def endings(self, job_name: str, owner: str, window_s: float) -> tuple[Ending, ...]:
        raise NotConfigured(self.why)

    def task0_endings(self, array_job_ids: Sequence[str]) -> tuple[Ending, ...]:
        raise NotConfigured(self.why)

    def allocations(self, owner: str, query: dict[str, Any]) -> list[AcctRow]:
        raise NotConfigured(self.why)

    def scancel(self, argv: Sequence[str]) -> None:
        raise NotConfigured(self.why)


class SlurmPlatform:
    name = "slurm"

    def __init__(self, timeout: float = DEFAULT_TIMEOUT_S, run: Runner | None = None) -> None:
        self.timeout = timeout
        self.slurm = Slurm(timeout=timeout, run_command=run)

    def describe(self, job_id: str) -> JobInfo | None:
        """Name, owner, work dir and script of a job id; None if Slurm knows no such job.

        scontrol forgets a job MinJobAge after it ends; sacct remembers it for the
        accounting window, and its SubmitLine names the script as it was submitted.
        """
        records = self.slurm.scontrol_jobs(job_id)
        if records:
            first = records[0]
            return JobInfo(
                job_name=first.get("JobName", ""),
                owner=slurm_output.scontrol_owner(first),
                work_dir=first.get("WorkDir", ""),
                command=first.get("Command", ""),
                source="scontrol",
            )
        rows = [r for r in self._sacct(jobs=[job_id], fields=IDENTITY) if r.name]
        if not rows:
            return None
        return JobInfo(
            job_name=rows[0].name,
            owner=rows[0].user,
            work_dir=rows[0].work_dir,
            command=slurm_output.submitted_script(rows[0].submit_line, rows[0].work_dir),
            source="sacct",
        )

    def generations(self, job_name: str, owner: str) -> tuple[Generation, ...]:
        """Every queued or running task of the chain, in one squeue call."""
        try:
            tasks = self.slurm.squeue(user=owner, name=job_name, fields=CHAIN_TASKS)
        except ParseError as exc:
            raise SlurmUnavailable(f"squeue: {exc}") from None
        return slurm_output.generations(tasks)

    def endings(self, job_name: str, owner: str, window_s: float) -> tuple[Ending, ...]:
        """How the chain's generations ended within the window (task 0 of each)."""
        since = f"now-{int(window_s)}seconds"
        rows = self._sacct(user=owner, name=job_name, since=since, fields=ENDINGS)
        return slurm_output.task0_endings(rows)

    def task0_endings(self, array_job_ids: Sequence[str]) -> tuple[Ending, ...]:
        """Task 0 of generations the windowed sacct did not cover: sacct by id first, then
        scontrol, which still knows a job for MinJobAge even where accounting lags."""
        if not array_job_ids:
            return ()
        rows = self._sacct(jobs=[f"{a}_0" for a in array_job_ids], fields=ENDINGS)
        found = {
            e.array_job_id: e
            for e in slurm_output.task0_endings(rows)
            if e.array_job_id in array_job_ids
        }
        for array_job_id in array_job_ids:
            if array_job_id in found:
                continue
            # Gone from scontrol too: unknown, never "ended".
            for record in self.slurm.scontrol_jobs(f"{array_job_id}_0"):
                ending = slurm_output.scontrol_ending(record)
                if ending is not None and ending.array_job_id == array_job_id:
                    found[array_job_id] = ending
        return tuple(found.values())

    def allocations(self, owner: str, query: dict[str, Any]) -> list[AcctRow]:
        """Every task of the chain with its nodes and times, for the goodput gauges;
        `query` is workdir.accounting_query's (ids, or a name and a start time)."""
        return self._sacct(user=owner, fields=ALLOCATIONS, **query)

    def _sacct(self, **query) -> list[slurm_output.AcctRow]:
        try:
            return self.slurm.sacct(**query)
        except ParseError as exc:
            raise SlurmUnavailable(f"sacct: {exc}") from None

    def scancel(self, argv: Sequence[str]) -> None:
        self.slurm.call(argv)
