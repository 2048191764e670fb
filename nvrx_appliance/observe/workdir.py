"""A chain's work dir, read by its Layout: run.json, the ledger, the checkpoint
tracker, the cycle-info files, the ids submit recorded, the chain marker and a
qualify run's record.

For the host tools (status, cancel, the workflows): a file that is missing, being
replaced or unreadable reads as absent, so one bad file never hides the rest. Every
read is bounded and non-blocking (files.read_text): a FIFO in place of a file, or a
byte that is not UTF-8, must neither hang nor crash a reader.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from nvrx_appliance.clock import now_iso
from nvrx_appliance.files import read_text
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe import deaths as death_record
from nvrx_appliance.observe import exclusions as exclusion_record
from nvrx_appliance.observe import hangs as hang_record
from nvrx_appliance.observe import run_files
from nvrx_appliance.observe.times import sacct_since
from nvrx_appliance.observe.types import Cycle

MAX_FILE_BYTES = 64 << 20


class NotFound(Exception):
    """The job id, name or work dir leads to no chain of this user; the message says
    what to try."""


def read(path: Path) -> str:
    """A file's text, "" when it is absent or cannot be read."""
    try:
        return read_text(path, MAX_FILE_BYTES) or ""
    except OSError:
        return ""


# A longer line is no record of ours (a progress event, a Megatron line): skipped, so one
# runaway line cannot take a reader's memory.
MAX_LINE_BYTES = 1 << 20


@dataclass
class Tail:
    """How far a reader of a growing log got: the file it read (device, inode) and the
    offset just past the last whole line it took. `fresh` is set when the file is not the
    one read before, or shrank: whatever was built from it must be built again."""

    identity: tuple[int, int] | None = None
    offset: int = 0
    fresh: bool = True


def appended_lines(path: Path, tail: Tail) -> Iterator[str]:
    """The whole lines appended to a log since `tail`, read as a stream that advances it;
    a last line still being written is left for the next read. `tail.fresh` is decided
    here, before any line: a log replaced or truncated is read again from its start.
    Nothing when the file is absent, unreadable or not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return iter(())
    handle = os.fdopen(fd, "rb")
    try:
        info = os.fstat(fd)
    except OSError:
        handle.close()
        return iter(())
    if not stat.S_ISREG(info.st_mode):
        handle.close()
        return iter(())
    identity = (info.st_dev, info.st_ino)
    tail.fresh = identity != tail.identity or info.st_size < tail.offset
    if tail.fresh:
        tail.identity, tail.offset = identity, 0
    return _whole_lines(handle, tail)


def _whole_lines(handle: BinaryIO, tail: Tail) -> Iterator[str]:
    with handle:
        handle.seek(tail.offset)
        too_long = False
        while raw := handle.readline(MAX_LINE_BYTES):
            if not raw.endswith(b"\n"):
                if len(raw) < MAX_LINE_BYTES:
                    return  # being written: taken whole next time
                too_long = True
                tail.offset += len(raw)
                continue
            tail.offset += len(raw)
            if too_long:
                too_long = False  # the end of an over-long line
                continue
            yield raw.decode("utf-8", errors="replace")


def read_json(path: Path) -> Any:
    """A whole JSON file; None when absent or unreadable (a record being replaced)."""
    try:
        return json.loads(read(path) or "null")
    except ValueError:
        return None


def load_manifest(work_dir: Path) -> dict[str, Any]:
    """run.json as a plain dict: status reads what an older or newer submit wrote too."""
    path = Layout(work_dir).run_json
    try:
        text = read_text(path, MAX_FILE_BYTES)
        if text is None:
            raise FileNotFoundError(path)
        data = json.loads(text)
    except FileNotFoundError:
        raise NotFound(
            f"{path} does not exist: this work dir holds no nvrx-appliance chain"
        ) from None
    except OSError as exc:
        raise NotFound(f"{path} cannot be read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise Unreadable(f"{path} is not JSON ({exc}); was it edited by hand?") from None
    if not isinstance(data, dict) or "spec" not in data or "shape" not in data:
        raise NotFound(f"{path} is not an nvrx-appliance run manifest")
    problem = manifest_problem(data)
    if problem:
        raise Unreadable(f"{path} {problem}; was it edited by hand? resubmit to rewrite it")
    return data


class Unreadable(NotFound):
    """run.json is there but lacks what a reader needs (a hand edit): the chain's files
    cannot be read through it, though Slurm may still know its jobs."""


# What the host tools read from run.json without a second look: each key, its type.
_NEEDED: dict[str, dict[str, type]] = {
    "spec": {"job_name": str, "work_dir": str},
    "shape": {"array_spec": str, "active_tasks": int},
}


def manifest_problem(data: dict[str, Any]) -> str:
    """Why run.json cannot be read by status, logs, report and cancel; "" when it can."""
    for part, keys in _NEEDED.items():
        section = data.get(part)
        if not isinstance(section, dict):
            return f"has no `{part}` object"
        for key, kind in keys.items():
            value = section.get(key)
            if not isinstance(value, kind) or isinstance(value, bool) or value == "":
                return f"has no {kind.__name__} `{part}.{key}`"
    return ""


def ledger(layout: Layout) -> list[dict[str, Any]]:
    return run_files.ledger_lines(read(layout.ledger))


def json_lines(path: Path) -> list[dict[str, Any]]:
    return run_files.json_lines(read(path))


def checkpoint_iteration(layout: Layout) -> int | None:
    """The tracker's value: the last iteration with a complete checkpoint."""
    return run_files.tracker_value(read(layout.tracker))


def cycles(layout: Layout, array_job_ids: list[str]) -> dict[str, list[Cycle]]:
    """array job id -> the cycles its task 0's ft_launcher recorded, by file name."""
    found: dict[str, list[Cycle]] = {}
    for array_job_id in array_job_ids:
        folder = layout.cycle_infos(array_job_id)
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if run_files.cycle_file_name(path.name):
                cycle = run_files.cycle_info(read(path))
                if cycle is not None:
                    found.setdefault(array_job_id, []).append(cycle)
    return found


def submitted_ids(layout: Layout) -> list[str]:
    """The array job ids submit recorded, oldest first."""
    record = read_json(layout.submitted)
    ids = record.get("job_ids", []) if isinstance(record, dict) else []
    return [str(i) for i in ids if str(i).isdigit()]


def accounting_query(layout: Layout, manifest: dict[str, Any]) -> dict[str, Any]:
    """How to ask sacct for every task of the chain: by the ids submit recorded when
    there are some (the only way sacct shows a generation cancelled before it started),
    else by name since the chain's creation (Slurm.sacct's keywords)."""
    ids = submitted_ids(layout)
    if ids:
        return {"jobs": ids}
    return {
        "name": manifest["spec"]["job_name"],
        "since": sacct_since(str(manifest.get("created", ""))),
    }


def chain_marker(layout: Layout) -> bool:
    return layout.chain_marker.exists()


def exclusions(layout: Layout) -> exclusion_record.Record:
    """The exclusion record as of now: the nodes kept out of the queued generations."""
    return exclusion_record.read(read(layout.exclusions), now_iso())


HANG_RECORD_BYTES = 1 << 20
MAX_HANG_RECORDS = 1000


def hangs(layout: Layout, array_job_ids: list[str]) -> dict[str, list[hang_record.Hang]]:
    """Each generation's hang records (Layout.hangs), by cycle."""
    found: dict[str, list[hang_record.Hang]] = {}
    for array_job_id in array_job_ids:
        directory = layout.hangs(array_job_id)
        try:
            names = sorted(os.listdir(directory))[:MAX_HANG_RECORDS]
        except OSError:
            continue
        withdrawn = {n.removeprefix("withdrawn.") for n in names if n.startswith("withdrawn.")}
        for name in names:
            if not (name.startswith("cycle") and name.endswith(".json")):
                continue
            try:
                text = read_text(directory / name, HANG_RECORD_BYTES) or ""
            except OSError:
                continue
            hang = hang_record.parse(text, withdrawn)
            if hang is not None:
                found.setdefault(array_job_id, []).append(hang)
        found.get(array_job_id, []).sort(key=lambda h: h.cycle)
    return found


DEATH_RECORD_BYTES = 64 << 10


def deaths(layout: Layout, array_job_ids: list[str]) -> dict[str, list[death_record.Death]]:
    """Each generation's node deaths (Layout.deaths), in the order task 0 judged them."""
    found: dict[str, list[death_record.Death]] = {}
    for array_job_id in array_job_ids:
        directory = layout.deaths(array_job_id)
        try:
            names = sorted(os.listdir(directory))[:MAX_HANG_RECORDS]
        except OSError:
            continue
        for name in names:
            if not name.startswith(death_record.DEAD_PREFIX):
                continue
            try:
                text = read_text(directory / name, DEATH_RECORD_BYTES) or ""
            except OSError:
                continue
            death = death_record.parse(text)
            if death is not None:
                found.setdefault(array_job_id, []).append(death)
        found.get(array_job_id, []).sort(key=lambda d: d.time)
    return found


NAMED_STRAGGLER_BYTES = 64 << 10  # a few fields of JSON
MAX_NAMED_STRAGGLERS = 1000


def stragglers_named(
    layout: Layout, chain: str, array_job_ids: list[str]
) -> dict[str, list[dict[str, Any]]]:
    """The stragglers task 0 named in each generation and what it did about each
    (node/straggler_leave.py's `named.<node>`, by node), as they stand before the
    generation's ledger line takes them over; none from a file another chain left under
    a reused array job id."""
    found: dict[str, list[dict[str, Any]]] = {}
    for array_job_id in array_job_ids:
        directory = layout.stragglers(array_job_id)
        try:
            names = sorted(n for n in os.listdir(directory) if n.startswith("named."))
        except OSError:
            continue
        for name in names[:MAX_NAMED_STRAGGLERS]:
            try:
                named = json.loads(read_text(directory / name, NAMED_STRAGGLER_BYTES) or "")
            except (OSError, ValueError):
                continue
            if not isinstance(named, dict):
                continue
            if str(named.get("generation", "")).split("/")[:2] != [chain, array_job_id]:
                continue
            found.setdefault(array_job_id, []).append(named)
    return found
