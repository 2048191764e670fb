"""The guard's stack sampler: the workload's last stack, kept where the judgement reads it.

The guard is its workload's parent, so it may read the workload's memory (ptrace rules:
a parent, the same user, no root). Every `stack_sampling` seconds it runs
`py-spy dump --nonblocking --json` on the workload (about 8 ms of one core, measured:
docs/hangs.md) and keeps the last stack on the node, in the directory the entrypoint
names (LOCAL_STACKS_ENV), which its publisher puts on the shared file system once per
period for the whole node (node/stack_publisher.py); a guard without one writes the
generation's work dir itself:

    nvrx/<array job id>/stacks/cycle<N>/<node>.rank<R>.json     (owner-only)

--nonblocking reads without stopping the workload, so it also reads a rank that is
itself stopped (SIGSTOP, state T) where the blocking mode fails. rank/stacks.py reads
the samples back and judges a hang from them.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nvrx_appliance import files
from nvrx_appliance.clock import now_iso
from nvrx_appliance.jobhost import hostlib
from nvrx_appliance.rank import run_waits
from nvrx_appliance.rank.hang_rule import FORMING, STOPPED_STATES

SAMPLE_VERSION = 1
# A node-local directory the entrypoint names (node/stack_publisher.py): where set, the
# guard keeps its samples there, and the node's one publisher puts them on the shared
# file system, one file per node per period instead of one per rank.
LOCAL_STACKS_ENV = "NVRX_APPLIANCE_LOCAL_STACKS"
PYSPY_TIMEOUT_S = 10.0  # a dump takes ~8 ms; one that takes this long is given up
MIN_READ_S = 1.0  # ... and a non-blocking one at a period's length, though no less than this
MAX_FRAMES = 64  # innermost frames kept per stack
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# A rank that used less than this share of one core between two alike samples is blocked.
QUIET_SHARE = 0.1
# ... and woke less than once a second on average (a blocked main thread does not wake).
QUIET_WAKEUPS_PER_S = 1.0


def pyspy() -> str | None:
    """py-spy beside this Python (the image's venv), else on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def main_thread_frames(dump: Any, pid: int) -> list[dict[str, Any]] | None:
    """The workload's main thread (its os thread id is the pid) from py-spy's JSON, as
    [{name, file, line}] innermost first; None when it is not there."""
    if not isinstance(dump, list):
        return None
    for thread in dump:
        if isinstance(thread, dict) and thread.get("os_thread_id") == pid:
            return [
                {
                    "name": str(f.get("name", "")),
                    "file": str(f.get("short_filename") or f.get("filename") or ""),
                    "line": int(f.get("line") or 0),
                }
                for f in thread.get("frames") or []
                if isinstance(f, dict)
            ][:MAX_FRAMES]
    return None


# A process that has died and waits to be reaped (Z) or is being torn down (X): gone. Its
# state is no evidence of what it did: NVRx's rank monitor ends a hung rank with SIGCONT
# then SIGKILL, and a stopped rank's last sample read as Z named no state T (the frames,
# read a moment before, still showed the collective it was stopped on the way into).
DEAD_STATES = frozenset({"Z", "X", "x"})


def proc_state(pid: int) -> tuple[str, int]:
    """(state letter, CPU ticks used) from /proc; ("", 0) when gone (dead included)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "", 0
    fields = text.rsplit(")", 1)[-1].split()
    try:
        state, ticks = fields[0], int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return "", 0
    return ("", 0) if state in DEAD_STATES else (state, ticks)


YAMA_SCOPE = Path("/proc/sys/kernel/yama/ptrace_scope")
# prctl(PR_SET_PTRACER, pid): under Yama's ptrace_scope 1 only an ancestor of a process,
# or the process it names (and that one's descendants), may read its memory. py-spy is
# the guard's child, the workload's sibling: the workload names the guard before exec.
PR_SET_PTRACER = 0x59616D61
# py-spy's words when the kernel refused it the workload's memory (EPERM from
# process_vm_readv or ptrace): sampling is impossible for the run, not for this sample.
_REFUSED = ("permission denied", "operation not permitted", "os error 1)")


def traceable_by(tracer: int) -> Callable[[], None]:
    """What the workload's child runs before exec: name `tracer` as its ptracer, so that
    tracer's children (py-spy) may read it under ptrace_scope 1. Without Yama (EINVAL) or
    without libc nothing is needed or possible: the call's result is not looked at."""

    def name_tracer() -> None:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PTRACER, tracer, 0, 0, 0)

    return name_tracer


def ptrace_scope() -> str:
    """Yama's ptrace_scope, or "" on a kernel without Yama."""
    try:
        return YAMA_SCOPE.read_text().strip()
    except OSError:
        return ""


def refused(said: str) -> bool:
    """Did py-spy say the kernel refused it the workload (not a passing failure)?"""
    lowered = said.lower()
    return any(word in lowered for word in _REFUSED)


def no_stacks_words(said: str, scope: str) -> str:
    """Why no rank's stack can be read on this host, in py-spy's own words, and the fix."""
    told = " ".join(said.split())[:300] or "nothing"
    if scope in ("2", "3"):
        fix = (f"kernel.yama.ptrace_scope is {scope} here; set it to 1 "
               "(sysctl -w kernel.yama.ptrace_scope=1): the guard names itself each "
               "rank's tracer, which 1 allows")  # fmt: skip
    else:
        fix = ("give the job the ptrace capability (a container: --cap-add SYS_PTRACE, "
               "or the runtime's equivalent), or run py-spy where the kernel allows it")  # fmt: skip
    return f"py-spy cannot read the workload (py-spy said: {told}); {fix}"


def wakeups(pid: int) -> int:
    """How often the workload's main thread has blocked and woken (its voluntary context
    switches); 0 when unknown. A rank paced by short sleeps or I/O wakes many times a
    second with the same Python stack and little CPU; a rank blocked in a collective, or
    stopped, does not wake (measured: 0 in 4 s for a gloo all_reduce waiting on a peer)."""
    try:
        for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


PROGRESS_ENV = "NVRX_APPLIANCE_PROGRESS_LOG"  # the workload's progress log (the contract)
PROGRESS_TAIL = 256 << 10  # what a guard without a publisher reads of it: its recent past


def kernel_wait(pid: int) -> str:
    """Where the kernel keeps a process that sleeps in it (/proc/<pid>/wchan, readable by
    its owner): a file system's wait (`nfs_...`, `fuse_...`, `folio_wait_bit_common`) is
    not a node's fault; "" when the kernel does not say."""
    try:
        found = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:
        return ""
    return "" if found in ("", "0") else found


def computed(last: dict[str, Any], sample: dict[str, Any], period: float) -> bool:
    """Did the rank use more than QUIET_SHARE of a core between two samples?"""
    ticks = sample.get("cpu_ticks", 0) - last.get("cpu_ticks", 0)
    return ticks > QUIET_SHARE * period * CLOCK_TICKS


def stopped_throughout(last: dict[str, Any], sample: dict[str, Any]) -> bool:
    """Was the rank stopped (T) at both samples? With no CPU between them it ran no code,
    whatever py-spy read of it: a non-blocking read of a stopped rank can time out (no
    frames) and the next one succeed."""
    return {last.get("state"), sample.get("state")} <= STOPPED_STATES


def still_stopped(last: dict[str, Any], state: str, ticks: int) -> bool:
    """Stopped (T) at the last sample and now, with no CPU in between: it ran no code."""
    return {last.get("state"), state} <= STOPPED_STATES and ticks == last.get("cpu_ticks")


def quiet(last: dict[str, Any], sample: dict[str, Any], period: float) -> bool:
    """Did the rank neither compute nor wake between two samples `period` apart? While
    its process group forms, its wakeups do not count, only its CPU: nothing can move
    before the group exists, and the wait polls (at a cycle's start-up, rank 0's TCPStore
    woke ~280 times a second waiting for its workers, at 1% of a core, on the local
    cluster). Anywhere else a rank that wakes may be stepping slowly through collectives
    with little CPU (a straggler's peers): not still."""
    woke = sample.get("wakeups", 0) - last.get("wakeups", 0)
    busy = computed(last, sample, period)
    if forming_group(sample.get("frames") or []):
        return not busy
    return not busy and woke <= QUIET_WAKEUPS_PER_S * period


def forming_group(frames: list[dict[str, Any]]) -> bool:
    """Do these py-spy frames (innermost first) stand in the forming of a process group?"""
    return any(
        str(f.get("name", "")).rsplit(".", 1)[-1] in FORMING
        and "torch/distributed/" in str(f.get("file", ""))
        for f in frames
    )


class Sampler:
    """A thread that keeps the workload's last stack in `path`, every `period` s.

    Every sample has the process's state and CPU ticks from /proc. A rank py-spy cannot
    read still gets one, with `frames: []` and `unreadable` (py-spy's words): a rank
    stuck in the kernel is evidence, not a gap. Where the kernel refuses py-spy every
    rank (Yama's ptrace_scope 2 or 3, no capability), the guard says so once and stops
    running py-spy (`no_stacks` says why in every sample from then on)."""

    def __init__(
        self,
        pid: int,
        path: Path | None,
        period: float,
        who: dict[str, Any],
        say: Callable[[str], None],
        on_sample: Callable[[dict[str, Any]], None] | None = None,
    ):
        local = os.environ.get(LOCAL_STACKS_ENV)
        if path is not None and local:
            path = Path(local) / path.parent.name / path.name  # cycle<N>/<node>.rank<R>.json
        self.pid, self.path, self.period, self.who, self.say = pid, path, period, who, say
        self.on_sample = on_sample
        self.stop = threading.Event()
        self.last: dict[str, Any] | None = None
        self.binary = pyspy()
        self.no_stacks = "" if path is None or self.binary else "py-spy is not installed"
        self.said = ""  # py-spy's last words on a failed dump
        self.thread = threading.Thread(target=self._run, name="stack-sampler", daemon=True)

    def start(self) -> None:
        if self.no_stacks:
            self.say(f"no stacks sampled: {self.no_stacks} (a hang names no node from them)")
        if self.path is not None:
            try:
                files.make_private_dirs(self.path.parent)
            except OSError as exc:
                self.say(f"no stacks sampled: {self.path.parent}: {exc}")
                self.path = None
        self.thread.start()

    def _run(self) -> None:
        failures = 0
        while not self.stop.wait(self.period if self.last is not None else 1.0):
            sample = self.take()
            if sample is None:
                return  # the workload is gone
            if sample.get("unreadable") and not self.no_stacks:
                failures += 1
                if failures == 3:
                    self.say("py-spy could not read the workload's stack 3 times in a row: "
                             + sample["unreadable"])  # fmt: skip
            else:
                failures = 0
            self.last = sample
            if self.path is not None:
                try:
                    files.write_atomic(self.path, json.dumps(sample) + "\n", 0o600, durable=False)
                except OSError as exc:
                    self.say(f"could not keep the workload's stack in {self.path}: {exc}")
            if self.on_sample is not None:
                self.on_sample(sample)

    def dump(self, *how: str) -> list[dict[str, Any]] | None:
        """The main thread's frames by one py-spy dump; None when it could not read them
        (`said` keeps py-spy's words)."""
        if self.binary is None or self.no_stacks or self.path is None:
            return None
        # A non-blocking read is given a period at most (a second at least): one that
        # ran longer would hold up the next look at the rank (its state and CPU), which
        # the judgement needs at most a couple of periods old.
        limit = PYSPY_TIMEOUT_S
        if "--nonblocking" in how:
            limit = min(limit, max(self.period, MIN_READ_S))
        try:
            done = subprocess.run(
                [self.binary, "dump", *how, "--json", "--pid", str(self.pid)],
                capture_output=True, text=True, timeout=limit, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            # A blocking dump that timed out was killed while it held the rank stopped:
            # the rank must not stay so. A non-blocking one never stopped it, and a rank
            # stopped by something else (a SIGSTOP, the fault itself) is not ours to wake.
            if "--nonblocking" not in how:
                with contextlib.suppress(OSError):
                    os.kill(self.pid, signal.SIGCONT)
            self.said = f"py-spy took over {limit:g} s"
            return None
        except OSError as exc:
            self.said = str(exc)
            return None
        if done.returncode != 0 or self.stop.is_set():
            self.said = (done.stderr or done.stdout).strip()
            if refused(self.said) and not self.stop.is_set():
                self.no_stacks = no_stacks_words(self.said, ptrace_scope())
                self.say(f"no stacks sampled from now on: {self.no_stacks}")
            return None  # the workload ended meanwhile: its last stack stands
        try:
            return main_thread_frames(json.loads(done.stdout), self.pid)
        except ValueError:
            self.said = "py-spy's output was not JSON"
            return None

    def take(self) -> dict[str, Any] | None:
        """A sample of the workload now; None when it is gone."""
        last = self.last
        state, ticks = proc_state(self.pid)
        if not state:
            return None
        if last is not None and last["frames"] and still_stopped(last, state, ticks):
            # It ran no code since its stack was read: that stack is its stack now. py-spy
            # is not run on it, as a non-blocking read of a stopped rank sometimes ran
            # past its timeout on the cluster, and such a read delayed the sample that
            # the judgement needs fresh.
            frames: list[dict[str, Any]] | None = last["frames"]
        else:
            frames = self.dump("--nonblocking")
            state, ticks = proc_state(self.pid)
            if not state:
                return None
        now = time.time()
        sample = {
            **self.who,
            "version": SAMPLE_VERSION,
            "pid": self.pid,
            "time": now_iso(),
            "epoch": now,
            "frames": frames or [],
            "still_since": now,
            "state": state,
            "cpu_ticks": ticks,
            "wakeups": wakeups(self.pid),
            "native": [],
            "native_at": None,
            # since when its frames read the same, whatever its CPU: a rank spinning in one
            # call (a GPU wait, state R) never reads still by its CPU
            "same_since": now,
        }
        if state == "D":
            sample["wchan"] = kernel_wait(self.pid)
        # Still since the last sample only when nothing moved: the same stack, no CPU
        # and no wakeups (a running rank's Python stack can stay the same for long), or
        # stopped throughout (a differing read of a frozen rank once reset its stillness).
        stopped = last is not None and stopped_throughout(last, sample)
        alike = last is not None and (last["frames"] == sample["frames"] or stopped)
        if last is not None and alike:
            sample["same_since"] = last.get("same_since", last["epoch"])
        if last is not None and alike and quiet(last, sample, self.period):
            sample["still_since"] = last["still_since"]
            sample["native"] = last.get("native", [])
            sample["native_at"] = last.get("native_at")
            if stopped and not frames and last["frames"]:
                # A read of a rank stopped since its last sample failed: its stack is the
                # one read then (it ran no code since).
                sample["frames"], frames = last["frames"], last["frames"]
        if frames is None:
            sample["unreadable"] = self.no_stacks or self.said or "py-spy did not run"
        if self.no_stacks:
            sample["no_stacks"] = self.no_stacks
        if alike and frames and self.blocked(sample) and self.past_legit_waits(sample):
            # A rank that waits in C++ (DDP's gradient all-reduce runs inside backward)
            # shows only its Python caller: its native frames say what it waits for.
            # Blocking mode pauses the rank for ~0.5 s, so only a blocked one, once.
            native = self.dump("--native")
            # The dump's own stop of every thread wakes the rank: counted from after it.
            sample["wakeups"] = wakeups(self.pid)
            sample["cpu_ticks"] = proc_state(self.pid)[1] or sample["cpu_ticks"]
            # Tried once per stillness, read or not: each try stops the rank (up to
            # PYSPY_TIMEOUT_S when it fails), and a rank that stands still stays so.
            sample["native_at"] = now
            if native is not None:
                sample["native"] = [f["name"] for f in native][:MAX_FRAMES]
            else:
                sample["native_failed"] = self.said
        return sample

    def blocked(self, sample: dict[str, Any]) -> bool:
        """Asleep (not stopped: a stopped rank cannot be read natively; not in the kernel
        either: py-spy's attach to a rank stuck in state D hung past its timeout on the
        cluster and starved the sampler), still since the last sample, and no native
        dump tried in this stillness yet."""
        return sample["state"] == "S" and sample["native_at"] is None

    def past_legit_waits(self, sample: dict[str, Any]) -> bool:
        """Has the rank stood still longer than any wait the run itself reports (its
        longest save so far), and, in the first cycle, after it trained (not in its
        start-up: the rendezvous, a peer's load)? A blocking dump stops every thread of
        the rank, NCCL's watchdog included: only of a rank that waits for longer than a
        healthy one does."""
        cycle = int(self.who.get("cycle") or 0)
        job = os.environ.get("SLURM_ARRAY_JOB_ID")
        local = os.environ.get(LOCAL_STACKS_ENV)
        if local:  # the node's publisher reads the log, once a period for the node
            trained, longest = run_waits.read(Path(local), job, cycle) or (False, 0.0)
        else:
            log = os.environ.get(PROGRESS_ENV)
            text = (hostlib.read_text(log, PROGRESS_TAIL, tail=True) if log else None) or ""
            trained, longest = run_waits.of_text(text, job, cycle)
        if cycle == 0 and not trained:
            return False
        return sample["epoch"] - sample["still_since"] > longest

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(PYSPY_TIMEOUT_S)
