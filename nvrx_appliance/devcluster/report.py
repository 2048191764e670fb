"""Reading Slurm's view of the nodes, and the `cluster status` table. Pure."""

from __future__ import annotations

from typing import Any

from nvrx_appliance.devcluster import nvlink
from nvrx_appliance.devcluster.plan import Plan
from nvrx_appliance.devcluster.state import (
    CONTROL_DAEMONS,
    MUNGED,
    Observed,
    State,
    assess,
    slurmd_key,
)

# Node state flags (scontrol's State=BASE+FLAG+...) that mean a node cannot run jobs.
UNAVAILABLE = {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "NOT_RESPONDING", "UNKNOWN", "INVAL"}


def parse_node_states(scontrol_oneliner: str) -> dict[str, str]:
    """`scontrol -o show nodes` -> {node name: State value, e.g. 'IDLE+NOT_RESPONDING'}."""
    states = {}
    for line in scontrol_oneliner.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "NodeName" in fields and "State" in fields:
            states[fields["NodeName"]] = fields["State"]
    return states


def flags(state: str) -> set[str]:
    return {part.rstrip("*") for part in state.split("+")}


def in_service(state: str) -> bool:
    """Slurm would schedule onto the node now (IDLE, MIXED, ALLOCATED, nothing wrong)."""
    return bool(state) and not (flags(state) & UNAVAILABLE)


def seen_dead(state: str) -> bool:
    """Slurm has noticed the node is gone: not responding, or already DOWN."""
    return bool(flags(state) & {"DOWN", "NOT_RESPONDING"})


def status_document(
    plan: Plan, state: State, seen: Observed, slurm_states: dict[str, str]
) -> dict[str, Any]:
    """`cluster status --json` for a recorded cluster: each daemon, each node, and
    whether all of it is up (every daemon running and every node in service)."""
    remedy = assess(plan, state, seen)
    nodes_in_service = all(in_service(slurm_states.get(n.name, "")) for n in plan.nodes)
    if remedy.action != "none":
        reason = remedy.reason
    elif not nodes_in_service:
        reason = "not every node is in service (see SLURM STATE)"
    else:
        reason = remedy.reason

    def daemon(key: str, name: str, host: str) -> dict[str, Any]:
        recorded = state.daemons.get(key)
        return {
            "name": name,
            "host": host,
            "pid": recorded.pid if recorded else None,
            "running": key in seen.alive,
        }

    ctl = plan.controller
    domains = nvlink.domains(plan)
    return {
        "up": remedy.action == "none" and nodes_in_service,
        "reason": reason,
        "slurm_version": state.params.slurm_version,
        "params": state.params.to_dict(),
        "controller": {"name": ctl.name, "address": ctl.address, "netns": ctl.netns},
        "daemons": [daemon(k, k, "(root)" if k == MUNGED else ctl.name) for k in CONTROL_DAEMONS]
        + [daemon(slurmd_key(n.name), "slurmd", n.name) for n in plan.nodes],
        "nodes": [
            {
                "name": n.name,
                "address": n.address,
                "netns": n.netns,
                "link_up": n.link in seen.links_up,
                "slurmd_running": slurmd_key(n.name) in seen.alive,
                "slurm_state": slurm_states.get(n.name),
                "seen_dead": seen_dead(slurm_states.get(n.name, "")),
                # What the nvidia-smi stand-in reports: None without NVLink domains,
                # "" for a node given --no-cluster-uuid.
                "cluster_uuid": domains.get(n.name),
            }
            for n in plan.nodes
        ],
    }


def _yes(value: bool) -> str:
    return "up" if value else "DOWN"


def _cluster_uuid(node: dict[str, Any], mixed: set[str]) -> str:
    if not node.get("cluster_uuid"):
        return "none"
    return node["cluster_uuid"] + (" (its GPUs disagree)" if node["name"] in mixed else "")


def table(status: dict[str, Any]) -> str:
    """The human view of `cluster status --json`."""
    head = "UP" if status["up"] else "NOT UP"
    lines = [f"cluster: {head} ({status['reason']})"]
    if not status.get("daemons"):
        return "\n".join(lines) + "\n"
    lines += [
        f"slurm {status['slurm_version']}, SLURM_CONF={status['slurm_conf']}",
        f"work root: {status['work_root']}",
        "",
        f"{'DAEMON':<16}{'HOST':<8}{'PID':>8}  STATE",
    ]
    lines += [
        f"{d['name']:<16}{d['host']:<8}{d['pid'] or '-':>8}  {_yes(d['running'])}"
        for d in status["daemons"]
    ]
    domains = any(n.get("cluster_uuid") is not None for n in status["nodes"])
    mixed = set(status.get("params", {}).get("mixed_cluster_uuid", ()))
    head = f"{'NODE':<8}{'ADDRESS':<16}{'LINK':<6}{'SLURMD':<8}{'SLURM STATE':<22}"
    lines += ["", head + ("CLUSTERUUID (nvidia-smi stand-in)" if domains else "").rstrip()]
    lines += [
        (
            f"{n['name']:<8}{n['address']:<16}{_yes(n['link_up']):<6}"
            f"{_yes(n['slurmd_running']):<8}{n['slurm_state'] or '?':<22}"
            + (_cluster_uuid(n, mixed) if domains else "")
        ).rstrip()
        for n in status["nodes"]
    ]
    return "\n".join(lines) + "\n"
