"""The one way this project replaces a file: a private temp file beside it, then rename.

Why each step: the temp file comes from mkstemp (O_CREAT|O_EXCL, a random name, mode
0600), so nothing planted in the directory (a symlink at a guessable name) is ever
opened or chmod-ed; the mode is set on the open descriptor, never through a path; the
rename replaces the directory entry (a symlink at the target is replaced, not
followed), so a reader sees the old file or the new one, never half of either.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, text: str, mode: int = 0o644, *, durable: bool = True) -> None:
    """Replace `path` with `text`. durable=False skips the fsync, for files that may be
    lost in a crash (the watcher's state and textfile) on a busy login node's disk."""
    path = Path(path)
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
