"""Submitting a resolved spec from a workflow: submit's own code (the same checks,
run.json and sbatch as `nvrx-appliance submit`), with the workflow's own say on the plan
before anything is queued. Following the chain is observe/follow.py's loop."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from nvrx_appliance.settings import resolve
from nvrx_appliance.slurm import submit as submitting


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
    plan = submitting.plan(resolved, dry_run=False, force=False, user=user, extra=tuple(extra))
    vet(plan)
    done = submitting.submit(plan)
    return Submission(plan=plan, job_ids=list(done.job_ids))
