"""One machine-wide lock around the cluster, so `up`, `down` and test sessions never
build and tear down at the same time.

A pytest session holds it for its whole length and runs `cluster up/down` as child
processes; a child of the holder proceeds under its parent's lock instead of waiting
for itself. The holder is read from /proc/locks (the kernel's truth), not from the note
the holder leaves in the file for people.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from nvrx_appliance.devcluster.procs import cmdline

# In /run/lock: cleared at boot, like the cluster itself. Never deleted while in use:
# a waiter would then lock a file nobody else can see.
LOCK_PATH = Path("/run/lock/nvrx-devcluster.lock")


def holder(path: Path = LOCK_PATH) -> int | None:
    """The pid holding a flock on `path`, from /proc/locks, or None."""
    try:
        inode = path.stat().st_ino
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    for line in table.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 1234 00:1a:5678 0 EOF"
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5].split(":")[-1] == str(inode):
            return int(fields[4])
    return None


def _ancestors(pid: int) -> Iterator[int]:
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        yield pid


def describe(pid: int) -> str:
    argv = " ".join(cmdline(pid)) or "(gone)"
    return f"pid {pid}: {argv[:160]}"


@contextlib.contextmanager
def cluster_lock(
    path: Path = LOCK_PATH, say: Callable[[str], None] = lambda line: print(line, file=sys.stderr)
) -> Iterator[None]:
    """Hold the machine-wide cluster lock for the `with` body (waiting for it if needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = holder(path)
            if owner is not None and owner in _ancestors(os.getpid()):
                yield  # our parent holds it for us (a test session running the CLI)
                return
            say(f"waiting for the cluster lock {path}, held by {describe(owner or 0)}")
            started = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            say(f"got the cluster lock after {time.monotonic() - started:.0f} s")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{describe(os.getpid())}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
