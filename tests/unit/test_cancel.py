"""`nvrx-appliance cancel` ends what is left of a chain, and a job that ends on its own
between the listing and the scancel (a teardown, a released spare) is no failure; a job
scancel could not end still is. Slurm is the file-backed stand-in (slurm_standin.py):
the real cluster cannot be made to end a job inside that window on demand; the real
cancel is covered by tests/integration/test_chain_handoff.py and test_cli_cluster.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

from nvrx_appliance.chain import submit

from .test_submit_rollback import CLI, make_plan


def cancel(work: Path, name: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CLI, "cancel", name, "--work-dir", str(work)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def queued_chain(tmp_path: Path) -> tuple[Path, str]:
    plan = make_plan(tmp_path / "run")
    submit.submit(plan)
    return Path(plan.manifest.spec.work_dir), plan.manifest.spec.job_name


def test_a_generation_that_ends_under_the_cancel_is_no_failure(slurm, tmp_path):
    work, name = queued_chain(tmp_path)
    assert slurm.live() == ["101", "102", "103"]
    slurm.steer(ended_before_cancel="102")
    done = cancel(work, name)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"Cancelled chain {name!r}: running none; queued 101, 102, 103"
    assert slurm.live() == []
    assert not (work / "chain.active").exists()


def test_a_generation_scancel_could_not_end_is_a_failure_that_names_it(slurm, tmp_path):
    work, name = queued_chain(tmp_path)
    slurm.steer(refuse_cancel="103")
    done = cancel(work, name)
    assert done.returncode != 0
    assert "Access/permission denied" in done.stderr and "Traceback" not in done.stderr
    assert slurm.live() == ["103"]


def test_a_generation_already_completing_is_left_to_end_and_no_failure(slurm, tmp_path):
    # A second cancel while the first one's running generation still completes (squeue
    # shows it CG; scancel answers "Invalid job id specified" for it).
    work, name = queued_chain(tmp_path)
    slurm.steer(completing="101")
    done = cancel(work, name)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"Cancelled chain {name!r}: running none; queued 102, 103"
    assert not [c for c in slurm.calls("scancel") if "101" in c.split()]
