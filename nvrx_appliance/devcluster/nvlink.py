"""NVLink domains for the local cluster: a stand-in `nvidia-smi`. Pure: text out.

No GPU exists here, so no node has a ClusterUUID, the one fact segment mode needs: NVRx
0.7.0 (`ft_rendezvous_barrier._parse_domain_id_from_nvidia_smi`) and the entrypoint
(node/node_probe.py) both run the first `nvidia-smi` on PATH with `-q` and read
its ClusterUUID lines. With `cluster up --nvlink-domain-size N`, every N consecutive
nodes form one domain: a STAND-IN `nvidia-smi` (a shell script that says so) prints, on
each node, an `nvidia-smi -q` listing of that node's GPU stand-ins whose ClusterUUID is
its domain's. Slurm's TaskProlog puts it first on every job step's PATH, where a GPU
node has the real one, so every process of a job finds it the way NVRx does.

Two deliberate faults, for the refusals: a node given --no-cluster-uuid prints its GPUs
with no ClusterUUID line (as a driver without fabric support does: NVRx cannot find a
domain, the entrypoint reports none); a node given --mixed-cluster-uuid has a second
GPU that reports the next domain's ClusterUUID (NVRx takes the first line; the
entrypoint refuses a node whose GPUs disagree).
"""

from __future__ import annotations

import uuid

from nvrx_appliance.devcluster.plan import CLUSTER_NAME, Plan

# ClusterUUIDs are derived, not random: the same cluster options give the same domains,
# so a rebuild keeps them and a test can compute what a node must report.
_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "nvlink.nvrx-devcluster.invalid")
# Printed in place of a real product and driver, so a person reading the text, a log
# line or a cycle's record cannot take it for a GPU.
STANDIN = "stand-in (no GPU: nvrx-appliance local cluster)"


def domain_of(plan: Plan, node: str) -> int:
    """The 1-based NVLink domain `node` belongs to (node1..nodeN in domains of N)."""
    index = [n.name for n in plan.nodes].index(node)
    return index // plan.params.nvlink_domain_size + 1


def domain_cluster_uuid(domain: int) -> str:
    return str(uuid.uuid5(_NAMESPACE, f"{CLUSTER_NAME}/domain/{domain}"))


def domains(plan: Plan) -> dict[str, str]:
    """node -> the ClusterUUID its stand-in reports ("" for --no-cluster-uuid nodes;
    for --mixed-cluster-uuid nodes, that of its first GPU)."""
    if not plan.params.nvlink_domain_size:
        return {}
    return {
        n.name: ""
        if n.name in plan.params.no_cluster_uuid
        else domain_cluster_uuid(domain_of(plan, n.name))
        for n in plan.nodes
    }


def _gpu(node: str, index: int, cluster_uuid: str | None) -> str:
    # Bus ids and GPU UUIDs as the real tool prints them, unique per node and GPU.
    gpu_uuid = "GPU-" + str(uuid.uuid5(_NAMESPACE, f"{CLUSTER_NAME}/{node}/gpu/{index}"))
    if cluster_uuid is None:
        fabric = "        State                             : Not Supported\n"
    else:
        fabric = (
            "        State                             : Completed\n"
            "        Status                            : Success\n"
            f"        ClusterUUID                       : {cluster_uuid}\n"
        )
    return (
        f"GPU 00000000:{index + 1:02X}:00.0\n"
        f"    Product Name                          : NVIDIA {STANDIN}\n"
        f"    GPU UUID                              : {gpu_uuid}\n"
        f"    Minor Number                          : {index}\n"
        "    Fabric\n"
        f"{fabric}"
    )


def answer(plan: Plan, node: str) -> str:
    """What the stand-in prints for `nvidia-smi -q` on `node`."""
    params = plan.params
    domain = domain_of(plan, node)
    own = None if node in params.no_cluster_uuid else domain_cluster_uuid(domain)
    per_gpu = [own] * params.gpus_per_node
    if node in params.mixed_cluster_uuid and len(per_gpu) > 1:
        per_gpu[-1] = domain_cluster_uuid(domain + 1)
    elif node in params.mixed_cluster_uuid:
        per_gpu = [own, domain_cluster_uuid(domain + 1)]  # one GPU cannot disagree
    gpus = "".join(_gpu(node, i, cluster_uuid) for i, cluster_uuid in enumerate(per_gpu))
    return (
        "\n==============NVSMI LOG==============\n\n"
        f"Driver Version                            : {STANDIN}\n\n"
        f"Attached GPUs                             : {len(per_gpu)}\n"
        f"{gpus}"
    )


def nvidia_smi(plan: Plan) -> str:
    """The stand-in executable: the answer file of the node it runs on (its hostname,
    which is its node name here), for `-q` only."""
    answers = plan.paths.nvidia_smi_answer("NODE").parent
    return f"""#!/bin/sh
# STAND-IN nvidia-smi of the nvrx-appliance local cluster (`cluster up
# --nvlink-domain-size`): no GPU exists here. It answers `nvidia-smi -q` with this
# node's GPU stand-ins and its NVLink domain's ClusterUUID, the line NVRx's segment mode
# and the appliance's entrypoint read. Written by `cluster up`; edits are lost.
if [ "$#" -ne 1 ] || [ "$1" != "-q" ]; then
    echo "nvidia-smi stand-in of the nvrx-appliance local cluster: only -q is answered" >&2
    exit 2
fi
exec cat "{answers}/$(hostname).txt"
"""


def task_prolog(plan: Plan) -> str:
    """Slurm's TaskProlog: its `export` lines set each job step's environment, so the
    stand-in comes first on PATH for the batch script and every srun step alike."""
    return f"""#!/bin/sh
# Written by `nvrx-appliance cluster up --nvlink-domain-size`; edits are lost.
# Puts the nvidia-smi stand-in first on the PATH of every job step, as a GPU node has
# the real nvidia-smi on its PATH.
echo "export PATH={plan.paths.nvidia_smi_dir}:$PATH"
"""


def files(plan: Plan) -> dict[str, str]:
    """Every file of the NVLink stand-in, by path; all executable or world-readable
    (jobs run as their user). Empty for a cluster without NVLink domains."""
    if not plan.params.nvlink_domain_size:
        return {}
    p = plan.paths
    return {
        str(p.task_prolog): task_prolog(plan),
        str(p.nvidia_smi_dir / "nvidia-smi"): nvidia_smi(plan),
        **{str(p.nvidia_smi_answer(n.name)): answer(plan, n.name) for n in plan.nodes},
    }
