"""Reads what `status` and `cancel` need: which chain a job id or name is, and its state.

A job id or a job name leads to the chain's work dir (Slurm records it: submit passes
--chdir), and the work dir to run.json, the ledger, the cycle-info files and the
checkpoint tracker. Two Slurm calls per look (one squeue, one sacct), whatever the depth.
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path
from typing import Any

from nvrx_appliance.files import read_text
from nvrx_appliance.manifest import Layout
from nvrx_appliance.slurm import parse, slurmcli
from nvrx_appliance.slurm.status import ChainView, assemble
from nvrx_appliance.slurm.teardown import parse_iteration, parse_ledger
from nvrx_appliance.watch.parsing import cycle_file_name, cycle_info


class NotFound(Exception):
    """The job id or name leads to no chain of this user; the message says what to try."""


def locate_job(target: str, *, user: str) -> tuple[Path, str | None]:
    """(work dir, array job id) of the chain `target` (a job id or a job name) belongs
    to: the generation a job id names (a task's own id too); None for a job name.
    Raises NotFound, or SlurmUnavailable when Slurm could not be asked."""
    failures: list[str] = []
    rows = _live_rows(user, failures)
    if target.isdigit():
        match = [r for r in rows if target in (r.array_job_id, r.job_id)]
    else:
        match = [r for r in rows if r.name == target]
    if not match:
        match = _accounted(target, user, failures)
    dirs = [r.work_dir for r in match if r.work_dir]
    if not dirs and failures:
        # Not "no such job": Slurm was not asked. Say why.
        raise slurmcli.SlurmUnavailable(failures[0])
    if not dirs:
        raise NotFound(
            f"no job {target!r} of user {user} in squeue or sacct; pass a job id or name of "
            "your chain, or its work dir with --work-dir"
        )
    # The newest job wins: a name reused by a later chain means that chain.
    generation = match[-1].array_job_id if target.isdigit() else None
    return Path(dirs[-1]), generation


def _live_rows(user: str, failures: list[str]) -> list[parse.QueueRow]:
    try:
        return slurmcli.squeue(user=user)
    except (slurmcli.SlurmUnavailable, parse.ParseError) as exc:
        failures.append(str(exc))
        return []


def _accounted(target: str, user: str, failures: list[str]) -> list[parse.AcctRow]:
    try:
        if target.isdigit():
            out = slurmcli.run(["sacct", *_SACCT_BASE, "--jobs", target])
        else:
            out = slurmcli.run(
                [
                    "sacct",
                    *_SACCT_BASE,
                    "--user",
                    user,
                    "--name",
                    target,
                    "--starttime",
                    "now-30days",
                ]
            )
        return parse.sacct_rows(out)
    except (slurmcli.SlurmUnavailable, parse.ParseError) as exc:
        failures.append(str(exc))
        return []


_SACCT_BASE = ("--noheader", "--parsable2", "--allocations", "--format", parse.SACCT_FORMAT)


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
    except (OSError, ValueError) as exc:
        raise NotFound(f"{path} is unreadable ({exc}); was it edited by hand?") from None
    if not isinstance(data, dict) or "spec" not in data or "shape" not in data:
        raise NotFound(f"{path} is not an nvrx-appliance run manifest")
    return data


def slurm_time(iso_utc: str) -> str:
    """run.json's UTC time as the local time sacct --starttime expects."""
    try:
        moment = datetime.datetime.fromisoformat(iso_utc.replace("Z", "+00:00"))
    except ValueError:
        return "now-30days"
    return moment.astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """A JSON-lines file (progress log, ledger); a line being appended is skipped."""
    rows = []
    for line in _read(path).splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


# The same reader as the watcher's: a FIFO in place of a file, or a byte that is not
# UTF-8, must neither hang nor crash status.
MAX_FILE_BYTES = 64 << 20


def _read(path: Path) -> str:
    try:
        return read_text(path, MAX_FILE_BYTES) or ""
    except OSError:
        return ""


def _json(path: Path) -> Any:
    """A whole JSON file; None when absent or unreadable (a record being replaced)."""
    try:
        return json.loads(_read(path) or "null")
    except ValueError:
        return None


def _cycles(layout: Layout, array_job_ids: list[str]) -> dict[str, list]:
    found: dict[str, list] = {}
    for array_job_id in array_job_ids:
        folder = layout.cycle_infos(array_job_id)
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if cycle_file_name(path.name):
                cycle = cycle_info(_read(path))
                if cycle is not None:
                    found.setdefault(array_job_id, []).append(cycle)
    return found


def submitted_ids(layout: Layout) -> list[str]:
    try:
        ids = json.loads(layout.submitted.read_text()).get("job_ids", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [str(i) for i in ids if str(i).isdigit()]


def _accounting(layout: Layout, manifest: dict[str, Any], user: str) -> list[parse.AcctRow]:
    """By the ids submit recorded when there are some (the only way sacct shows a
    generation cancelled before it started), else by name since the chain's creation."""
    ids = submitted_ids(layout)
    if ids:
        out = slurmcli.run(["sacct", *_SACCT_BASE, "--user", user, "--jobs", ",".join(ids)])
        return parse.sacct_rows(out)
    since = slurm_time(str(manifest.get("created", "")))
    return slurmcli.sacct(user=user, name=manifest["spec"]["job_name"], since=since)


def read_chain(work_dir: Path, *, user: str) -> ChainView:
    manifest = load_manifest(work_dir)
    spec = manifest["spec"]
    layout = Layout(work_dir)
    # Blindness is a state, not a crash: a source that fails is named, the rest shown.
    blind: list[str] = []
    queue: list[parse.QueueRow] | None = None
    acct: list[parse.AcctRow] | None = None
    try:
        queue = slurmcli.squeue(user=user, name=spec["job_name"])
    except (slurmcli.SlurmUnavailable, parse.ParseError) as exc:
        blind.append(f"squeue: {exc}")
    try:
        acct = _accounting(layout, manifest, user)
    except (slurmcli.SlurmUnavailable, parse.ParseError) as exc:
        blind.append(f"sacct: {exc}")
    ledger = parse_ledger(_read(layout.ledger))
    ids = {r.array_job_id for r in queue or []} | {r.array_job_id for r in acct or []}
    ids |= {str(e["array_job_id"]) for e in ledger}
    return assemble(
        manifest=manifest,
        queue=queue,
        acct=acct,
        ledger=ledger,
        cycles=_cycles(layout, sorted(ids)),
        checkpoint_now=parse_iteration(_read(layout.tracker)),
        chain_marker=layout.chain_marker.exists(),
        qualify_record=_json(layout.qualification),
        blind=blind,
        now=time.time(),
    )
