"""Fencing: when task 0's node dies, a peer closes the generation on its behalf one lease
after the death, and the successor starts before Slurm has even noticed the node.

Two hot spares and a cold spare may each see task 0's lease go stale: one fences, and
the ledger records the fence once. (Which one varies: the hot spares' ft_launchers may
give up on the dead store first, and the throttle then admits the cold spare, which
finds the stale lease in its gate.) The exclusive claim itself is raced by 32
processes in tests/unit/test_entrypoint_gate.py.
"""

from __future__ import annotations

import datetime
import re
import subprocess
import time

import pytest

from nvrx_appliance.devcluster.poll import Timeout
from nvrx_appliance.lease import POLL_S
from nvrx_appliance.workflows.demo import QUICK

from .chain_support import (
    cli,
    ledger,
    logs_on_failure,
    progress,
    ran,
    state,
    submit,
    tasks,
    unique,
    wait_event,
    wait_idle,
    wait_ledger,
)
from .conftest import Cluster, cluster_cli

pytestmark = [pytest.mark.cluster, pytest.mark.disruptive]

GENERATION_S = 240
# Short, so that the fence comes well before Slurm's node-failure detection (about 20 s
# on this cluster); the grace shortened with it to keep task 0's self-fence margin.
LEASE_S = 6
LEASE = ("--lease-stale-after", str(LEASE_S), "--closed-flag-grace", "1")
DOWN_S = 120  # SlurmdTimeout and the ping period, with room


def _checkpointed(work, generation: str) -> None:
    wait_event(
        work,
        lambda e: e["event"] == "checkpoint" and e.get("slurm_array_job_id") == generation,
        GENERATION_S,
        f"a checkpoint of generation {generation}",
    )


def _slurm_time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text)


def _marked_down_at(cluster: Cluster, node: str) -> datetime.datetime:
    """When slurmctld declared the node dead (the stamp of its "Not responding" reason)."""

    def stamp():
        out = cluster.slurm("scontrol", "-o", "show", "node", node).stdout
        found = re.search(r"Reason=Not responding \[\S+@(\S+)\]", out)
        return _slurm_time(found.group(1)) if found and "DOWN" in out else None

    return cluster.wait_until(stamp, DOWN_S, f"Slurm to mark {node} down", 0.5)


def test_a_peer_fences_a_dead_task_0_once_and_the_successor_starts_before_slurm_notices(
    cluster: Cluster,
):
    work = cluster.workdir("fence")
    name = unique("fence")
    first, second = submit(
        cluster, work, name, *LEASE,
        "--mode", "train", "--train-tasks", "1", "--hot-spares", "2", "--cold-spares", "1",
        "--depth", "2",
    )  # fmt: skip
    victim = ""
    try:
        _checkpointed(work, first)
        victim = tasks(cluster, first)[0]["NodeList"]
        killed_at = time.time()
        assert cluster_cli("kill-node", victim).returncode == 0

        wait_event(
            work,
            lambda e: e["event"] == "step" and e.get("slurm_array_job_id") == second,
            GENERATION_S,
            f"generation {second} to train",
        )
        down = _marked_down_at(cluster, victim)
        # Accounting lags the controller: wait until it has the successor's start.
        successor = cluster.wait_until(
            lambda: next((r for r in [tasks(cluster, second)[0]] if ran(r)), None),
            60,
            f"accounting to record {second}_0's start",
        )
        assert successor["NodeList"] != victim
        assert _slurm_time(successor["Start"]) < down, logs_on_failure(work)

        # Task 0's job was cancelled by the fence, not ended by Slurm's node failure.
        gen1 = tasks(cluster, first)
        assert state(gen1[0]) == "CANCELLED", gen1[0]
        # Two hot spares saw the stale lease; one fence, one ledger entry.
        fenced = [e for e in wait_ledger(work, 1, 60) if e["array_job_id"] == first]
        assert [e["action"] for e in fenced] == ["fenced"], ledger(work)
        assert fenced[0]["scancel_ok"] is True and fenced[0]["task0_node"] == victim
        # Nobody trained in the dead generation after the kill, the cold spare included:
        # cancelled while pending, or admitted late (the hot spares' ft_launchers may give
        # up on the dead store before the lease is stale). A spare admitted while the lease
        # was still fresh may even join the dead host's rendezvous; it leaves on the stale
        # lease or the closed flag without a worker ever starting.
        trained = [
            e for e in progress(work)
            if e["event"] == "start" and e.get("slurm_array_job_id") == first
            and e["time"] > killed_at
        ]  # fmt: skip
        assert trained == [], logs_on_failure(work)
        cold = gen1[3]
        if ran(cold):
            assert state(cold) != "COMPLETED", cold
        else:
            assert state(cold) == "CANCELLED", cold
    finally:
        cli(cluster, "cancel", name)
        if victim:
            assert cluster_cli("revive-node", victim, timeout=180).returncode == 0
        wait_idle(cluster, name, timeout=90)


def test_the_watchers_alone_fence_a_dead_task_0_in_time_and_the_relay_ends_the_rest(
    cluster: Cluster,
):
    # Issue 24: one watcher (task 1); task 2 reads the control directory only every
    # backstop period. Task 0's node and task 2's node die together: the watcher alone
    # must fence within its bound, and task 2's job, on a node nobody can reach, must be
    # ended by the relay's scancel, not held until Slurm declares the node dead.
    work = cluster.workdir("watchers")
    name = unique("watchers")
    first, second = submit(
        cluster, work, name, *LEASE, "--lease-watchers", "1",
        "--mode", "train", "--train-tasks", "1", "--hot-spares", "2", "--cold-spares", "0",
        "--depth", "2",
    )  # fmt: skip
    victims: list[str] = []
    try:
        _checkpointed(work, first)

        def all_started():
            found = tasks(cluster, first)
            return found if all(t in found and ran(found[t]) for t in range(3)) else None

        gen1 = cluster.wait_until(all_started, 60, f"accounting to record {first}'s tasks")
        task0_node, other_node = gen1[0]["NodeList"], gen1[2]["NodeList"]
        victims = [other_node, task0_node]
        assert cluster_cli("kill-node", other_node).returncode == 0
        killed_at = time.time()
        assert cluster_cli("kill-node", task0_node).returncode == 0

        closed = work / "nvrx" / first / "control" / "closed"
        try:
            fenced_at = cluster.wait_until(
                lambda: closed.exists() and closed.stat().st_mtime, LEASE_S + 30, "the fence"
            )
        except Timeout:
            raise AssertionError(f"no fence: {logs_on_failure(work)}") from None
        # The watcher sees task 0's last refresh within a poll, and the lease unchanged
        # for the threshold within another; room for a loaded 2-core machine.
        assert fenced_at - killed_at <= LEASE_S + 2 * POLL_S + 2, logs_on_failure(work)
        fenced = [e for e in wait_ledger(work, 1, 60) if e["array_job_id"] == first]
        assert [e["action"] for e in fenced] == ["fenced"], ledger(work)
        assert "fenced by task 1 " in fenced[0]["reason"], fenced[0]

        wait_event(
            work,
            lambda e: e["event"] == "step" and e.get("slurm_array_job_id") == second,
            GENERATION_S,
            f"generation {second} to train",
        )
        successor = cluster.wait_until(
            lambda: next((r for r in [tasks(cluster, second)[0]] if ran(r)), None),
            60,
            f"accounting to record {second}_0's start",
        )
        down = min(_marked_down_at(cluster, node) for node in victims)
        assert _slurm_time(successor["Start"]) < down, logs_on_failure(work)
        # Task 2 was cancelled: by the relay (the fence itself cancels only task 0 and
        # the pending spares), not ended by Slurm's node failure.
        ended = tasks(cluster, first)
        assert [state(ended[t]) for t in (0, 2)] == ["CANCELLED", "CANCELLED"], ended
    finally:
        cli(cluster, "cancel", name)
        for node in victims:
            assert cluster_cli("revive-node", node, timeout=180).returncode == 0
        wait_idle(cluster, name, timeout=90)


def test_a_partitioned_task_0_stops_itself_before_its_lease_is_stale_and_the_chain_goes_on(
    cluster: Cluster,
):
    # Task 0 alive, but the shared file system refuses its lease refreshes (an immutable
    # file refuses them even to root): it must stop training before any peer may call
    # it dead, and its own trap then closes the generation as after any failure.
    work = cluster.workdir("partition")
    name = unique("partition")
    first, second = submit(
        cluster, work, name,
        "--mode", "train", "--train-tasks", "1", "--hot-spares", "1", "--cold-spares", "0",
        "--depth", "2",
    )  # fmt: skip
    lease = work / "nvrx" / first / "control" / "task0.lease"
    frozen = False
    try:
        _checkpointed(work, first)
        frozen = subprocess.run(["chattr", "+i", str(lease)], check=False).returncode == 0
        if not frozen:
            pytest.skip(f"the cluster's work root cannot make {lease} immutable")
        [entry] = [e for e in wait_ledger(work, 1, 120) if e["array_job_id"] == first]
        assert (entry["exit_code"], entry["action"]) == (77, "released_spares"), entry
        # Task 0 was done (its trap ran after ft_launcher and the workers stopped) while
        # its lease was still fresh enough for every peer to believe it alive.
        stale_at = lease.stat().st_mtime + QUICK["lease_stale_after"]
        ended = datetime.datetime.fromisoformat(entry["end"].replace("Z", "+00:00"))
        assert ended.timestamp() <= stale_at + 1  # the ledger keeps whole seconds
        wait_event(
            work,
            lambda e: e["event"] == "step" and e.get("slurm_array_job_id") == second,
            GENERATION_S,
            f"generation {second} to train",
        )
    finally:
        if frozen:
            subprocess.run(["chattr", "-i", str(lease)], check=False)
        cli(cluster, "cancel", name)
        wait_idle(cluster, name, timeout=90)
