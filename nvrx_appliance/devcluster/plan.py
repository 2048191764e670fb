"""What the local cluster is: names, addresses, paths and settings, computed from options.

Pure: no I/O. The shell (cluster.py) reads the machine (Slurm version, memory) and
hands the facts in; everything else follows from them here, so a plan can be compared
with the one recorded at the last `up` to decide whether anything must change.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Everything the cluster writes lives under this one directory, so `down` can remove
# exactly what `up` made and nothing the machine had before. Not under /tmp, /var/tmp
# or /dev/shm: the work root below it must look like a shared file system, not
# node-local scratch that a real cluster would wipe between jobs.
DEFAULT_ROOT = Path("/var/lib/nvrx-devcluster")
# A file whose presence says "this directory is ours"; `up` refuses a root without it.
MARKER = ".nvrx-devcluster"

# Every interface and namespace name starts with this, so leftovers of a killed `up`
# can be found without a state file. Short: Linux caps interface names at 15 bytes.
NET_PREFIX = "nvrxdc-"
BRIDGE = NET_PREFIX + "br"

CONTROLLER = "ctl"
CLUSTER_NAME = "nvrxdev"
PARTITION = "main"
DEFAULT_SUBNET = "172.29.41.0/24"
DEFAULT_NODES = 4
DEFAULT_GPUS_PER_NODE = 2
# Scheduling tokens, not real cores: task/none binds nothing, so a node may claim more
# CPUs than the machine has and multi-task jobs still fit.
DEFAULT_CPUS_PER_NODE = 4

# Host numbers inside the subnet: the bridge (the machine itself) is .1, the
# controller .2, node k is .(NODE_BASE + k).
BRIDGE_HOST = 1
CONTROLLER_HOST = 2
NODE_BASE = 10


@dataclass(frozen=True)
class Paths:
    root: Path

    @property
    def marker(self) -> Path:
        return self.root / MARKER

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def gres_conf(self) -> Path:
        return self.etc / "gres.conf"

    @property
    def cgroup_conf(self) -> Path:
        # Slurm reads cgroup.conf from the directory of slurm.conf, never from /etc.
        return self.etc / "cgroup.conf"

    @property
    def slurmdbd_conf(self) -> Path:
        return self.etc / "slurmdbd.conf"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def ctld_state(self) -> Path:
        return self.spool / "slurmctld"

    @property
    def munge(self) -> Path:
        return self.root / "munge"

    @property
    def munge_key(self) -> Path:
        return self.munge / "munge.key"

    @property
    def munge_socket(self) -> Path:
        return self.munge / "munge.socket"

    @property
    def mysql(self) -> Path:
        return self.root / "mysql"

    @property
    def mysql_data(self) -> Path:
        return self.mysql / "data"

    @property
    def mysql_socket(self) -> Path:
        return self.mysql / "mysqld.sock"

    @property
    def gpu_devices(self) -> Path:
        return self.root / "dev"

    def gpu_device(self, index: int) -> Path:
        return self.gpu_devices / f"nvidia{index}"

    @property
    def work_root(self) -> Path:
        return self.root / "work"

    @property
    def task_prolog(self) -> Path:
        return self.etc / "task_prolog.sh"

    @property
    def nvlink(self) -> Path:
        return self.root / "nvlink"

    @property
    def nvidia_smi_dir(self) -> Path:
        # The directory the task prolog puts first on every job's PATH.
        return self.nvlink / "bin"

    def nvidia_smi_answer(self, node: str) -> Path:
        return self.nvlink / "answers" / f"{node}.txt"

    def kept_across_rebuilds(self) -> tuple[Path, ...]:
        """What a rebuild leaves in place: the work root holds every run's work dir
        (checkpoints, logs, reports), and the marker keeps the root ours meanwhile."""
        return (self.marker, self.work_root)


@dataclass(frozen=True)
class Host:
    """The controller or a compute node: a network namespace with its own hostname."""

    name: str
    address: str

    @property
    def netns(self) -> str:
        return NET_PREFIX + self.name

    @property
    def link(self) -> str:
        # The root-namespace end of the host's veth pair, plugged into the bridge.
        return NET_PREFIX + self.name


@dataclass(frozen=True)
class Params:
    """The options and machine facts a cluster is built from; recorded in the state."""

    nodes: int = DEFAULT_NODES
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    cpus_per_node: int = DEFAULT_CPUS_PER_NODE
    memory_mb: int = 1024
    subnet: str = DEFAULT_SUBNET
    slurm_version: str = "22.05"
    # NVLink domains of this many consecutive nodes, each answering `nvidia-smi -q` with
    # its domain's ClusterUUID through a stand-in (nvlink.py); 0: no nvidia-smi at all.
    nvlink_domain_size: int = 0
    # Nodes whose stand-in prints no ClusterUUID, and nodes whose GPUs disagree on it:
    # what segment mode must refuse.
    no_cluster_uuid: tuple[str, ...] = ()
    mixed_cluster_uuid: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Params:
        # JSON has no tuples: lists come back as the tuples they were.
        fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in data.items()
        }
        return cls(**fields)


@dataclass(frozen=True)
class Plan:
    params: Params
    paths: Paths
    controller: Host
    nodes: tuple[Host, ...]
    bridge_address: str
    prefixlen: int

    @property
    def hosts(self) -> tuple[Host, ...]:
        return (self.controller, *self.nodes)

    def node(self, name: str) -> Host:
        for node in self.nodes:
            if node.name == name:
                return node
        known = ", ".join(n.name for n in self.nodes)
        raise KeyError(f"no node named {name!r} (the nodes are {known})")

    @property
    def slurm_version(self) -> tuple[int, int]:
        major, minor = self.params.slurm_version.split(".")
        return int(major), int(minor)


class PlanError(ValueError):
    """An option the cluster cannot be built with; the message names it and the fix."""


def node_name(index: int) -> str:
    return f"node{index}"


def make_plan(params: Params, root: Path = DEFAULT_ROOT) -> Plan:
    problems = check_params(params)
    if problems:
        raise PlanError(problems[0])
    net = ipaddress.ip_network(params.subnet)
    hosts = list(net.hosts())

    def address(host_number: int) -> str:
        return str(hosts[host_number - 1])

    nodes = tuple(Host(node_name(k), address(NODE_BASE + k)) for k in range(1, params.nodes + 1))
    return Plan(
        params=params,
        paths=Paths(root),
        controller=Host(CONTROLLER, address(CONTROLLER_HOST)),
        nodes=nodes,
        bridge_address=address(BRIDGE_HOST),
        prefixlen=net.prefixlen,
    )


def check_params(params: Params) -> list[str]:
    problems = []
    if params.nodes < 1:
        problems.append("--nodes must be at least 1")
    if params.gpus_per_node < 0:
        problems.append("--gpus-per-node must be 0 or more")
    if params.cpus_per_node < 1:
        problems.append("--cpus-per-node must be at least 1")
    problems += _nvlink_problems(params)
    try:
        net = ipaddress.ip_network(params.subnet)
    except ValueError:
        problems.append(f"--subnet {params.subnet!r} is not a network such as {DEFAULT_SUBNET}")
        return problems
    if net.version != 4 or not net.is_private:
        problems.append(f"--subnet {params.subnet} must be a private IPv4 network")
    elif net.num_addresses - 2 < NODE_BASE + params.nodes:
        problems.append(
            f"--subnet {params.subnet} is too small for {params.nodes} nodes; "
            f"use a larger one such as {DEFAULT_SUBNET}"
        )
    return problems


def _nvlink_problems(params: Params) -> list[str]:
    size = params.nvlink_domain_size
    odd = [*params.no_cluster_uuid, *params.mixed_cluster_uuid]
    if size < 0:
        return ["--nvlink-domain-size must be 0 (no NVLink domains) or more"]
    if size == 0:
        return (
            [f"--no-cluster-uuid and --mixed-cluster-uuid ({', '.join(odd)}) need NVLink "
             "domains: add --nvlink-domain-size N"]
            if odd else []
        )  # fmt: skip
    problems = []
    if params.gpus_per_node < 1:
        problems.append("--nvlink-domain-size needs GPUs: set --gpus-per-node 1 or more")
    if params.nodes % size:
        problems.append(
            f"--nodes {params.nodes} is not a whole number of NVLink domains of "
            f"--nvlink-domain-size {size}; pick a node count that is a multiple of it"
        )
    known = {node_name(k) for k in range(1, params.nodes + 1)}
    unknown = sorted(set(odd) - known)
    if unknown:
        problems.append(
            f"--no-cluster-uuid/--mixed-cluster-uuid name {', '.join(unknown)}, which is "
            f"not a node of this cluster (node1..node{params.nodes})"
        )
    both = sorted(set(params.no_cluster_uuid) & set(params.mixed_cluster_uuid))
    if both:
        problems.append(
            f"{', '.join(both)} is given to both --no-cluster-uuid and --mixed-cluster-uuid; "
            "pick one"
        )
    return problems


def overlapping_routes(subnet: str, routes: list[str]) -> list[str]:
    """Destinations already routed on this machine that the cluster's subnet would shadow."""
    ours = ipaddress.ip_network(subnet)
    clashes = []
    for route in routes:
        try:
            theirs = ipaddress.ip_network(route, strict=False)
        except ValueError:
            continue  # "default" and other non-network destinations
        if theirs.version == ours.version and theirs.overlaps(ours):
            clashes.append(route)
    return clashes


_VERSION = re.compile(r"(\d+)\.(\d+)\.\d+")


def parse_slurm_version(text: str) -> str:
    """'slurm-wlm 22.05.8' -> '22.05' (major.minor decides which settings apply)."""
    match = _VERSION.search(text)
    if not match:
        raise PlanError(f"cannot read a Slurm version from {text.strip()!r}")
    return f"{int(match.group(1))}.{match.group(2)}"


def debian_like(os_release: str) -> bool:
    """Whether /etc/os-release's text names Debian or a derivative (Ubuntu, ...)."""
    fields = {}
    for line in os_release.splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            fields[key.strip()] = value.strip().strip('"')
    family = {fields.get("ID", ""), *fields.get("ID_LIKE", "").split()}
    return bool(family & {"debian", "ubuntu"})
