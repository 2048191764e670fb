"""Processes of the cluster: identity, discovery, and stopping them (the shell, /proc)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from nvrx_appliance.devcluster.state import Daemon

# The daemons the cluster starts. A process counts as ours when it is one of these and
# its command line or environment (SLURM_CONF) names our root directory, so a machine's
# own slurmd or MariaDB is never touched.
DAEMON_NAMES = ("munged", "mariadbd", "mysqld", "slurmdbd", "slurmctld", "slurmd")

# Daemons get this long to exit on SIGTERM before SIGKILL; all of them stop in well
# under a second when their peers are alive, and `down` should not hang when one is not.
STOP_GRACE_S = 5.0


def start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` in clock ticks, or None when it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2) may hold spaces and parentheses.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None  # a zombie has already died; it only waits to be reaped
    return int(fields[19])


def identify(pid: int, netns: str | None = None) -> Daemon:
    start = start_time(pid)
    if start is None:
        raise ProcessLookupError(pid)
    return Daemon(pid, start, netns)


def is_alive(daemon: Daemon) -> bool:
    return start_time(daemon.pid) == daemon.start


def _proc_strings(pid: int, what: str) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/{what}").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def cmdline(pid: int) -> list[str]:
    return _proc_strings(pid, "cmdline")


def our_daemons(root: Path) -> list[int]:
    """Daemons started from our root directory, found by scanning /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        argv = cmdline(pid)
        if not argv or Path(argv[0]).name not in DAEMON_NAMES:
            continue
        if any(str(root) in s for s in argv + _proc_strings(pid, "environ")):
            found.append(pid)
    return found


def netns_pids(netns: str) -> list[int]:
    """Every process whose network namespace is `netns` (daemons, job steps, workers)."""
    out = subprocess.run(
        ["ip", "netns", "pids", netns], capture_output=True, text=True, check=False
    ).stdout
    return [int(word) for word in out.split() if word.isdigit()]


def _signal(pids: dict[int, int | None], sig: int) -> None:
    for pid, start in pids.items():
        if start is not None and start_time(pid) == start:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def stop(pids: list[int], grace: float = STOP_GRACE_S) -> None:
    """SIGTERM, then SIGKILL whatever still runs after `grace` seconds.

    Each pid is pinned to its start time first, so a pid that is reused meanwhile by
    another process is not signalled.
    """
    pinned = {pid: start_time(pid) for pid in pids}
    _signal(pinned, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not any(start_time(p) == s for p, s in pinned.items() if s is not None):
            return
        time.sleep(0.1)
    kill(pids)


def signal_all(pids: list[int], sig: int) -> None:
    """`sig` to each of `pids` still the process it was when listed (a pid reused since
    is left alone)."""
    _signal({pid: start_time(pid) for pid in pids}, sig)


def kill(pids: list[int]) -> None:
    """SIGKILL, and wait until the processes are gone (how a crashed node's die)."""
    pinned = {pid: start_time(pid) for pid in pids}
    _signal(pinned, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(
        start_time(p) == s for p, s in pinned.items() if s is not None
    ):
        time.sleep(0.05)


def empty_netns(netns: str) -> None:
    """Kill everything in a namespace, again and again, until nothing is left (a dying
    job step may fork while we kill it)."""
    for _ in range(20):
        pids = netns_pids(netns)
        if not pids:
            return
        kill(pids)
