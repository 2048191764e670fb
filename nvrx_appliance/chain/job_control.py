"""Slurm's job control: the calls that change the queue, sbatch (submit) and scancel
(submit's rollback, cancel). observe/ only reads Slurm; these run through its one bounded
runner (observe/slurmcli.run), so a failure is SlurmUnavailable with one readable line.
The job's host cancels with its own stdlib code (jobhost/)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nvrx_appliance.observe import slurm_output
from nvrx_appliance.observe.slurmcli import DEFAULT_TIMEOUT_S, run

# sbatch's own bound: past it, submit treats the job as maybe queued and looks for it.
SBATCH_TIMEOUT_S = DEFAULT_TIMEOUT_S


def sbatch(args: Sequence[str], script: str, *, env: Mapping[str, str] | None = None) -> str:
    """Submit one job; returns its job id. `env` lets SBATCH_* reach sbatch untouched."""
    out = run(["sbatch", "--parsable", *args, script], env=env, timeout=SBATCH_TIMEOUT_S)
    return slurm_output.sbatch_job_id(out)


def scancel(args: Sequence[str]) -> None:
    run(["scancel", *args])
