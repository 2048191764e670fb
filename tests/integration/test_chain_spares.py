"""d) A hot spare replaces an active non-zero task's dead node in the next cycle;
e) with the hot spare used up, a pending cold spare is admitted, joins, and replaces
the next dead node. One generation throughout: in-job restarts, no hand-off."""

from __future__ import annotations

import pytest

from nvrx_appliance.observe.run_files import cycle_info
from nvrx_appliance.observe.slurm_output import expand_nodelist

from .chain_support import (
    cli,
    logs_on_failure,
    progress,
    ran,
    started_in_cycle,
    submit,
    tasks,
    unique,
    wait_event,
    wait_idle,
)
from .conftest import Cluster, cluster_cli

pytestmark = [pytest.mark.cluster, pytest.mark.disruptive]

CYCLE_S = 180  # a lost node noticed, the next rendezvous formed, training resumed


def _node(cluster: Cluster, array_job_id: str, task: int) -> str:
    def placed() -> str:
        record = tasks(cluster, array_job_id).get(task)
        return record["NodeList"] if record and ran(record) else ""

    return cluster.wait_until(placed, CYCLE_S, f"task {task} of {array_job_id} to start")


def _active_nodes(work, array_job_id: str, cycle: int) -> set[str]:
    path = work / "nvrx" / array_job_id / "cycle_infos" / f"cycle_info.{array_job_id}.0.{cycle}"
    info = cycle_info(path.read_text())
    assert info is not None, logs_on_failure(work)
    return set(expand_nodelist(info.active_nodes))


def test_a_hot_then_a_cold_spare_replace_dead_nodes_within_one_generation(cluster: Cluster):
    work = cluster.workdir("spares")
    name = unique("spares")
    [gen] = _submit(cluster, work, name)
    killed: list[str] = []
    try:
        # A checkpoint first, for the next cycle to resume from (a node killed as its
        # cycle starts leaves none).
        wait_event(
            work, lambda e: e["event"] == "checkpoint" and e.get("slurm_array_job_id") == gen,
            CYCLE_S, f"generation {gen} to save",
        )  # fmt: skip
        task0, *others = (_node(cluster, gen, t) for t in (0, 1, 2))
        # Tasks 1 and 2 start together; NVRx makes whichever joins later the hot spare.
        active = _active_nodes(work, gen, 0)
        assert task0 in active and len(active) == 2
        (peer,) = active - {task0}
        (hot,) = set(others) - {peer}

        # d) the active peer's node dies: NVRx's next cycle runs on task 0 and the hot spare.
        killed.append(peer)
        assert cluster_cli("kill-node", peer).returncode == 0
        resumed = started_in_cycle(work, gen, 1, CYCLE_S)
        assert resumed["iteration"] > 0
        assert _active_nodes(work, gen, 1) == {task0, hot}

        # e) Slurm ends the peer's task (node failure); the throttle admits the cold spare.
        cold = _node(cluster, gen, 3)
        assert cold not in (task0, peer, hot)
        cluster.wait_until(
            lambda: _joined(work, gen, cold), CYCLE_S, "the cold spare to join the rendezvous"
        )
        # The promoted hot spare dies too: the cold spare is what keeps training going.
        killed.append(hot)
        assert cluster_cli("kill-node", hot).returncode == 0
        cycle = started_in_cycle(work, gen, 2, CYCLE_S)
        assert _active_nodes(work, gen, 2) == {task0, cold}
        assert cycle["iteration"] >= resumed["iteration"]
        assert {e["slurm_array_job_id"] for e in progress(work) if e["event"] == "start"} == {gen}
    finally:
        cli(cluster, "cancel", name)
        for node in killed:
            assert cluster_cli("revive-node", node, timeout=180).returncode == 0
        wait_idle(cluster, name, timeout=90)


def _joined(work, array_job_id: str, node: str) -> bool:
    """ft_launcher on `node` has logged (into the generation's NVRx log) that it asked to
    join the rendezvous: a late node waits for the next round as a standby."""
    path = work / "nvrx" / array_job_id / "logs" / "ft_launcher.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return any(f"[{node}]" in line and "to join the next round" in line for line in lines)


def _submit(cluster: Cluster, work, name: str) -> list[str]:
    return submit(
        cluster, work, name,
        "--mode", "train", "--train-tasks", "2", "--hot-spares", "1", "--cold-spares", "1",
        "--depth", "1",
    )  # fmt: skip
