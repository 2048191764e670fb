"""`nvrx-appliance demo --segment` (`make demo SEGMENT=1`): the hand-off demo in segment
mode, on a local cluster whose NVLink domains are what its tasks need."""

from __future__ import annotations

from click.testing import CliRunner

from nvrx_appliance import api
from nvrx_appliance.cli import demo as demo_cli
from nvrx_appliance.devcluster.plan import Params, check_params
from nvrx_appliance.settings.chain import derive
from nvrx_appliance.workflows import demo


def _cluster_params() -> Params:
    options = dict(zip(demo.SEGMENT_CLUSTER[::2], demo.SEGMENT_CLUSTER[1::2], strict=True))
    return Params(nodes=int(options["--nodes"]),
                  nvlink_domain_size=int(options["--nvlink-domain-size"]))  # fmt: skip


def test_the_segment_demo_is_a_valid_chain_of_one_domain_per_task_on_whole_domains():
    spec = api.chain_spec(environ={}, work_dir="/shared/demo", job_name="nvrx-demo",
                          **demo.SEGMENT_DEMO)  # fmt: skip
    params = _cluster_params()
    assert check_params(params) == []
    assert spec.nodes_per_task == params.nvlink_domain_size == int(spec.segment)
    assert spec.mode == "handoff"
    # Task 0, the hot spare and the cold spare each get a domain of their own.
    tasks = spec.train_tasks + spec.hot_spares + spec.cold_spares
    assert tasks * spec.nodes_per_task == params.nodes
    assert derive(spec).min_nodes % int(spec.segment) == 0


def test_the_plain_demo_stays_in_simple_mode_on_the_default_cluster():
    assert demo.DEMO["segment"] == "off" and "nodes_per_task" not in demo.DEMO


def test_demo_segment_asks_the_workflow_for_segment_mode(monkeypatch):
    asked = []

    def fake_run(say, *, segment=False):
        asked.append(segment)
        raise demo.DemoFailed("stopped here by the test")

    monkeypatch.setattr(demo, "run", fake_run)
    done = CliRunner().invoke(demo_cli.demo_command, ["--segment"])
    assert asked == [True] and done.exit_code == 1
    assert "stopped here by the test" in done.output
    assert "--segment" in CliRunner().invoke(demo_cli.demo_command, ["--help"]).output


def test_the_segment_demo_says_which_nodes_share_a_cluster_uuid():
    status = {"nodes": [{"name": "node1", "cluster_uuid": "a"}, {"name": "node2", "cluster_uuid": "a"},
                        {"name": "node3", "cluster_uuid": "b"}, {"name": "node4", "cluster_uuid": ""}]}  # fmt: skip
    assert demo._domains_line(status) == (
        "node1+node2 ClusterUUID a; node3 ClusterUUID b; node4 ClusterUUID none"
    )
