"""A sick node on the local cluster, made from outside as a user meets one: every
training worker of a chain on the given nodes is frozen (SIGSTOP) a few seconds into
each NVRx cycle, once that cycle trains: no error, no exit (issue 38). For the hang
tests and the sick-node benchmark; what it froze it thaws when stopped.

The nodes share this machine's PID namespace, so a worker is found in /proc: it is the
child of one of the chain's rank guards (whose command line names the chain's work dir),
whatever the workload (the cpu trainer, a script); its environment names the Slurm node
it was started on and the NVRx cycle it runs in. A cycle trains from its first `step`
event in the progress log (the cpu trainer's, or a script's that keeps one).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

from nvrx_appliance.checkpoints import checkpoint_dir
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe import workdir

# The rank guard's module (rank/guard.py's MODULE; host code does not import the in-job
# side): every workload process is its child.
GUARD = "nvrx_appliance.rank.guard"
FREEZE_AFTER_S = 3.0  # into a cycle's training, its workers on the sick nodes stop
POLL_S = 0.5


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    return dict(e.decode(errors="replace").partition("=")[::2] for e in raw if b"=" in e)


def workers(work: Path, node: str) -> list[int]:
    """The chain's workload processes (its training ranks) on `node`."""
    guards, children = set(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if GUARD.encode() in argv[1:4] and any(str(work).encode() in a for a in argv):
            guards.add(int(entry.name))
        else:
            children.append((int(entry.name), parent))
    return sorted(
        pid for pid, parent in children
        if parent in guards and _environ(pid).get("SLURMD_NODENAME") == node
    )  # fmt: skip


def _cycle_of(pid: int) -> tuple[str, str]:
    """(array job id, NVRx cycle) a worker runs in."""
    env = _environ(pid)
    return env.get("SLURM_ARRAY_JOB_ID", ""), env.get("TORCHELASTIC_RESTART_COUNT", "")


class Freezer:
    """Freezes every worker on `nodes` FREEZE_AFTER_S after its cycle's first step (or,
    in its modes, during a save or at its start), each cycle anew, until stopped."""

    def __init__(
        self,
        work: Path,
        nodes: set[str],
        *,
        kernel: bool = False,
        in_save: bool = False,
        at_start: bool = False,
    ):
        # kernel: freeze in the kernel (cgroup v1 freezer: state D, as a driver call that
        # never returns; py-spy cannot read such a process) instead of SIGSTOP (state T).
        # in_save: only while a checkpoint is being written (a .partial_iter_ directory in
        # the chain's checkpoints), as a fault that lands in a save; the save must last
        # longer than a poll for that to be certain (tests/integration/slow_storage.c).
        # at_start: as soon as a worker is seen (a poll after it starts), before its cycle
        # trains: a node that hangs in a cycle's start-up.
        self.work, self.nodes, self.kernel = work, nodes, kernel
        self.in_save, self.at_start = in_save, at_start
        self.frozen: dict[int, float] = {}  # pid -> when
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sick-node", daemon=True)

    def __enter__(self) -> Freezer:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join(5)
        for pid in self.frozen:
            if self.kernel:
                _thaw(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def first(self) -> float | None:
        """When the first worker was frozen; None before."""
        return min(self.frozen.values(), default=None)

    def _saving(self) -> bool:
        try:
            names = os.listdir(Layout(self.work).checkpoints)
        except OSError:
            return False
        return any(checkpoint_dir.is_partial_dir(name) for name in names)

    def _run(self) -> None:
        log = Layout(self.work).progress_log
        while not self.done.wait(POLL_S):
            if self.in_save and not self._saving():
                continue
            trained = {
                (str(e.get("slurm_array_job_id")), str(e.get("cycle"))): e["time"]
                for e in reversed(workdir.json_lines(log))
                if e.get("event") == "step"
            }  # the first step of each cycle
            for node in self.nodes:
                for pid in workers(self.work, node):
                    since = trained.get(_cycle_of(pid))
                    due = self.at_start or (since and time.time() - since >= FREEZE_AFTER_S)
                    if pid in self.frozen or not due:
                        continue
                    with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                        if self.kernel:
                            _freeze(pid)
                        else:
                            os.kill(pid, signal.SIGSTOP)
                        self.frozen[pid] = time.time()


FREEZER = Path("/sys/fs/cgroup/freezer")  # cgroup v1's freezer hierarchy


def _group(pid: int) -> Path:
    return FREEZER / f"nvrx-sick-node-{pid}"


def _freeze(pid: int) -> None:
    """Move the worker into a freezer cgroup of its own and freeze it (state D)."""
    group = _group(pid)
    group.mkdir(exist_ok=True)
    (group / "cgroup.procs").write_text(str(pid))
    (group / "freezer.state").write_text("FROZEN")


def _thaw(pid: int) -> None:
    group = _group(pid)
    with contextlib.suppress(OSError):
        (group / "freezer.state").write_text("THAWED")
        (FREEZER / "cgroup.procs").write_text(str(pid))
    with contextlib.suppress(OSError):
        group.rmdir()
