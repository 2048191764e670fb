"""The local cluster's NVLink domains: the nvidia-smi stand-in, read by NVRx 0.7.0's own
parser and by the entrypoint's, exactly as they run it (the first nvidia-smi on PATH)."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
from nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier import (
    _parse_domain_id_from_nvidia_smi as nvrx_domain_id,
)

from nvrx_appliance.devcluster import cluster, cluster_conf, nvlink
from nvrx_appliance.devcluster.plan import Params, PlanError, check_params, make_plan
from nvrx_appliance.devcluster.state import Daemon, Observed, State, assess, from_json
from nvrx_appliance.node import node_probe


def plan(root: Path = Path("/srv/devcluster-under-test"), **overrides):
    return make_plan(Params(**{"nodes": 6, "nvlink_domain_size": 2, **overrides}), root)


def installed(tmp_path: Path, monkeypatch, node: str, **overrides) -> Path:
    """The stand-in and its answers written as `cluster up` writes them, with `node`'s
    answer under this machine's hostname (the stand-in picks its answer by hostname,
    which on the cluster is the node's name), and its directory first on PATH."""
    p = plan(tmp_path, **overrides)
    for path, text in nvlink.files(p).items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
        Path(path).chmod(0o755)
    here = p.paths.nvidia_smi_answer(socket.gethostname())
    here.write_text(nvlink.answer(p, node))
    monkeypatch.setenv("PATH", f"{p.paths.nvidia_smi_dir}:{os.environ['PATH']}")
    return p.paths.nvidia_smi_dir / "nvidia-smi"


def test_each_domain_of_two_nodes_reports_its_own_cluster_uuid_to_nvrx(tmp_path, monkeypatch):
    seen = {}
    for node in ("node1", "node2", "node3", "node4", "node5", "node6"):
        installed(tmp_path, monkeypatch, node)
        seen[node] = nvrx_domain_id()
    assert seen["node1"] == seen["node2"] == nvlink.domain_cluster_uuid(1)
    assert seen["node3"] == seen["node4"] == nvlink.domain_cluster_uuid(2)
    assert seen["node5"] == seen["node6"] == nvlink.domain_cluster_uuid(3)
    assert len(set(seen.values())) == 3


def test_the_entrypoint_reads_the_same_domain_from_every_gpu(tmp_path, monkeypatch):
    installed(tmp_path, monkeypatch, "node4")
    fabric = node_probe.node_fabric()
    assert fabric.cluster_uuid == nvlink.domain_cluster_uuid(2)
    assert len(fabric.gpus) == 2 and "stand-in" in fabric.gpus[0].name


def test_a_node_without_a_cluster_uuid_is_refused_by_both_parsers(tmp_path, monkeypatch):
    installed(tmp_path, monkeypatch, "node6", no_cluster_uuid=("node6",))
    with pytest.raises(RuntimeError, match="ClusterUUID not found"):
        nvrx_domain_id()
    fabric = node_probe.node_fabric()
    assert fabric.cluster_uuid is None and "no ClusterUUID line" in fabric.reason


def test_gpus_that_disagree_pass_nvrx_but_not_the_entrypoint(tmp_path, monkeypatch):
    # NVRx takes the first ClusterUUID line it sees: this node would join domain 3.
    installed(tmp_path, monkeypatch, "node5", mixed_cluster_uuid=("node5",))
    assert nvrx_domain_id() == nvlink.domain_cluster_uuid(3)
    fabric = node_probe.node_fabric()
    assert fabric.cluster_uuid is None and "GPUs disagree" in fabric.reason
    assert nvlink.domain_cluster_uuid(4) in fabric.reason


def test_the_stand_in_says_what_it_is_and_answers_only_dash_q(tmp_path, monkeypatch):
    binary = installed(tmp_path, monkeypatch, "node1")
    assert "STAND-IN nvidia-smi" in binary.read_text()
    done = subprocess.run([str(binary), "-L"], capture_output=True, text=True)
    assert done.returncode == 2 and "stand-in" in done.stderr and "only -q" in done.stderr
    assert nvlink.STANDIN in subprocess.run([str(binary), "-q"], capture_output=True,
                                            text=True).stdout  # fmt: skip


def test_a_node_the_stand_in_has_no_answer_for_fails_as_nvidia_smi_would(tmp_path, monkeypatch):
    binary = installed(tmp_path, monkeypatch, "node1")
    (binary.parent.parent / "answers" / f"{socket.gethostname()}.txt").unlink()
    with pytest.raises(RuntimeError, match="return code"):
        nvrx_domain_id()
    assert node_probe.node_fabric().cluster_uuid is None


def test_the_task_prolog_puts_the_stand_in_first_on_every_job_steps_path():
    p = plan()
    assert cluster_conf.slurm_conf(p).count(f"TaskProlog={p.paths.task_prolog}\n") == 1
    files = nvlink.files(p)
    prolog = files[str(p.paths.task_prolog)]
    done = subprocess.run(
        ["sh", "-c", prolog], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}
    )
    assert done.stdout == f"export PATH={p.paths.nvidia_smi_dir}:/usr/bin:/bin\n"
    assert sorted(files) == sorted(
        [str(p.paths.task_prolog), str(p.paths.nvidia_smi_dir / "nvidia-smi")]
        + [str(p.paths.nvidia_smi_answer(f"node{k}")) for k in range(1, 7)]
    )


def test_the_default_cluster_has_no_nvidia_smi_and_no_task_prolog():
    p = make_plan(Params())
    assert nvlink.files(p) == {}
    assert "TaskProlog" not in cluster_conf.slurm_conf(p)
    assert nvlink.domains(p) == {}


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"nodes": 5}, "--nodes 5 is not a whole number of NVLink domains"),
        ({"gpus_per_node": 0}, "--nvlink-domain-size needs GPUs"),
        ({"nvlink_domain_size": -1}, "--nvlink-domain-size must be 0"),
        ({"no_cluster_uuid": ("node9",)}, "node9, which is not a node of this cluster"),
        ({"no_cluster_uuid": ("node2",), "mixed_cluster_uuid": ("node2",)}, "pick one"),
        ({"nvlink_domain_size": 0, "no_cluster_uuid": ("node1",)}, "add --nvlink-domain-size"),
    ],
)
def test_options_that_cannot_make_domains_are_refused_with_the_fix(overrides, problem):
    params = Params(**{"nodes": 6, "nvlink_domain_size": 2, **overrides})
    assert any(problem in p for p in check_params(params)), check_params(params)
    with pytest.raises(PlanError):
        make_plan(params)


def _healthy(p) -> tuple[State, Observed]:
    keys = frozenset(["munged", "mariadbd", "slurmdbd", "slurmctld"]
                     + [f"slurmd@{n.name}" for n in p.nodes])  # fmt: skip
    state = State(p.params, {k: Daemon(1, 1) for k in keys})
    seen = Observed(
        alive=keys,
        namespaces=frozenset(h.netns for h in p.hosts),
        links_up=frozenset(h.link for h in p.hosts),
        hosts_ok=True,
        configs_ok=True,
        leftovers=True,
    )
    return state, seen


def test_changing_only_what_the_stand_in_answers_rebuilds_nothing():
    before = plan()
    state, seen = _healthy(before)
    after = plan(no_cluster_uuid=("node6",), mixed_cluster_uuid=("node5",))
    assert assess(after, state, seen).action == "nvlink"
    assert assess(plan(nvlink_domain_size=3), state, seen).action == "nvlink"
    # Turning domains on or off changes slurm.conf (the task prolog): the daemons must
    # read it again, so that is a rebuild, as is any other setting.
    assert assess(make_plan(Params(nodes=6)), state, seen).action == "rebuild"
    assert assess(plan(nodes=4), state, seen).action == "rebuild"


def test_the_recorded_state_keeps_the_stand_ins_faults_as_given():
    state = State(plan(no_cluster_uuid=("node6",)).params)
    assert from_json(state.to_json()) == state  # lists in JSON, tuples again after


def test_rewriting_the_answers_in_place_leaves_none_of_the_old_ones(tmp_path):
    (tmp_path / "etc").mkdir()
    cluster._write_nvlink(plan(tmp_path))
    smaller = plan(tmp_path, nodes=4, no_cluster_uuid=("node4",))
    cluster._write_nvlink(smaller)
    written = {str(p) for p in tmp_path.rglob("*") if p.is_file()}
    assert written == set(nvlink.files(smaller))
    assert "ClusterUUID" not in smaller.paths.nvidia_smi_answer("node4").read_text()
    cluster._write_nvlink(make_plan(Params(nodes=4), tmp_path))  # domains off: all gone
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
