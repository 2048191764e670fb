"""Segment mode over NVLink domains of two nodes, the shape the reference deployment
defaults to (`NVRX_SEGMENT=1` on GB200-class systems): every array task is one domain of
two nodes, NVRx reads each node's ClusterUUID through `nvidia-smi -q` (the local
cluster's stand-in, devcluster/nvlink.py), and a spare replaces a whole domain.

The module rebuilds the session's cluster with six nodes in three domains (node1-2,
node3-4, node5-6) for its own tests, and puts the default cluster back afterwards; a
rebuild costs seconds and keeps the work root, which the first test checks. It runs
with the disruptive tests (it kills a node, and the rebuild ends every other test's
cluster), after all others.

a) a hand-off of two-node tasks: task 0's node fails NVRx's health check (its injector);
   both nodes of task 0 trained; the successor resumes at exactly the last checkpoint;
   `--segment auto` chose segment mode from the ClusterUUID;
b) a node of a non-zero task dies: the spare domain replaces the whole domain inside
   the generation, and the dead domain is not in the next cycle;
c) 93 from the non-zero node of task 0's domain stops the chain, whatever code srun
   hands task 0's shell (a site that kills the step on the first bad exit);
d) a drained node inside a domain: its domain leaves at the next rendezvous;
e) `--segment 2` where task 0's node has no ClusterUUID: refused, with the fix.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nvrx_appliance.devcluster import nvlink
from nvrx_appliance.devcluster.plan import DEFAULT_NODES, Params, make_plan
from nvrx_appliance.observe.run_files import cycle_info
from nvrx_appliance.observe.slurm_output import expand_nodelist

from .chain_support import (
    CLI,
    FAST,
    cli,
    ledger,
    logs_on_failure,
    progress,
    ran,
    squeue_ids,
    started_in_cycle,
    state,
    submit,
    tasks,
    unique,
    wait_idle,
    wait_in,
    wait_ledger,
    wait_tracker,
)
from .conftest import Cluster, cluster_cli
from .test_bad_nodes import _drain, _drained_marker, _kill_a_rank, _remembered, _resume

pytestmark = [pytest.mark.cluster, pytest.mark.disruptive]

NODES, DOMAIN = 6, 2
DOMAINS = ("--nodes", str(NODES), "--nvlink-domain-size", str(DOMAIN))
CYCLE_S = 180  # a fault noticed, the next rendezvous formed, training resumed
GENERATION_S = 300  # a generation's start, fault, end, and its successor's first step
# Two-node tasks, one trainer process per node (2 cores run the whole cluster).
SHAPE = ("--nodes-per-task", "2", "--gpus-per-node", "1")
# Two training domains and a hot spare domain, all six nodes. --segment 2: NVRx selects
# whole domains of two, so one node left of a domain cannot train (auto's segment 1
# would pair the survivor with a node of the spare domain).
TWO_DOMAINS_AND_A_SPARE = (
    *SHAPE, "--mode", "train", "--segment", "2", "--train-tasks", "2", "--hot-spares", "1",
    "--cold-spares", "0", "--depth", "1",
)  # fmt: skip


@dataclass(frozen=True)
class Domains:
    cluster: Cluster
    kept: Path  # a tracker written under the work root before the rebuild

    def of(self, node: str) -> frozenset[str]:
        """The nodes of `node`'s NVLink domain."""
        plan = make_plan(Params(nodes=NODES, nvlink_domain_size=DOMAIN))
        own = nvlink.domain_of(plan, node)
        return frozenset(n.name for n in plan.nodes if nvlink.domain_of(plan, n.name) == own)


def _up(*args: str) -> None:
    done = cluster_cli("up", *args, timeout=600)
    assert done.returncode == 0, f"cluster up {' '.join(args)} failed:\n{done.stderr}"


@pytest.fixture(scope="module")
def domains(cluster: Cluster) -> Iterator[Domains]:
    # A rebuild refuses over live jobs: earlier tests end theirs, wait for the last.
    cluster.wait_until(
        lambda: not cluster.slurm("squeue", "-h", "-o", "%i").stdout.split(),
        300, "the queue to empty before the rebuild", 1.0,
    )  # fmt: skip
    kept = cluster.workdir("before-rebuild") / "checkpoints" / "latest_checkpointed_iteration.txt"
    kept.parent.mkdir()
    kept.write_text("40\n")
    _up(*DOMAINS)
    try:
        yield Domains(cluster, kept)
    finally:
        # Every later test expects the default cluster (node1..node4, no nvidia-smi).
        _up("--nodes", str(DEFAULT_NODES))


def _nodes(cluster: Cluster, array_job_id: str, task: int) -> list[str]:
    """The nodes of one two-node task, node 0 (the one that publishes, for task 0) first."""

    def placed() -> list[str]:
        record = tasks(cluster, array_job_id).get(task)
        return expand_nodelist(record["NodeList"]) if record and ran(record) else []

    return cluster.wait_until(placed, CYCLE_S, f"task {task} of {array_job_id} to start")


def _cycle(work: Path, array_job_id: str, cycle: int) -> tuple[set[str], set[str]]:
    """(active, standby) nodes of one NVRx cycle, from its cycle-info file."""
    path = work / "nvrx" / array_job_id / "cycle_infos" / f"cycle_info.{array_job_id}.0.{cycle}"
    info = wait_in(work, lambda: path.exists() and cycle_info(path.read_text()), 60, str(path))
    return set(expand_nodelist(info.active_nodes)), set(expand_nodelist(info.standby_nodes))


def _training_on_two_domains(
    cluster: Cluster, work: Path, array_job_id: str
) -> tuple[set[str], set[str], set[str]]:
    """Once a generation of TWO_DOMAINS_AND_A_SPARE has a checkpoint: (cycle 0's active
    nodes, the spare domain, a training domain of a non-zero task). NVRx trains on the
    two complete domains that joined first, usually task 0's and task 1's; the third
    may join only after cycle 0 formed (then its cycle-info lists no standby)."""
    started_in_cycle(work, array_job_id, 0, CYCLE_S)
    wait_tracker(work, CYCLE_S)  # a checkpoint to resume from
    task_domains = [set(_nodes(cluster, array_job_id, t)) for t in (0, 1, 2)]
    active, _ = _cycle(work, array_job_id, 0)
    training = [d for d in task_domains if d <= active]
    assert len(training) == 2 and set().union(*training) == active, logs_on_failure(work)
    [spare] = [d for d in task_domains if d not in training]
    peer = next(d for d in task_domains[1:] if d in training)
    return active, spare, peer


def _batch_log(work: Path, name: str, array_job_id: str, task: int) -> str:
    path = work / "logs" / f"slurm-{name}-{array_job_id}_{task}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def test_a_rebuild_for_domains_keeps_every_runs_work_dir(domains: Domains):
    # `cluster up` with another node count used to remove the whole root, work root and
    # all: here a run's checkpoint tracker written before the rebuild is still there.
    assert domains.kept.read_text() == "40\n"
    status = json.loads(cluster_cli("status", "--json").stdout)
    assert status["up"] and len(status["nodes"]) == NODES
    uuids = {n["name"]: n["cluster_uuid"] for n in status["nodes"]}
    assert uuids["node1"] == uuids["node2"] != uuids["node3"] == uuids["node4"]
    assert len(set(uuids.values())) == NODES // DOMAIN
    shown = cluster_cli("status").stdout
    assert "CLUSTERUUID (nvidia-smi stand-in)" in shown and uuids["node5"] in shown


def test_two_node_tasks_hand_off_in_segment_mode_at_the_last_checkpoint(domains: Domains):
    cluster = domains.cluster
    work, name = cluster.workdir("seg-handoff"), unique("seghandoff")
    # No spare: NVRx may form a first cycle from whichever complete domains join first
    # (the demo shows that), and here only task 0's domain is there to train.
    first, second = submit(
        cluster, work, name, *SHAPE,
        "--mode", "handoff", "--segment", "auto", "--train-tasks", "1", "--hot-spares", "0",
        "--cold-spares", "0", "--depth", "2", "--fault-delay", "3",
    )  # fmt: skip
    try:
        task0 = _nodes(cluster, first, 0)
        # Both nodes of task 0 trained in its first cycle: one domain, both active.
        active, _ = _cycle(work, first, 0)
        assert active == set(task0) == domains.of(task0[0]), logs_on_failure(work)
        # auto: task 0 read its ClusterUUID and chose segment mode; every node joined it.
        record = json.loads((work / "nvrx" / first / "control" / "rdzv.json").read_text())
        plan = make_plan(Params(nodes=NODES, nvlink_domain_size=DOMAIN))
        expected_uuid = nvlink.domain_cluster_uuid(nvlink.domain_of(plan, task0[0]))
        assert (record["segment"], record["cluster_uuid"]) == (1, expected_uuid)
        task0_log = _batch_log(work, name, first, 0)
        assert f"ClusterUUID {expected_uuid}" in task0_log, task0_log
        assert "(segment 1)" in task0_log

        # The injector failed task 0's node 0 (infra rank 0) at cycle 1's health check:
        # the generation ends and the next one resumes where the first one's tracker was.
        [entry] = wait_ledger(work, 1, GENERATION_S)
        assert entry["array_job_id"] == first and entry["action"] == "released_spares", entry
        left = entry["checkpoint_iteration"]
        start = started_in_cycle(work, second, 0, CYCLE_S)
        assert left and left > 0, logs_on_failure(work)
        assert (start["iteration"], start["cycle"]) == (left, 0), logs_on_failure(work)
        # Node memory: the node that failed the health check, not its domain's other node
        # (the exclusion record, written after the ledger line, before the successor ran).
        remembered = _remembered(work, first)
        assert [e["node"] for e in remembered] == [task0[0]], remembered
        assert remembered[0]["reason"].startswith("failed NVRx's health check")
    finally:
        cli(cluster, "cancel", name)
        wait_idle(cluster, name, timeout=120)


def test_a_dead_node_of_a_non_zero_task_takes_its_domain_out_and_the_spare_domain_in(
    domains: Domains,
):
    cluster = domains.cluster
    work, name = cluster.workdir("seg-spare"), unique("segspare")
    [gen] = submit(cluster, work, name, *TWO_DOMAINS_AND_A_SPARE)
    killed = ""
    try:
        before, spare, peer = _training_on_two_domains(cluster, work, gen)
        killed = sorted(peer)[1]  # a node of a non-zero task, not its first
        assert cluster_cli("kill-node", killed).returncode == 0
        resumed = started_in_cycle(work, gen, 1, CYCLE_S)
        assert resumed["iteration"] > 0
        active, _ = _cycle(work, gen, 1)
        # The dead node's domain partner may still wait as a standby until Slurm ends
        # its task; it does not train.
        assert active == (before - peer) | spare, logs_on_failure(work)
        assert not active & domains.of(killed)
        # Inside the generation: no hand-off, nothing in the ledger.
        starts = {e["slurm_array_job_id"] for e in progress(work) if e["event"] == "start"}
        assert starts == {gen} and ledger(work) == []
    finally:
        cli(cluster, "cancel", name)
        if killed:
            assert cluster_cli("revive-node", killed, timeout=180).returncode == 0
        wait_idle(cluster, name, timeout=120)
    # The generation's end (cancelled) remembered no node of the domains that lived.
    [entry] = wait_ledger(work, 1, 60)
    remembered = {e["node"] for e in _remembered(work, gen)}
    assert not remembered & ((before - peer) | spare), (entry, remembered)


def test_93_from_task_0s_second_node_stops_the_chain_whatever_srun_hands_task_0(
    domains: Domains,
):
    cluster = domains.cluster
    work, name = cluster.workdir("seg-93"), unique("seg93")
    # A site that kills the step on the first bad exit: the second node's ft_launcher
    # exits 93 first (node 0 hosts NVRx's store and lingers), srun then ends node 0's
    # entrypoint and may hand task 0's shell its own code rather than 93.
    done = subprocess.run(
        [CLI, "submit", *FAST, *SHAPE, "--work-dir", str(work), "--job-name", name,
         "--mode", "no-restart", "--segment", "auto", "--train-tasks", "1",
         "--hot-spares", "0", "--cold-spares", "0", "--depth", "3", "--fault-delay", "3",
         "--json"],
        env=cluster.env(SLURM_KILL_BAD_EXIT="1"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first, *queued = json.loads(done.stdout)["job_ids"]
    try:
        [entry] = wait_ledger(work, 1, GENERATION_S)
        wait_idle(cluster, name, timeout=120)
    finally:
        cli(cluster, "cancel", name)
    task0_log = _batch_log(work, name, first, 0)
    second_node = [line for line in task0_log.splitlines() if line.startswith("1: ")]
    assert any("exiting with 93" in line for line in second_node), task0_log
    witness = work / "nvrx" / first / "control" / "no_restart"
    assert "exit_code=93" in witness.read_text()
    # srun's code, whatever it was, is what the ledger shows; the witness decided.
    assert entry["action"] == "cancelled_chain", (entry, logs_on_failure(work))
    for array_job_id in queued:
        records = tasks(cluster, array_job_id)
        assert {state(r) for r in records.values()} == {"CANCELLED"}
        assert not any(ran(r) for r in records.values())
    assert squeue_ids(cluster, name) == []


def test_a_drained_node_leaves_with_its_domain_at_the_next_rendezvous(domains: Domains):
    cluster = domains.cluster
    work, name = cluster.workdir("seg-drain"), unique("segdrain")
    [gen] = submit(cluster, work, name, *TWO_DOMAINS_AND_A_SPARE, "--drain-poll-interval", "2")
    drained = ""
    try:
        before, spare, peer = _training_on_two_domains(cluster, work, gen)
        drained = sorted(peer)[1]
        _drain(cluster, drained)
        _drained_marker(work, gen, drained)
        # A rank fault on a node of the other training domain: the next rendezvous.
        _kill_a_rank(cluster, work, sorted(before - peer)[0])
        resumed = started_in_cycle(work, gen, 1, CYCLE_S)
        assert resumed["iteration"] > 0
        active, _ = _cycle(work, gen, 1)
        assert active == (before - peer) | spare, logs_on_failure(work)
        assert not active & domains.of(drained)
    finally:
        cli(cluster, "cancel", name)
        if drained:
            _resume(cluster, drained)
        wait_idle(cluster, name, timeout=120)


def test_segment_2_where_task_0s_node_has_no_cluster_uuid_is_refused_with_the_fix(
    domains: Domains,
):
    cluster = domains.cluster
    # Only the stand-in's answers change: no rebuild, the cluster stays as it is.
    _up(*DOMAINS, "--no-cluster-uuid", "node5", "--mixed-cluster-uuid", "node6")
    try:
        work, name = cluster.workdir("seg-refused"), unique("segrefused")
        # One-node tasks, every one of them on node5: task 0 is there, task 1 waits for
        # it (the refusal ends the generation, whose teardown cancels it).
        done = cli(
            cluster, "submit", *FAST, "--work-dir", str(work), "--job-name", name,
            "--gpus-per-node", "1", "--mode", "train", "--segment", "2",
            "--train-tasks", "2", "--hot-spares", "0", "--cold-spares", "0", "--depth", "1",
            "--json", "--", "--nodelist=node5",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        [gen] = json.loads(done.stdout)["job_ids"]
        [entry] = wait_ledger(work, 1, GENERATION_S)
        wait_idle(cluster, name, timeout=120)
        task0_log = _batch_log(work, name, gen, 0)
        assert "the manifest asks for --ft-segment 2, but this node has no ClusterUUID" in (
            task0_log
        ), task0_log
        assert "no ClusterUUID line for GPU" in task0_log
        assert "Resubmit with --segment auto (or off)" in task0_log
        assert (entry["exit_code"], entry["task0_node"]) == (73, "node5"), entry
        assert not progress(work)  # nothing trained, no rendezvous formed
    finally:
        _up(*DOMAINS)
