"""A generation saves before its Slurm time limit and hands off with nothing lost, even
after an in-job restart shortly before the limit: Slurm's own --signal, a real
ft_launcher, the cpu trainer.

--time 2 with the auto margin (30 s): Slurm signals 60-90 s into the generation (its
timer runs every 30 s), long after the injected fault and the in-job restart that
follows it. Checkpoints are never due (--save-interval 100000), so the only checkpoint
a generation leaves is the one it takes at the time limit.
"""

from __future__ import annotations

import pytest

from .chain_support import (
    cli,
    ledger,
    logs_on_failure,
    progress,
    state,
    submit,
    tasks,
    tracker,
    unique,
    wait_event,
    wait_idle,
    wait_ledger,
)
from .conftest import Cluster
from .test_watch_cluster import watch

pytestmark = pytest.mark.cluster


def events(work, generation: str, kind: str) -> list[dict]:
    return [
        e
        for e in progress(work)
        if e["event"] == kind and e.get("slurm_array_job_id") == generation
    ]


def test_the_time_limit_save_hands_off_at_the_last_trained_iteration_after_a_restart(
    cluster: Cluster, tmp_path
):
    work, name = cluster.workdir("limit"), unique("limit")
    first, second = submit(
        cluster, work, name,
        # handoff mode without its GPU-failure injector: only the workload fault, on
        # rank 1 in the first cycle of each generation, two seconds into training.
        "--mode", "handoff", "--gpu-failure", "", "--fault-delay", "2",
        "--train-tasks", "2", "--hot-spares", "0", "--cold-spares", "0",
        "--depth", "2", "--time", "2", "--save-interval", "100000",
    )  # fmt: skip
    try:
        [entry] = wait_ledger(work, 1, timeout=300)
        assert (entry["array_job_id"], entry["exit_code"], entry["action"]) == (
            first, 0, "saved_at_time_limit",
        ), logs_on_failure(work)  # fmt: skip
        resumed = wait_event(
            work,
            lambda e: e["event"] == "start" and e.get("slurm_array_job_id") == second,
            180,
            f"generation {second} to start training",
        )
        # nvrx-watch pages nothing for a generation that ended at its time limit.
        watched = watch(cluster, tmp_path, second, "--work-dir", str(work))
        assert watched.returncode == 0, watched.stderr
    finally:
        cli(cluster, "cancel", name)
        wait_idle(cluster, name, timeout=90)

    # Generation 1 had its in-job restart (cycle 0's fault, a second start in cycle 1)...
    assert [e["cycle"] for e in events(work, first, "fault")] == [0]
    assert [e["cycle"] for e in events(work, first, "start")] == [0, 1]
    # ...then Slurm's signal: its batch shell wrote the notice, and every rank saved the
    # iteration it had reached.
    notice = (work / "nvrx" / first / "control" / "time_limit").read_text()
    assert "is near its time limit" in notice
    [saved] = events(work, first, "saved_at_time_limit")
    trained = max(e["iteration"] for e in events(work, first, "step") if e["cycle"] == 1)
    assert saved["iteration"] >= trained > 0
    assert entry["checkpoint_iteration"] == saved["iteration"]
    # The successor starts at exactly the last iteration its predecessor trained.
    assert resumed["iteration"] == saved["iteration"], logs_on_failure(work)
    # Generation 1 ended itself before the limit: Slurm recorded no TIMEOUT.
    assert state(tasks(cluster, first)[0]) == "COMPLETED"
    assert (tracker(work) or 0) >= saved["iteration"]
    assert [e["array_job_id"] for e in ledger(work)][:1] == [first]
