"""A node that dies silently (issue 52), on the real cluster at the appliance's defaults:
its link goes first (`cluster kill-node --silent`: a power loss, a dead NIC), so no peer
reads a reset, and only task 0's liveness judge can tell. And the look-alikes that must
take nobody out: a node whose jobs freeze for less than the silence timeout, a 5 s
network blip, a 60 s checkpoint save on one rank; and a frozen node that comes back.

Every timeout is the default (submit's, not the demo's quick ones) but for the pace of
the built-in trainer and the save interval.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from nvrx_appliance.observe.workdir import json_lines
from nvrx_appliance.settings.chain import ChainSpec

from .chain_support import (
    cli,
    cycle_nodes,
    logs_on_failure,
    slow_storage,
    started_in_cycle,
    submit,
    tracker,
    unique,
    wait_event,
    wait_idle,
    wait_in,
    wait_ledger,
)
from .conftest import Cluster, cluster_cli

pytestmark = [pytest.mark.cluster]

DEFAULTS = ChainSpec(work_dir="/")
# Back to submit's own defaults from chain_support's quick ones (the last flag wins).
AT_DEFAULTS = tuple(
    arg
    for name in ("setup_timeout", "step_timeout", "checkpointing_timeout",
                 "out_of_section_timeout", "join_timeout", "store_connect_wait",
                 "rdzv_host_wait", "lease_stale_after")
    for arg in (f"--{name.replace('_', '-')}", str(getattr(DEFAULTS, name)))
)  # fmt: skip
TRAIN = ("--mode", "train", "--train-samples", "10000000", "--cpu-step-pause", "0.1",
         "--save-interval", "10", "--time", "00:20:00")  # fmt: skip
START_S = 240  # a generation's first step on a busy 2-core machine
SILENCE_S = DEFAULTS.node_silence_timeout
LEASE_S = DEFAULTS.lease_stale_after


@contextmanager
def _chain(
    cluster: Cluster, label: str, *flags: str, env=None
) -> Iterator[tuple[Path, str, list[str]]]:
    work, name = cluster.workdir(label), unique(label)
    generations = submit(cluster, work, name, *AT_DEFAULTS, *TRAIN, *flags, env=env)
    try:
        yield work, name, generations
    finally:
        cli(cluster, "cancel", name)
        wait_idle(cluster, name, timeout=180)


def _task0(work: Path, gen: str) -> str:
    record = json.loads((work / "nvrx" / gen / "control" / "rdzv.json").read_text())
    return str(record["host"]).split(".", 1)[0]


def _checkpointed(work: Path, gen: str, cycle: int, after: float = 0.0) -> dict:
    return wait_event(
        work,
        lambda e: e["event"] == "checkpoint" and e.get("slurm_array_job_id") == gen
        and e.get("cycle") == cycle and e["time"] > after,
        START_S,
        f"a checkpoint of generation {gen} in cycle {cycle}",
    )  # fmt: skip


def _deaths(work: Path, gen: str) -> dict[str, dict]:
    folder = work / "nvrx" / gen / "deaths"
    return {p.name[5:]: json.loads(p.read_text()) for p in folder.glob("dead.*")}


def _cycles(work: Path, gen: str) -> list[str]:
    return sorted(p.name for p in (work / "nvrx" / gen / "cycle_infos").glob("cycle_info.*.*.*"))


def test_a_node_that_dies_silently_then_one_that_freezes_are_each_replaced_by_a_hot_spare(
    cluster: Cluster,
):
    # Every node of the cluster: task 0, a peer, and two hot spares, one per death.
    flags = ("--train-tasks", "2", "--hot-spares", "2", "--cold-spares", "0", "--depth", "1")
    victim = frozen = ""
    try:
        with _chain(cluster, "silent-peer", *flags) as (work, name, [gen]):
            # a) The peer's link goes first, then its processes: no peer reads a reset.
            _checkpointed(work, gen, 0)
            active, _ = cycle_nodes(work, gen, 0)
            task0 = _task0(work, gen)
            (victim,) = active - {task0}
            died = time.time()
            assert cluster_cli("kill-node", victim, "--silent").returncode == 0
            saved = _checkpointed(work, gen, 1)
            took = saved["time"] - died
            assert took < 60, f"death -> next checkpoint {took:.1f} s\n{logs_on_failure(work)}"
            [(node, death)] = _deaths(work, gen).items()
            assert (node, death["kind"], death["cycle"]) == (victim, "silent", 0)
            assert re.fullmatch(
                rf"{victim} stopped answering at \d\d:\d\d:\d\d UTC; no reset, no exit: a "
                rf"silent death \(no liveness beat for 1\d s in cycle 0\)",
                death["words"],
            ), death
            assert not list((work / "nvrx" / gen / "hangs").glob("hung.*"))  # no hang named
            status = cli(cluster, "status", name).stdout
            assert f"{victim} stopped answering at " in status, status
            assert "a hot spare took its place in the next cycle" in status, status
            report = cli(cluster, "report", name, "--no-svg").stdout
            assert f"node death: generation {gen}: {victim} stopped answering" in report, report

            # b) The hot spare that took its place freezes whole (its kernel answers, none
            # of its processes runs): taken for dead, replaced by the second spare; when
            # it thaws it leaves, and it is judged once.
            (frozen,) = cycle_nodes(work, gen, 1)[0] - {task0}
            assert cluster_cli("freeze-node", frozen).returncode == 0
            started_in_cycle(work, gen, 2, START_S)
            held = tracker(work) or 0
            assert cluster_cli("thaw-node", frozen).returncode == 0
            frozen_log = _batch_log(work, gen, frozen)
            wait_in(work, lambda: "task 0 took this node for dead" in frozen_log.read_text(),
                    60, f"{frozen} to learn it was taken for dead")  # fmt: skip
            wait_in(work, lambda: "exiting with 79" in frozen_log.read_text(), 60,
                    f"{frozen}'s entrypoint to leave")  # fmt: skip
            moved = _checkpointed(work, gen, 2, after=time.time())
            assert moved["iteration"] > held  # training went on past where it stood
            assert sorted(_deaths(work, gen)) == sorted([victim, frozen])  # each once
            assert _deaths(work, gen)[frozen]["kind"] == "silent"
            assert len(_cycles(work, gen)) == 3, _cycles(work, gen)  # none for its return

        # The generation ended (cancelled): its teardown remembered both, and not task 0's
        # node, whose ranks task 0 itself ended for each restart.
        [entry] = wait_ledger(work, 1, 120)
        assert sorted(d["node"] for d in entry["dead"]) == sorted([victim, frozen]), entry
        kept = {e["node"]: e for e in json_lines(work / "exclusions.jsonl")}
        assert kept[victim]["evidence"] == kept[frozen]["evidence"] == "dead", kept
        assert "a silent death" in kept[victim]["reason"]
        assert task0 not in kept, kept
    finally:
        if frozen:
            cluster_cli("thaw-node", frozen)
        if victim:
            assert cluster_cli("revive-node", victim, timeout=180).returncode == 0


def test_task_0s_node_dying_silently_hands_off_to_the_next_generation_within_its_lease(
    cluster: Cluster,
):
    flags = ("--train-tasks", "2", "--hot-spares", "1", "--cold-spares", "0", "--depth", "2")
    victim = ""
    try:
        with _chain(cluster, "silent-task0", *flags) as (work, _name, [first, second]):
            _checkpointed(work, first, 0)
            victim = _task0(work, first)
            died = time.time()
            assert cluster_cli("kill-node", victim, "--silent").returncode == 0
            saved = _checkpointed(work, second, 0)
            took = saved["time"] - died
            # The target (issue 52) is the lease + 15 s, which the bench row measures
            # (docs/benchmarks.md, silentdeath); on a machine busy with other tests the
            # successor's start-up alone can take 15 s, so the test allows it 30.
            assert took < LEASE_S + 30, f"{took:.1f} s\n{logs_on_failure(work)}"
            assert _task0(work, second) != victim
    finally:
        if victim:
            assert cluster_cli("revive-node", victim, timeout=180).returncode == 0


def _batch_log(work: Path, gen: str, node: str) -> Path:
    for path in (work / "logs").glob(f"slurm-*-{gen}_*.out"):
        if f"({node})" in path.read_text():
            return path
    raise AssertionError(f"no batch log of {node}\n{logs_on_failure(work)}")


def test_a_short_freeze_a_network_blip_and_a_minute_long_save_on_one_rank_take_nobody_out(
    cluster: Cluster,
):
    flags = ("--train-tasks", "2", "--hot-spares", "1", "--cold-spares", "0", "--depth", "1")
    # Rank 1 alone writes its part of every checkpoint for 60 s; the others wait for it.
    env = slow_storage(cluster, NVRX_SLOW_SAVE_S=60, NVRX_SLOW_SAVE_RANK=1)
    with _chain(cluster, "no-false-death", *flags, env=env) as (work, _name, [gen]):
        started_in_cycle(work, gen, 0, START_S)
        saving = work / "checkpoints"
        wait_in(work, lambda: list(saving.glob(".partial_iter_*")), 60, "the first save to begin")
        active, _ = cycle_nodes(work, gen, 0)
        (peer,) = active - {_task0(work, gen)}
        # While that save goes on, two faults a few beats apart (back to back they would
        # be one silence as long as both): the peer's jobs stop for half the silence
        # timeout, then its link goes down for 5 s.
        assert cluster_cli("freeze-node", peer).returncode == 0
        time.sleep(SILENCE_S / 2)  # the freeze itself
        assert cluster_cli("thaw-node", peer).returncode == 0
        time.sleep(3)  # the node runs, and beats, between the two faults
        assert cluster_cli("cut-link", peer, "--seconds", "5").returncode == 0
        saved = _checkpointed(work, gen, 0)
        assert saved["seconds"] >= 60, saved
        wait_event(
            work, lambda e: e["event"] == "step" and e["iteration"] > saved["iteration"],
            60, "a step after the save",
        )  # fmt: skip
        assert _deaths(work, gen) == {}, logs_on_failure(work)
        assert len(_cycles(work, gen)) == 1, logs_on_failure(work)
        assert not list((work / "nvrx" / gen / "hangs").glob("hung.*"))
