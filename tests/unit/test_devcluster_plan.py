"""Names, addresses and checks of the local cluster's plan."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from nvrx_appliance.devcluster.plan import (
    DEFAULT_ROOT,
    Params,
    PlanError,
    check_params,
    make_plan,
    overlapping_routes,
    parse_slurm_version,
)


def test_nodes_are_node1_to_nodeN_beside_a_controller_named_ctl():
    p = make_plan(Params(nodes=4, subnet="10.9.8.0/24"))
    assert [n.name for n in p.nodes] == ["node1", "node2", "node3", "node4"]
    assert [n.address for n in p.nodes] == ["10.9.8.11", "10.9.8.12", "10.9.8.13", "10.9.8.14"]
    assert (p.controller.name, p.controller.address) == ("ctl", "10.9.8.2")
    assert p.bridge_address == "10.9.8.1" and p.prefixlen == 24
    assert len({h.address for h in p.hosts} | {p.bridge_address}) == 6  # all distinct


def test_every_interface_name_fits_linux_limit_even_for_the_largest_cluster():
    largest = 254 - 10  # node k is host number 10 + k of 254
    p = make_plan(Params(nodes=largest))
    assert all(len(h.link) <= 15 and len(h.netns) <= 15 for h in p.hosts)
    with pytest.raises(PlanError, match="too small"):
        make_plan(Params(nodes=largest + 1))


def test_unknown_node_names_the_ones_that_exist():
    with pytest.raises(KeyError, match="node1, node2"):
        make_plan(Params(nodes=2)).node("node9")


@pytest.mark.parametrize(
    ("params", "complaint"),
    [
        (Params(nodes=0), "--nodes"),
        (Params(gpus_per_node=-1), "--gpus-per-node"),
        (Params(cpus_per_node=0), "--cpus-per-node"),
        (Params(subnet="not-a-net"), "--subnet"),
        (Params(subnet="8.8.8.0/24"), "private"),
        (Params(subnet="10.0.0.0/29"), "too small"),
    ],
)
def test_bad_options_are_refused_naming_the_option(params, complaint):
    problems = check_params(params)
    assert problems and complaint in problems[0]


def test_work_root_is_not_node_local_scratch():
    root = PurePosixPath(str(make_plan(Params()).paths.work_root))
    assert root.is_relative_to(PurePosixPath(str(DEFAULT_ROOT)))
    for scratch in ("/tmp", "/var/tmp", "/dev/shm"):
        assert not root.is_relative_to(scratch)


def test_subnet_that_shadows_an_existing_route_is_found():
    routes = ["default", "192.0.2.0/24", "172.29.0.0/16", "10.1.2.3"]
    assert overlapping_routes("172.29.41.0/24", routes) == ["172.29.0.0/16"]
    assert overlapping_routes("10.1.2.0/24", routes) == ["10.1.2.3"]
    assert overlapping_routes("10.200.0.0/24", routes) == []


@pytest.mark.parametrize(
    ("text", "version"),
    [("slurm-wlm 22.05.8\n", "22.05"), ("slurm 24.11.5", "24.11"), ("slurm 23.02.10", "23.02")],
)
def test_slurm_version_is_read_as_major_minor(text, version):
    assert parse_slurm_version(text) == version


def test_unreadable_slurm_version_is_an_error():
    with pytest.raises(PlanError, match="Slurm version"):
        parse_slurm_version("command not found")
