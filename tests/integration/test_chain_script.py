"""A user's own PyTorch script (examples/train_script.py, `--workload script`) hands off
when task 0's node dies: the successor generation resumes from exactly the checkpoint
the tracker named when the node died. And it keeps the contract's two ordinary ends: at
the time limit it saves the iteration it reached and the next generation resumes there;
when its training is done, the chain ends and no later generation starts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nvrx_appliance.devcluster.poll import wait_until

from .chain_support import (
    cli,
    ledger,
    logs_on_failure,
    ran,
    state,
    submit,
    tasks,
    tracker,
    unique,
    wait_idle,
    wait_ledger,
)
from .conftest import Cluster, cluster_cli

pytestmark = pytest.mark.cluster

EXAMPLE = Path(__file__).parents[2] / "examples" / "train_script.py"
GENERATION_S = 240


def resumed_at(work: Path, name: str, array_job_id: str) -> int | None:
    """The iteration the script said it resumed from, in that generation's cycle logs."""
    for log in sorted((work / "logs").glob(f"{name}_{array_job_id}*")):
        found = re.search(r"resumed from iteration (\d+)", log.read_text(errors="replace"))
        if found:
            return int(found.group(1))
    return None


@pytest.mark.disruptive
def test_a_users_script_hands_off_to_the_next_generation_at_the_last_checkpoint(
    cluster: Cluster,
):
    work = cluster.workdir("script")
    name = unique("script")
    args = work.parent / f"{name}.args"
    args.write_text("--iterations 100000\n--step-seconds 0.1  # a few steps a second\n")
    first, second = submit(
        cluster, work, name,
        "--workload", "script", "--script", str(EXAMPLE), "--script-args", str(args),
        "--train-tasks", "1", "--hot-spares", "1", "--cold-spares", "1", "--depth", "2",
    )  # fmt: skip
    victim = ""
    try:
        # Two checkpoints of its own, so there is progress for the successor to keep.
        wait_until(
            lambda: (tracker(work) or 0) >= 10, GENERATION_S, "the script's 2nd checkpoint", 1.0
        )
        victim = tasks(cluster, first)[0]["NodeList"]
        assert cluster_cli("kill-node", victim).returncode == 0
        # Every training rank lived on task 0's node: nothing moves the tracker now.
        left = tracker(work)
        resumed = wait_until(
            lambda: resumed_at(work, name, second), GENERATION_S, f"generation {second} to resume"
        )
        assert resumed == left, logs_on_failure(work)
        assert tasks(cluster, second)[0]["NodeList"] != victim
        # It goes on training from there: the tracker moves past the hand-off point.
        wait_until(lambda: (tracker(work) or 0) > left, 120, "a checkpoint after the hand-off")
    finally:
        cli(cluster, "cancel", name)
        if victim:
            assert cluster_cli("revive-node", victim, timeout=180).returncode == 0
        wait_idle(cluster, name, timeout=90)


ITERATIONS = 150


def test_a_users_script_saves_at_the_time_limit_and_its_chain_ends_when_training_is_done(
    cluster: Cluster,
):
    work = cluster.workdir("script-ends")
    name = unique("script-ends")
    args = work.parent / f"{name}.args"
    args.write_text(f"--iterations {ITERATIONS}\n--step-seconds 0.1\n")
    first, second, third = submit(
        cluster, work, name,
        "--workload", "script", "--script", str(EXAMPLE), "--script-args", str(args),
        "--train-tasks", "1", "--hot-spares", "0", "--depth", "3", "--time", "2",
    )  # fmt: skip
    try:
        # The signal Slurm's --signal=B:URG@margin sends near the limit, sent now (Slurm
        # sends it on its own 60-90 s in: the script would be done by then), to task 0's
        # batch shell alone, as --signal=B: does.
        wait_until(lambda: (tracker(work) or 0) >= 20, GENERATION_S, "two checkpoints", 0.5)
        task0 = tasks(cluster, first)[0]["JobID"]
        cluster.slurm("scancel", "--batch", "--signal=URG", task0)
        entries = wait_ledger(work, 2, timeout=GENERATION_S)
        wait_idle(cluster, name, timeout=90)
    finally:
        cli(cluster, "cancel", name)
    saved, done = entries
    assert (saved["array_job_id"], saved["exit_code"], saved["action"]) == (
        first, 0, "saved_at_time_limit",
    ), logs_on_failure(work)  # fmt: skip
    left = saved["checkpoint_iteration"]
    assert 20 <= left < ITERATIONS
    # Nothing trained after that checkpoint: the successor resumed at exactly it.
    assert resumed_at(work, name, second) == left, logs_on_failure(work)
    assert (done["array_job_id"], done["action"], done["final_iteration"]) == (
        second, "completed", ITERATIONS,
    )  # fmt: skip
    records = cluster.wait_until(lambda: tasks(cluster, third) or None, 60, f"{third}")
    assert all(state(r) == "CANCELLED" and not ran(r) for r in records.values()), records
    assert len(ledger(work)) == 2
