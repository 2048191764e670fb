"""Submit honours SBATCH_* variables and passes scheduler arguments given after `--`."""

from __future__ import annotations

import json
import subprocess

import pytest

from .chain_support import CLI, FAST, cli, squeue_ids, unique, wait_idle
from .conftest import Cluster

pytestmark = pytest.mark.cluster


def test_sbatch_variables_and_extra_arguments_reach_every_generation(cluster: Cluster):
    work = cluster.workdir("sbatch-env")
    name = unique("sbatchenv")
    done = subprocess.run(
        [CLI, "submit", *FAST, "--work-dir", str(work), "--job-name", name, "--mode", "train",
         "--train-tasks", "1", "--hot-spares", "0", "--depth", "2", "--json",
         # Held back an hour, so the chain is judged in the queue and never runs.
         "--", "--begin=now+3600", f"--comment=ticket-{name}"],
        # One of sbatch's own input variables, with a value no default would give.
        env={**cluster.env(), "SBATCH_DELAY_BOOT": "7"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_ids = json.loads(done.stdout)["job_ids"]
    try:
        assert len(job_ids) == 2
        for job_id in job_ids:
            shown = cluster.slurm("scontrol", "show", "job", job_id).stdout
            assert f"Comment=ticket-{name}" in shown, shown
            assert "DelayBoot=00:07:00" in shown, shown
            assert "JobState=PENDING" in shown, shown
        # --dependency=singleton reached sbatch: the second generation waits on the first,
        # which --begin holds for an hour, so Slurm cannot have cleared it. (The first's
        # own singleton is satisfied at once, and Slurm may show it as (null) any time.)
        second = cluster.slurm("scontrol", "show", "job", job_ids[1]).stdout
        assert "Dependency=singleton" in second, second
    finally:
        cli(cluster, "cancel", name)
        wait_idle(cluster, name, timeout=60)
    assert squeue_ids(cluster, name) == []
