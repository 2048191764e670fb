"""The cluster's configuration files, rendered from a Plan. Pure: text in, text out.

The same text must work on Debian 12 (Slurm 22.05) and Debian 13 (Slurm 24.11): where
the two differ, the plan's Slurm version picks the setting, and the reason sits beside it.
"""

from __future__ import annotations

from nvrx_appliance.devcluster.plan import CLUSTER_NAME, PARTITION, Plan

# A node that stops answering is marked DOWN this many seconds after its last answer.
# Short, so fault tests see a dead node within ~20-30 s (slurmctld pings every third of
# it), yet long enough that a node busy with a CPU-heavy job on a 2-core machine is not
# declared dead by mistake.
SLURMD_TIMEOUT_S = 10
# How long slurmctld waits for any RPC reply, pings of a dead node included; a ping
# cycle must end before the next starts, so this bounds how late the node is noticed.
# Every daemon is on this machine, where replies take milliseconds, not seconds.
MESSAGE_TIMEOUT_S = 5
# Finished jobs stay visible to squeue/scontrol this long; tests and the watcher read
# final states from there as well as from sacct.
MIN_JOB_AGE_S = 3600
# Seconds between SIGTERM and SIGKILL when a job ends or is cancelled. Long enough for
# ft_launcher to stop its workers and for task 0's teardown trap to run.
KILL_WAIT_S = 10
# Pending jobs are looked at every second (backfill) and the main scheduler may run
# again 0.1 s after its last pass, so a freed node is refilled at once instead of
# after the default 30 s: tests measure hand-off times on this cluster.
SCHEDULER_PARAMETERS = "bf_interval=1,sched_min_interval=100000"
# Where MariaDB listens inside the controller's namespace. The namespace has its own
# loopback, so this never collides with a MariaDB the machine already runs.
MARIADB_PORT = 3306
ACCOUNTING_DB = "slurm_acct_db"
ACCOUNTING_USER = "slurm"

# CgroupPlugin=disabled appeared in the 23.x/24.x series; 22.05 does not know it and
# instead needs the cgroup plugin to load (which it does, given /sys/fs/cgroup).
_CGROUP_DISABLED_SINCE = (24, 5)

HEADER = "# Written by `nvrx-appliance cluster up`; removed by `cluster down`. Edits are lost.\n"


def _lines(pairs: list[tuple[str, object]]) -> str:
    return "".join(f"{key}={value}\n" for key, value in pairs)


def node_range(plan: Plan) -> str:
    """node[1-4] in Slurm's hostlist notation (node1 when there is one)."""
    count = len(plan.nodes)
    return "node1" if count == 1 else f"node[1-{count}]"


def slurm_conf(plan: Plan) -> str:
    p, params = plan.paths, plan.params
    settings: list[tuple[str, object]] = [
        ("ClusterName", CLUSTER_NAME),
        ("SlurmctldHost", f"{plan.controller.name}({plan.controller.address})"),
        ("SlurmUser", "slurm"),
        ("SlurmdUser", "root"),
        ("AuthType", "auth/munge"),
        # Our own munged, never the machine's /run/munge socket.
        ("AuthInfo", f"socket={p.munge_socket}"),
        ("StateSaveLocation", p.ctld_state),
        ("SlurmdSpoolDir", p.spool / "slurmd-%n"),
        ("SlurmctldPidFile", p.run / "slurmctld.pid"),
        ("SlurmdPidFile", p.run / "slurmd-%n.pid"),
        ("SlurmctldLogFile", p.log / "slurmctld.log"),
        ("SlurmdLogFile", p.log / "slurmd-%n.log"),
        # Every node shares one kernel: track job processes by process group, bind
        # nothing, and let each slurmd announce the resources configured here rather
        # than the machine's.
        ("ProctrackType", "proctrack/pgid"),
        ("TaskPlugin", "task/none"),
        ("SlurmdParameters", "config_overrides"),
        ("SelectType", "select/cons_tres"),
        ("SelectTypeParameters", "CR_Core"),
        ("MpiDefault", "none"),
        ("ReturnToService", 2),  # a node that was DOWN rejoins when its slurmd registers
        ("SlurmdTimeout", SLURMD_TIMEOUT_S),
        ("MessageTimeout", MESSAGE_TIMEOUT_S),
        ("MinJobAge", MIN_JOB_AGE_S),
        ("KillWait", KILL_WAIT_S),
        ("SchedulerParameters", SCHEDULER_PARAMETERS),
        ("AccountingStorageType", "accounting_storage/slurmdbd"),
        ("AccountingStorageHost", plan.controller.name),
        # Connections to slurmdbd take their munge socket from here, not from AuthInfo.
        ("AccountingStoragePass", p.munge_socket),
        ("JobCompType", "jobcomp/none"),
    ]
    if params.gpus_per_node:
        settings.append(("GresTypes", "gpu"))
    if params.nvlink_domain_size:
        # The nvidia-smi stand-in first on every job step's PATH (nvlink.py).
        settings.append(("TaskProlog", p.task_prolog))
    gres = f" Gres=gpu:{params.gpus_per_node}" if params.gpus_per_node else ""
    nodes = "".join(
        f"NodeName={n.name} NodeAddr={n.address} CPUs={params.cpus_per_node} "
        f"RealMemory={params.memory_mb}{gres} State=UNKNOWN\n"
        for n in plan.nodes
    )
    partition = (
        f"PartitionName={PARTITION} Nodes={node_range(plan)} Default=YES "
        "MaxTime=INFINITE State=UP\n"
    )
    return HEADER + _lines(settings) + nodes + partition


def gres_conf(plan: Plan) -> str:
    gpus = plan.params.gpus_per_node
    if not gpus:
        return HEADER
    # No GPUs exist here. Slurm registers a GPU only for a File= it can stat, and
    # Count= alone leaves nodes INVAL, so the files are character-device stand-ins.
    last = gpus - 1
    files = plan.paths.gpu_device(0) if gpus == 1 else f"{plan.paths.gpu_devices}/nvidia[0-{last}]"
    return HEADER + f"AutoDetect=off\nNodeName={node_range(plan)} Name=gpu File={files}\n"


def cgroup_conf(plan: Plan) -> str:
    if plan.slurm_version >= _CGROUP_DISABLED_SINCE:
        # Newer slurmd insists on a delegated cgroup v2 subtree per daemon, which
        # several slurmds in one kernel cannot each own; nothing here needs cgroups.
        return HEADER + "CgroupPlugin=disabled\n"
    # 22.05 loads the plugin regardless; on a cgroup v2 machine it must not ask systemd
    # for a scope (there is one machine-wide systemd and four slurmds).
    return HEADER + "CgroupPlugin=autodetect\nIgnoreSystemd=yes\n"


def slurmdbd_conf(plan: Plan, db_password: str) -> str:
    """slurmdbd.conf holds the database password: written 0600, owned by SlurmUser."""
    p = plan.paths
    return HEADER + _lines(
        [
            ("AuthType", "auth/munge"),
            ("AuthInfo", f"socket={p.munge_socket}"),
            ("DbdHost", plan.controller.name),
            ("SlurmUser", "slurm"),
            ("LogFile", p.log / "slurmdbd.log"),
            ("PidFile", p.run / "slurmdbd.pid"),
            ("StorageType", "accounting_storage/mysql"),
            ("StorageHost", "127.0.0.1"),
            ("StoragePort", MARIADB_PORT),
            ("StorageUser", ACCOUNTING_USER),
            ("StoragePass", db_password),
            ("StorageLoc", ACCOUNTING_DB),
        ]
    )


def accounting_sql(db_password: str) -> str:
    """SQL that gives slurmdbd its database; fed on stdin so the password stays off argv."""
    user = f"'{ACCOUNTING_USER}'@'127.0.0.1'"
    return (
        f"CREATE DATABASE IF NOT EXISTS {ACCOUNTING_DB};\n"
        f"CREATE USER IF NOT EXISTS {user} IDENTIFIED BY '{db_password}';\n"
        f"ALTER USER {user} IDENTIFIED BY '{db_password}';\n"
        f"GRANT ALL PRIVILEGES ON {ACCOUNTING_DB}.* TO {user};\n"
    )


def config_files(plan: Plan) -> dict[str, str]:
    """The files every Slurm daemon and client reads, by path; slurmdbd.conf is apart
    because its text holds a secret that must not be compared or printed."""
    p = plan.paths
    return {
        str(p.slurm_conf): slurm_conf(plan),
        str(p.gres_conf): gres_conf(plan),
        str(p.cgroup_conf): cgroup_conf(plan),
    }
