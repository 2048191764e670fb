"""The watcher's own memory between passes: ~/.nvrx_watch/state.json and a cycle cache.

The state file holds only what cannot be recovered from disk or Slurm: when the
current checkpoint value was first seen (a stall timer without a process kept alive),
when each finding was last sent to each sink (dedup and cooldown), and what each job
id resolved to (so a chain can be followed after Slurm has forgotten the id). The
cycle cache lets a pass skip cycle-info files it parsed before.

Both are rewritten atomically (files.write_atomic), without fsync. Losing or corrupting either is
not an error: timers restart from this pass, which delays a detection by at most one
threshold, and the next pass reads every cycle-info file again. The watcher must never
be the thing that needs recovering.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from nvrx_appliance.files import make_private_dirs, read_text, write_atomic
from nvrx_appliance.observe.types import Checkpoint, Cycle

VERSION = 1
# The state holds timers and alert times of a few chains; a cycle cache file, one
# generation's cycles. Anything larger is not ours to parse.
MAX_STATE_BYTES = 16 << 20


def default_state_file() -> str:
    return str(Path.home() / ".nvrx_watch" / "state.json")


def chain_key(owner: str, job_name: str) -> str:
    return f"{owner}/{job_name}"


def _read_json(path: str | Path) -> Any:
    """A file of ours, read bounded and without blocking; None when absent or bad."""
    try:
        return json.loads(read_text(path, MAX_STATE_BYTES) or "null")
    except (OSError, ValueError):
        return None


def load(path: str) -> dict[str, Any]:
    """The whole state file, or an empty state if it is missing, unreadable or foreign."""
    data = _read_json(path)
    return data if isinstance(data, dict) and data.get("version") == VERSION else {}


def chain_section(state: dict[str, Any], key: str) -> dict[str, Any]:
    chains = state.get("chains")
    section = chains.get(key) if isinstance(chains, dict) else None
    return section if isinstance(section, dict) else {}


def _seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def sane_section(section: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The section with every entry of the wrong shape dropped, and what was dropped.

    A hand edit or another version's file must cost one timer or one cooldown, never a
    pass: every later pass would raise on the same entry.
    """
    sane, notes = dict(section), []
    checkpoint = sane.get("checkpoint")
    if checkpoint is not None and not (
        isinstance(checkpoint, dict) and _seconds(checkpoint.get("first_seen"))
    ):
        notes.append(f"checkpoint timer {checkpoint!r} is malformed; it restarts now")
        del sane["checkpoint"]
    alerts = sane.get("alerts", {})
    good = {
        sink: sent
        for sink, sent in (alerts.items() if isinstance(alerts, dict) else [])
        if isinstance(sent, dict) and all(map(_seconds, sent.values()))
    }
    if good != alerts:
        notes.append("alert memory is malformed; findings may be sent again")
        sane["alerts"] = good
    return sane, notes


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """Serialise writers (cron overlap, several chains watched by one user)."""
    lock = Path(path + ".lock")
    _private_dir(lock.parent)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _private_dir(path: Path) -> None:
    make_private_dirs(path)


def save_chain(path: str, key: str, section: dict[str, Any], jobs: dict[str, Any]) -> None:
    """Merge this chain's section (and job-id identities) into the file, atomically."""
    with _locked(path):
        state = load(path)
        state["version"] = VERSION
        state.setdefault("chains", {})[key] = section
        state.setdefault("jobs", {}).update(jobs)
        write_atomic(
            Path(path), json.dumps(state, indent=1, sort_keys=True) + "\n", 0o600, durable=False
        )


# --- pure transitions ---------------------------------------------------------------------


def checkpoint_since(section: dict[str, Any], checkpoint: Checkpoint, now: float) -> Checkpoint:
    """Attach to the checkpoint when its current value was first seen.

    A tracker rewritten with the same value (a static tracker, a re-save) moves its
    mtime but not its value; the earlier of the two is when progress last happened.
    """
    if checkpoint.value is None:
        return checkpoint
    prior = section.get("checkpoint", {})
    first_seen = now
    if isinstance(prior, dict) and prior.get("value") == checkpoint.value:
        first_seen = float(prior.get("first_seen", now))
    since = min(first_seen, checkpoint.mtime) if checkpoint.mtime is not None else first_seen
    return Checkpoint(checkpoint.value, checkpoint.mtime, since)


def due(sent: dict[str, float], key: str, now: float, cooldown: float) -> bool:
    """A finding goes to a sink the first time, and again once the cooldown has passed."""
    last = sent.get(key)
    return last is None or now - last >= cooldown


def prune(sent: dict[str, float], now: float, keep: float) -> dict[str, float]:
    """Forget sends older than `keep`, so the file does not grow for ever."""
    return {k: v for k, v in sent.items() if now - v < keep}


# --- the cycle cache ---------------------------------------------------------------------------


def cycle_cache_dir(state_file: str, key: str, pattern: str) -> str:
    """One directory per watched run, one file in it per cycle-info directory."""
    digest = hashlib.sha256(f"{key}\n{pattern}".encode()).hexdigest()[:16]
    return str(Path(state_file).parent / "cycles" / digest)


def _cache_name(directory: str) -> str:
    return hashlib.sha256(directory.encode()).hexdigest()[:20] + ".json"


def load_cycle_cache(cache_dir: str) -> dict[str, Any]:
    """directory -> {file name -> entry}; whatever is unreadable is simply not cached."""
    cache: dict[str, Any] = {}
    try:
        paths = list(Path(cache_dir).glob("*.json"))
    except OSError:
        return cache
    for path in paths:
        data = _read_json(path)
        if isinstance(data, dict) and _cache_rows_sane(data.get("files")):
            cache[str(data.get("directory"))] = {
                "mtime_ns": data.get("mtime_ns"),
                "settled": data.get("settled") is True,
                "files": data["files"],
            }
    return cache


def _cache_rows_sane(files: Any) -> bool:
    """file name -> [ino, size, mtime_ns, row or None], row a Cycle's fields: anything
    else (another version, a hand edit) drops the directory's cache, so it is re-read."""

    def entry_ok(entry: Any) -> bool:
        if not (isinstance(entry, list) and len(entry) == 4):
            return False
        row = entry[3]
        return all(isinstance(v, int) for v in entry[:3]) and (
            row is None
            or (
                isinstance(row, list)
                and len(row) == len(Cycle._fields)
                and isinstance(row[0], str)
                and all(_seconds(v) for v in row[1:4])
                and (row[4] is None or _seconds(row[4]))
                and all(isinstance(v, str) for v in row[5:])
            )
        )

    return isinstance(files, dict) and all(map(entry_ok, files.values()))


def save_cycle_cache(cache_dir: str, cache: dict[str, Any], changed: set[str]) -> None:
    """Rewrite the cache files of the directories that changed; drop those that are gone."""
    _private_dir(Path(cache_dir))
    for directory in changed:
        path = Path(cache_dir) / _cache_name(directory)
        if directory in cache:
            text = json.dumps({"directory": directory, **cache[directory]}, separators=(",", ":"))
            write_atomic(path, text, 0o600, durable=False)
        else:
            path.unlink(missing_ok=True)
