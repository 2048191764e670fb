"""One submit at a time per chain name and per work dir, for one user.

Submit checks that no live job holds the chain's name (chains sharing a name cancel
each other's generations) and that no live chain reads the work dir's run.json, then
queues. Two submits racing between that check and their sbatch calls would both pass;
the lock makes check-and-queue one step. It lives in the user's own state directory,
so it serialises submits on one login node, and across login nodes that share the home
directory (flock reaches the file server's lock manager on NFS).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from nvrx_appliance.files import make_private_dirs

# A submit holds the lock for its checks and its `depth` sbatch calls: seconds, or a
# minute or two on a controller that is slow to answer. Past this, say who holds it.
WAIT_S = 180.0
POLL_S = 0.2


class LockBusy(Exception):
    """Another submit of the same chain name or work dir held its lock too long."""


class LockUnavailable(Exception):
    """The lock directory or a lock file cannot be made (a read-only home, a file in
    the way); the message names the path and the fix."""


def lock_dir(environ: dict[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    state = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "nvrx-appliance" / "submit-locks"


def _key(kind: str, value: str) -> str:
    # Hashed: a job name or a path may hold characters no file name should.
    return f"{kind}-{hashlib.sha256(value.encode()).hexdigest()[:20]}.lock"


def lock_names(job_name: str, work_dir: Path) -> list[str]:
    """The lock files of one submit, in the one order every submit takes them (so two
    submits that share both a name and a work dir cannot deadlock)."""
    return sorted([_key("name", job_name), _key("workdir", os.path.realpath(work_dir))])


def _holder(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()[:200] or "unknown"
    except OSError:
        return "unknown"


@contextlib.contextmanager
def hold(
    job_name: str,
    work_dir: Path,
    *,
    directory: Path | None = None,
    wait_s: float = WAIT_S,
    on_wait: Callable[[str], None] = lambda line: None,
) -> Iterator[None]:
    """Hold the name's and the work dir's locks; raises LockBusy after `wait_s`."""
    folder = directory or lock_dir()
    try:
        make_private_dirs(folder)
    except OSError as exc:
        raise LockUnavailable(_cannot(folder, exc)) from None
    with contextlib.ExitStack() as held:
        for name in lock_names(job_name, work_dir):
            path = folder / name
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            except OSError as exc:
                raise LockUnavailable(_cannot(path, exc)) from None
            held.callback(os.close, fd)
            _acquire(fd, path, job_name, wait_s, on_wait)
            # For a person reading the file: the kernel's lock is the truth.
            note = f"pid {os.getpid()} on {socket.gethostname()}, chain {job_name!r}\n"
            os.ftruncate(fd, 0)
            os.pwrite(fd, note.encode(), 0)
        yield


def _cannot(path: Path, exc: OSError) -> str:
    return (
        f"cannot make the submit lock {path} ({exc.strerror or exc}); set XDG_STATE_HOME "
        "to a directory of yours that can be written, or fix that path"
    )


def _acquire(
    fd: int, path: Path, job_name: str, wait_s: float, on_wait: Callable[[str], None]
) -> None:
    deadline = time.monotonic() + wait_s
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if not told:
            on_wait(
                f"waiting for another submit of chain {job_name!r} or of its work dir "
                f"({_holder(path)}) to finish"
            )
            told = True
        if time.monotonic() >= deadline:
            raise LockBusy(
                f"another submit of chain {job_name!r} or of its work dir ({_holder(path)}) "
                f"has held {path} for over {wait_s:.0f}s; wait for it to finish, or end it, "
                "then submit again"
            )
        time.sleep(POLL_S)
