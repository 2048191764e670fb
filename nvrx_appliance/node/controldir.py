"""The control directory on the shared file system: create, check, publish, observe.

The thin adapter under gate.py. Whether task 0 is alive is judged from how long its
lease's stat has gone unchanged, by this node's own clock (lease_watch.py): no clock is
compared with another, or with the file system's.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from nvrx_appliance.files import make_private_dirs, write_atomic
from nvrx_appliance.layout import ControlFiles
from nvrx_appliance.node import control, gate, lease_watch


class ControlDirError(Exception):
    """The control directory is not ours alone; one line says why."""


def _dir_seen(path: Path) -> gate.DirSeen:
    st = os.lstat(path)
    return gate.DirSeen(mode=st.st_mode, owner=st.st_uid, is_dir=stat.S_ISDIR(st.st_mode))


def prepare(path: Path, uid: int) -> None:
    """Create the directory owner-only (whoever comes first), then refuse it unless it is."""
    make_private_dirs(path.parent)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    d = _dir_seen(path)
    problem = control.dir_problem(mode=d.mode, owner=d.owner, uid=uid, is_dir=d.is_dir)
    if problem:
        raise ControlDirError(f"control directory {path} {problem}")


def set_aside_stale(path: Path) -> Path | None:
    """Task 0, before anything else: move away a control dir another run left here.

    Array job ids repeat (a controller rebuilt without its state, a wrapped counter),
    and a reused work dir then holds the old generation's directory under the new id:
    its closed flag would send the new peers away, its record point them at the old
    host. Only a task 0 entrypoint writes the record and the lease, and this is that
    entrypoint's first look, so either one found now is another run's. Set aside (by
    rename, kept for a post-mortem) rather than deleted. Returns where it went.
    """
    if not (
        os.path.lexists(ControlFiles(path).record) or os.path.lexists(ControlFiles(path).lease)
    ):
        return None
    aside = path.with_name(f"{path.name}.stale.{os.getpid()}.{time.time_ns()}")
    os.rename(path, aside)
    return aside


def read_file(path: Path) -> gate.FileSeen | None:
    try:
        # O_NOFOLLOW: a symlink planted in place of the record is refused, not followed.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError:
        st = os.lstat(path)
        return gate.FileSeen(text="", owner=st.st_uid, is_file=False)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            return gate.FileSeen(text="", owner=st.st_uid, is_file=False)
        text = fh.read(64 * 1024).decode("utf-8", errors="replace")
    return gate.FileSeen(text=text, owner=st.st_uid, is_file=True)


def _ours(path: Path, generation: str) -> gate.FileSeen | None:
    """The file as read, or None when it is missing or names another generation."""
    seen = read_file(path)
    if seen is None or control.foreign(seen.text, generation):
        return None
    return seen


class LeaseWatch:
    """This node's watch on task 0's lease: one stat per look, and the lease's content
    (whose generation it names) read once per lease file, not on every look."""

    def __init__(
        self,
        directory: Path,
        generation: str,
        clock: Callable[[], float] = lease_watch.peer_clock,
    ):
        self.path = ControlFiles(directory).lease
        self.generation = generation
        self.clock = clock
        self._track = lease_watch.Track()
        self._ours: int | None = None  # the inode found to be this generation's lease

    def look(self) -> float | None:
        """Seconds for which this node has seen the lease go unrefreshed (a lower bound
        on its age; 0.0 the first time); None when there is no lease of this generation."""
        before = self.clock()  # before the stat: a stall then only shortens the figure
        try:
            st = os.stat(self.path)
            stamp: lease_watch.Stamp | None = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        except FileNotFoundError:
            stamp = None
        after = self.clock()
        if stamp is not None and stamp[0] != self._ours:
            if _ours(self.path, self.generation) is None:
                stamp = None
            else:
                self._ours = stamp[0]
        self._track, unchanged = lease_watch.observe(self._track, stamp, before, after)
        return unchanged


def observe(directory: Path, watch: LeaseWatch, generation: str) -> gate.Observation:
    """One gate poll: the closed flag, the lease and the record; the directory's owner
    and mode and the no-restart witness only once a record is there to be joined
    (prepare() checked the directory just before, and no peer exits 93 before task 0
    has published)."""
    record = _ours(ControlFiles(directory).record, generation)
    return gate.Observation(
        directory=_dir_seen(directory) if record is not None else None,
        closed=closed(directory, generation),
        lease_age=watch.look(),
        record=record,
        no_restart=record is not None
        and _ends_ours(ControlFiles(directory).no_restart, generation),
    )


def _ends_ours(path: Path, generation: str) -> bool:
    """A closed flag or no-restart witness that names this generation (control.names_ours)."""
    seen = read_file(path)
    return seen is not None and seen.is_file and control.names_ours(seen.text, generation)


def closed(directory: Path, generation: str) -> bool:
    return _ends_ours(ControlFiles(directory).closed, generation)


def workload_verdict(directory: Path, generation: str) -> dict | None:
    """The workload's verdict for this generation (guard.py writes it), or None: absent,
    another run's, not a regular file, or not ours to trust (another user's)."""
    seen = read_file(ControlFiles(directory).verdict)
    if seen is None or not seen.is_file or seen.owner != os.geteuid():
        return None
    if not control.names_ours(seen.text, generation):
        return None
    try:
        verdict = json.loads(seen.text)
    except ValueError:
        return None
    return verdict if isinstance(verdict, dict) else None


def lease_holder(directory: Path, generation: str) -> dict:
    """What task 0 wrote into its lease (host, start, checkpoint), for the fence's
    ledger entry; {} when unreadable."""
    seen = _ours(ControlFiles(directory).lease, generation)
    try:
        holder = json.loads(seen.text) if seen is not None and seen.is_file else {}
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _claim(path: Path, claim: dict) -> bool:
    """Create a claim file, exclusively: True for the one caller that created it, False
    for every other (however many peers race, one acts)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(claim, sort_keys=True) + "\n")
    return True


def claim_fence(directory: Path, claim: dict) -> bool:
    return _claim(ControlFiles(directory).fence, claim)


def claim_relay(directory: Path, claim: dict) -> bool:
    """The relay claim: its winner's batch script cancels the array's other tasks, so
    that every node learns of the generation's end from Slurm, not by polling."""
    return _claim(ControlFiles(directory).relay, claim)


def close(directory: Path, flag: dict) -> None:
    """The closed flag, `generation` first (the batch script greps for that line)."""
    fields = {"generation": flag.get("generation"), **flag}
    write_atomic(ControlFiles(directory).closed, control.encode_fields(fields), 0o600)


def publish(directory: Path, record: control.Record) -> Path:
    path = ControlFiles(directory).record
    write_atomic(path, control.encode(record), mode=0o600)
    return path


def mark_no_restart(directory: Path, exit_code: int, generation: str) -> None:
    """The witness of a peer's exit 93: task 0's teardown reads it (the chain ends), and
    spares admitted from now on leave at once (the batch script and the gate)."""
    fields = {"generation": generation, "exit_code": exit_code}
    write_atomic(ControlFiles(directory).no_restart, control.encode_fields(fields), 0o600)


def seed_static_tracker(path: Path) -> None:
    """no-restart mode: an iteration file that never advances, non-zero so NVRx tracks it."""
    if not path.exists():
        write_atomic(path, "1\n")


class LeaseKeeper:
    """Task 0's liveness lease: written once, then its mtime refreshed by a thread.

    Never removed: a peer that saw no lease would take task 0 for not started yet and
    wait without a timeout. A lease that stops changing is what tells peers task 0 died.
    The keeper also knows how long ago its last successful refresh began, by task 0's
    own clocks (lease_watch.elapsed: a suspend counts), so that task 0 can stop itself
    in time when the refreshes fail (lease.py).
    """

    def __init__(self, directory: Path, interval: float, holder: dict, warn):
        self.path = ControlFiles(directory).lease
        self.interval = interval
        self.holder = holder
        self.warn = warn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="task0-lease", daemon=True)
        self._refreshed = lease_watch.task0_reading()

    def start(self) -> None:
        began = lease_watch.task0_reading()
        write_atomic(self.path, json.dumps(self.holder, sort_keys=True) + "\n", 0o600)
        self._refreshed = began
        self._thread.start()

    def unrefreshed_for(self) -> float:
        return lease_watch.elapsed(self._refreshed, lease_watch.task0_reading())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            # Taken before the call: the lease changes at or after this moment, so the
            # self-fence deadline counts from no later than the change a peer sees.
            began = lease_watch.task0_reading()
            try:
                os.utime(self.path, None)
            except OSError as exc:
                self.warn(f"could not refresh task 0's lease {self.path}: {exc.strerror}")
            else:
                self._refreshed = began

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval + 1)
