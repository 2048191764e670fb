"""a) The no-restart demo: ft_launcher exits 93 and task 0's trap cancels the chain."""

from __future__ import annotations

import pytest

from .chain_support import (
    cli,
    ledger,
    logs_on_failure,
    progress,
    ran,
    squeue_ids,
    state,
    submit,
    tasks,
    unique,
    wait_idle,
    wait_ledger,
)
from .conftest import Cluster

pytestmark = pytest.mark.cluster


def test_exit_93_cancels_every_queued_generation(cluster: Cluster):
    work = cluster.workdir("norestart")
    name = unique("norestart")
    first, *queued = submit(
        cluster, work, name,
        "--mode", "no-restart", "--train-tasks", "1", "--hot-spares", "1",
        "--cold-spares", "1", "--depth", "3", "--fault-delay", "3",
    )  # fmt: skip

    [entry] = wait_ledger(work, 1, timeout=240)
    wait_idle(cluster, name, timeout=60)

    assert entry["exit_code"] == 93, logs_on_failure(work)
    assert entry["action"] == "cancelled_chain" and entry["array_job_id"] == first
    # Slurm: task 0 ended with NVRx's 93, untouched by the trap. Accounting lags squeue:
    # once its three tasks are final there (under load it still said 0:0 at once).
    cluster.wait_finished(first, 3, timeout=60)
    gen1 = tasks(cluster, first)
    assert gen1[0]["ExitCode"] == "93:0"
    # Every later generation was cancelled before a single task of it ran.
    for array_job_id in queued:
        records = tasks(cluster, array_job_id)
        assert sorted(records) == [0, 1, 2]
        assert {state(r) for r in records.values()} == {"CANCELLED"}
        assert not any(ran(r) for r in records.values())
    # The first generation's own cold spare (task 2) was cancelled by task 0's trap, or
    # the hot spare's exit let the throttle admit it first (task 0 drains its log server
    # a few seconds longer). Then it arrived after the generation had ended: the hot
    # spare's entrypoint left a witness of its 93 before its job ended, so the spare's
    # batch script leaves at once (71) without starting srun, let alone ft_launcher.
    spare = gen1[2]
    if state(spare) != "CANCELLED":
        assert spare["ExitCode"] == "71:0", (spare, logs_on_failure(work))
        steps = cluster.slurm("sacct", "-n", "-P", "-j", spare["JobID"], "-o", "JobID").stdout
        assert not [s for s in steps.split() if s.endswith(".0")], steps
    starts = [e for e in progress(work) if e["event"] == "start"]
    assert not [e for e in starts if e.get("host") == spare["NodeList"] and e.get("cycle", 0) > 0]
    assert squeue_ids(cluster, name) == []
    # On disk: only the first generation ever trained, and it saw the fault.
    generations = {e.get("slurm_array_job_id") for e in progress(work) if e["event"] == "start"}
    assert generations == {first}
    assert any(e["event"] == "fault" for e in progress(work))
    # The chain ended on purpose: nothing for the watcher to page about.
    assert not (work / "chain.active").exists()
    assert len(ledger(work)) == 1
    # `logs` finds what sbatch and ft_launcher wrote: by job id through Slurm, by name.
    batch = cli(cluster, "logs", first)
    assert batch.returncode == 0 and f"-{first}_0.out <==" in batch.stderr, batch.stderr
    assert "--cycle 0" in batch.stderr and "--launcher" in batch.stderr, batch.stderr
    cycle = cli(cluster, "logs", name, "--cycle", "0")
    assert cycle.returncode == 0 and cycle.stdout.strip(), cycle.stderr
    launcher = cli(cluster, "logs", name, "--launcher")
    assert launcher.returncode == 0 and launcher.stdout.strip(), launcher.stderr
