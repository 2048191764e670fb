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
when the file still holds its own token, never a thief's. Both removals (the holder's,
and a waiter's of a stale lock) rename the lock aside before they judge it, so that a
lock that took the name between the look and the removal is never the one removed.
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


def _token(seen: tuple[int, str | None] | None) -> str | None:
    with contextlib.suppress(AttributeError, TypeError, ValueError):
        return json.loads((seen or (0, None))[1] or "").get("token")
    return None


def _holds(path: Path, token: str) -> bool:
    with contextlib.suppress(OSError):
        return _token(_seen(path)) == token
    return False


def _remove_if(path: Path, judged: Callable[[tuple[int, str | None] | None], bool]) -> None:
    """Remove the lock at `path` only if it is the one `judged` accepts. Judging it in
    place and then unlinking the name would remove whatever lock took the name in
    between (a waiter's that broke it, a new holder's): the lock is renamed aside first,
    which is atomic on every file system, and judged there. One that is not the judged
    lock is linked back unless a new lock took the name meanwhile; its holder then finds
    it lost at its next still_held() and stops, as any holder that lost its lock does."""
    aside = path.with_name(f"{path.name}.{secrets.token_hex(8)}.removing")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    try:
        if not judged(_seen(aside)):
            with contextlib.suppress(FileExistsError):
                os.link(aside, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(aside)


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
        with contextlib.suppress(OSError):
            _remove_if(path, lambda seen: _token(seen) == token)


def _break(path: Path, stale: tuple[int, str | None]) -> None:
    """Remove the lock a dead guard left, unless it changed since it was judged stale."""
    _remove_if(path, lambda seen: seen == stale)
