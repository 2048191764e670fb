"""The time-limit notice and the save signal, on one node (settings/endings.py has the
design).

The notice is a control file: a batch shell that Slurm's --signal reached writes it, or
task 0's entrypoint at the exit duration. Every entrypoint's supervisor reads it with
the closed flag and then sends the save signal to its ft_launcher, which forwards it to
each worker's process group. Only when it can land: a process that has not installed a
handler ignores SIGURG, so a signal sent while ft_launcher is still in its first
rendezvous, or while a worker is still importing, would be lost. So the supervisor waits
until ft_launcher and every worker of it catch the signal (the kernel says so in
/proc/PID/status), which also covers a notice that arrives during an in-job restart: the
next cycle's workers get it as soon as they can act on it.

Workers save together: the first node whose supervisor signals starts a save that every
rank joins, and then every worker exits 0. A node that had not signalled yet finds its
ft_launcher with no workers, waiting at torch elastic's exit barrier for the agents that
were signalled, which never arrive there (300 s, past the time limit). So a
ft_launcher that catches the signal and runs no worker is ready too: the signal ends its
wait, gracefully. The price is paid only when the notice finds an in-job restart between
two cycles: ft_launcher ends there instead of starting a cycle that would reload the
last checkpoint and train for what is left of the margin. If ft_launcher swallows the
signal and starts workers after all, they get it again (supervise.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path

from nvrx_appliance.clock import now_iso
from nvrx_appliance.entrypoints import control, controldir
from nvrx_appliance.files import write_atomic
from nvrx_appliance.layout import ControlFiles

try:  # an NVRx dependency, so present wherever ft_launcher is
    import psutil
except ImportError:  # pragma: no cover - degraded: the signal goes out without waiting
    psutil = None  # type: ignore[assignment]


def noticed(directory: Path, generation: str) -> str | None:
    """Why this generation must save and end (the notice's reason), or None. The notice
    is `key=value` lines, `generation` first, as the batch script writes it."""
    seen = controldir.read_file(ControlFiles(directory).time_limit)
    if seen is None or not seen.is_file or control.foreign(seen.text, generation):
        return None
    return control.decode_fields(seen.text).get("reason") or "the time-limit notice is present"


def write_notice(directory: Path, generation: str, reason: str) -> None:
    fields = {"generation": generation, "reason": reason, "time": now_iso()}
    write_atomic(ControlFiles(directory).time_limit, control.encode_fields(fields), 0o600)


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler installed for the signal (SigCgt)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def workers(launcher_pid: int, workload: Sequence[str]) -> list[int]:
    """ft_launcher's children that run the workload. Its rank monitors are children too,
    forked, so their command line is ft_launcher's own, which ends with the workload's:
    only a command line that is the workload's from its start counts. The interpreter's
    path is left out: it may be spelled otherwise once exec'd (numactl, when NVRx binds
    ranks, execs it by the name it was given)."""
    if psutil is None:
        return []
    found = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(launcher_pid).children():
            with contextlib.suppress(psutil.Error):
                if child.cmdline()[1:] == list(workload[1:]):
                    found.append(child.pid)
    return found


def ready(launcher_pid: int, workload: Sequence[str], signum: int) -> tuple[int, ...] | None:
    """The workers the signal reaches if it is sent now, or None while it cannot land:
    ft_launcher does not catch it yet (torch elastic installs its handler when it first
    starts workers), or a worker of it does not yet. No worker at all is ready once
    ft_launcher catches it (the module's docstring says why)."""
    if psutil is None:
        return ()
    if not catches(launcher_pid, signum):
        return None
    running = tuple(workers(launcher_pid, workload))
    return running if all(catches(pid, signum) for pid in running) else None
