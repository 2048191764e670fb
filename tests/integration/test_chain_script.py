"""A user's own PyTorch script (examples/train_script.py, `--workload script`) hands off
when task 0's node dies: the successor generation resumes from exactly the checkpoint
the tracker named when the node died."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nvrx_appliance.devcluster.poll import wait_until

from .chain_support import cli, logs_on_failure, submit, tasks, tracker, unique, wait_idle
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
