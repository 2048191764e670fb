"""What NVRx and the appliance write into a work dir, parsed: cycle-info files, the
checkpoint tracker, JSON lines (the ledger, the cpu trainer's progress log). Pure.

Every file here is read while its writer may still be writing: a half-written cycle
info, a torn last line, a foreign line, is skipped, never raised.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeGuard

from nvrx_appliance.jobhost import hostlib
from nvrx_appliance.observe.times import parse_time
from nvrx_appliance.observe.types import Cycle, LedgerEntry

_CYCLE_NAME = re.compile(r"^cycle_info\.(?P<job>[^.]*)\.(?P<attempt>\d+)\.(?P<cycle>\d+)$")


def cycle_file_name(name: str) -> bool:
    """cycle_info.<job>.<attempt>.<cycle>; not the .current symlink or a writer's .tmp."""
    return _CYCLE_NAME.match(name) is not None


def cycle_info(text: str | bytes) -> Cycle | None:
    """A cycle-info JSON document (NVRx's NVRxCycleInfo) -> Cycle, or None if it is not one.

    NVRx writes a new cycle's file in place, so a reader can see it half-written; that,
    and any JSON that is not a cycle info, is skipped.
    """
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    job_id, number, attempt = (
        data.get("job_id"),
        data.get("cycle_number"),
        data.get("attempt_index", 0),
    )
    start = parse_time(_text(data.get("cycle_start_time")))
    if not isinstance(job_id, str) or start is None:
        return None
    if not _integer(number) or not _integer(attempt):
        return None
    return Cycle(
        job_id=job_id,
        attempt=attempt,
        number=number,
        start=start,
        end=parse_time(_text(data.get("cycle_end_time"))),
        active_nodes=_text(data.get("active_nodes")),
        standby_nodes=_text(data.get("standby_nodes")),
        log_file=_text(data.get("cycle_log_file")),
    )


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _integer(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


# Python 3.11's int() refuses more than 4,300 digits; no run trains 10**18 iterations.
MAX_ITERATION_DIGITS = 18


def tracker_value(text: str) -> int | None:
    """latest_checkpointed_iteration.txt holds an iteration number (Megatron may write
    'release' for a converted checkpoint, which carries no progress). Anything else,
    however it got there, is no number: never an exception in the reader."""
    value = text.strip()
    # isdecimal, not isdigit: "²" is a digit to isdigit, and int("²") raises.
    return int(value) if value.isdecimal() and len(value) <= MAX_ITERATION_DIGITS else None


# A JSON-lines file (progress log, ledger): one object per line; a line being appended,
# or one that is not an object, is skipped. One parser with the job's host's.
json_lines = hostlib.json_lines


def ledger_lines(text: str) -> list[dict[str, Any]]:
    """<work>/chain.jsonl, one generation outcome per line, as task 0's teardown wrote
    them (the teardown is the ledger's writer; a test keeps the two in step)."""
    return [row for row in json_lines(text) if row.get("array_job_id") not in (None, "")]


def ledger_entries(text: str) -> tuple[LedgerEntry, ...]:
    """The ledger, typed: what the watcher's detectors read."""
    return tuple(
        LedgerEntry(
            array_job_id=str(row["array_job_id"]),
            end=parse_time(_text(row.get("end"))),
            exit_code=row.get("exit_code") if _integer(row.get("exit_code")) else None,
            action=_text(row.get("action")),
            reason=_text(row.get("reason")),
            final_iteration=row["final_iteration"]
            if _integer(row.get("final_iteration"))
            else None,
        )
        for row in ledger_lines(text)
    )
