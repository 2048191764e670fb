"""up, down, status, kill-node, revive-node: the imperative shell around the pure plan.

Everything of the cluster lives under one root directory, a set of network namespaces
and links named with one prefix, and one marked /etc/hosts block; `down` removes
exactly those, so it can also clean up after an `up` that was killed half-way.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nvrx_appliance.devcluster import cluster_conf, daemons, hosts, net, nvlink, procs
from nvrx_appliance.devcluster.plan import (
    CLUSTER_NAME,
    DEFAULT_ROOT,
    Host,
    Params,
    Paths,
    Plan,
    PlanError,
    debian_like,
    make_plan,
    overlapping_routes,
    parse_slurm_version,
)
from nvrx_appliance.devcluster.poll import Timeout, wait_until
from nvrx_appliance.devcluster.report import in_service, parse_node_states, status_document
from nvrx_appliance.devcluster.state import (
    MARIADB,
    MUNGED,
    SLURMCTLD,
    SLURMDBD,
    Observed,
    Remedy,
    State,
    StateError,
    assess,
    from_json,
    slurmd_key,
)

HOSTS_FILE = Path("/etc/hosts")
# How long `up` and `revive-node` wait for nodes to register with slurmctld.
NODE_READY_S = 60

Say = Callable[[str], None]


class ClusterError(RuntimeError):
    """The cluster could not be brought to the asked state; one readable message."""


class ClusterRefused(ClusterError):
    """Nothing was changed: wrong machine, wrong user, or a clash with what is there."""


# --- preconditions ------------------------------------------------------------------


def preflight() -> None:
    if os.geteuid() != 0:
        raise ClusterRefused(
            "the local cluster needs root (network namespaces, daemons, /etc/hosts); "
            "run it with sudo"
        )
    if not _is_debian():
        raise ClusterRefused(
            "the local cluster is built from Debian's Slurm packages; "
            "this machine is not Debian or Ubuntu"
        )


def _is_debian() -> bool:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return False
    return debian_like(text) and shutil.which("apt-get") is not None


def machine_params(
    nodes: int,
    gpus_per_node: int,
    cpus_per_node: int,
    subnet: str,
    *,
    nvlink_domain_size: int = 0,
    no_cluster_uuid: tuple[str, ...] = (),
    mixed_cluster_uuid: tuple[str, ...] = (),
) -> Params:
    version = subprocess.run(
        [daemons.executable("slurmd"), "-V"], capture_output=True, text=True
    ).stdout
    return Params(
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        cpus_per_node=cpus_per_node,
        memory_mb=_memory_mb(),
        subnet=subnet,
        slurm_version=parse_slurm_version(version),
        nvlink_domain_size=nvlink_domain_size,
        no_cluster_uuid=tuple(sorted(set(no_cluster_uuid))),
        mixed_cluster_uuid=tuple(sorted(set(mixed_cluster_uuid))),
    )


def _memory_mb() -> int:
    # Each node claims the machine's memory: memory is not a consumable resource here
    # (CR_Core), so this only lets jobs that ask for --mem be scheduled at all.
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 1024


def check_clashes(plan: Plan) -> None:
    """Refuse, before changing anything, to take what the machine already uses."""
    root = plan.paths.root
    # An empty root is what an `up` killed between mkdir and marker leaves; take it.
    if root.exists() and not plan.paths.marker.exists() and any(root.iterdir()):
        raise ClusterRefused(
            f"{root} exists and was not made by nvrx-appliance; move it away first"
        )
    clashes = overlapping_routes(plan.params.subnet, net.foreign_routes())
    if clashes:
        raise ClusterRefused(
            f"--subnet {plan.params.subnet} overlaps this machine's route {clashes[0]}; "
            "pick a free private subnet with --subnet"
        )
    taken = hosts.foreign_names(HOSTS_FILE.read_text(), [h.name for h in plan.hosts])
    if taken:
        raise ClusterRefused(
            f"/etc/hosts already defines {', '.join(taken)}; the local cluster needs those "
            "names for its own hosts (remove those lines, or use another machine)"
        )


# --- state ----------------------------------------------------------------------------


def load_state(paths: Paths) -> State | None:
    try:
        return from_json(json.loads(paths.state.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, StateError):
        return None  # unreadable: treated as "no state", so `up` rebuilds


def save_state(paths: Paths, state: State) -> None:
    tmp = paths.state.with_suffix(".tmp")
    tmp.write_text(json.dumps(state.to_json(), indent=1) + "\n")
    tmp.rename(paths.state)


def _hosts_entries(plan: Plan) -> list[tuple[str, str]]:
    return [(h.address, h.name) for h in plan.hosts]


def observe(plan: Plan, state: State | None) -> Observed:
    p = plan.paths
    links = net.links()
    hosts_text = HOSTS_FILE.read_text()
    configs_ok = all(
        Path(path).exists() and Path(path).read_text() == text
        for path, text in {**cluster_conf.config_files(plan), **nvlink.files(plan)}.items()
    )
    alive = frozenset(
        key for key, d in (state.daemons.items() if state else []) if procs.is_alive(d)
    )
    return Observed(
        alive=alive,
        namespaces=frozenset(net.namespaces()),
        links_up=frozenset(name for name, up in links.items() if up),
        hosts_ok=hosts.has_block(hosts_text, _hosts_entries(plan)),
        configs_ok=configs_ok,
        leftovers=bool(p.root.exists() or links or net.namespaces() or hosts.BEGIN in hosts_text),
    )


# --- up ---------------------------------------------------------------------------------


def up(plan: Plan, say: Say, *, force: bool = False) -> Remedy:
    check_clashes(plan)
    state = load_state(plan.paths)
    seen = observe(plan, state)
    remedy = assess(plan, state, seen)
    if remedy.action == "nvlink":
        assert state is not None
        say(f"rewriting the nvidia-smi stand-in's answers: {remedy.reason}")
        _write_nvlink(plan)
        state = State(plan.params, state.daemons)
        save_state(plan.paths, state)
        seen = observe(plan, state)
        remedy = assess(plan, state, seen)  # and whatever else needs doing
    if remedy.action == "none":
        say("already up; nothing to do")
        return remedy
    if remedy.action == "revive":
        assert state is not None
        say(f"repairing: {remedy.reason}")
        for key in remedy.daemons:
            _restart(plan, state, key, say)
        if SLURMCTLD in remedy.daemons:
            # The nodes re-register with the new slurmctld: up means they are in service.
            _await_nodes(plan, [n.name for n in plan.nodes if n.name not in remedy.nodes])
        for name in remedy.nodes:
            _revive(plan, state, plan.node(name), say)
        return remedy
    if remedy.action == "rebuild":
        at_stake = _jobs_at_stake(plan, seen)
        if at_stake and not force:
            raise ClusterRefused(
                f"the cluster needs a rebuild ({remedy.reason}), which would lose {at_stake} "
                "and all accounting; let them finish or cancel them, or pass --force"
            )
        say(f"rebuilding: {remedy.reason}")
        teardown(plan.paths, state, say, keep_work=True)
    build(plan, say)
    return remedy


# Each control daemon restarted on its own data: munged's key, MariaDB's data directory,
# slurmctld's StateSaveLocation (no -c: it recovers every job from there).
_RESTART: dict[str, Callable[[Plan], subprocess.Popen]] = {
    MUNGED: daemons.start_munged,
    MARIADB: lambda plan: daemons.start_mariadb(plan, setup_sql=None),
    SLURMDBD: daemons.start_slurmdbd,
    SLURMCTLD: daemons.start_slurmctld,
}


def _restart(plan: Plan, state: State, key: str, say: Say) -> None:
    host = None if key == MUNGED else plan.controller
    _record(plan.paths, state, key, _RESTART[key](plan), host)
    say(f"{key} restarted in place with its state")


def _jobs_at_stake(plan: Plan, seen: Observed) -> str:
    """What a rebuild would throw away ("" when nothing): the queued and running jobs,
    or, with slurmctld down, the job state it saved and would have recovered."""
    if SLURMCTLD in seen.alive:
        jobs = _slurm(plan, "squeue", "--noheader", "--format=%i").split()
        return f"{len(jobs)} queued or running job(s) ({' '.join(jobs[:10])})" if jobs else ""
    saved = plan.paths.ctld_state / "job_state"
    return f"the jobs slurmctld saved in {saved}" if saved.exists() else ""


def build(plan: Plan, say: Say) -> None:
    started = time.monotonic()
    p = plan.paths
    state = State(plan.params)
    say(f"[1/7] writing configuration under {p.root} (Slurm {plan.params.slurm_version})")
    db_password = secrets.token_hex(16)
    _write_files(plan, db_password)
    save_state(p, state)
    say(
        f"[2/7] network: bridge {plan.bridge_address}/{plan.prefixlen}, "
        f"{len(plan.hosts)} namespaces ({plan.controller.name}, "
        f"{plan.nodes[0].name}..{plan.nodes[-1].name})"
    )
    net.create(plan)
    _write_hosts(hosts.with_block(HOSTS_FILE.read_text(), _hosts_entries(plan)))
    say("[3/7] munged (own key and socket)")
    _record(p, state, MUNGED, daemons.start_munged(plan))
    say("[4/7] MariaDB for accounting (own data directory, in ctl's namespace)")
    daemons.init_mariadb(plan)
    proc = daemons.start_mariadb(plan, cluster_conf.accounting_sql(db_password))
    _record(p, state, MARIADB, proc, plan.controller)
    say("[5/7] slurmdbd")
    _record(p, state, SLURMDBD, daemons.start_slurmdbd(plan), plan.controller)
    daemons.register_cluster(plan, CLUSTER_NAME)
    say("[6/7] slurmctld")
    _record(p, state, SLURMCTLD, daemons.start_slurmctld(plan), plan.controller)
    say(f"[7/7] slurmd on {len(plan.nodes)} nodes")
    for node in plan.nodes:
        _record(p, state, slurmd_key(node.name), daemons.start_slurmd(plan, node), node)
    _await_nodes(plan, [n.name for n in plan.nodes])
    size = plan.params.nvlink_domain_size
    domains = f", NVLink domains of {size} (nvidia-smi stand-in)" if size else ""
    say(
        f"up in {time.monotonic() - started:.0f} s: {len(plan.nodes)} nodes, "
        f"{plan.params.gpus_per_node} GPU stand-ins each{domains}; work root {p.work_root}"
    )


def _record(
    paths: Paths, state: State, key: str, proc: subprocess.Popen, host: Host | None = None
) -> None:
    state.daemons[key] = procs.identify(proc.pid, host.netns if host else None)
    save_state(paths, state)


def _mkdir(path: Path, mode: int = 0o755, owner: str | None = None) -> None:
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    path.chmod(mode)  # mkdir's mode is filtered by the umask
    if owner:
        shutil.chown(path, owner, owner)


def _write(path: Path, text: str | bytes, mode: int = 0o644, owner: str | None = None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(text.encode() if isinstance(text, str) else text)
    os.chmod(path, mode)
    if owner:
        shutil.chown(path, owner, owner)


def _write_files(plan: Plan, db_password: str) -> None:
    p = plan.paths
    _mkdir(p.root)
    _write(p.marker, "made by `nvrx-appliance cluster up`; `cluster down` removes this tree\n")
    _mkdir(p.etc)
    for path, text in cluster_conf.config_files(plan).items():
        _write(Path(path), text)
    _write(p.slurmdbd_conf, cluster_conf.slurmdbd_conf(plan, db_password), 0o600, "slurm")
    _mkdir(p.run, owner="slurm")
    _mkdir(p.log, owner="slurm")
    _mkdir(p.spool)
    _mkdir(p.ctld_state, 0o700, "slurm")
    for node in plan.nodes:
        _mkdir(p.spool / f"slurmd-{node.name}", 0o700)
    # munged checks that nobody else can write where its key and socket live.
    _mkdir(p.munge, 0o755, "munge")
    _write(p.munge_key, os.urandom(1024), 0o400, "munge")
    _mkdir(p.mysql, 0o755, "mysql")
    _mkdir(p.gpu_devices)
    for index in range(plan.params.gpus_per_node):
        device = p.gpu_device(index)
        if not device.exists():
            # A character device like /dev/null: Slurm only stats GRES files.
            os.mknod(device, 0o666 | 0o020000, os.makedev(1, 3))
    _write_nvlink(plan)
    # World-traversable so tests and users can make their own owner-only directories.
    _mkdir(p.work_root, 0o755)


def _write_nvlink(plan: Plan) -> None:
    """The nvidia-smi stand-in, its answers and the task prolog; readable and runnable
    by every job's user."""
    p = plan.paths
    wanted = nvlink.files(plan)
    for path, text in wanted.items():
        # By rename: a job step may run the stand-in while `up` changes its answers.
        _mkdir(Path(path).parent)
        _write(Path(path + ".new"), text, 0o644 if path.endswith(".txt") else 0o755)
        os.replace(path + ".new", path)
    # Answers of nodes the cluster no longer has, or the whole stand-in without domains.
    stale = [f for f in p.nvlink.rglob("*") if f.is_file() and str(f) not in wanted]
    for leftover in [*stale, p.task_prolog]:
        if str(leftover) not in wanted and leftover.exists():
            leftover.unlink()


def _write_hosts(text: str) -> None:
    # In place, not by rename: /etc/hosts is often a bind mount (containers).
    with HOSTS_FILE.open("r+") as f:
        f.seek(0)
        f.write(text)
        f.truncate()


def _slurm(plan: Plan, *argv: str) -> str:
    done = subprocess.run(
        [daemons.executable(argv[0]), *argv[1:]],
        env=daemons.slurm_env(plan),
        capture_output=True,
        text=True,
        timeout=20,
    )
    return done.stdout if done.returncode == 0 else ""


def node_states(plan: Plan) -> dict[str, str]:
    return parse_node_states(_slurm(plan, "scontrol", "-o", "show", "nodes"))


def _await_nodes(plan: Plan, names: list[str], timeout: float = NODE_READY_S) -> None:
    def ready() -> bool:
        states = node_states(plan)
        return all(in_service(states.get(n, "")) for n in names)

    try:
        wait_until(ready, timeout, f"{', '.join(names)} to register with slurmctld", 0.5)
    except Timeout as exc:
        states = node_states(plan)
        seen = ", ".join(f"{n}={states.get(n, '?')}" for n in names)
        raise ClusterError(f"{exc} ({seen}); see {plan.paths.log}/slurmd-<node>.log") from None


# --- down -------------------------------------------------------------------------------


def teardown(paths: Paths, state: State | None, say: Say, *, keep_work: bool = False) -> None:
    """Remove everything of ours, whether or not `up` finished or left a state file;
    keep_work (a rebuild): all but the work root, which holds every run's work dir."""
    recorded = [d.pid for d in (state.daemons.values() if state else []) if procs.is_alive(d)]
    found = sorted(set(recorded) | set(procs.our_daemons(paths.root)))
    if found:
        say(f"stopping {len(found)} daemons (pids {' '.join(map(str, found))})")
        # In waves, each before what it talks to: slurmctld saves its state through
        # slurmdbd and would wait out its timeouts on a slurmdbd already gone.
        waves = (("slurmctld",), ("slurmd", "slurmdbd"))
        for wave in waves:
            procs.stop([pid for pid in found if _name(pid) in wave])
        procs.stop([pid for pid in found if not any(_name(pid) in w for w in waves)])
    namespaces = net.namespaces()
    for ns in sorted(namespaces):
        procs.empty_netns(ns)
    if namespaces or net.links():
        say(f"removing {len(namespaces)} network namespaces, their links and the bridge")
    net.remove()
    text = HOSTS_FILE.read_text()
    if hosts.BEGIN in text or hosts.END in text:
        say("removing the /etc/hosts block")
        _write_hosts(hosts.without_block(text))
    if paths.root.exists():
        if not paths.marker.exists() and any(paths.root.iterdir()):
            raise ClusterRefused(f"{paths.root} was not made by nvrx-appliance; left in place")
        if keep_work:
            say(f"removing {paths.root}, all but the work root {paths.work_root}")
        else:
            say(f"removing {paths.root}")
        remove_root(paths, keep_work=keep_work)


def remove_root(paths: Paths, *, keep_work: bool) -> None:
    """The cluster's root directory, or with keep_work everything in it but the work
    root (and the marker that keeps the root ours until the rebuild writes it again)."""
    if not keep_work:
        shutil.rmtree(paths.root)
        return
    kept = paths.kept_across_rebuilds()
    for entry in paths.root.iterdir():
        if entry in kept:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _name(pid: int) -> str:
    argv = procs.cmdline(pid)
    return Path(argv[0]).name if argv else ""


def down(root: Path, say: Say) -> bool:
    """Returns False when there was nothing to remove."""
    paths = Paths(root)
    state = load_state(paths)
    anything = (
        paths.root.exists()
        or net.namespaces()
        or net.links()
        or hosts.BEGIN in HOSTS_FILE.read_text()
        or procs.our_daemons(root)
    )
    if not anything:
        return False
    teardown(paths, state, say)
    return True


# --- kill-node / revive-node --------------------------------------------------------------


def current_plan(root: Path = DEFAULT_ROOT) -> tuple[Plan, State]:
    state = load_state(Paths(root))
    if state is None:
        raise ClusterError("the local cluster is not up; run `nvrx-appliance cluster up`")
    return make_plan(state.params, root), state


def _node(plan: Plan, name: str) -> Host:
    try:
        return plan.node(name)
    except KeyError as exc:
        raise ClusterRefused(str(exc.args[0])) from None


def kill_node(name: str, say: Say, root: Path = DEFAULT_ROOT, silent: bool = False) -> int:
    """Kill every process in the node's namespace and take its link down, the way a
    node dies: no clean shutdown, no goodbye to slurmctld. Returns how many died.

    In that order, the kernel closes the dead processes' connections while the link is
    still up, so their peers read a reset at once (a crash: the OOM killer, a kernel
    that kills the job). `silent` takes the link down first: nothing leaves the node,
    and its peers find out only when a timeout of theirs runs out (a power loss, a
    dead NIC)."""
    plan, _ = current_plan(root)
    node = _node(plan, name)
    victims = procs.netns_pids(node.netns)
    if silent:
        net.set_link(node, up=False)
    procs.empty_netns(node.netns)
    net.set_link(node, up=False)
    say(
        f"{name}: killed {len(victims)} processes (slurmd and its jobs) and took its link "
        f"down{' first' if silent else ''}; Slurm marks it DOWN within about "
        f"{cluster_conf.SLURMD_TIMEOUT_S + 10} s"
    )
    return len(victims)


def freeze_node(name: str, say: Say, root: Path = DEFAULT_ROOT) -> int:
    """Stop (SIGSTOP) every process of the node's jobs, its link left up: a node whose
    work hangs whole while its kernel still answers the network. Slurm's daemons are left
    running: on a real cluster Slurm's SlurmdTimeout (300 s by default) outlasts such a
    freeze, where the local cluster's (10 s) would end the jobs first. Returns how many
    were stopped; thaw_node undoes it."""
    plan, _ = current_plan(root)
    node = _node(plan, name)
    pids = _job_processes(node)
    procs.signal_all(pids, signal.SIGSTOP)
    say(f"{name}: stopped the {len(pids)} processes of its jobs (Slurm's daemons and the "
        f"link left up); `cluster thaw-node {name}` resumes them")  # fmt: skip
    return len(pids)


def thaw_node(name: str, say: Say, root: Path = DEFAULT_ROOT) -> int:
    plan, _ = current_plan(root)
    node = _node(plan, name)
    pids = _job_processes(node)
    procs.signal_all(pids, signal.SIGCONT)
    say(f"{name}: resumed the {len(pids)} processes of its jobs")
    return len(pids)


def _job_processes(node: Host) -> list[int]:
    """The node's job processes: what its jobs run, not Slurm's own (slurmd with its
    reaper, and each step's slurmstepd, which slurmd asks about its steps: a stopped one
    would stall slurmd, and the local cluster's short SlurmdTimeout would call the node
    dead)."""
    return [pid for pid in procs.netns_pids(node.netns) if not _slurms_own(procs.cmdline(pid))]


def _slurms_own(argv: list[str]) -> bool:
    head = argv[0] if argv else ""
    return head.startswith("slurmstepd") or any(os.path.basename(a) == "slurmd" for a in argv)


def cut_link(name: str, seconds: float, say: Say, root: Path = DEFAULT_ROOT) -> None:
    """Take the node's link down for `seconds`, then up again: a network blip (a switch
    that reboots, a flapping port). Its processes run on; what they send meanwhile is lost
    or retried."""
    plan, _ = current_plan(root)
    node = _node(plan, name)
    net.set_link(node, up=False)
    try:
        time.sleep(seconds)  # the blip itself: how long the link stays down
    finally:
        net.set_link(node, up=True)
    say(f"{name}: link was down for {seconds:g} s, up again")


def revive_node(name: str, say: Say, root: Path = DEFAULT_ROOT) -> None:
    plan, state = current_plan(root)
    _revive(plan, state, _node(plan, name), say)


def _revive(plan: Plan, state: State, node: Host, say: Say) -> None:
    if node.netns not in net.namespaces():
        raise ClusterError(f"{node.name}'s namespace is gone; run `nvrx-appliance cluster up`")
    net.set_link(node, up=True)
    key = slurmd_key(node.name)
    recorded = state.daemons.get(key)
    if recorded is None or not procs.is_alive(recorded):
        procs.empty_netns(node.netns)  # nothing of the dead node may linger
        _record(plan.paths, state, key, daemons.start_slurmd(plan, node), node)
        say(f"{node.name}: slurmd started, link up; waiting for Slurm to return it to service")
    # A node that died while running a job comes back DOWN (ReturnToService=2 lifts
    # that on registration) or still marked not responding for a moment.
    _await_nodes(plan, [node.name])
    say(f"{node.name}: back in service")


# --- status -------------------------------------------------------------------------------


def status(root: Path = DEFAULT_ROOT) -> dict[str, Any]:
    paths = Paths(root)
    base: dict[str, Any] = {
        "root": str(paths.root),
        "slurm_conf": str(paths.slurm_conf),
        "work_root": str(paths.work_root),
        "env": {"SLURM_CONF": str(paths.slurm_conf)},
    }
    state = load_state(paths)
    if state is None:
        return {"up": False, "reason": "no cluster (run `nvrx-appliance cluster up`)", **base}
    try:
        plan = make_plan(state.params, root)
    except PlanError as exc:
        return {"up": False, "reason": f"unreadable state: {exc}", **base}
    seen = observe(plan, state)
    slurm_states = node_states(plan) if SLURMCTLD in seen.alive else {}
    return {**base, **status_document(plan, state, seen, slurm_states)}
