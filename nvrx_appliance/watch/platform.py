"""The scheduler, seen by the watcher: Slurm through its CLI, or none at all.

Every call goes through one runner with a timeout (slurmcli.run by default) and any
failure surfaces as SlurmUnavailable: the runner marks Slurm unavailable for the pass
and skips the detectors that need it. Silence is never read as "nothing is running".
slurmctld is shared, so a pass costs one squeue for the whole chain and one sacct for
its recent endings; further calls only for a task 0 neither of those accounts for.
Parsing lives in parsing.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nvrx_appliance.observe.types import Ending, Generation
from nvrx_appliance.slurm import slurmcli
from nvrx_appliance.slurm.slurmcli import SlurmUnavailable
from nvrx_appliance.watch import parsing

Runner = Callable[[Sequence[str], float], str]

__all__ = ["JobInfo", "NoPlatform", "SlurmPlatform", "SlurmUnavailable"]


def _run(argv: Sequence[str], timeout: float) -> str:
    return slurmcli.run(argv, timeout=timeout)


@dataclass(frozen=True)
class JobInfo:
    """Who a job id belongs to and where it came from."""

    job_name: str
    owner: str
    work_dir: str = ""
    command: str = ""  # the batch script's path (scontrol's Command=, or sacct's SubmitLine)
    source: str = ""  # "scontrol", "sacct" or "state"


class SlurmPlatform:
    name = "slurm"

    def __init__(self, timeout: float = slurmcli.DEFAULT_TIMEOUT_S, run: Runner = _run) -> None:
        self.timeout = timeout
        self._run = run

    def call(self, argv: Sequence[str]) -> str:
        return self._run(argv, self.timeout)

    def describe(self, job_id: str) -> JobInfo | None:
        """Name, owner, work dir and script of a job id; None if Slurm knows no such job.

        scontrol forgets a job MinJobAge after it ends; sacct remembers it for the
        accounting window, and its SubmitLine names the script as it was submitted.
        """
        try:
            records = parsing.scontrol_records(
                self.call(["scontrol", "--oneliner", "show", "job", job_id])
            )
        except SlurmUnavailable as exc:
            if "invalid job id" not in str(exc).lower():
                raise
            records = []
        if records:
            first = records[0]
            return JobInfo(
                job_name=first.get("JobName", ""),
                owner=parsing.scontrol_owner(first),
                work_dir=first.get("WorkDir", ""),
                command=first.get("Command", ""),
                source="scontrol",
            )
        out = self.call(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", parsing.DESCRIBE_FIELDS])
        identity = parsing.sacct_identity(out)
        if identity is None:
            return None
        name, owner, work_dir, submit_line = identity
        return JobInfo(
            job_name=name,
            owner=owner,
            work_dir=work_dir,
            command=parsing.submitted_script(submit_line, work_dir),
            source="sacct",
        )

    def generations(self, job_name: str, owner: str) -> tuple[Generation, ...]:
        """Every queued or running task of the chain, in one squeue call."""
        out = self.call(
            [
                "squeue",
                "--noheader",
                "--array",
                "--name",
                job_name,
                "--user",
                owner,
                "--format",
                parsing.SQUEUE_FORMAT,
            ]
        )
        return parsing.squeue_generations(out)

    def endings(self, job_name: str, owner: str, window_s: float) -> tuple[Ending, ...]:
        """How the chain's generations ended within the window (task 0 of each)."""
        out = self.call(
            [
                "sacct",
                "-X",
                "-n",
                "-P",
                "--name",
                job_name,
                "--user",
                owner,
                "--starttime",
                f"now-{int(window_s)}seconds",
                "--format",
                parsing.SACCT_FIELDS,
            ]
        )
        return parsing.sacct_task0_endings(out)

    def task0_endings(self, array_job_ids: Sequence[str]) -> tuple[Ending, ...]:
        """Task 0 of generations the windowed sacct did not cover: sacct by id first, then
        scontrol, which still knows a job for MinJobAge even where accounting lags."""
        if not array_job_ids:
            return ()
        ids = ",".join(f"{a}_0" for a in array_job_ids)
        out = self.call(["sacct", "-X", "-n", "-P", "-j", ids, "--format", parsing.SACCT_FIELDS])
        found = {
            e.array_job_id: e
            for e in parsing.sacct_task0_endings(out)
            if e.array_job_id in array_job_ids
        }
        for array_job_id in array_job_ids:
            if array_job_id in found:
                continue
            try:
                text = self.call(["scontrol", "--oneliner", "show", "job", f"{array_job_id}_0"])
            except SlurmUnavailable as exc:
                if "invalid job id" in str(exc).lower():
                    continue  # gone from scontrol too: unknown, never "ended"
                raise
            for record in parsing.scontrol_records(text):
                ending = parsing.scontrol_ending(record)
                if ending is not None and ending.array_job_id == array_job_id:
                    found[array_job_id] = ending
        return tuple(found.values())

    def scancel(self, argv: Sequence[str]) -> None:
        self.call(argv)


class NoPlatform:
    """--platform none: cycle infos only. Describes nothing; every chain source is off."""

    name = "none"
