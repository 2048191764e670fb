"""Slurm's node states as the cluster reads them, and the status table."""

from __future__ import annotations

import pytest

from nvrx_appliance.devcluster.plan import Params, make_plan
from nvrx_appliance.devcluster.report import (
    in_service,
    parse_node_states,
    seen_dead,
    status_document,
    table,
)
from nvrx_appliance.devcluster.state import CONTROL_DAEMONS, Daemon, Observed, State

# Two lines of `scontrol -o show nodes` from the local cluster (Slurm 22.05).
SCONTROL = (
    "NodeName=node1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=4 CPUTot=4 "
    "Gres=gpu:2 NodeAddr=172.29.41.11 NodeHostName=node1 Version=22.05.8 "
    "OS=Linux 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=24105 State=IDLE "
    "ThreadsPerCore=1 Partitions=main\n"
    "NodeName=node3 Arch=x86_64 CoresPerSocket=1 State=DOWN+NOT_RESPONDING Partitions=main\n"
)


def test_states_are_read_per_node_despite_spaces_in_other_fields():
    assert parse_node_states(SCONTROL) == {"node1": "IDLE", "node3": "DOWN+NOT_RESPONDING"}
    assert parse_node_states("") == {}


@pytest.mark.parametrize(
    ("state", "usable", "dead"),
    [
        ("IDLE", True, False),
        ("MIXED", True, False),
        ("ALLOCATED", True, False),
        ("IDLE+NOT_RESPONDING", False, True),
        ("DOWN+NOT_RESPONDING", False, True),
        ("DOWN", False, True),
        ("IDLE+DRAIN", False, False),
        ("UNKNOWN", False, False),
        ("", False, False),
    ],
)
def test_a_node_is_in_service_only_without_trouble_flags(state, usable, dead):
    assert in_service(state) is usable
    assert seen_dead(state) is dead


def test_table_shows_each_daemon_and_node_and_says_what_is_wrong():
    status = {
        "up": False,
        "reason": "node(s) node2 are down",
        "slurm_version": "22.05",
        "slurm_conf": "/r/etc/slurm.conf",
        "work_root": "/r/work",
        "daemons": [{"name": "slurmctld", "host": "ctl", "pid": 42, "running": True}],
        "nodes": [
            {
                "name": "node2",
                "address": "10.0.0.12",
                "link_up": False,
                "slurmd_running": False,
                "slurm_state": "DOWN+NOT_RESPONDING",
            },
        ],
    }
    text = table(status)
    assert "NOT UP (node(s) node2 are down)" in text
    assert "slurmctld" in text and "42" in text
    assert "node2" in text and "DOWN+NOT_RESPONDING" in text
    assert table({"up": False, "reason": "no cluster"}) == "cluster: NOT UP (no cluster)\n"


def _cluster(alive_slurmd: tuple[str, ...]):
    plan = make_plan(Params(nodes=2))
    keys = [*CONTROL_DAEMONS, "slurmd@node1", "slurmd@node2"]
    state = State(plan.params, {k: Daemon(10 + i, 1) for i, k in enumerate(keys)})
    seen = Observed(
        alive=frozenset([*CONTROL_DAEMONS, *(f"slurmd@{n}" for n in alive_slurmd)]),
        namespaces=frozenset(h.netns for h in plan.hosts),
        links_up=frozenset(h.link for h in plan.hosts),
        hosts_ok=True,
        configs_ok=True,
        leftovers=True,
    )
    return plan, state, seen


def test_status_is_up_only_with_every_daemon_running_and_every_node_in_service():
    plan, state, seen = _cluster(("node1", "node2"))
    doc = status_document(plan, state, seen, {"node1": "IDLE", "node2": "MIXED"})
    assert doc["up"] and [n["name"] for n in doc["nodes"]] == ["node1", "node2"]
    assert [d["pid"] for d in doc["daemons"]] == [10, 11, 12, 13, 14, 15]
    assert doc["controller"] == {"name": "ctl", "address": "172.29.41.2", "netns": "nvrxdc-ctl"}

    drained = status_document(plan, state, seen, {"node1": "IDLE", "node2": "IDLE+DRAIN"})
    assert not drained["up"] and "not every node is in service" in drained["reason"]


def test_status_of_a_killed_node_names_it_and_shows_slurms_view():
    plan, state, seen = _cluster(("node1",))
    doc = status_document(plan, state, seen, {"node1": "IDLE", "node2": "DOWN+NOT_RESPONDING"})
    assert not doc["up"] and "node2" in doc["reason"]
    node2 = doc["nodes"][1]
    assert (node2["slurmd_running"], node2["seen_dead"]) == (False, True)
