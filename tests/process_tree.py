"""The processes a test session starts, found by a marker in their environment.

A test that kills the process it started does not always end what that process started:
NVRx's ft_launcher forks its RankMonitorServer, which ignores SIGTERM and is left with
parent 1 when the launcher is SIGKILLed. Walking the children of the process a test
started misses such an orphan; its environment does not. Every process the suite starts
inherits two variables from the pytest process (unless a test hands it an environment
without them): the session's token, and the id of the test that was running.
tests/conftest.py fails a unit test that leaves one running, and fails the session when
one outlives it.

Linux only (/proc); elsewhere nothing is found. Another session's processes (another
engineer's, CI beside a person's) carry another token and are never touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import psutil

SESSION = "NVRX_TEST_SESSION"  # the pytest session's token
TEST = "NVRX_TEST_ID"  # the test that was running when the process was started
POLL_S = 0.05


@dataclass(frozen=True)
class Survivor:
    pid: int
    command: str
    test: str  # the test that started it ("" outside any test: a session fixture)

    def __str__(self) -> str:
        started = f"started by {self.test}" if self.test else "started outside any test"
        return f"pid {self.pid} ({self.command}), {started}"


def _environ(pid: int) -> dict[bytes, bytes]:
    # A zombie's or a kernel thread's environment reads empty: neither runs anything.
    with open(f"/proc/{pid}/environ", "rb") as fh:
        pairs = fh.read().split(b"\0")
    return dict(p.split(b"=", 1) for p in pairs if b"=" in p)


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            words = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        words = ""
    return words[:200] or "?"


def survivors(token: str, *, test: str | None = None, spare: Iterable[int] = ()) -> list[Survivor]:
    """The live processes carrying the session's `token` (and, given `test`, started by
    that test), but for the pids in `spare` (the pytest processes themselves)."""
    spared = {os.getpid(), *spare}
    found = []
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        if pid in spared:
            continue
        try:
            env = _environ(pid)
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if env.get(SESSION.encode()) != token.encode():
            continue
        started_by = env.get(TEST.encode(), b"").decode(errors="replace")
        if test is not None and started_by != test:
            continue
        found.append(Survivor(pid, _command(pid), started_by))
    return found


def outlived(token: str, grace_s: float, **which) -> list[Survivor]:
    """Those of survivors(token, **which) still running after `grace_s` seconds (a
    process a test killed a moment ago is given that long to exit), then killed: a
    session leaves nothing running, whatever it reports."""
    deadline = time.monotonic() + grace_s
    found = survivors(token, **which)
    while found and time.monotonic() < deadline:
        time.sleep(POLL_S)
        found = survivors(token, **which)
    _kill(found)
    return found


def _kill(found: Iterable[Survivor]) -> None:
    for survivor in found:
        with contextlib.suppress(OSError):  # gone meanwhile
            os.kill(survivor.pid, signal.SIGKILL)


def end(token: str, test: str, *, spare: Iterable[int] = ()) -> None:
    """End every process `test` started, whatever its parent now is (a test's own
    clean-up, for a tree it cannot walk: NVRx's rank monitor left with parent 1)."""
    _kill(survivors(token, test=test, spare=spare))
    deadline = time.monotonic() + 10
    while survivors(token, test=test, spare=spare) and time.monotonic() < deadline:
        time.sleep(POLL_S)


def unmarked(environ: Mapping[str, str]) -> dict[str, str]:
    """An environment without the markers, for a process the session starts on purpose
    to outlive it: the local cluster's daemons, which other sessions share."""
    return {k: v for k, v in environ.items() if k not in (SESSION, TEST)}


def end_started() -> None:
    """End every process the running test has started (tests/conftest.py marks them):
    what a test calls where it cannot walk the tree it started. Outside a test (a
    module's fixture) nothing names its processes apart from another worker's: their
    parent-child tree is all there is (end_tree)."""
    if TEST in os.environ:
        end(os.environ[SESSION], os.environ[TEST])


def end_tree(proc: subprocess.Popen) -> None:
    """End `proc` and all it started: its descendants as they stand (torch elastic's
    workers run in sessions of their own, so no group signal reaches them), then whatever
    of the test's is left with parent 1. A process that has exited is reaped."""
    try:
        descendants = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    if proc.poll() is None:
        proc.kill()
    for child in descendants:
        with contextlib.suppress(psutil.Error):
            child.kill()
    proc.wait()
    end_started()
