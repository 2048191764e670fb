"""How this project writes and reads its small files (manifests, ledgers, state), and
creates its directories.

Reading never blocks and never raises on bad bytes: a FIFO or a device planted where a
file belongs is refused, and a byte that is not UTF-8 spoils only itself.

Every directory this project creates is 0700, whatever the umask: under a group-writable
umask (002) a member of the group could otherwise plant a checkpoint in `checkpoints/`
(torch loads it with pickle: code run as the job's user) or swap the control directory
for a symlink.

Writing replaces a file by a private temp file beside it, then rename. Why each step: the temp file comes from mkstemp (O_CREAT|O_EXCL, a random name, mode
0600), so nothing planted in the directory (a symlink at a guessable name) is ever
opened or chmod-ed; the mode is set on the open descriptor, never through a path; the
rename replaces the directory entry (a symlink at the target is replaced, not
followed), so a reader sees the old file or the new one, never half of either.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any


class NotRegularFile(OSError):
    """A FIFO, a device or a directory where a regular file belongs."""


def read_text(path: str | Path, limit: int) -> str | None:
    """The first `limit` bytes of a regular file as text; None when it does not exist.
    Raises OSError when it cannot be read, NotRegularFile when it is not a regular file."""
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", str(path))
        return fh.read(limit).decode("utf-8", errors="replace")


def make_private_dirs(path: str | Path) -> None:
    """Create `path` and each missing parent, every one 0700 whatever the umask. What
    already exists is left as it is: the checks that trust a directory judge it."""
    missing: list[Path] = []
    here = Path(path)
    while not os.path.lexists(here) and here != here.parent:
        missing.append(here)
        here = here.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            continue  # another node or process made it first: theirs to have set
        # mkdir's mode passes through the umask, which may also take the owner's bits.
        os.chmod(directory, 0o700)


def write_atomic(
    path: Path, text: str, mode: int = 0o644, *, durable: bool = True, parent_made: bool = False
) -> None:
    """Replace `path` with `text`. durable=False skips the fsync, for files that may be
    lost in a crash (the watcher's state and textfile) on a busy login node's disk;
    parent_made: the caller made the directory (on shared storage each mkdir that finds
    it is two metadata operations)."""
    path = Path(path)
    if not parent_made:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def create_once(path: Path, data: dict[str, Any]) -> bool:
    """Write `path` whole, owner-only, only if it does not exist: True for the one writer
    that created it (a hard link of a complete file: a reader never sees it half written)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(data, sort_keys=True) + "\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        os.unlink(tmp)
