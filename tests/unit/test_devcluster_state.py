"""What a second `cluster up` decides from the recorded state and what it sees."""

from __future__ import annotations

import pytest

from nvrx_appliance.devcluster.plan import Params, make_plan
from nvrx_appliance.devcluster.state import (
    CONTROL_DAEMONS,
    Daemon,
    Observed,
    State,
    StateError,
    assess,
    from_json,
    slurmd_key,
)

PLAN = make_plan(Params(nodes=2))
ALL = frozenset([*CONTROL_DAEMONS, slurmd_key("node1"), slurmd_key("node2")])
NAMESPACES = frozenset(h.netns for h in PLAN.hosts)
LINKS = frozenset(h.link for h in PLAN.hosts)


def seen(**changes) -> Observed:
    base = dict(
        alive=ALL,
        namespaces=NAMESPACES,
        links_up=LINKS,
        hosts_ok=True,
        configs_ok=True,
        leftovers=True,
    )
    return Observed(**{**base, **changes})


STATE = State(PLAN.params, {key: Daemon(100 + i, 5000 + i) for i, key in enumerate(sorted(ALL))})


def test_state_survives_a_round_trip_through_json():
    state = State(
        Params(nodes=3),
        {"munged": Daemon(12, 345, None), "slurmd@node1": Daemon(7, 8, "nvrxdc-node1")},
    )
    assert from_json(state.to_json()) == state


@pytest.mark.parametrize(
    "data", [None, [], {"version": 99}, {"version": 1, "params": {"nodes": 2}}]
)
def test_unreadable_state_is_an_error_not_a_guess(data):
    with pytest.raises(StateError):
        from_json(data)


def test_healthy_cluster_asked_for_again_is_left_alone():
    assert assess(PLAN, STATE, seen()).action == "none"


def test_a_clean_machine_gets_a_fresh_build():
    assert assess(PLAN, None, seen(leftovers=False)).action == "build"


def test_leftovers_of_a_killed_up_without_state_are_rebuilt():
    remedy = assess(PLAN, None, seen(alive=frozenset()))
    assert remedy.action == "rebuild" and "partial" in remedy.reason


def test_other_settings_rebuild_and_say_what_changed():
    asked = make_plan(Params(nodes=3))
    remedy = assess(asked, STATE, seen())
    assert remedy.action == "rebuild"
    assert "nodes 2 -> 3" in remedy.reason


@pytest.mark.parametrize(
    ("observed", "why"),
    [
        (seen(configs_ok=False), "configuration"),
        (seen(hosts_ok=False), "/etc/hosts"),
        (seen(namespaces=NAMESPACES - {"nvrxdc-node2"}), "nvrxdc-node2"),
        (seen(links_up=LINKS - {"nvrxdc-ctl"}), "controller"),
    ],
)
def test_broken_shared_parts_rebuild_the_cluster(observed, why):
    remedy = assess(PLAN, STATE, observed)
    assert remedy.action == "rebuild" and why in remedy.reason


def test_dead_or_unplugged_nodes_are_revived_not_rebuilt():
    remedy = assess(PLAN, STATE, seen(alive=ALL - {slurmd_key("node2")}))
    assert (remedy.action, remedy.nodes) == ("revive", ("node2",))
    remedy = assess(PLAN, STATE, seen(links_up=LINKS - {"nvrxdc-node1"}))
    assert (remedy.action, remedy.nodes) == ("revive", ("node1",))


def test_dead_control_daemons_are_restarted_in_place_in_start_order_not_rebuilt():
    # A rebuild would start slurmctld without its saved state: every job and all
    # accounting gone. A real site restarts the daemon.
    remedy = assess(PLAN, STATE, seen(alive=ALL - {"slurmctld", "munged", slurmd_key("node1")}))
    assert remedy.action == "revive"
    assert remedy.daemons == ("munged", "slurmctld") and remedy.nodes == ("node1",)
    assert "munged, slurmctld not running" in remedy.reason
