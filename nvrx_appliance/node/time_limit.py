"""The time-limit notice and the save signal, on one node (settings/generation_end.py has the
design).

The notice is a control file: a batch shell that Slurm's --signal reached writes it, or
task 0's entrypoint at the exit duration. Every entrypoint's supervisor reads it with
the closed flag and then sends the save signal to each of its ft_launcher's workers
(each one's process group, as torch elastic would): the workload saves at the end of
its step, every rank at one iteration, and exits 0.

Not to ft_launcher itself. Torch elastic turns a signal it handles into a shutdown that
skips its exit barrier, the wait of every agent for the others at the end of a run: a
ft_launcher that left that way leaves its peers waiting for it there (300 s, past any
time limit), each blocked inside the store's wait, where a signal cannot reach its
Python handler. Workers that end 0 on their own instead look to torch elastic like a
finished run: every agent reaches the barrier and ends 0 (node/env.py leaves the
save signal out of ft_launcher's handled signals, so a stray one is ignored there).

Only when it can land: a process that has not installed a handler ignores SIGURG, so a
signal sent while a worker is still importing would be lost. So the supervisor sends it
to each worker once the kernel says the worker catches it (/proc/PID/status), which also
covers a notice that arrives during an in-job restart: the next cycle's workers get it
as soon as they can act on it. Ranks that got it first start the save every rank joins.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Sequence
from pathlib import Path

from nvrx_appliance.clock import now_iso
from nvrx_appliance.files import write_atomic
from nvrx_appliance.layout import ControlFiles
from nvrx_appliance.node import control, controldir
from nvrx_appliance.rank import guard

try:  # an NVRx dependency, so present wherever ft_launcher is
    import psutil
except ImportError:  # pragma: no cover - degraded: no worker is found, none is signalled
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


def workers(launcher_pid: int, workload: Sequence[str]) -> list[tuple[int, int]]:
    """ft_launcher's workers: (the process to signal, the workload process) each. A
    worker is the workload guard (guard.py), whose child is the workload in the guard's
    process group; or, without a guard, the workload itself. Its rank monitors are
    children too, forked, so their command line is ft_launcher's own, which ends with the
    workload's: only a command line that is the workload's or the guard's from its start
    counts. The interpreter's path is left out: it may be spelled otherwise once exec'd
    (numactl, when NVRx binds ranks, execs it by the name it was given)."""
    if psutil is None:
        return []
    found = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(launcher_pid).children():
            with contextlib.suppress(psutil.Error):
                argv = child.cmdline()
                if argv[1:] == list(workload[1:]):
                    found.append((child.pid, child.pid))
                elif argv[1:3] == ["-m", guard.MODULE]:
                    found += [
                        (child.pid, grandchild.pid)
                        for grandchild in child.children()
                        if grandchild.cmdline()[1:] == list(workload[1:])
                    ]
    return found


def own_workers(workload: Sequence[str]) -> list[int]:
    """The workload processes of this process's ft_launcher, found among our children by
    its command line (the supervisor's trampoline execs it); [] between two cycles."""
    if psutil is None:
        return []
    found = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if any(a.endswith("ft_launcher") for a in child.cmdline()[:2]):
                found += [worker for _target, worker in workers(child.pid, workload)]
    return found


def end_workers(workload: Sequence[str]) -> int:
    """SIGKILL the workers of this process's ft_launcher (each workload process, as NVRx's
    own timeouts do); how many were sent it."""
    ended = 0
    for worker in own_workers(workload):
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)
            ended += 1
    return ended


def reachable(launcher_pid: int, workload: Sequence[str], signum: int) -> tuple[int, ...]:
    """The workers of ft_launcher that the signal would reach now: those that catch it
    (one still importing does not yet, and would lose it)."""
    return tuple(
        target for target, worker in workers(launcher_pid, workload) if catches(worker, signum)
    )


def send(pid: int, signum: int) -> None:
    """The signal to a worker's process group, as torch elastic sends its own (a worker
    leads a session of its own), or to the worker alone if it does not lead one. The
    guard, in that group, ignores it (SIGURG's default); the workload acts on it."""
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
