"""File-system readers: cycle-info files, the checkpoint tracker, the ledger, the chain
marker, run.json and batch scripts. Read-only: the watcher never writes into a job's
directories.

A missing file is a fact (no cycle yet, no checkpoint yet, no ledger yet); a file or
directory that exists but cannot be read raises ReadError, which the runner turns into
"source unavailable" for that pass.
"""

from __future__ import annotations

import fnmatch
import glob
import operator
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nvrx_appliance.files import NotRegularFile, read_text
from nvrx_appliance.observe import exclusions, run_files
from nvrx_appliance.observe.types import Checkpoint, Cycle, LedgerEntry

MAX_SCRIPT_BYTES = 1 << 20  # a batch script or a library it sources; anything larger is not one
MAX_CYCLE_BYTES = 1 << 16  # a cycle-info file is a few hundred bytes


class ReadError(Exception):
    """A source exists but could not be read; the message is one line."""


# --- cycle-info files, read incrementally --------------------------------------------------

# Cache entry per file: (inode, size, mtime_ns, the parsed cycle or None if it was not one).
# A file whose three keys are unchanged is not opened again: NVRx rewrites a cycle by
# rename (new inode) or in place (new size or mtime), and either shows. The cache is
# kept per directory (one generation's cycle_infos/), so a pass that sees one cycle
# close rewrites one small cache file, not the run's whole history.
CacheEntry = tuple[int, int, int, "tuple | None"]

# A directory whose own mtime has not moved since it was last listed is not listed (or
# its files stat'ed) again. Every write NVRx makes there moves it: a new cycle's file is
# created and then the .current symlink is replaced by rename, a cycle's end is written
# by rename, and a failed write unlinks. Only a stamp that was already this old when it
# was recorded is trusted: file systems with one-second mtimes could otherwise hide a
# second write made in the same second as the listing.
SETTLE_S = 2.0
_ORDER = operator.itemgetter(3, 0, 1, 2)  # Cycle fields start, job_id, attempt, number


@dataclass
class CycleScan:
    cycles: tuple[Cycle, ...]
    parsed: int  # files opened and parsed this pass
    reused: int  # files not opened because unchanged
    skipped: int  # files that were not (or not yet) a complete cycle info
    listed: int  # directories listed this pass (the others had not changed)


class CycleReader:
    """Reads every cycle-info file matching a glob; keeps what it parsed between passes.

    cache: directory -> {"mtime_ns": the directory's mtime when listed, "settled": whether
    that stamp may be trusted, "files": file name -> CacheEntry}.
    """

    def __init__(self, pattern: str, cache: dict[str, dict] | None = None, clock=time.time) -> None:
        self.pattern = pattern
        self.cache: dict[str, dict] = dict(cache or {})
        self.changed: set[str] = set()  # directories whose cache differs from the one saved
        self.clock = clock

    def scan(self) -> CycleScan:
        directory_pattern, name_pattern = os.path.split(self.pattern)
        fresh: dict[str, dict] = {}
        counts = {"parsed": 0, "reused": 0, "listed": 0}
        for directory in _directories(directory_pattern):
            try:
                stamp = os.stat(directory).st_mtime_ns
            except FileNotFoundError:
                continue  # a generation directory that went away between glob and stat
            before = self.cache.get(directory)
            if before and before.get("settled") and before.get("mtime_ns") == stamp:
                fresh[directory] = before
                counts["reused"] += len(before["files"])
                continue
            fresh[directory] = self._list(directory, name_pattern, stamp, before, counts)
        self.changed |= set(self.cache) - set(fresh)
        self.cache = fresh
        rows = [e[3] for d in fresh.values() for e in d["files"].values()]
        cycles = [_from_row(row) for row in rows if row]
        cycles.sort(key=_ORDER)
        skipped = sum(1 for row in rows if not row)
        return CycleScan(
            tuple(cycles), counts["parsed"], counts["reused"], skipped, counts["listed"]
        )

    def _list(self, directory: str, name_pattern: str, stamp: int, before, counts) -> dict:
        known = before["files"] if before else {}
        files: dict[str, CacheEntry] = {}
        for name, stat in _files(directory, name_pattern):
            key = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
            entry = known.get(name)
            if entry is None or tuple(entry[:3]) != key:
                entry = (*key, _as_row(_parse_file(os.path.join(directory, name), stat.st_size)))
                counts["parsed"] += 1
            else:
                counts["reused"] += 1
            files[name] = entry
        counts["listed"] += 1
        settled = self.clock() - stamp / 1e9 >= SETTLE_S
        state = {"mtime_ns": stamp, "settled": settled, "files": files}
        if before != state:
            self.changed.add(directory)
        return state


def _files(directory: str, name_pattern: str) -> Iterator[tuple[str, os.stat_result]]:
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return  # a generation directory that went away between glob and scan
    except OSError as exc:
        raise ReadError(f"cannot list cycle-info directory {directory}: {exc.strerror}") from None
    wanted = re.compile(fnmatch.translate(name_pattern)).match
    for entry in entries:
        name = entry.name
        if not (run_files.cycle_file_name(name) and wanted(name)):
            continue  # the .current symlink, a writer's .tmp, anything else
        if not entry.is_file(follow_symlinks=False):
            continue
        try:
            yield entry.name, entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue


def _directories(pattern: str) -> list[str]:
    if not glob.has_magic(pattern):
        return [pattern] if os.path.isdir(pattern) or _unreadable(pattern) else []
    _check_readable_prefix(pattern)
    return sorted(glob.glob(pattern))


def _check_readable_prefix(pattern: str) -> None:
    """glob hides a directory it may not list; say so instead of seeing nothing."""
    parts = pattern.split(os.sep)
    prefix = os.sep.join(
        p for p in parts[: next(i for i, p in enumerate(parts) if glob.has_magic(p))]
    )
    if prefix and os.path.isdir(prefix) and not os.access(prefix, os.R_OK | os.X_OK):
        raise ReadError(f"cannot list {prefix}: permission denied")


def _unreadable(path: str) -> bool:
    return os.path.exists(path) and not os.access(path, os.R_OK | os.X_OK)


def _parse_file(path: str, size: int) -> Cycle | None:
    """A listed cycle-info file, read bounded and without blocking: between the listing
    and the open it may have been replaced (a FIFO would hold the pass for hours)."""
    if size > MAX_CYCLE_BYTES:
        return None
    try:
        text = read_text(path, MAX_CYCLE_BYTES)
    except NotRegularFile:
        return None  # as the listing skips whatever is not a regular file
    except OSError as exc:
        raise ReadError(f"cannot read cycle-info file {path}: {exc.strerror}") from None
    return None if text is None else run_files.cycle_info(text)


def _as_row(cycle: Cycle | None) -> tuple | None:
    if cycle is None:
        return None
    return (
        cycle.job_id,
        cycle.attempt,
        cycle.number,
        cycle.start,
        cycle.end,
        cycle.active_nodes,
        cycle.standby_nodes,
        cycle.log_file,
    )


def _from_row(row: tuple | list) -> Cycle:
    return Cycle._make(row)


# --- the other run files -------------------------------------------------------------------


def read_checkpoint(path_or_glob: str) -> Checkpoint:
    """The tracker's value and mtime. A glob (a per-generation tracker found in a batch
    script) means the most recently written match."""
    paths = glob.glob(path_or_glob) if glob.has_magic(path_or_glob) else [path_or_glob]
    best: tuple[float, str] | None = None
    for path in paths:
        try:
            mtime = os.stat(path).st_mtime
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ReadError(f"cannot stat checkpoint tracker {path}: {exc.strerror}") from None
        if best is None or mtime > best[0]:
            best = (mtime, path)
    if best is None:
        return Checkpoint(value=None, mtime=None)
    text = _read_small(best[1], "checkpoint tracker", 4096)
    return Checkpoint(value=None if text is None else run_files.tracker_value(text), mtime=best[0])


def read_ledger(path: str) -> tuple[LedgerEntry, ...]:
    text = _read_small(path, "ledger", 64 << 20)
    return () if text is None else run_files.ledger_entries(text)


def read_excluded(path: str, now: str) -> frozenset[str]:
    """The nodes the chain's exclusion record keeps out of its queued generations now."""
    text = _read_small(path, "exclusion record", 64 << 20)
    record = exclusions.read(text or "", now)
    return frozenset(e.node for e in record.active)


def marker_present(path: str) -> bool:
    try:
        os.stat(path)
        return True
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise ReadError(f"cannot stat chain marker {path}: {exc.strerror}") from None


def read_script(path: str) -> str | None:
    """A batch script or a file it sources; None when it is missing or unreadable (the
    caller then asks for --work-dir)."""
    try:
        return _read_small(path, "script", MAX_SCRIPT_BYTES)
    except ReadError:
        return None


def is_dir(path: str) -> bool:
    return Path(path).is_dir()


def _read_small(path: str, what: str, limit: int) -> str | None:
    try:
        return read_text(path, limit)
    except OSError as exc:
        raise ReadError(f"cannot read {what} {path}: {exc.strerror}") from None
