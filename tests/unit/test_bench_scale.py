"""The growth benchmark's pure parts (bench/scale.py, bench/segment.py): the chain each
size submits is one `submit` accepts, the victim of the segment scenario is a node of
another task's domain, and the growth table says how a figure grows per doubling."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from bench import scale, segment
from nvrx_appliance.cli.main import cli

DOMAINS = {"node1": "a", "node2": "a", "node3": "b", "node4": "b", "node5": "c", "node6": "c"}


def test_the_victim_is_the_second_node_of_a_training_domain_that_is_not_task_0s():
    assert segment.victim_of(["node1", "node2", "node3", "node4"], "node1", DOMAINS) == "node4"
    assert segment.victim_of(["node3", "node4", "node5", "node6"], "node5", DOMAINS) == "node4"


def test_no_victim_when_only_task_0s_domain_trains():
    with pytest.raises(segment.extract.Incomplete, match="no domain but task 0's"):
        segment.victim_of(["node1", "node2"], "node2", DOMAINS)


def test_quick_flags_drops_the_named_options_with_their_values():
    flags = segment.quick_flags("--segment", "--save-interval")
    assert "--segment" not in flags and "--save-interval" not in flags
    assert flags[flags.index("--lease-stale-after") + 1] == "10"
    assert len(flags) % 2 == 0


@pytest.mark.parametrize("nodes", [4, 8, 16])
def test_each_size_submits_a_chain_of_two_node_tasks_that_fills_the_cluster(tmp_path, nodes):
    flags = scale.chain_flags(nodes, depth=3)
    done = CliRunner().invoke(
        cli,
        ["submit", *flags, "--work-dir", "/shared/bench/run", "--python", sys.executable,
         "--dry-run", "--json"],
        env={"SLURM_CONF": str(tmp_path / "absent.conf")},
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    plan = json.loads(done.stdout)
    assert plan["shape"]["array_size"] * 2 == nodes
    world = (nodes // 2 - 1) * 2
    # The injected fault hits the last training rank, never task 0's first node.
    assert flags[flags.index("--fault-ranks") + 1] == str(world - 1)
    assert "--step-pause" in plan["workload"]


def _samples(start: list[float], watch: list[float]) -> list[dict]:
    out = []
    for nodes, gate, cold in zip((4, 8, 16), start, watch, strict=True):
        out += [
            {"nodes": nodes, "kind": "start", "gate_s": gate, "total_s": gate + 5,
             "phases": {"import torch": gate / 2}},
            {"nodes": nodes, "kind": "restart", "total_s": 4.0, "phases": {"detection": 1.0}},
            {"nodes": nodes, "kind": "handoff", "total_s": 9.0, "dying_s": 4.0, "phases": {}},
            {"nodes": nodes, "kind": "watch", "cold": [cold, cold * 3], "warm": [0.1]},
            {"nodes": nodes, "kind": "machine", "memory_peak_gib": nodes / 2, "cpu_busy_pct": 50.0},
        ]  # fmt: skip
    return out


def _row(table: str, label: str) -> list[str]:
    [line] = [x for x in table.splitlines() if x.startswith(f"| {label} |")]
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_the_growth_table_gives_each_size_and_the_growth_per_doubling():
    table = scale.growth_table(_samples(start=[1.0, 2.0, 4.0], watch=[0.2, 0.2, 0.2]))
    assert table.splitlines()[0].startswith("| measure (median s) | 4 nodes | 8 nodes | 16 nodes")
    assert _row(table, "start gate: task 0 starts -> the round closes")[1:] == [
        "1.00", "2.00", "4.00", "x2.00"
    ]  # fmt: skip
    assert _row(table, "- import torch (every worker at once)")[-1] == "x2.00"
    assert _row(table, "in-job restart: fault -> first step")[-1] == "x1.00"
    # A pass's median is over all its passes at that size: (0.2, 0.6) -> 0.4.
    assert _row(table, "watcher pass, cold (a new process, as cron runs it)")[1] == "0.40"
    assert _row(table, "memory in use, most (GiB)")[1:4] == ["2", "4", "8"]
    assert _row(table, "- detection")[1:] == ["1.00", "1.00", "1.00", "x1.00"]


def test_a_measure_missing_at_a_size_shows_a_dash_and_the_growth_of_the_rest():
    samples = [s for s in _samples([1.0, 3.0, 9.0], [0.2] * 3) if s["nodes"] != 8]
    row = _row(scale.growth_table(samples), "start gate: task 0 starts -> the round closes")
    # 4 -> 16 nodes is two doublings: 9x over two is 3x per doubling.
    assert row[1:] == ["1.00", "9.00", "x3.00"]


def _events(*rows: tuple[str, str, float]) -> list:
    from bench.timing import NvrxEvent

    return [NvrxEvent(cycle=1, event=e, host=h, time=t) for e, h, t in rows]


def test_the_restart_is_told_by_rank_0s_host_when_it_trained_before_the_failure():
    from bench.extract import restart_host

    events = _events(
        ("failure_detected", "node1", 1.0), ("worker_terminated", "node1", 2.0),
        ("rendezvous_started", "node1", 3.0), ("failure_detected", "node3", 0.5),
        ("worker_terminated", "node3", 1.5), ("rendezvous_started", "node3", 2.5),
    )  # fmt: skip
    assert restart_host(events, 1, "node1") == "node1"


def test_a_standby_that_became_rank_0s_host_leaves_the_story_to_a_host_that_trained():
    from bench.extract import restart_host

    # NVRx moved the work to the spare domain (node1-2): node1 only joined the round.
    events = _events(
        ("rendezvous_started", "node1", 0.2), ("failure_detected", "node4", 1.0),
        ("worker_terminated", "node4", 2.0), ("rendezvous_started", "node4", 3.0),
        ("failure_detected", "node3", 1.1), ("worker_terminated", "node3", 2.1),
        ("rendezvous_started", "node3", 2.9),
    )  # fmt: skip
    assert restart_host(events, 1, "node1") == "node3"


def test_a_cycle_info_name_nvrx_padded_is_read_as_the_node_it_means():
    # NVRx 0.7.0 writes node1..node14 as node[01-14] in its cycle-info files.
    nodes = [f"node{n}" for n in range(1, 17)]
    assert scale.real_name("node01", nodes) == "node1"
    assert scale.real_name("node14", nodes) == "node14"
    assert scale.real_name("node007", ["node007"]) == "node007"
    assert scale.real_name("login", nodes) == "login"
