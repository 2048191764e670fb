"""What the Slurm commands print, parsed. Pure: text in, values out."""

from __future__ import annotations

import re
from dataclasses import dataclass

# One line per array task (squeue --array). The work dir goes last: it is the one field
# that could hold a '|', so lines are split at most len-1 times.
SQUEUE_FORMAT = "%A|%F|%K|%j|%u|%T|%N|%r|%Z"
SACCT_FORMAT = "JobID,JobIDRaw,JobName,User,State,ExitCode,NodeList,Start,End,WorkDir"


class ParseError(ValueError):
    """Slurm printed something this tool does not understand."""


@dataclass(frozen=True)
class QueueRow:
    job_id: str  # the task's own job id
    array_job_id: str
    task_id: int | None  # None for a job that is not an array task
    name: str
    user: str
    state: str  # PENDING, RUNNING, COMPLETING, ...
    nodes: str
    reason: str
    work_dir: str


@dataclass(frozen=True)
class AcctRow:
    job_id: str  # JobIDRaw
    array_job_id: str
    task_ids: tuple[int, ...]  # one task, or the still-pending range sacct folds together
    name: str
    user: str
    state: str  # first word: "CANCELLED by 0" -> CANCELLED
    exit_code: int | None
    signal: int | None
    nodes: str
    start: str  # ISO-like, or "" when unknown
    end: str
    work_dir: str


def sbatch_job_id(out: str) -> str:
    """`sbatch --parsable` prints 'JOBID' or 'JOBID;CLUSTER'."""
    first = out.strip().splitlines()[0] if out.strip() else ""
    job_id = first.split(";")[0].strip()
    if not job_id.isdigit():
        raise ParseError(f"sbatch printed no job id: {out.strip()!r}")
    return job_id


def scontrol_config(out: str) -> dict[str, str]:
    """`scontrol show config`: 'Key = value' lines."""
    config: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            config[key.strip()] = value.strip()
    return config


def max_array_size(config: dict[str, str]) -> int | None:
    value = config.get("MaxArraySize", "")
    return int(value) if value.isdigit() else None


_PAIR = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=(\S*)")


def scontrol_records(out: str) -> list[dict[str, str]]:
    """`scontrol show job --oneliner`: one record per line of Key=Value pairs."""
    return [dict(_PAIR.findall(line)) for line in out.splitlines() if "=" in line]


def array_throttle(record: dict[str, str]) -> int | None:
    value = record.get("ArrayTaskThrottle", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def _task_id(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def squeue_rows(out: str) -> list[QueueRow]:
    rows = []
    for line in out.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 8)
        if len(parts) != 9:
            raise ParseError(f"unexpected squeue line: {line!r}")
        job_id, array_job_id, task, name, user, state, nodes, reason, work_dir = parts
        rows.append(
            QueueRow(
                job_id=job_id,
                array_job_id=array_job_id,
                task_id=_task_id(task),
                name=name,
                user=user,
                state=state,
                # A pending task has no nodes; squeue says "(null)" for that.
                nodes="" if nodes == "(null)" else nodes,
                reason=reason,
                work_dir=work_dir,
            )
        )
    return rows


_ARRAY_JOB = re.compile(r"^(\d+)_(\d+|\[[^\]]*\])$")


def expand_task_range(text: str) -> tuple[int, ...]:
    """'[2-4,7%3]' -> (2, 3, 4, 7): the tasks sacct folds into one pending row."""
    body = text.strip("[]").split("%")[0]
    tasks: list[int] = []
    for part in filter(None, body.split(",")):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ParseError(f"unexpected array task range: {text!r}")
        tasks.extend(range(int(low), int(high or low) + 1))
    return tuple(tasks)


def _exit_code(text: str) -> tuple[int | None, int | None]:
    code, _, signal = text.partition(":")
    return (_task_id(code), _task_id(signal))


_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def slurm_seconds(text: str) -> int | None:
    """A Slurm time limit in seconds: "M", "M:S", "H:M:S", "D-H", "D-H:M", "D-H:M:S"."""
    match = _SLURM_TIME.match(text.strip())
    if not match:
        return None
    days, first, second, third = match.groups()
    if days is None:
        parts = [int(first), int(second or 0), int(third or 0)]
        # Without days: M, M:S or H:M:S.
        hours, minutes, seconds = [0, *parts[:2]] if third is None else parts
        return hours * 3600 + minutes * 60 + seconds
    return int(days) * 86400 + int(first) * 3600 + int(second or 0) * 60 + int(third or 0)


def _time(text: str) -> str:
    return "" if text in ("Unknown", "None", "") else text


def sacct_rows(out: str) -> list[AcctRow]:
    rows = []
    for line in out.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 9)
        if len(parts) != 10:
            raise ParseError(f"unexpected sacct line: {line!r}")
        job_id, raw, name, user, state, exit_code, nodes, start, end, work_dir = parts
        match = _ARRAY_JOB.match(job_id)
        if match:
            array_job_id, task = match.groups()
            tasks = (int(task),) if task.isdigit() else expand_task_range(task)
        else:
            array_job_id, tasks = job_id, ()
        code, signal = _exit_code(exit_code)
        rows.append(
            AcctRow(
                job_id=raw,
                array_job_id=array_job_id,
                task_ids=tasks,
                name=name,
                user=user,
                state=state.split(" ")[0],
                exit_code=code,
                signal=signal,
                nodes="" if nodes in ("None assigned", "") else nodes,
                start=_time(start),
                end=_time(end),
                work_dir=work_dir,
            )
        )
    return rows
