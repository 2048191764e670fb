"""Bad nodes stay out of the run (issue 23), on the real cluster: real sinfo, squeue,
scontrol drain and ExcNodeList, real ft_launcher 0.7.0 asking the entrypoint's drain
check at each rendezvous.

a) a drained training node leaves at the next rendezvous and the hot spare takes its
   place; a drained task 0 hands the chain to the next generation instead;
b) Slurm unreachable during a poll: no marker changes;
c) a node whose ranks fail repeatedly in generation 1 is in generation 2's ExcNodeList,
   and generation 2 trains elsewhere;
d) the cap: the exclusion record never leaves the partition too small for the array.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from nvrx_appliance.jobhost import drain_poller
from nvrx_appliance.observe import exclusions
from nvrx_appliance.observe.run_files import json_lines
from nvrx_appliance.observe.slurm_output import expand_nodelist

from .chain_support import (
    CLI,
    cli,
    cycle_nodes,
    logs_on_failure,
    progress,
    ran,
    started_in_cycle,
    submit,
    tasks,
    unique,
    wait_event,
    wait_idle,
    wait_ledger,
    worker_pids,
)
from .conftest import Cluster

pytestmark = [pytest.mark.cluster]

CYCLE_S = 180  # a fault noticed, the next rendezvous formed, training resumed
POLL_S = 2  # the drain poller's interval in these tests (minutes by default)


# --- helpers ----------------------------------------------------------------------------


def _node(cluster: Cluster, array_job_id: str, task: int) -> str:
    def placed() -> str:
        record = tasks(cluster, array_job_id).get(task)
        return record["NodeList"] if record and ran(record) else ""

    return cluster.wait_until(placed, CYCLE_S, f"task {task} of {array_job_id} to start")


def _kill_a_rank(cluster: Cluster, work: Path, node: str) -> None:
    pids = cluster.wait_until(lambda: worker_pids(work, node), 60, f"a rank on {node}", 0.5)
    os.kill(pids[0], signal.SIGKILL)


def _drain(cluster: Cluster, node: str) -> None:
    cluster.slurm("scontrol", "update", f"nodename={node}", "state=drain", "reason=issue 23 test")


def _resume(cluster: Cluster, node: str) -> None:
    cluster.slurm("scontrol", "update", f"nodename={node}", "state=resume", check=False)


def _drained_marker(work: Path, array_job_id: str, node: str) -> Path:
    def found() -> Path | None:
        for path in sorted((work / "nvrx" / array_job_id / "drain").glob("task_*")):
            if node in drain_poller.drained_in(path.read_text()):
                return path
        return None

    return Cluster.wait_until(found, 60, f"the drain poller to mark {node}", 0.5)


def _excluded(cluster: Cluster, job_id: str) -> set[str]:
    out = cluster.slurm("squeue", "-h", "-j", job_id, "-o", "%x").stdout.split()
    return set(expand_nodelist(out[0])) if out else set()


def _remembered(work: Path, array_job_id: str) -> list[dict]:
    """The exclusion record's lines a generation's teardown wrote (after its ledger line)."""
    record = (work / "exclusions.jsonl").read_text() if (work / "exclusions.jsonl").exists() else ""
    return [
        {"node": e["node"], "reason": e["reason"]}
        for e in json_lines(record)
        if e.get("kind") == exclusions.EXCLUDED and e.get("generation") == array_job_id
    ]


@contextmanager
def _chain(cluster: Cluster, label: str, *flags: str) -> Iterator[tuple[Path, str, list, list]]:
    """A chain in train mode without cold spares: (work dir, name, its generations, the
    nodes the test drains); afterwards cancelled, its drained nodes resumed, idle."""
    work, name = cluster.workdir(label), unique(label)
    generations = submit(cluster, work, name, "--mode", "train", "--cold-spares", "0", *flags)
    drained: list[str] = []
    try:
        yield work, name, generations, drained
    finally:
        cli(cluster, "cancel", name)
        for node in drained:
            _resume(cluster, node)
        wait_idle(cluster, name, timeout=120)


def _status(cluster: Cluster, name: str) -> str:
    """`status` as a person runs it, on a terminal wide enough for its tables."""
    done = subprocess.run(
        [CLI, "status", name], env=cluster.env(COLUMNS="250"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    return done.stdout


# --- a) drained nodes leave at the next rendezvous ----------------------------------------


@pytest.mark.disruptive
def test_a_drained_training_node_leaves_at_the_next_rendezvous_and_the_hot_spare_replaces_it(
    cluster: Cluster,
):
    flags = ("--train-tasks", "2", "--hot-spares", "1", "--depth", "1",
             "--drain-poll-interval", str(POLL_S))  # fmt: skip
    with _chain(cluster, "drain", *flags) as (work, _name, [gen], drained):
        started_in_cycle(work, gen, 0, CYCLE_S)
        task0 = _node(cluster, gen, 0)
        active, _ = cycle_nodes(work, gen, 0)
        (peer,) = active - {task0}
        (hot,) = {_node(cluster, gen, t) for t in (1, 2)} - {peer}

        drained.append(peer)
        _drain(cluster, peer)
        marker = _drained_marker(work, gen, peer)
        # Not at once: the running cycle trains on after the poller marked the node, to
        # a checkpoint that the next cycle resumes from.
        marked = marker.stat().st_mtime
        wait_event(
            work,
            lambda e: e["event"] == "checkpoint" and e.get("cycle") == 0
            and e.get("slurm_array_job_id") == gen and e["time"] > marked + 1,
            CYCLE_S,
            "cycle 0 to train on to a checkpoint after the drain",
        )  # fmt: skip
        assert not (work / "nvrx" / gen / "cycle_infos" / f"cycle_info.{gen}.0.1").exists()

        _kill_a_rank(cluster, work, task0)  # a rank fault: the next rendezvous
        resumed = started_in_cycle(work, gen, 1, CYCLE_S)
        assert resumed["iteration"] > 0
        active, standby = cycle_nodes(work, gen, 1)
        assert active == {task0, hot} and peer not in standby, logs_on_failure(work)
        launcher_log = (work / "nvrx" / gen / "logs" / "ft_launcher.log").read_text()
        assert f"[{peer}]" in launcher_log and "Slurm has drained" in launcher_log


@pytest.mark.disruptive
def test_a_drained_task_0_hands_the_chain_to_the_next_generation_instead_of_hosting(
    cluster: Cluster,
):
    flags = ("--train-tasks", "1", "--hot-spares", "1", "--depth", "2",
             "--drain-poll-interval", str(POLL_S))  # fmt: skip
    with _chain(cluster, "drain0", *flags) as (work, _name, [first, second], drained):
        started_in_cycle(work, first, 0, CYCLE_S)
        task0 = _node(cluster, first, 0)
        wait_event(work, lambda e: e["event"] == "checkpoint", CYCLE_S, "a first checkpoint")
        drained.append(task0)
        _drain(cluster, task0)
        _drained_marker(work, first, task0)
        _kill_a_rank(cluster, work, task0)

        [entry] = wait_ledger(work, 1, CYCLE_S)
        assert entry["array_job_id"] == first and entry["drained"] == [task0]
        assert entry["action"] == "released_spares" and entry["exit_code"] not in (0, 93)
        resumed = started_in_cycle(
            work, second, 0, CYCLE_S
        )  # so the first generation's teardown ended
        assert resumed["host"] != task0 and resumed["iteration"] > 0
        assert task0 not in {e["node"] for e in _remembered(work, first)}  # Slurm's, not ours
        assert not (work / "nvrx" / first / "cycle_infos" / f"cycle_info.{first}.0.1").exists()


# --- b) Slurm unreachable during a poll ------------------------------------------------------


def _poll_once(cluster: Cluster, directory: Path, array_job_id: str, timeout: int):
    return subprocess.run(
        [sys.executable, drain_poller.__file__, "--array-job-id", array_job_id,
         "--generation", f"test/{array_job_id}/", "--dir", str(directory),
         "--interval", "1", "--timeout", str(timeout), "--once"],
        env=cluster.env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _running(cluster: Cluster, array: str) -> dict[str, str] | None:
    """task -> node, once both tasks of the array run."""
    out = cluster.slurm("squeue", "-h", "-r", "-j", array, "-t", "R", "-o", "%K %N").stdout
    placed = dict(line.split() for line in out.splitlines())
    return placed if len(placed) == 2 else None


def _markers(directory: Path) -> dict[str, tuple[str, int]]:
    return {p.name: (p.read_text(), p.stat().st_ino) for p in directory.glob("task_*")}


def test_a_poll_that_slurm_does_not_answer_changes_no_marker(cluster: Cluster):
    work = cluster.workdir("drainpoll")
    array = cluster.sbatch(
        "--array=0-1", "--exclusive", f"--job-name={unique('drainpoll')}", f"--chdir={work}",
        f"--output={work}/task_%a.out", "--wrap", "sleep 600",
    )  # fmt: skip
    directory = work / "drain"
    controller = next(d["pid"] for d in cluster.status["daemons"] if d["name"] == "slurmctld")
    node = ""
    try:
        placed = cluster.wait_until(lambda: _running(cluster, array), 60, "both tasks", 0.5)
        node = placed["1"]
        _drain(cluster, node)
        first = _poll_once(cluster, directory, array, timeout=20)
        assert first.returncode == 0, first.stderr
        before = _markers(directory)
        assert set(before) == {"task_0", "task_1"}
        assert drain_poller.drained_in(before["task_1"][0]) == [node]

        os.kill(controller, signal.SIGSTOP)  # the controller stops answering
        try:
            blind = _poll_once(cluster, directory, array, timeout=3)
        finally:
            os.kill(controller, signal.SIGCONT)
        assert "pass skipped, every marker kept as it was" in blind.stderr
        assert _markers(directory) == before  # same text, same file: nothing rewritten
        last = (directory / "last_poll").read_text()
        assert "outcome=skipped: sinfo did not answer within 3 s" in last
        assert f"drained={node}\n" in last
    finally:
        if node:
            _resume(cluster, node)
        cluster.slurm("scancel", array, check=False)


# --- c) and d): memory across generations ----------------------------------------------------


def _ends_on_its_own(cluster: Cluster, work: Path, array_job_id: str, node: str) -> dict:
    """Kill a rank on `node` once ft_launcher has no restart left: the generation ends on
    its own, as generations do, and task 0's teardown runs while its job still lives (an
    scancel would let Slurm count the job finished at once and start the next generation
    while the teardown still ran: docs/how-it-works.md, "The chain remembers bad nodes")."""
    _kill_a_rank(cluster, work, node)
    [entry] = wait_ledger(work, 1, CYCLE_S)
    assert entry["array_job_id"] == array_job_id and entry["exit_code"] not in (0, 93), entry
    return entry


def test_a_node_whose_ranks_fail_repeatedly_is_kept_out_of_the_next_generation(cluster: Cluster):
    flags = ("--train-tasks", "2", "--hot-spares", "0", "--depth", "2",
             "--exclude-after-failures", "3", "--max-no-progress-cycles", "10",
             "--max-restarts", "3")  # fmt: skip
    with _chain(cluster, "memory", *flags) as (work, name, [first, second], _drained):
        # A checkpoint first, for the next generation to resume from: a rank killed as
        # its cycle starts dies in its setup (CI once killed all four before any save).
        saved = wait_event(
            work, lambda e: e["event"] == "checkpoint" and e.get("slurm_array_job_id") == first,
            CYCLE_S, f"generation {first} to save",
        )  # fmt: skip
        bad = _node(cluster, first, 1)  # task 1's node: not the rendezvous host
        for cycle in (1, 2, 3):
            _kill_a_rank(cluster, work, bad)
            started_in_cycle(work, first, cycle, CYCLE_S)
        # The fourth finds no restart left. The workload guards account for every
        # failure, that one too (NVRx's log names only those it restarts from), and each
        # cycle's earliest is this node's: a killed rank, not its peers' broken collectives.
        entry = _ends_on_its_own(cluster, work, first, bad)

        reason = "its ranks failed 4 times in one generation"
        assert bad in _excluded(cluster, second)  # applied: so remembered before
        assert {"node": bad, "reason": reason} in _remembered(work, first), entry
        resumed = started_in_cycle(work, second, 0, CYCLE_S)
        hosts = {e["host"] for e in progress(work)
                 if e["event"] == "start" and e.get("slurm_array_job_id") == second}  # fmt: skip
        assert bad not in hosts and resumed["iteration"] >= saved["iteration"] > 0, resumed
        shown = _status(cluster, name)
        assert "nodes kept out of the queued generations" in shown and bad in shown


def test_the_cap_leaves_the_partition_room_for_the_array_and_says_so(cluster: Cluster):
    # Three bad nodes already in the record, as nvrx-watch --act would leave them; the
    # array is 2 tasks of 1 node on a 4-node partition, so only two may be kept out.
    record = "".join(
        exclusions.excluded_line(node, "test", since=f"2026-01-01T00:00:0{i}Z",
                                 until="2999-01-01T00:00:00Z", chain="test", generation="0",
                                 by="nvrx-watch")
        for i, node in enumerate(cluster.nodes[1:])
    )  # fmt: skip
    flags = ("--train-tasks", "2", "--hot-spares", "0", "--depth", "2", "--max-restarts", "0")
    with _chain(cluster, "cap", *flags) as (work, name, [first, second], _drained):
        (work / "exclusions.jsonl").write_text(record)  # before the first teardown reads it
        started_in_cycle(work, first, 0, CYCLE_S)
        _ends_on_its_own(cluster, work, first, _node(cluster, first, 1))
        kept, capped = set(cluster.nodes[1:3]), cluster.nodes[3]  # the oldest two are kept
        cluster.wait_until(lambda: _excluded(cluster, second) == kept, 30, "the ExcNodeList", 0.5)
        applied = exclusions.read((work / "exclusions.jsonl").read_text(), "2026-06-01T00:00:00Z")
        assert applied.applied is not None and applied.applied.capped == (capped,)
        batch_log = (work / "logs" / f"slurm-{name}-{first}_0.out").read_text()
        assert f"the cap: {capped} stay(s) eligible" in batch_log
        assert "the array needs 2" in batch_log
        assert "NOT applied: the cap" in _status(cluster, name)
        resumed = started_in_cycle(work, second, 0, CYCLE_S)
        assert resumed["host"] not in kept
