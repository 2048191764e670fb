"""Run ft_launcher as our child: forward signals to it, ask its workload to save and end
at the time-limit notice, stop it when the generation ends.

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

from nvrx_appliance import exitcodes
from nvrx_appliance.node import time_limit
from nvrx_appliance.node.gate import Leave

try:  # an NVRx dependency, so present wherever ft_launcher is
    import psutil
except ImportError:  # pragma: no cover - degraded: only the process group is killed
    psutil = None  # type: ignore[assignment]

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
STOPPING = (signal.SIGTERM, signal.SIGINT)  # Slurm ends the job: time limit, scancel, ...
REAP_S = 2.0  # after SIGKILL, how long we wait for the kernel to reap
LEFTOVER_POLL_S = 0.2  # while a drain lets what ft_launcher left behind finish
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


@dataclass(frozen=True)
class Save:
    """The time-limit notice: the workload must save and end (time_limit.py)."""

    reason: str


@dataclass(frozen=True)
class SaveSignal:
    """How the workload is asked to save: the signal, and, given ft_launcher's pid, the
    workers it would reach now (time_limit.reachable)."""

    signum: int
    reachable: Callable[[int], tuple[int, ...]]


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


Decision = Leave | Save | None


class _Probe:
    """`check` on a thread of its own, one call at a time. A call stuck in a hung shared
    file system then holds only that thread, and the loop goes on judging what needs no
    file system (task 0's self-fence deadline) and stopping ft_launcher when it must."""

    def __init__(self, check: Callable[[], Decision]):
        self._check = check
        self._idle = threading.Event()
        self._idle.set()
        self._result: tuple[Decision, OSError | None] | None = None
        self.began = 0.0  # monotonic start of the call in flight

    def result(self, wait: float) -> tuple[Decision, OSError | None] | None:
        """The next check's (decision, error), waiting up to `wait` seconds for it;
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
        except OSError as exc:  # a shared file system stall is not a decision
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
    """ft_launcher under watch. Slurm's TERM (or INT) is passed on once, and
    `on_stop_signal` runs at once (task 0 writes the closed flag there: its batch shell
    may be what died, and then Slurm kills this step within a second). From then on the
    closed flag no longer cuts ft_launcher short: it was told to stop and finishes on its
    own (a workload may be saving on TERM), within `drain` seconds (task 0: two thirds
    of Slurm's KillWait; then what is left is stopped) or Slurm's KillWait (a peer). A
    `Save` decision of `check` sends `save.signum` to each worker `save.reachable` names,
    once."""

    def __init__(
        self,
        argv: Sequence[str],
        env: dict[str, str],
        *,
        check: Callable[[], Decision],
        urgent: Callable[[], Leave | None] | None = None,
        grace: float,
        poll: float,
        log: Callable[[str], None],
        on_stop_signal: Callable[[int], None] | None = None,
        drain: float | None = None,
        save: SaveSignal | None = None,
    ):
        self.argv = list(argv)
        self.on_stop_signal = on_stop_signal
        self.env = env
        self.check = check  # may read the file system: run where a hang cannot stop us
        self.urgent = urgent  # judged from memory alone, every poll, hang or not
        self.grace = grace
        self.poll = poll
        self.log = log
        self.drain = drain
        self.save = save
        self.child: subprocess.Popen | None = None
        self._told: tuple[int, float] | None = None  # Slurm's stop signal, and when
        self._draining_noted = False
        self._asked: str | None = None  # why the workload must save (the notice)
        self._saving: set[int] = set()  # the workers the save signal was sent to

    def _forward(self, signum: int, _frame) -> None:
        if self.child is not None and self.child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child.pid, signum)

    def _signalled(self, signum: int, frame) -> None:
        if signum not in STOPPING:
            self._forward(signum, frame)
            return
        if self._told is not None:
            # Once: torch elastic raises on every one, and a second, raised inside its
            # shutdown, ends its wait for workers that are saving.
            return
        self._told = (signum, time.monotonic())
        self._forward(signum, frame)
        if self.on_stop_signal is not None:
            self.on_stop_signal(signum)

    def _drain_deadline(self) -> float | None:
        if self._told is None or self.drain is None:
            return None
        return self._told[1] + self.drain

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
                self._end_leftovers(list(tree.values()), until=self._drain_deadline())
                return Outcome(code, None)
            drained = self._drain_deadline()
            if drained is not None and time.monotonic() >= drained and self._told is not None:
                return self._drained_out(self._told[0])
            self._send_save()
            decision: Decision = self.urgent() if self.urgent is not None else None
            if decision is None:
                result = probe.result(wait=self.poll)
                if result is None:
                    stuck = time.monotonic() - probe.began
                    if stuck >= STUCK_REPORT_S and not reported:
                        self.log(f"reading the control directory has not returned in "
                                 f"{stuck:.0f} s; still watching")  # fmt: skip
                        reported = True
                    continue
                reported = False
                decision, error = result
                if error is not None:
                    self.log(f"could not read the control directory: {error}; still watching")
                    continue
            if isinstance(decision, Save):
                if self._asked is None:
                    self._asked = decision.reason
                    self.log(f"{decision.reason}: asking the workload to save and end")
                continue
            if self._told_to_finish(decision):
                continue
            if decision is not None:
                # ft_launcher may have ended while the check read the file system (93
                # among the likeliest: the same fault that ends the generation): its own
                # code stands, or a "do not restart" would be lost with its witness.
                ended = self.child.poll()
                if ended is not None:
                    self._end_leftovers(list(tree.values()))
                    return Outcome(exit_code(ended), None)
                self.log(decision.message)
                # Task 0 is dead (this node fenced it): nothing it trained with can save,
                # and the successor waits for this node's end, so no grace.
                self._stop(grace=0.0 if isinstance(decision, Leave) and decision.fence else None)
                if self.child.returncode is not None and (
                    exit_code(self.child.returncode) == exitcodes.NVRX_NO_RESTART
                ):
                    # NVRx decided "do not restart" while we were stopping it: that
                    # decision is the generation's, and its witness must be written.
                    self.log("ft_launcher exited 93 while being stopped; NVRx's decision stands")
                    return Outcome(exitcodes.NVRX_NO_RESTART, None)
                return Outcome(decision.exit_code, decision)

    def _told_to_finish(self, decision: Decision) -> bool:
        """The closed flag, after Slurm's TERM reached us: ft_launcher is stopping already
        and is let finish (task 0 wrote that flag itself on the same TERM)."""
        if self._told is None or not isinstance(decision, Leave):
            return False
        if decision.exit_code != exitcodes.STOPPED_BY_CLOSED_FLAG:
            return False
        if not self._draining_noted:
            self._draining_noted = True
            self.log("the generation is closed; ft_launcher, told to stop, finishes on its own")
        return True

    def _send_save(self) -> None:
        """The save signal to each worker of ft_launcher that can act on it and was not
        sent it yet (time_limit.py says why to the workers, not to ft_launcher): the
        first ones start the save, and workers ft_launcher starts later (a restart under
        way at the notice) get it as soon as they catch it."""
        save, child = self.save, self.child
        if self._asked is None or save is None or child is None:
            return
        fresh = [pid for pid in save.reachable(child.pid) if pid not in self._saving]
        if not fresh:
            return
        name = signal.Signals(save.signum).name
        if self._saving:
            self.log(f"ft_launcher started new workers after {name}; sending it to them too")
        else:
            self.log(f"sending {name} to ft_launcher's {len(fresh)} worker(s): they save "
                     "at the end of their step and end")  # fmt: skip
        for pid in fresh:
            time_limit.send(pid, save.signum)
        self._saving.update(fresh)

    def _drained_out(self, signum: int) -> Outcome:
        """Slurm's TERM came `drain` seconds ago and ft_launcher still runs: stop what is
        left before Slurm's KILL, leaving the rest of KillWait to the teardown."""
        name = signal.Signals(signum).name
        message = f"ft_launcher still running {self.drain or 0:g} s after {name}; stopping it"
        self.log(message)
        self._stop()
        return Outcome(128 + signum, Leave(128 + signum, message))

    def _end_leftovers(self, tree: list, until: float | None = None) -> None:
        """ft_launcher has exited on its own, after its own graceful shutdown: whatever it
        started and left running (in a session of its own, out of reach of Slurm's
        process-group kill) must not outlive it into the next generation on this node.
        KILL at once, since waiting would hold the generation's end; but while a TERM
        drain lasts (`until`), a worker still saving is let finish. is_running() checks
        the start time, so a reused pid is never signalled."""
        alive = [p for p in tree if _running(p)]
        while alive and until is not None and time.monotonic() < until:
            time.sleep(LEFTOVER_POLL_S)
            alive = [p for p in alive if _running(p)]
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

    def _stop(self, grace: float | None = None) -> None:
        """TERM, then KILL after the grace (the supervisor's, unless given); then nothing
        it started may outlive it."""
        child = self.child
        assert child is not None
        grace = self.grace if grace is None else grace
        tree = _descendants(child.pid)
        self._forward(signal.SIGTERM, None)
        try:
            child.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            tree += _descendants(child.pid)
            self.log(f"ft_launcher still running {grace:g} s after SIGTERM; sending SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
        # Workers run in sessions of their own, so no group signal reaches them.
        self._kill(tree)
        try:
            child.wait(timeout=REAP_S)
        except subprocess.TimeoutExpired:
            self.log(f"ft_launcher (pid {child.pid}) did not go away after SIGKILL")
