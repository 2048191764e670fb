"""Starting the cluster's daemons and knowing when each is ready (shell).

Every daemon runs in the foreground of the process we start (no self-daemonising), so
the pid we record is the daemon's own from the first instant (for slurmd: its reaping
parent's, which lives exactly as long), and a daemon that dies during start-up is
noticed at once instead of by a timeout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from nvrx_appliance.devcluster.cluster_conf import ACCOUNTING_DB, MARIADB_PORT
from nvrx_appliance.devcluster.plan import Host, Plan
from nvrx_appliance.devcluster.poll import Timeout, wait_until


class DaemonError(RuntimeError):
    """A daemon did not start or did not become ready; says which and where its log is."""


def executable(name: str) -> str:
    # root's PATH may lack the sbin directories when run through sudo or a test runner.
    found = shutil.which(name, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if not found:
        raise DaemonError(f"{name} is not installed (run `nvrx-appliance cluster up` as root)")
    return found


# Daemons start from a clean environment, not from whatever shell, venv or test runner
# ran `up`; SLURM_CONF in it is also how `down` recognises slurmdbd as ours.
DAEMON_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def daemon_env(plan: Plan) -> dict[str, str]:
    return {"PATH": DAEMON_PATH, "LANG": "C.UTF-8", "SLURM_CONF": str(plan.paths.slurm_conf)}


def slurm_env(plan: Plan) -> dict[str, str]:
    """The environment for Slurm client commands: the caller's, pointed at our cluster."""
    return {**os.environ, "SLURM_CONF": str(plan.paths.slurm_conf)}


def spawn(
    plan: Plan,
    argv: list[str],
    log: Path,
    *,
    host: Host | None = None,
    user: str | None = None,
) -> subprocess.Popen:
    """Start a daemon; in `host`'s network namespace with its hostname when given.

    nsenter enters the namespace without `ip netns exec`, which would remount /sys and
    hide the cgroup file system slurmd needs. nsenter, unshare and sh all exec, so the
    process we get back is the daemon itself.
    """
    if host is not None:
        argv = [
            "nsenter",
            f"--net=/run/netns/{host.netns}",
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            host.name,
            *argv,
        ]
    with log.open("ab") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=plan.paths.root,  # never the caller's directory, which may go away
            env=daemon_env(plan),
            user=user,
            group=user,
            extra_groups=[] if user else None,
        )


def _log_tail(log: Path, lines: int = 12) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def await_ready(proc: subprocess.Popen, ready, timeout: float, what: str, log: Path) -> None:
    """Wait for `ready()`; fail at once, with the log's tail, if the daemon exits."""

    def check() -> bool:
        if proc.poll() is not None:
            raise DaemonError(
                f"{what} exited with status {proc.returncode} while starting; "
                f"its log ({log}) ends with:\n{_log_tail(log)}"
            )
        return ready()

    try:
        wait_until(check, timeout, what, interval=0.2)
    except Timeout as exc:
        raise DaemonError(f"{exc}; see {log}:\n{_log_tail(log)}") from None


def succeeds(argv: list[str], env: dict[str, str] | None = None, stdin: str | None = None) -> bool:
    try:
        return (
            subprocess.run(
                argv, env=env, input=stdin, capture_output=True, text=True, timeout=15
            ).returncode
            == 0
        )
    except subprocess.TimeoutExpired:
        return False


# --- the daemons, in start order ---------------------------------------------------------


def start_munged(plan: Plan) -> subprocess.Popen:
    p = plan.paths
    log = p.munge / "munged.log"
    proc = spawn(
        plan,
        [
            executable("munged"),
            "--foreground",
            f"--socket={p.munge_socket}",
            f"--key-file={p.munge_key}",
            f"--pid-file={p.munge / 'munged.pid'}",
            f"--log-file={log}",
            f"--seed-file={p.munge / 'munged.seed'}",
        ],
        p.munge / "munged.out",
        user="munge",
    )
    encode = [executable("munge"), "-n", "-S", str(p.munge_socket)]
    await_ready(proc, lambda: succeeds(encode), 20, "munged to answer on its socket", log)
    return proc


def init_mariadb(plan: Plan) -> None:
    p = plan.paths
    log = p.mysql / "install-db.log"
    with log.open("ab") as out:
        done = subprocess.run(
            [
                executable("mariadb-install-db"),
                "--no-defaults",
                f"--datadir={p.mysql_data}",
                "--user=mysql",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    if done.returncode != 0:
        raise DaemonError(f"mariadb-install-db failed; see {log}:\n{_log_tail(log)}")


def start_mariadb(plan: Plan, setup_sql: str | None) -> subprocess.Popen:
    """setup_sql: the accounting database and user, on a fresh data directory; None on a
    restart, where they are already there."""
    p = plan.paths
    log = p.mysql / "mariadbd.log"
    proc = spawn(
        plan,
        [
            executable("mariadbd"),
            "--no-defaults",  # the machine's /etc/mysql must not reach our server
            f"--datadir={p.mysql_data}",
            f"--socket={p.mysql_socket}",
            f"--pid-file={p.mysql / 'mariadbd.pid'}",
            f"--log-error={log}",
            "--user=mysql",
            "--bind-address=127.0.0.1",
            f"--port={MARIADB_PORT}",
            "--skip-name-resolve",
            "--innodb-buffer-pool-size=64M",
            # slurmdbd warns below this; its long schema updates need it.
            "--innodb-lock-wait-timeout=900",
        ],
        p.mysql / "mariadbd.out",
        host=plan.controller,
    )
    client = [executable("mariadb"), "--no-defaults", f"--socket={p.mysql_socket}", "-u", "root"]
    await_ready(proc, lambda: succeeds([*client, "-e", "SELECT 1"]), 60, "MariaDB", log)
    if setup_sql is not None and not succeeds(client, stdin=setup_sql):
        raise DaemonError(f"could not create the accounting database {ACCOUNTING_DB}; see {log}")
    return proc


def start_slurmdbd(plan: Plan) -> subprocess.Popen:
    p = plan.paths
    log = p.log / "slurmdbd.log"
    env = slurm_env(plan)
    proc = spawn(plan, [executable("slurmdbd"), "-D"], p.log / "slurmdbd.out", host=plan.controller)
    show = [executable("sacctmgr"), "-n", "-P", "show", "cluster"]
    await_ready(proc, lambda: succeeds(show, env), 60, "slurmdbd to answer sacctmgr", log)
    return proc


def register_cluster(plan: Plan, name: str) -> None:
    env = slurm_env(plan)
    add = [executable("sacctmgr"), "-i", "add", "cluster", name]
    listed = subprocess.run(
        [executable("sacctmgr"), "-n", "-P", "show", "cluster", "format=cluster"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.split()
    if name not in listed and not succeeds(add, env):
        raise DaemonError(f"sacctmgr could not register cluster {name} with slurmdbd")


def start_slurmctld(plan: Plan) -> subprocess.Popen:
    p = plan.paths
    log = p.log / "slurmctld.log"
    env = slurm_env(plan)
    proc = spawn(
        plan,
        [executable("slurmctld"), "-D", "-f", str(p.slurm_conf)],
        p.log / "slurmctld.out",
        host=plan.controller,
    )

    def answers() -> bool:
        done = subprocess.run(
            [executable("scontrol"), "ping"], env=env, capture_output=True, text=True, timeout=15
        )
        return "UP" in done.stdout

    await_ready(proc, answers, 60, "slurmctld to answer scontrol ping", log)
    return proc


def start_slurmd(plan: Plan, node: Host) -> subprocess.Popen:
    p = plan.paths
    # Under a reaping parent, as on a node whose init is systemd: a job ends when its
    # step ends, not when this VM's PID 1 gets round to an orphan (reaper.py).
    reaper = [sys.executable, "-m", "nvrx_appliance.devcluster.reaper"]
    return spawn(
        plan,
        [*reaper, executable("slurmd"), "-D", "-f", str(p.slurm_conf), "-N", node.name],
        p.log / f"slurmd-{node.name}.out",
        host=node,
    )
