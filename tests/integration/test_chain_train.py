"""f) task 0's end releases the pending cold spares; h) two chains with different names
leave each other alone, and a second chain under a name in use is refused; j) a chain
submitted with no --mode trains (`train`) to the end with no injected fault anywhere in
its logs; and training done in generation 1 of 3 ends the chain: no later generation
ever starts, the ledger says `completed`, status says so, and nvrx-watch is content."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .chain_support import (
    cli,
    ledger,
    logs_on_failure,
    progress,
    ran,
    state,
    submit,
    tasks,
    tracker,
    unique,
    wait_idle,
    wait_ledger,
)
from .conftest import Cluster
from .test_watch_cluster import reported, watch

pytestmark = pytest.mark.cluster

ITERATIONS = 300  # train samples / global batch (1 micro batch x 2 ranks)
# What the trainer and NVRx's GPU-failure injector say when they inject anything.
INJECTION = re.compile(r"injecting|injection enabled", re.IGNORECASE)


def injections(work: Path) -> list[str]:
    """Every log line under the work dir (Slurm, ft_launcher, cycles) that tells of one."""
    return [
        f"{log.name}: {line}"
        for log in sorted(work.rglob("*.log")) + sorted(work.rglob("*.out"))
        for line in log.read_text(errors="replace").splitlines()
        if INJECTION.search(line)
    ]


def ended(cluster: Cluster, array_job_id: str, count: int) -> dict | None:
    """sacct's record of every task of a generation, once none is live any more."""
    found = tasks(cluster, array_job_id)
    live = {"PENDING", "RUNNING", "COMPLETING"} & {state(r) for r in found.values()}
    return found if len(found) == count and not live else None


def test_two_chains_apart_and_a_train_run_that_completes(cluster: Cluster, tmp_path: Path):
    work_a, work_b = cluster.workdir("train"), cluster.workdir("neighbour")
    name_a, name_b = unique("train"), unique("neighbour")
    # Throttle 1: the two cold spares stay pending for as long as task 0 runs.
    a1, a2, a3 = submit(
        cluster, work_a, name_a,
        "--train-tasks", "1", "--hot-spares", "0", "--cold-spares", "2",
        "--depth", "3", "--train-samples", str(2 * ITERATIONS),
    )  # fmt: skip

    # h) the same name again is refused, and nothing is written for it.
    work_dup = cluster.workdir("duplicate")
    dup = cli(cluster, "submit", "--workload", "cpu", "--work-dir", str(work_dup / "run"),
              "--job-name", name_a)  # fmt: skip
    assert dup.returncode == 2
    assert (
        f"--job-name: {name_a!r} is used by your queued or running job(s) {a1}, {a2}, {a3}"
        in dup.stderr
    )
    assert not (work_dup / "run").exists()

    # A neighbour under another name ends in 93 and cancels its own chain by name...
    _b1, b2 = submit(
        cluster, work_b, name_b,
        "--mode", "no-restart", "--train-tasks", "1", "--hot-spares", "0", "--cold-spares", "1",
        "--depth", "2", "--fault-delay", "2",
    )  # fmt: skip
    wait_ledger(work_b, 1, timeout=240)
    wait_idle(cluster, name_b, timeout=60)
    # One entry: b2 never ran (the teardown cancelled it while it was pending).
    b_entries = ledger(work_b)
    assert [e["action"] for e in b_entries] == ["cancelled_chain"], logs_on_failure(work_b)

    # Accounting lags squeue: wait until it holds b2's end, then say what that end was.
    def b2_ended() -> set[str] | None:
        found = {state(r) for r in tasks(cluster, b2).values()}
        return found if found and not found & {"PENDING", "RUNNING"} else None

    b2_states = cluster.wait_until(b2_ended, 60, f"accounting to record how {b2} ended")
    assert b2_states == {"CANCELLED"}
    # ...and this chain's queued generations are untouched by it: checked below from
    # when they ended (under load this chain may finish training, and cancel them
    # itself, before the neighbour's cancel even lands).
    b_cancelled_at = max(r["End"] for r in tasks(cluster, b2).values())

    wait_ledger(work_a, 1, timeout=300)
    wait_idle(cluster, name_a, timeout=60)
    entries = ledger(work_a)
    assert len(entries) == 1, (entries, logs_on_failure(work_a))  # no later generation ran
    [first] = entries
    # j) training ran to its end: exit 0, no fault, the tracker at the last iteration.
    assert first["exit_code"] == 0, logs_on_failure(work_a)
    assert first["mode"] == "train"
    assert not [e for e in progress(work_a) if e["event"] == "fault"]
    assert injections(work_a) == []
    done = [e for e in progress(work_a) if e["event"] == "done"]
    assert done and done[0]["iteration"] == ITERATIONS == tracker(work_a)
    # Accounting lags squeue (no later generation's start waits for it here any more).
    gen1 = cluster.wait_until(lambda: ended(cluster, a1, 3), 60, f"accounting to record {a1}'s end")
    assert (state(gen1[0]), gen1[0]["ExitCode"]) == ("COMPLETED", "0:0")
    # f) task 0's end released the cold spares: cancelled, never started.
    for spare in (1, 2):
        assert state(gen1[spare]) == "CANCELLED" and not ran(gen1[spare])
    # Training done ended the chain: no later generation ever started (before, both
    # would have queued for nodes, loaded the final checkpoint and stopped).
    assert (first["action"], first["final_iteration"]) == ("completed", ITERATIONS)
    assert (work_a / "checkpoints" / "training_done.txt").read_text() == f"{ITERATIONS}\n"
    for later in (a2, a3):
        records = cluster.wait_until(lambda j=later: tasks(cluster, j) or None, 60, f"{later}")
        assert all(state(r) == "CANCELLED" and not ran(r) for r in records.values()), records
        # h) cancelled by this chain's own end, not by the neighbour's (sacct's End is an
        # ISO time to the second, so the strings order as the times do).
        ends = {r["End"] for r in records.values()}
        assert min(ends) >= gen1[0]["End"], (
            f"the neighbour's cancel reached this chain: {later} ended at {sorted(ends)}, "
            f"before {a1}_0 ended ({gen1[0]['End']}); the neighbour's {b2} at {b_cancelled_at}"
        )
    shown = cli(cluster, "status", a1)
    assert shown.returncode == 0 and f"training completed at iteration {ITERATIONS}" in " ".join(
        shown.stdout.split()
    ), shown.stdout
    watched = watch(cluster, tmp_path, a1, "--work-dir", str(work_a))
    assert watched.returncode == 0, watched.stderr
    assert not reported(watched, "chain_exhausted")
    assert "completed training at iteration" in watched.stderr
