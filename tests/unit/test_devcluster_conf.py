"""The cluster's configuration text, for both Slurm releases it must run on."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvrx_appliance.devcluster import cluster_conf
from nvrx_appliance.devcluster.plan import Params, make_plan

ROOT = Path("/srv/devcluster-under-test")


def settings(text: str) -> dict[str, str]:
    """Top-level Key=Value lines (NodeName/PartitionName lines hold several pairs)."""
    pairs = [
        line.split("=", 1)
        for line in text.splitlines()
        if line and not line.startswith("#") and " " not in line
    ]
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), f"a setting appears twice: {keys}"
    return dict(pairs)


def plan(**overrides):
    return make_plan(Params(**overrides), ROOT)


def test_every_node_is_declared_with_its_address_cpus_and_gpus():
    p = plan(nodes=3, gpus_per_node=2, cpus_per_node=6, memory_mb=2048)
    node_lines = [
        line for line in cluster_conf.slurm_conf(p).splitlines() if line.startswith("NodeName=")
    ]
    assert node_lines == [
        f"NodeName=node{k} NodeAddr=172.29.41.{10 + k} CPUs=6 RealMemory=2048 Gres=gpu:2 "
        "State=UNKNOWN"
        for k in (1, 2, 3)
    ]


def test_one_default_partition_holds_all_nodes():
    text = cluster_conf.slurm_conf(plan(nodes=4))
    partitions = [line for line in text.splitlines() if line.startswith("PartitionName=")]
    assert len(partitions) == 1
    assert "Nodes=node[1-4]" in partitions[0] and "Default=YES" in partitions[0]
    single = cluster_conf.slurm_conf(plan(nodes=1))
    assert "Nodes=node1 " in single


def test_controller_is_named_ctl_at_its_own_address():
    assert settings(cluster_conf.slurm_conf(plan()))["SlurmctldHost"] == "ctl(172.29.41.2)"


def test_clients_and_daemons_use_our_munge_socket_never_the_machines():
    p = plan()
    conf = settings(cluster_conf.slurm_conf(p))
    dbd = settings(cluster_conf.slurmdbd_conf(p, "pw"))
    ours = f"socket={p.paths.munge_socket}"
    assert conf["AuthInfo"] == ours and dbd["AuthInfo"] == ours
    # connections to slurmdbd (sacct, sacctmgr, slurmctld) read the socket from here
    assert conf["AccountingStoragePass"] == str(p.paths.munge_socket)
    assert "/run/munge" not in cluster_conf.slurm_conf(p) + cluster_conf.slurmdbd_conf(p, "pw")


def test_every_file_the_daemons_write_lies_under_the_cluster_root():
    conf = settings(cluster_conf.slurm_conf(plan()))
    for key in (
        "StateSaveLocation",
        "SlurmdSpoolDir",
        "SlurmctldPidFile",
        "SlurmdPidFile",
        "SlurmctldLogFile",
        "SlurmdLogFile",
    ):
        assert conf[key].startswith(f"{ROOT}/"), key


def test_a_dead_node_is_noticed_fast_and_comes_back_by_itself():
    conf = settings(cluster_conf.slurm_conf(plan()))
    assert conf["ReturnToService"] == "2"
    # slurmctld pings every SlurmdTimeout/3 and waits MessageTimeout for an answer:
    # the node must be marked DOWN well inside the half minute the fault tests allow.
    assert int(conf["SlurmdTimeout"]) + 2 * int(conf["MessageTimeout"]) <= 25
    assert int(conf["MinJobAge"]) >= 600  # finished jobs stay visible to squeue
    assert "bf_interval=1" in conf["SchedulerParameters"]
    assert conf["AccountingStorageType"] == "accounting_storage/slurmdbd"


def test_gpu_stand_ins_are_device_files_under_the_root():
    p = plan(nodes=2, gpus_per_node=2)
    gres = cluster_conf.gres_conf(p)
    assert "AutoDetect=off" in gres
    assert f"NodeName=node[1-2] Name=gpu File={ROOT}/dev/nvidia[0-1]" in gres
    assert f"File={ROOT}/dev/nvidia0\n" in cluster_conf.gres_conf(plan(gpus_per_node=1))
    assert settings(cluster_conf.slurm_conf(p))["GresTypes"] == "gpu"


def test_without_gpus_no_gres_is_declared():
    p = plan(gpus_per_node=0)
    assert "Gres" not in cluster_conf.slurm_conf(p)
    assert "Name=gpu" not in cluster_conf.gres_conf(p)


@pytest.mark.parametrize(
    ("version", "expected"),
    [("22.05", "CgroupPlugin=autodetect"), ("24.11", "CgroupPlugin=disabled")],
)
def test_cgroup_setting_follows_the_installed_slurm(version, expected):
    text = cluster_conf.cgroup_conf(plan(slurm_version=version))
    assert expected in text
    if version == "22.05":
        assert "disabled" not in text  # 22.05 rejects a value it does not know


def test_slurmdbd_reaches_its_own_mariadb_over_the_controllers_loopback():
    dbd = settings(cluster_conf.slurmdbd_conf(plan(), "s3cret"))
    assert dbd["DbdHost"] == "ctl"
    assert dbd["StorageHost"] == "127.0.0.1"
    assert dbd["StoragePort"] == str(cluster_conf.MARIADB_PORT)
    assert dbd["StoragePass"] == "s3cret"


def test_accounting_sql_creates_the_database_and_a_user_with_the_password():
    sql = cluster_conf.accounting_sql("abc123")
    assert f"CREATE DATABASE IF NOT EXISTS {cluster_conf.ACCOUNTING_DB}" in sql
    assert "IDENTIFIED BY 'abc123'" in sql
    assert f"GRANT ALL PRIVILEGES ON {cluster_conf.ACCOUNTING_DB}.*" in sql


def test_config_files_omit_the_secret_bearing_slurmdbd_conf():
    p = plan()
    files = cluster_conf.config_files(p)
    assert set(files) == {str(p.paths.slurm_conf), str(p.paths.gres_conf), str(p.paths.cgroup_conf)}
