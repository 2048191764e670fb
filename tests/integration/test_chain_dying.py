"""Die fast (issue 30): task 0's node fails NVRx's health check at a rendezvous (the
GPU-failure injector, as in the demo). Task 0 closes the generation the moment its
ft_launcher decides to leave, so the hot spare's ft_launcher is gone before task 0's
gRPC log server is told to stop: the server waits out no drain (and no 5 s gRPC stop
after it), its own log says it, and nothing the run relies on is lost: the per-cycle
log holds both ranks' lines, the hot spare's launcher lines reach the launcher log, the
teardown decides on task 0's own exit code, and the successor resumes from the
checkpoint."""

from __future__ import annotations

import pytest

from nvrx_appliance.node import launcher_end

from .chain_support import ledger, logs_on_failure, progress, submit, unique, wait_event, wait_idle
from .conftest import Cluster

pytestmark = pytest.mark.cluster

GENERATION_S = 240  # a generation's start, fault, restart, health check and end on 2 cores


def test_task_0_failing_the_health_check_ends_its_generation_without_nvrxs_idle_waits(
    cluster: Cluster,
):
    work = cluster.workdir("dying")
    name = unique("dying")
    first, second = submit(
        cluster, work, name, "--mode", "handoff", "--train-tasks", "1", "--hot-spares", "1",
        "--cold-spares", "0", "--depth", "2", "--fault-delay", "5",
    )  # fmt: skip
    wait_event(
        work,
        lambda e: e["event"] == "start" and e.get("slurm_array_job_id") == second,
        GENERATION_S,
        f"generation {second} to resume",
    )
    wait_idle(cluster, name, GENERATION_S)
    logs = work / "nvrx" / first / "logs"
    launcher = (logs / "ft_launcher.log").read_text(errors="replace")
    server = (logs / "ft_launcher_grpc_root.log").read_text(errors="replace")
    shown = logs_on_failure(work) + f"\n==== grpc root log\n{server[-3000:]}"
    # NVRx decided task 0 must go; by the time its log server was told to stop, no
    # client was connected, so it waited for none.
    assert launcher_end.DECIDED.search(launcher), shown
    assert "Received signal 15" in server, shown
    assert "All clients disconnected after" in server, shown
    assert "still connected" not in server and "still_connected_streams" not in server, shown
    # Nothing lost: the hot spare's launcher lines came through the same server, both
    # ranks wrote the cycle's log, and the teardown decided on task 0's own exit code.
    hosts = {line.split("] [", 2)[1] for line in launcher.splitlines() if "] [" in line}
    assert len(hosts) >= 2, shown
    cycle_log = (work / "logs" / f"{name}_{first}_cycle0.log").read_text(errors="replace")
    assert any(line.startswith("0:") for line in cycle_log.splitlines()), shown
    assert any(line.startswith("1:") for line in cycle_log.splitlines()), shown
    entry = next(e for e in ledger(work) if e["array_job_id"] == first)
    assert (entry["action"], entry["exit_code"]) == ("released_spares", 1), shown
    [resumed] = [
        e for e in progress(work)
        if e["event"] == "start" and e.get("slurm_array_job_id") == second
    ]  # fmt: skip
    assert resumed["iteration"] == entry["checkpoint_iteration"] > 0, shown
