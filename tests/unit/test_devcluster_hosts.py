"""The marked /etc/hosts block: added, replaced and removed without touching other lines."""

from __future__ import annotations

from nvrx_appliance.devcluster import hosts

MACHINE = "127.0.0.1 localhost\n::1 localhost ip6-localhost\n10.0.0.5 build-box # the CI box\n"
ENTRIES = [("172.29.41.2", "ctl"), ("172.29.41.11", "node1")]


def test_adding_then_removing_the_block_restores_the_file_exactly():
    added = hosts.with_block(MACHINE, ENTRIES)
    assert added.startswith(MACHINE)
    assert "172.29.41.11\tnode1\n" in added
    assert hosts.without_block(added) == MACHINE


def test_adding_twice_leaves_one_block():
    twice = hosts.with_block(hosts.with_block(MACHINE, ENTRIES), ENTRIES)
    assert twice.count(hosts.BEGIN) == 1
    assert hosts.has_block(twice, ENTRIES)


def test_a_changed_cluster_replaces_the_old_block():
    old = hosts.with_block(MACHINE, ENTRIES)
    new_entries = [("10.5.0.2", "ctl")]
    new = hosts.with_block(old, new_entries)
    assert "node1" not in new and "10.5.0.2\tctl" in new
    assert not hosts.has_block(new, ENTRIES)


def test_a_file_without_final_newline_keeps_its_last_line():
    text = "127.0.0.1 localhost"
    added = hosts.with_block(text, ENTRIES)
    assert added.startswith("127.0.0.1 localhost\n")
    assert hosts.without_block(added) == "127.0.0.1 localhost\n"


def test_lines_after_a_torn_block_survive_its_removal():
    torn = MACHINE + hosts.BEGIN + "\n172.29.41.2\tctl\n" + "10.0.0.9 added-later\n"
    assert hosts.without_block(torn) == MACHINE + "10.0.0.9 added-later\n"


def test_names_the_machine_already_uses_are_reported_but_ours_are_not():
    text = hosts.with_block(MACHINE + "10.1.1.1 node2 ctl.example ctl\n", ENTRIES)
    assert hosts.foreign_names(text, ["ctl", "node1", "node2", "node3"]) == ["ctl", "node2"]
    assert hosts.foreign_names(MACHINE, ["ctl", "node1"]) == []
    # a name in a comment is not a definition
    assert hosts.foreign_names(MACHINE, ["the", "CI"]) == []
