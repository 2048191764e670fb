"""Who sent a workload's SIGKILL, where it was not a hang's timeout.

A rank that exits 137 was SIGKILLed. NVRx's rank monitor does that at a section or
out-of-section timeout (rank_monitor_server.py, `_shutdown_rank`: SIGCONT then SIGKILL;
the line saying so is logged at debug level, so it is not in ft_launcher's log at its
default level), and so does the guard's own stillness watch (rank/stillness.py, which
writes its record first). Two others send it too, and neither is a hang: the appliance's
straggler leaver (node/straggler_leave.py), which ends a slow node's ranks after a
checkpoint and writes `stragglers/ended.<node>` first; and the kernel's OOM killer,
which counts each kill in the cgroup's `oom_kill` (v2 memory.events, v1
memory.oom_control). The guard judges a 137 as a hang unless one of these says it was
theirs.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
ABORTED = 128 + 6  # SIGABRT: NCCL's watchdog tears the process down on a timeout
# torch 2.13's ProcessGroupNCCL, its watchdog on a timed-out work: "[Rank N] Watchdog
# caught collective operation timeout: WorkNCCL(SeqNum=.., OpType=.., ...) ran for N
# milliseconds before timing out." With TORCH_NCCL_ASYNC_ERROR_HANDLING's default (3,
# SkipCleanUp, ProcessGroupNCCL.hpp) the process then aborts: exit 134, every rank alike.
_WATCHDOG = re.compile(r"Watchdog caught collective operation timeout: (.*?) before timing out")


def _cgroup_files(table: str) -> list[Path]:
    """Where this process's cgroup counts OOM kills, most specific first: its own cgroup
    as /proc/self/cgroup names it, then the mount's root (a container sees its own
    cgroup mounted as the root)."""
    found = []
    for line in table.splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        rel = path.lstrip("/")
        if controllers == "":  # v2: one unified hierarchy
            found += [CGROUP_ROOT / rel / "memory.events", CGROUP_ROOT / "memory.events"]
        elif "memory" in controllers.split(","):
            base = CGROUP_ROOT / "memory"
            found += [base / rel / "memory.oom_control", base / "memory.oom_control"]
    return found


def oom_kills(table_path: Path = Path("/proc/self/cgroup")) -> int | None:
    """The OOM kills this process's memory cgroup has counted; None where unknown."""
    try:
        table = table_path.read_text()
    except OSError:
        return None
    for path in _cgroup_files(table):
        with contextlib.suppress(OSError, ValueError):
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return None


def ended_name(node: str) -> str:
    """The straggler leaver's mark, in the generation's stragglers dir, that it ended the
    node's ranks (written before the SIGKILL)."""
    return f"ended.{node}"


def for_a_dead_node(deaths: Path, node: str, generation: str, cycle: str) -> str | None:
    """Why task 0 ended this node's ranks in this cycle: another node died silently and
    NVRx must restart without it (node/dead_node.py writes the mark before the kill).
    None when no mark of this generation says so."""
    with contextlib.suppress(OSError, ValueError):
        mark = json.loads((deaths / f"stopped.{node}.cycle{cycle}").read_text())
        if isinstance(mark, dict) and mark.get("generation") == generation:
            return (f"task 0 ended this node's ranks for the restart: {mark.get('words')}; "
                    "not a hang and not this node's failure, nothing judged")  # fmt: skip
    return None


def not_a_hang(
    *, oom_before: int | None, oom_now: int | None, stragglers: Path, node: str, generation: str
) -> str | None:
    """Why this rank's SIGKILL was not a hang's timeout, or None when nothing says so."""
    if oom_before is not None and oom_now is not None and oom_now > oom_before:
        return (f"the kernel's OOM killer ended the workload (the cgroup's oom_kill went "
                f"{oom_before} -> {oom_now}): not a hang, nothing judged")  # fmt: skip
    with contextlib.suppress(OSError, ValueError):
        mark = json.loads((stragglers / ended_name(node)).read_text())
        if isinstance(mark, dict) and mark.get("generation") == generation:
            return ("the straggler leaver ended this node's ranks (it leaves at this "
                    "rendezvous): not a hang, nothing judged")  # fmt: skip
    return None


def nccl_watchdog(lines: Iterable[str]) -> str | None:
    """What NCCL's watchdog said it timed out ("`WorkNCCL(SeqNum=5, OpType=ALLREDUCE, ...)`
    ran for 600081 milliseconds"), from the workload's last lines; None when it said
    nothing: an exit 134 without it is some other abort, not a hang."""
    for line in reversed(list(lines)):
        match = _WATCHDOG.search(line)
        if match:
            work, _, ran = match.group(1).rpartition(" ran for ")
            return f"`{work}` ran for {ran}" if work else match.group(1)
    return None
