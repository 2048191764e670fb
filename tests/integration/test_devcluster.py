"""The local cluster behaves like a real multi-node Slurm cluster, and `up`, `down`,
`kill-node` and `revive-node` do what they promise (issue 2)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from nvrx_appliance.devcluster import cluster_conf, hosts, net, procs
from nvrx_appliance.devcluster.plan import Paths
from nvrx_appliance.devcluster.report import in_service, seen_dead

from .chain_support import submit, tasks, unique, wait_event, wait_idle, wait_ledger
from .conftest import Cluster, cluster_cli

pytestmark = pytest.mark.cluster

TASK = """#!/bin/bash
# One array task: record where and when it ran, then exit with the code asked for.
start=$(date +%s.%N)
sleep {seconds}
end=$(date +%s.%N)
code=0
[ "$SLURM_ARRAY_TASK_ID" = "$1" ] && code=3
echo "$SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID $(hostname) $SLURMD_NODENAME $start $end $code" \\
  > "{work}/ran.$SLURM_ARRAY_JOB_ID.$SLURM_ARRAY_TASK_ID"
exit $code
"""


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of intervals open at one instant."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def test_singleton_arrays_run_one_generation_at_a_time(cluster: Cluster):
    work = cluster.workdir("singleton")
    script = work / "task.sh"
    script.write_text(TASK.format(seconds=3, work=work))
    script.chmod(0o755)
    name = f"singleton-{uuid.uuid4().hex[:8]}"
    common = ["--job-name", name, "--array=0-3%2", "--dependency=singleton", "--exclusive"]
    common += ["-o", f"{work}/%A_%a.out", str(script)]
    first = cluster.sbatch(*common, "none")
    second = cluster.sbatch(*common, "3")  # task 3 of the second generation exits 3

    records = {job: cluster.wait_finished(job, 4, timeout=120) for job in (first, second)}

    # sacct reports every task with its state and exit code
    for job, expected_failed in ((first, None), (second, "3")):
        by_task = {r["JobID"].split("_")[1]: r for r in records[job]}
        assert sorted(by_task) == ["0", "1", "2", "3"]
        for task, record in by_task.items():
            if task == expected_failed:
                assert (record["State"], record["ExitCode"]) == ("FAILED", "3:0")
            else:
                assert (record["State"], record["ExitCode"]) == ("COMPLETED", "0:0")
            assert record["JobName"] == name

    ran = {}
    for path in work.glob("ran.*"):
        array, task, host, node, start, end, code = path.read_text().split()
        ran[(array, task)] = (host, node, float(start), float(end), int(code))
    assert len(ran) == 8
    for (array, task), (host, node, *_rest) in ran.items():
        assert host == node, f"task {array}_{task}: hostname {host} on node {node}"
        sacct_node = {r["JobID"]: r["NodeList"] for r in records[array]}[f"{array}_{task}"]
        assert sacct_node == node

    def generation(array: str) -> list[tuple[str, float, float]]:
        return [(n, s, e) for (a, _), (_, n, s, e, _) in ran.items() if a == array]

    gen1, gen2 = generation(first), generation(second)
    # one generation at a time: the second starts only after the first has ended
    assert max(e for _, _, e in gen1) <= min(s for _, s, _ in gen2)
    assert max(r["End"] for r in records[first]) <= min(r["Start"] for r in records[second])
    for gen in (gen1, gen2):
        # the throttle admits two tasks at once, never more, on distinct nodes
        assert most_at_once([(s, e) for _, s, e in gen]) == 2
        for i, (node_a, s_a, e_a) in enumerate(gen):
            for node_b, s_b, e_b in gen[i + 1 :]:
                if s_a < e_b and s_b < e_a:
                    assert node_a != node_b, "two exclusive tasks overlapped on one node"


def test_gpu_stand_ins_are_scheduled_like_gpus(cluster: Cluster):
    out = cluster.slurm(
        "srun",
        "-N2",
        "--gpus-per-node=2",
        "--label",
        "bash",
        "-c",
        'echo "$(hostname) $CUDA_VISIBLE_DEVICES"',
        timeout=60,
    ).stdout
    lines = sorted(line.split(": ", 1)[1] for line in out.splitlines())
    assert len(lines) == 2
    assert all(line.endswith(" 0,1") for line in lines)
    assert len({line.split()[0] for line in lines}) == 2
    too_many = cluster.slurm(
        "srun", "-N1", "--gpus-per-node=3", "--immediate=5", "true", check=False, timeout=60
    )
    assert too_many.returncode != 0


def test_an_orphan_a_job_step_leaves_is_reaped_on_its_node_not_by_this_machines_init(
    cluster: Cluster,
):
    # As on a systemd node: orphans of a job go to a reaper on the node, so the job ends
    # when its step does (this VM's PID 1 reaps late, and slurmstepd waits for it).
    work = cluster.workdir("orphan")
    pid_file = work / "orphan.pid"
    # The step's shell waits until the orphan is in its own session: exiting before the
    # orphan's setsid() would let slurmstepd's end-of-step kill of the group take it too.
    orphan_cmd = f"setsid sh -c 'echo \\$\\$ > {pid_file}.new && mv {pid_file}.new {pid_file} && exec sleep 300'"
    step = (
        f"{orphan_cmd} </dev/null >/dev/null 2>&1 & while [ ! -s {pid_file} ]; do sleep 0.05; done"
    )
    job = cluster.sbatch(
        "--job-name", unique("orphan"), "-o", f"{work}/%j.out",
        "--wrap", f"srun sh -c \"{step}\"",
    )  # fmt: skip
    cluster.wait_finished(job, 1, timeout=60)
    orphan = int(pid_file.read_text())
    try:
        status = Path(f"/proc/{orphan}/status").read_text()
        parent = int(next(x for x in status.splitlines() if x.startswith("PPid:")).split()[1])
        assert "nvrx_appliance.devcluster.reaper" in " ".join(procs.cmdline(parent))
    finally:
        os.kill(orphan, signal.SIGKILL)


def test_up_on_a_healthy_cluster_changes_nothing(cluster: Cluster):
    before = json.loads(cluster_cli("status", "--json").stdout)
    again = cluster_cli("up")
    assert again.returncode == 0, again.stderr
    assert "already up" in again.stderr
    after = json.loads(cluster_cli("status", "--json").stdout)
    assert [d["pid"] for d in after["daemons"]] == [d["pid"] for d in before["daemons"]]


def test_status_reports_each_daemon_and_node_by_name_and_address(cluster: Cluster):
    status = json.loads(cluster_cli("status", "--json").stdout)
    assert status["up"] and status["slurm_conf"] == cluster.slurm_env["SLURM_CONF"]
    assert status["work_root"] == str(cluster.work_root)
    assert {d["name"] for d in status["daemons"]} >= {"munged", "mariadbd", "slurmdbd", "slurmctld"}
    assert all(d["running"] and d["pid"] for d in status["daemons"])
    assert [n["name"] for n in status["nodes"]] == [
        f"node{k}" for k in range(1, len(cluster.nodes) + 1)
    ]
    for host in [status["controller"], *status["nodes"]]:
        # every namespace shares the machine's /etc/hosts: names resolve everywhere
        assert socket.gethostbyname(host["name"]) == host["address"]
    table = cluster_cli("status").stdout
    assert all(n["name"] in table and n["address"] in table for n in status["nodes"])


def test_env_prints_the_exports_clients_need(cluster: Cluster):
    out = cluster_cli("env").stdout
    assert f"export SLURM_CONF={cluster.slurm_env['SLURM_CONF']}\n" in out
    assert f"export NVRX_DEVCLUSTER_WORK_ROOT={cluster.work_root}\n" in out


def test_kill_node_of_an_unknown_node_is_refused(cluster: Cluster):
    done = cluster_cli("kill-node", "node99")
    assert done.returncode == 2
    assert "node99" in done.stderr and "node1" in done.stderr


@pytest.mark.disruptive
def test_kill_node_is_seen_dead_in_time_and_revive_returns_it(cluster: Cluster):
    node, netns = cluster.nodes[-1], cluster.status["nodes"][-1]["netns"]
    work = cluster.workdir("kill-node")
    pid_file = work / "job.pid"
    job = cluster.sbatch(
        "-w",
        node,
        "--no-requeue",
        "-o",
        f"{work}/job.out",
        "--wrap",
        f"echo $$ > {pid_file}.tmp && mv {pid_file}.tmp {pid_file} && exec sleep 600",
    )
    cluster.wait_until(pid_file.exists, 30, "the job to start on the node")
    job_pid = int(pid_file.read_text())
    assert job_pid in procs.netns_pids(netns)

    killed_at = time.monotonic()
    done = cluster_cli("kill-node", node)
    assert done.returncode == 0, done.stderr
    assert procs.start_time(job_pid) is None, "the job's process outlived its node"
    assert procs.netns_pids(netns) == []
    assert net.links()[netns] is False  # its link is down

    # slurmctld pings a node every SlurmdTimeout/3 and waits up to MessageTimeout for
    # an answer; it flags the node NOT_RESPONDING on the first ping that fails and sets
    # it DOWN on the first ping round after SlurmdTimeout without an answer.
    noticed_within = cluster_conf.SLURMD_TIMEOUT_S + 2 * cluster_conf.MESSAGE_TIMEOUT_S
    down_within = cluster_conf.SLURMD_TIMEOUT_S + 4 * cluster_conf.MESSAGE_TIMEOUT_S
    cluster.wait_until(
        lambda: seen_dead(cluster.node_state(node)), noticed_within, f"Slurm to notice {node}"
    )
    noticed = time.monotonic() - killed_at
    cluster.wait_until(
        lambda: "DOWN" in cluster.node_state(node),
        down_within - noticed,
        f"Slurm to mark {node} DOWN {down_within} s after it died",
    )
    print(
        f"{node}: not responding after {noticed:.1f} s, DOWN after "
        f"{time.monotonic() - killed_at:.1f} s (SlurmdTimeout {cluster_conf.SLURMD_TIMEOUT_S} s)"
    )
    [record] = cluster.wait_finished(job, 1, timeout=30)
    assert record["State"] == "NODE_FAIL"

    revived = cluster_cli("revive-node", node)
    assert revived.returncode == 0, revived.stderr
    assert in_service(cluster.node_state(node))
    ran = cluster.slurm("srun", "-w", node, "hostname", timeout=60).stdout.strip()
    assert ran == node


# One connection between two nodes: a server on the first that accepts and holds it, a
# client on the second that writes what its blocking read returned once it returns.
SERVER = """
import socket, sys
s = socket.create_server(("0.0.0.0", 29800))
conn, _ = s.accept()
open(sys.argv[1], "w").write("accepted")
conn.recv(1)
"""
CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], 29800), timeout=30)
c.settimeout(None)
try:
    got = "eof" if c.recv(1) == b"" else "data"
except OSError as exc:
    got = type(exc).__name__
open(sys.argv[2], "w").write(got)
"""


def _connected(cluster: Cluster, work: Path, server: int, client: int) -> tuple[Path, str]:
    """A held connection from node `client` to node `server` (indexes of the cluster's
    nodes); returns the client's result file and the server's address."""
    nodes = cluster.status["nodes"]
    address = nodes[server]["address"]
    accepted, result = work / f"accepted.{server}", work / f"read.{server}"
    subprocess.Popen(["ip", "netns", "exec", nodes[server]["netns"], "python3", "-c", SERVER,
                      str(accepted)])  # fmt: skip
    cluster.wait_until(
        lambda: subprocess.run(["ip", "netns", "exec", nodes[server]["netns"], "ss", "-Hltn",
                                "sport = :29800"], capture_output=True, text=True).stdout,
        10, "the server to listen",
    )  # fmt: skip
    subprocess.Popen(["ip", "netns", "exec", nodes[client]["netns"], "python3", "-c", CLIENT,
                      address, str(result)])  # fmt: skip
    cluster.wait_until(accepted.exists, 10, "the connection")
    return result, address


def _established(cluster: Cluster, client: int, address: str) -> bool:
    out = subprocess.run(
        ["ip", "netns", "exec", cluster.status["nodes"][client]["netns"], "ss", "-Htn",
         "state", "established", "dst", address],
        capture_output=True, text=True,
    ).stdout  # fmt: skip
    return bool(out.strip())


@pytest.mark.disruptive
def test_a_crashed_node_resets_its_connections_and_a_silent_one_says_nothing(cluster: Cluster):
    # A crash (the default) lets the kernel close the dead processes' connections while
    # the link is up: the peer's read ends at once. --silent (a power loss) takes the
    # link down first: the peer's connection stays open, its read blocked, until a
    # timeout of its own (in training, NVRx's step section) gives up on it.
    work = cluster.workdir("silent")
    crashed, silent = cluster.nodes[-1], cluster.nodes[-2]
    try:
        result, _ = _connected(cluster, work, server=-1, client=0)
        assert cluster_cli("kill-node", crashed).returncode == 0
        cluster.wait_until(result.exists, 10, "the crashed node's peer to read the end")
        assert result.read_text() in ("eof", "ConnectionResetError")

        result, address = _connected(cluster, work, server=-2, client=0)
        done = cluster_cli("kill-node", silent, "--silent")
        assert done.returncode == 0 and "link down first" in done.stderr, done.stderr
        assert procs.netns_pids(cluster.status["nodes"][-2]["netns"]) == []
        # Its processes are gone, and the peer still holds an open connection to them.
        assert _established(cluster, 0, address) and not result.exists()
    finally:
        for node in (crashed, silent):
            cluster_cli("revive-node", node)
        subprocess.run(["pkill", "-f", "socket.create_connection"], check=False)


@pytest.mark.disruptive
def test_up_after_a_controller_crash_restarts_it_in_place_and_the_chain_goes_on(cluster: Cluster):
    work, name = cluster.workdir("ctlcrash"), unique("ctlcrash")
    first, second = submit(
        cluster, work, name,
        "--mode", "train", "--train-tasks", "1", "--hot-spares", "0", "--depth", "2",
        "--train-samples", "600",
    )  # fmt: skip
    submitted_at = time.time()
    wait_event(work, lambda e: e["event"] == "checkpoint", 180, "the first checkpoint")
    status = json.loads(cluster_cli("status", "--json").stdout)
    # A crash loses what slurmctld had not yet written down: it saves its job state at
    # most every 5 s (SAVE_MAX_WAIT) and hands accounting records to slurmdbd through an
    # in-memory queue. The first checkpoint can come sooner than that after submit (a CI
    # run lost the whole chain so), so the crash waits until both generations are on
    # disk and in accounting: what `up` must then bring back is what a site keeps.
    job_state = Paths(Path(status["root"])).ctld_state / "job_state"
    cluster.wait_until(
        lambda: job_state.exists() and job_state.stat().st_mtime > submitted_at,
        30,
        f"slurmctld to save its job state after {second} was queued",
        0.2,
    )
    cluster.wait_until(
        lambda: tasks(cluster, first) and tasks(cluster, second),
        30,
        f"accounting to hold {first} and {second}",
        0.5,
    )
    pids = {d["name"]: d["pid"] for d in status["daemons"] if d["host"] in ("ctl", "(root)")}
    # what an OOM kill or a crashed controller host leaves behind, mid-chain
    os.kill(pids["slurmctld"], signal.SIGKILL)
    os.kill(pids["munged"], signal.SIGKILL)
    assert not json.loads(cluster_cli("status", "--json").stdout)["up"]

    repaired = cluster_cli("up")
    assert repaired.returncode == 0, repaired.stderr
    assert "slurmctld restarted in place" in repaired.stderr and "rebuild" not in repaired.stderr
    after = json.loads(cluster_cli("status", "--json").stdout)
    assert after["up"], after["reason"]
    # The controller recovered its jobs: the queued successor is still there, and the
    # running generation's accounting too.
    queued = cluster.slurm("squeue", "--noheader", "--format=%F", "--name", name).stdout.split()
    assert second in queued or tasks(cluster, second), "the queued generation was lost"
    assert tasks(cluster, first), "the running generation's accounting was lost"
    # ...and the chain goes on to its end: training completes in the first generation,
    # whose teardown cancels the queued one the controller kept.
    entries = wait_ledger(work, 1, timeout=420)
    wait_idle(cluster, name, timeout=60)
    assert [(e["array_job_id"], e["action"]) for e in entries] == [(first, "completed")]


def _fingerprint(paths: list[str]) -> dict[str, str]:
    """Contents of the machine's own Slurm/munge/MariaDB configuration, to prove that
    neither `up` nor `down` touches them."""
    seen = {}
    for top in paths:
        for path in sorted(Path(top).rglob("*")) if Path(top).is_dir() else [Path(top)]:
            if path.is_file():
                seen[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return seen


@pytest.mark.disruptive
def test_down_leaves_the_machine_as_found_and_up_works_again(cluster: Cluster):
    machine_config = ["/etc/slurm", "/etc/munge", "/etc/mysql"]
    before = _fingerprint(machine_config)
    status = json.loads(cluster_cli("status", "--json").stdout)
    root = Path(status["root"])
    pids = [d["pid"] for d in status["daemons"]]
    hosts_with_cluster = Path("/etc/hosts").read_text()
    addresses = [n["address"] for n in status["nodes"]] + [status["controller"]["address"]]

    # Stand-ins for the machine's own daemons: same names, nothing of ours in them.
    foreign = [
        subprocess.Popen([name, "600"], executable="sleep", env={"PATH": os.defpath})
        for name in ("slurmd", "slurmctld", "munged", "mariadbd")
    ]
    try:
        started = time.monotonic()
        down = cluster_cli("down")
        assert down.returncode == 0, down.stderr
        print(f"cluster down took {time.monotonic() - started:.1f} s")
        assert all(p.poll() is None for p in foreign), "down killed a daemon not its own"
    finally:
        for p in foreign:
            p.kill()
            p.wait()

    assert all(procs.start_time(pid) is None for pid in pids)
    assert procs.our_daemons(root) == []
    assert net.namespaces() == set() and net.links() == {}
    hosts_now = Path("/etc/hosts").read_text()
    assert hosts_now == hosts.without_block(hosts_with_cluster)
    assert hosts.BEGIN not in hosts_now
    assert not any(address in hosts_now for address in addresses)
    assert not root.exists()
    assert _fingerprint(machine_config) == before
    assert cluster_cli("down").returncode == 0  # nothing left to remove is fine
    assert cluster_cli("status").returncode == 1

    started = time.monotonic()
    up = cluster_cli("up")
    assert up.returncode == 0, up.stderr
    print(f"cluster up (packages present) took {time.monotonic() - started:.1f} s")
    again = json.loads(cluster_cli("status", "--json").stdout)
    assert again["up"], again["reason"]
    assert again["slurm_conf"] == cluster.slurm_env["SLURM_CONF"]
    assert _fingerprint(machine_config) == before
    ran = cluster.slurm("srun", f"-N{len(cluster.nodes)}", "hostname", timeout=60).stdout
    assert sorted(ran.split()) == sorted(cluster.nodes)
