"""Run ft_launcher as our child: forward signals to it, stop it when the generation ends.

The exit code is ft_launcher's, unchanged (93 above all); a death by signal N comes out
as 128+N, as a shell would report it. Only when we stopped it ourselves because the
generation is over does the caller get our own code instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nvrx_appliance.entrypoints.gate import Leave

try:  # an NVRx dependency, so present wherever ft_launcher is
    import psutil
except ImportError:  # pragma: no cover - degraded: only the process group is killed
    psutil = None  # type: ignore[assignment]

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
STOPPING = (signal.SIGTERM, signal.SIGINT)  # Slurm ends the job: time limit, scancel, ...
REAP_S = 2.0  # after SIGKILL, how long we wait for the kernel to reap
# A control-dir check that has not returned after this long is reported once: the file
# system is stalled here (the self-fence deadline is still judged meanwhile).
STUCK_REPORT_S = 5.0

# Runs in the child just before it becomes ft_launcher. If this entrypoint dies, even by
# SIGKILL, the kernel sends ft_launcher SIGTERM, so it stops its workers rather than live
# on unsupervised, hosting or dialing a rendezvous of a generation that is over. A
# trampoline rather than preexec_fn, which is unsafe once the lease thread runs.
_TRAMPOLINE = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))\n"  # PR_SET_PDEATHSIG
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(128 + int(signal.SIGTERM))\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    stopped: Leave | None  # why we stopped ft_launcher, if we did


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class _Probe:
    """`check` on a thread of its own, one call at a time. A call stuck in a hung shared
    file system then holds only that thread, and the loop goes on judging what needs no
    file system (task 0's self-fence deadline) and stopping ft_launcher when it must."""

    def __init__(self, check: Callable[[], Leave | None]):
        self._check = check
        self._idle = threading.Event()
        self._idle.set()
        self._result: tuple[Leave | None, OSError | None] | None = None
        self.began = 0.0  # monotonic start of the call in flight

    def result(self, wait: float) -> tuple[Leave | None, OSError | None] | None:
        """The next check's (verdict, error), waiting up to `wait` seconds for it;
        None while the call in flight has not returned."""
        if self._idle.is_set() and self._result is None:
            self._idle.clear()
            self.began = time.monotonic()
            threading.Thread(target=self._run, name="control-dir-check", daemon=True).start()
        if not self._idle.wait(wait):
            return None
        result, self._result = self._result, None
        return result

    def _run(self) -> None:
        try:
            self._result = (self._check(), None)
        except OSError as exc:  # a shared file system stall is not a verdict
            self._result = (None, exc)
        finally:
            self._idle.set()


def _running(proc) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _descendants(pid: int) -> list:
    if psutil is None:
        return []
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


class Supervisor:
    def __init__(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        *,
        check: Callable[[], Leave | None],
        urgent: Callable[[], Leave | None] | None = None,
        grace: float,
        poll: float,
        log: Callable[[str], None],
        on_stop_signal: Callable[[int], None] | None = None,
    ):
        self.argv = list(argv)
        self.on_stop_signal = on_stop_signal
        self.env = env
        self.check = check  # may read the file system: run where a hang cannot stop us
        self.urgent = urgent  # judged from memory alone, every poll, hang or not
        self.grace = grace
        self.poll = poll
        self.log = log
        self.child: subprocess.Popen | None = None

    def _forward(self, signum: int, _frame) -> None:
        if self.child is not None and self.child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child.pid, signum)

    def _signalled(self, signum: int, frame) -> None:
        self._forward(signum, frame)
        if signum in STOPPING and self.on_stop_signal is not None:
            self.on_stop_signal(signum)

    def run(self) -> Outcome:
        previous = {sig: signal.signal(sig, self._signalled) for sig in FORWARDED}
        try:
            self.child = subprocess.Popen(
                [sys.executable, "-c", _TRAMPOLINE, str(os.getpid()), *self.argv],
                env=self.env,
                # Its own process group: Slurm's signals reach it once, through us, and
                # a final SIGKILL reaches everything it started in that group.
                start_new_session=True,
            )
            return self._watch()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _watch(self) -> Outcome:
        assert self.child is not None
        probe = _Probe(self.check)
        reported = False
        tree: dict[int, Any] = {}  # what ft_launcher has started, as last seen
        while True:
            try:
                code = exit_code(self.child.wait(timeout=self.poll))
            except subprocess.TimeoutExpired:
                tree.update((p.pid, p) for p in _descendants(self.child.pid))
            else:
                self._end_leftovers(list(tree.values()))
                return Outcome(code, None)
            verdict = self.urgent() if self.urgent is not None else None
            if verdict is None:
                result = probe.result(wait=self.poll)
                if result is None:
                    stuck = time.monotonic() - probe.began
                    if stuck >= STUCK_REPORT_S and not reported:
                        self.log(f"reading the control directory has not returned in "
                                 f"{stuck:.0f} s; still watching")  # fmt: skip
                        reported = True
                    continue
                reported = False
                verdict, error = result
                if error is not None:
                    self.log(f"could not read the control directory: {error}; still watching")
                    continue
            if verdict is not None:
                # ft_launcher may have ended while the check read the file system (93
                # among the likeliest: the same fault that ends the generation): its own
                # code stands, or a "do not restart" would be lost with its witness.
                ended = self.child.poll()
                if ended is not None:
                    self._end_leftovers(list(tree.values()))
                    return Outcome(exit_code(ended), None)
                self.log(verdict.message)
                self._stop()
                return Outcome(verdict.exit_code, verdict)

    def _end_leftovers(self, tree: list) -> None:
        """ft_launcher has exited on its own, after its own graceful shutdown: whatever it
        started and left running (in a session of its own, out of reach of Slurm's
        process-group kill) must not outlive it into the next generation on this node.
        KILL at once: waiting here would hold the generation's end. is_running() checks
        the start time, so a reused pid is never signalled."""
        alive = [p for p in tree if _running(p)]
        if not alive:
            return
        self.log(f"ft_launcher left {len(alive)} process(es) running; killing them")
        self._kill(alive)

    @staticmethod
    def _kill(procs: list) -> None:
        """SIGKILL each one still running (is_running() checks the start time, so a
        reused pid is never signalled)."""
        for proc in procs:
            if _running(proc):
                with contextlib.suppress(psutil.Error):
                    proc.kill()

    def _stop(self) -> None:
        """TERM, then KILL after the grace; then nothing it started may outlive it."""
        child = self.child
        assert child is not None
        tree = _descendants(child.pid)
        self._forward(signal.SIGTERM, None)
        try:
            child.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            tree += _descendants(child.pid)
            self.log(f"ft_launcher still running {self.grace:g} s after SIGTERM; sending SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
        # Workers run in sessions of their own, so no group signal reaches them.
        self._kill(tree)
        try:
            child.wait(timeout=REAP_S)
        except subprocess.TimeoutExpired:
            self.log(f"ft_launcher (pid {child.pid}) did not go away after SIGKILL")
