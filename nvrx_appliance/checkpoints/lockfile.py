"""Locks of the checkpoint directory: the fall-back lock (one guard at a time sets a
checkpoint aside, fallback.py) and the record lock (one writer at a time appends to the
tracked record, tracked_record.py).

Each is a file created exclusively (O_CREAT|O_EXCL), which excludes across nodes where
flock does not (Lustre mounted localflock, NFS with local_lock). It holds a token of its
holder's own.

A lock left by a guard that died holding it is broken once a waiter has seen it
unchanged (the same file, the same token) for LOCK_STALE_S by the waiter's own
monotonic clock. No node compares its clock with the file's mtime, which NFS sets from
the server's clock (lease.py keeps the same rule for task 0's lease).

A live holder slower than that (a tracker write held up by the file system) can lose
the lock to a waiter. So the holder asks still_held() before each step that cannot be
repeated, and stops where it has lost it; and it removes the lock on the way out only
when the file still holds its own token, never a thief's.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from nvrx_appliance import files
from nvrx_appliance.clock import now_iso

LOCK_FILE = ".fallback.lock"
RECORD_LOCK_FILE = ".tracked.lock"
# Holding a lock takes a few file system calls; one seen unchanged this long was left
# by a guard that died holding it. Waiting for it is bounded by the same: a guard never
# hangs its rank.
LOCK_STALE_S = 30.0
LOCK_WAIT_S = 45.0
LOCK_RETRY_S = 0.1
_MAX_LOCK_BYTES = 4096


class LockUnavailable(OSError):
    """Another holder held the lock for longer than one can."""


def _seen(path: Path) -> tuple[int, str | None] | None:
    """What a waiter compares between looks: the file's inode and its text."""
    try:
        inode = os.stat(path).st_ino
        return inode, files.read_text(path, _MAX_LOCK_BYTES)
    except FileNotFoundError:
        return None


def _holds(path: Path, token: str) -> bool:
    with contextlib.suppress(OSError, ValueError):
        text = files.read_text(path, _MAX_LOCK_BYTES) or ""
        return json.loads(text).get("token") == token
    return False


def locked(checkpoints: Path) -> contextlib.AbstractContextManager[Callable[[], bool]]:
    """The fall-back lock; yields still_held()."""
    return exclusive(checkpoints / LOCK_FILE)


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[Callable[[], bool]]:
    """The lock file at `path`; yields still_held(). Raises LockUnavailable, or OSError
    when it cannot be made."""
    token = secrets.token_hex(8)
    holder = {"host": socket.gethostname(), "pid": os.getpid(), "time": now_iso(), "token": token}
    deadline = time.monotonic() + LOCK_WAIT_S
    watched: tuple[int, str | None] | None = None
    since = time.monotonic()
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            break
        except FileExistsError:
            now, seen = time.monotonic(), _seen(path)
            if seen != watched:  # another holder, or the first look: watch it afresh
                watched, since = seen, now
            elif seen is not None and now - since >= LOCK_STALE_S:
                _break(path, seen)
            if now >= deadline:
                raise LockUnavailable(f"{path} is held by another guard") from None
            time.sleep(LOCK_RETRY_S)
    try:
        os.write(fd, json.dumps(holder).encode() + b"\n")
    finally:
        os.close(fd)
    try:
        yield lambda: _holds(path, token)
    finally:
        if _holds(path, token):
            with contextlib.suppress(OSError):
                os.unlink(path)


def _break(path: Path, stale: tuple[int, str | None]) -> None:
    """Remove the lock a dead guard left, unless it changed since it was judged stale."""
    with contextlib.suppress(FileNotFoundError):
        if _seen(path) == stale:
            os.unlink(path)
