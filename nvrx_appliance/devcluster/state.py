"""What `up` recorded (state.json), and the remedy: what the next `up` must do.

Pure: the shell observes the machine and hands the observation in; `assess` decides
between leaving a healthy cluster alone, reviving dead nodes, and rebuilding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nvrx_appliance.devcluster.plan import Params, Plan

VERSION = 1

MUNGED = "munged"
MARIADB = "mariadbd"
SLURMDBD = "slurmdbd"
SLURMCTLD = "slurmctld"
# Started in this order, stopped in the reverse one.
CONTROL_DAEMONS = (MUNGED, MARIADB, SLURMDBD, SLURMCTLD)


def slurmd_key(node: str) -> str:
    return f"slurmd@{node}"


@dataclass(frozen=True)
class Daemon:
    pid: int
    # The kernel's start time of the process (clock ticks since boot): a pid alone may
    # have been reused by an unrelated process since the daemon died.
    start: int
    netns: str | None = None


@dataclass
class State:
    params: Params
    daemons: dict[str, Daemon] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "params": self.params.to_dict(),
            "daemons": {
                key: {"pid": d.pid, "start": d.start, "netns": d.netns}
                for key, d in self.daemons.items()
            },
        }


class StateError(ValueError):
    """state.json is unreadable or of another version: treat the cluster as stale."""


def from_json(data: Any) -> State:
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise StateError("state.json is not a devcluster state of a known version")
    try:
        params = Params.from_dict(data["params"])
        daemons = {
            key: Daemon(int(d["pid"]), int(d["start"]), d.get("netns"))
            for key, d in data["daemons"].items()
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(f"state.json is malformed: {exc}") from None
    return State(params, daemons)


@dataclass(frozen=True)
class Observed:
    """What the shell saw on the machine just now."""

    alive: frozenset[str]  # daemon keys whose recorded process still runs
    namespaces: frozenset[str]  # our network namespaces that exist
    links_up: frozenset[str]  # root-side veth ends that are up
    hosts_ok: bool  # /etc/hosts holds exactly our block
    configs_ok: bool  # the config files on disk are what the plan renders
    leftovers: bool  # anything of ours at all: root dir, namespaces, links, hosts block


@dataclass(frozen=True)
class Remedy:
    action: str  # "build" | "rebuild" | "nvlink" (rewrite the stand-in) | "revive" | "none"
    reason: str
    nodes: tuple[str, ...] = ()  # for "revive": nodes whose slurmd or link is down
    daemons: tuple[str, ...] = ()  # for "revive": control daemons to restart, in start order


def assess(plan: Plan, state: State | None, seen: Observed) -> Remedy:
    if state is None:
        if seen.leftovers:
            return Remedy("rebuild", "a previous run left a partial cluster without its state")
        return Remedy("build", "no cluster yet")
    if state.params != plan.params:
        changes = _changes(state.params, plan.params)
        if _only_nvlink_answers(state.params, plan.params):
            # The stand-in reads its answers at each call: no daemon needs to restart.
            return Remedy("nvlink", f"settings changed: {changes}")
        return Remedy("rebuild", f"settings changed: {changes}")
    if not seen.configs_ok:
        return Remedy("rebuild", "its configuration files are missing or were changed")
    if not seen.hosts_ok:
        return Remedy("rebuild", "its /etc/hosts block is missing or was changed")
    missing = [h.netns for h in plan.hosts if h.netns not in seen.namespaces]
    if missing:
        return Remedy("rebuild", f"network namespace {missing[0]} is gone")
    if plan.controller.link not in seen.links_up:
        return Remedy("rebuild", "the controller's link is down")
    # A dead daemon is restarted in place, as a real site restarts it: slurmctld recovers
    # its jobs from StateSaveLocation and accounting lives in MariaDB's data directory. A
    # rebuild would throw both away.
    dead = tuple(d for d in CONTROL_DAEMONS if d not in seen.alive)
    down = tuple(
        n.name
        for n in plan.nodes
        if slurmd_key(n.name) not in seen.alive or n.link not in seen.links_up
    )
    if dead or down:
        parts = [f"{', '.join(dead)} not running"] if dead else []
        parts += [f"node(s) {', '.join(down)} are down"] if down else []
        return Remedy("revive", "; ".join(parts), down, dead)
    return Remedy("none", "the cluster is up")


# What the nvidia-smi stand-in answers, as opposed to what the daemons were started with.
_NVLINK_ANSWERS = ("nvlink_domain_size", "no_cluster_uuid", "mixed_cluster_uuid")


def _only_nvlink_answers(old: Params, new: Params) -> bool:
    """Both clusters have NVLink domains (so the same task prolog in slurm.conf) and
    differ only in what the stand-in answers."""
    a, b = old.to_dict(), new.to_dict()
    differ = {k for k in a if a[k] != b[k]}
    return bool(old.nvlink_domain_size and new.nvlink_domain_size) and differ <= set(
        _NVLINK_ANSWERS
    )


def _changes(old: Params, new: Params) -> str:
    a, b = old.to_dict(), new.to_dict()
    return ", ".join(f"{k} {a[k]} -> {b[k]}" for k in a if a[k] != b[k])
