"""What the Slurm commands print, parsed: one parser each for squeue, sacct, scontrol
and sbatch. Pure: text in, values out.

squeue and sacct are asked for the fields a caller needs (a field list below); one
parser reads any of those lists, by name. Whatever field may hold a '|' goes last,
and lines are split at most len-1 times.
"""

from __future__ import annotations

import posixpath
import pwd
import re
from dataclasses import dataclass

from nvrx_appliance.jobhost import hostlib
from nvrx_appliance.observe.times import parse_time
from nvrx_appliance.observe.types import Ending, Generation, Task, terminal


class ParseError(ValueError):
    """Slurm printed something this tool does not understand."""


# --- squeue --------------------------------------------------------------------------------

# The squeue --format code of each Task field.
_SQUEUE_CODES = {
    "job_id": "%A",
    "array_job_id": "%F",
    "task_id": "%K",
    "name": "%j",
    "user": "%u",
    "state": "%T",
    "submitted": "%V",
    "nodes": "%N",
    "reason": "%r",
    "work_dir": "%Z",
}
# A user's jobs, for status, cancel and submit's checks: the work dir leads to the chain.
USER_JOBS = (
    "job_id",
    "array_job_id",
    "task_id",
    "name",
    "user",
    "state",
    "nodes",
    "reason",
    "work_dir",
)
# One chain's tasks, for the watcher: the submit time dates successors queued early.
CHAIN_TASKS = ("array_job_id", "task_id", "state", "user", "submitted", "nodes")


def squeue_format(fields: tuple[str, ...]) -> str:
    return "|".join(_SQUEUE_CODES[f] for f in fields)


def squeue_tasks(out: str, fields: tuple[str, ...] = USER_JOBS) -> list[Task]:
    """`squeue --noheader --array --format squeue_format(fields)` -> one Task per line.

    A task range squeue did not expand (--array ignored) is skipped, never guessed.
    """
    tasks = []
    for line in out.splitlines():
        if not line.strip():
            continue
        row = _fields(line, fields)
        task_id = row["task_id"]
        if task_id not in ("", "N/A") and not task_id.isdigit():
            continue
        tasks.append(
            Task(
                task_id=int(task_id) if task_id.isdigit() else None,
                job_id=row["job_id"],
                state=row["state"],
                user=row["user"],
                # A pending task has no nodes; squeue says "(null)" for that.
                nodes="" if row["nodes"] == "(null)" else row["nodes"],
                array_job_id=row["array_job_id"],
                name=row["name"],
                reason=row["reason"],
                work_dir=row["work_dir"],
                submitted=parse_time(row["submitted"]),
            )
        )
    return tasks


def generations(tasks: list[Task]) -> tuple[Generation, ...]:
    """Tasks grouped by array job id, oldest generation first; a generation's submit
    time is its earliest task's."""
    grouped: dict[str, list[Task]] = {}
    for task in tasks:
        if task.array_job_id:
            grouped.setdefault(task.array_job_id, []).append(task)
    return tuple(
        Generation(
            array_job_id=array_job_id,
            tasks=tuple(members),
            submitted=min((t.submitted for t in members if t.submitted is not None), default=None),
        )
        for array_job_id, members in sorted(grouped.items(), key=lambda item: _numeric(item[0]))
    )


def _numeric(job_id: str) -> tuple[int, str]:
    return (int(job_id), "") if job_id.isdigit() else (1 << 62, job_id)


def _fields(line: str, fields: tuple[str, ...]) -> dict[str, str]:
    """A line by field name; every other field empty. A line cut short is read as far as
    it goes: a record from an older field list must not hide the rest of the chain."""
    values = [v.strip() for v in line.rstrip("\n").split("|", len(fields) - 1)]
    row = dict.fromkeys(_ALL_FIELDS, "")
    row.update(zip(fields, values, strict=False))
    return row


# --- sacct ---------------------------------------------------------------------------------


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
    submit_line: str = ""
    submit: str = ""  # when Slurm accepted the job
    cancelled_by: str = ""  # "CANCELLED by 1000" -> the user's name (or "uid 1000")


# Every task of a chain since a time, for status and the benchmarks.
CHAIN_ACCOUNTING = (
    "JobID",
    "JobIDRaw",
    "JobName",
    "User",
    "State",
    "ExitCode",
    "NodeList",
    "Start",
    "End",
    "WorkDir",
)
# How task 0 of each generation ended, for the watcher.
ENDINGS = ("JobID", "State", "ExitCode", "End")
# Who a job id belongs to and which script it ran, for the watcher's start.
IDENTITY = ("JobName", "User", "WorkDir", "SubmitLine")  # SubmitLine last: it may hold '|'
# What each task of a chain held and when, for the goodput report: its allocation.
ALLOCATIONS = (
    "JobID",
    "JobIDRaw",
    "JobName",
    "User",
    "State",
    "NodeList",
    "Submit",
    "Start",
    "End",
    "WorkDir",
)
# Every chain of a user at once, for the chain list: status's fields and the allocation's.
CHAINS = (*CHAIN_ACCOUNTING[:-1], "Submit", "WorkDir")
_ALL_FIELDS = (*_SQUEUE_CODES, *CHAIN_ACCOUNTING, *IDENTITY, *ALLOCATIONS)


def sacct_format(fields: tuple[str, ...]) -> str:
    return ",".join(fields)


_ARRAY_JOB = re.compile(r"^(\d+)_(\d+|\[[^\]]*\])$")


def sacct_rows(out: str, fields: tuple[str, ...] = CHAIN_ACCOUNTING) -> list[AcctRow]:
    """`sacct --noheader --parsable2 --format sacct_format(fields)` -> one row per line."""
    rows = []
    for line in out.splitlines():
        if not line.strip():
            continue
        row = _fields(line, fields)
        match = _ARRAY_JOB.match(row["JobID"])
        if match:
            array_job_id, task = match.groups()
            tasks = (int(task),) if task.isdigit() else expand_task_range(task)
        else:
            array_job_id, tasks = row["JobID"], ()
        code, signal = _exit_code(row["ExitCode"])
        rows.append(
            AcctRow(
                job_id=row["JobIDRaw"],
                array_job_id=array_job_id,
                task_ids=tasks,
                name=row["JobName"],
                user=row["User"],
                state=first_word(row["State"]),
                exit_code=code,
                signal=signal,
                nodes="" if row["NodeList"] in ("None assigned", "") else row["NodeList"],
                start=_time(row["Start"]),
                end=_time(row["End"]),
                work_dir=row["WorkDir"],
                submit_line=row["SubmitLine"],
                submit=_time(row["Submit"]),
                cancelled_by=cancelled_by(row["State"]),
            )
        )
    return rows


def cancelled_by(state: str) -> str:
    """Who cancelled the job, when sacct says ("CANCELLED by 1000"): the user's name on
    this host, else the uid; "" when it does not say."""
    words = state.split()
    if len(words) != 3 or words[:2] != ["CANCELLED", "by"] or not words[2].isdigit():
        return ""
    try:
        return f"{pwd.getpwuid(int(words[2])).pw_name} (uid {words[2]})"
    except KeyError:
        return f"uid {words[2]}"


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


def _number(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _exit_code(text: str) -> tuple[int | None, int | None]:
    """Slurm's 'code:signal'; the code is what the batch script (task 0's trap) exited with."""
    code, _, signal = text.strip().partition(":")
    return (_number(code), _number(signal))


def first_word(state: str) -> str:
    return state.split()[0] if state.strip() else ""  # "CANCELLED by 0" -> CANCELLED


def _time(text: str) -> str:
    return "" if text in ("Unknown", "None", "") else text


def task0_endings(rows: list[AcctRow]) -> tuple[Ending, ...]:
    """How each generation's task 0 ended, from sacct rows.

    Only task 0 speaks for a generation: the others end whenever the pool drains. A
    plain job (an id without '_', from a chain that does not use arrays) speaks for itself.
    """
    endings: dict[str, Ending] = {}
    for row in rows:
        speaks = row.task_ids in ((0,), ())
        if not speaks or not row.array_job_id.isdigit() or not terminal(row.state):
            continue
        endings[row.array_job_id] = Ending(
            array_job_id=row.array_job_id,
            state=row.state,
            exit_code=row.exit_code,
            end=parse_time(row.end),
            source="sacct",
        )
    return tuple(endings.values())


# sbatch options (22.05) that take no value unless written with '=': every other option
# written as "--opt value" or "-o value" consumes the next word of a submit line.
_SBATCH_BARE_LONG = frozenset(
    [
        "--contiguous",
        "--exclusive",
        "--get-user-env",
        "--help",
        "--hold",
        "--ignore-pbs",
        "--nice",
        "--no-kill",
        "--no-requeue",
        "--overcommit",
        "--oversubscribe",
        "--parsable",
        "--propagate",
        "--quiet",
        "--reboot",
        "--requeue",
        "--spread-job",
        "--test-only",
        "--usage",
        "--use-min-nodes",
        "--verbose",
        "--version",
        "--wait",
    ]
)
_SBATCH_BARE_SHORT = frozenset("hHkOsQvVW")


def submitted_script(submit_line: str, work_dir: str) -> str:
    """sacct's SubmitLine ('sbatch [options] script [args]') -> the batch script's path.

    A relative path was relative to where sbatch ran, which is the work dir unless the
    line moved it (--chdir / -D): then it cannot be known and '' is returned, as for a
    --wrap job or a line that is not an sbatch call. Slurm joins the words with single
    blanks, so a quoted option value holding a blank cannot be told apart.
    """
    words = submit_line.split()
    if not words or posixpath.basename(words[0]) != "sbatch":
        return ""
    moved = False
    i = 1
    while i < len(words):
        word = words[i]
        if word.startswith("--wrap"):
            return ""
        if word.startswith("--"):
            name = word.split("=", 1)[0]
            moved |= name == "--chdir"
            i += 2 if "=" not in word and word not in _SBATCH_BARE_LONG else 1
        elif word.startswith("-") and len(word) > 1:
            moved |= word.startswith("-D")
            i += 2 if len(word) == 2 and word[1] not in _SBATCH_BARE_SHORT else 1
        elif posixpath.isabs(word):
            return posixpath.normpath(word)
        else:
            return (
                "" if moved or not work_dir else posixpath.normpath(posixpath.join(work_dir, word))
            )
    return ""


# --- host lists -----------------------------------------------------------------


# One expander for the package and the job's host: hostlib's (stdlib only).
expand_nodelist = hostlib.expand_nodelist


# --- scontrol, sbatch ----------------------------------------------------------------------


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


_SCONTROL_KEY = re.compile(r"(?:^|\s)(?=[A-Za-z][A-Za-z0-9:/_]*=)")


def scontrol_records(out: str) -> list[dict[str, str]]:
    """`scontrol --oneliner show job`: one 'Key=Value Key=Value' record per line.

    Values may hold spaces (a Command with arguments), so a record is split only before
    something that looks like the next key.
    """
    records: list[dict[str, str]] = []
    for line in out.splitlines():
        if "=" not in line:
            continue
        record: dict[str, str] = {}
        for token in _SCONTROL_KEY.split(line.strip()):
            key, sep, value = token.partition("=")
            if sep and key not in record:
                record[key] = value.strip()
        records.append(record)
    return records


def scontrol_owner(record: dict[str, str]) -> str:
    return record.get("UserId", "").split("(")[0]  # "alice(1000)" -> alice


def scontrol_ending(record: dict[str, str]) -> Ending | None:
    state = first_word(record.get("JobState", ""))
    array_job_id = record.get("ArrayJobId") or record.get("JobId", "")
    if not terminal(state) or not array_job_id:
        return None
    return Ending(
        array_job_id=array_job_id,
        state=state,
        exit_code=_exit_code(record.get("ExitCode", ""))[0],
        end=parse_time(record.get("EndTime")),
        source="scontrol",
    )


def array_throttle(record: dict[str, str]) -> int | None:
    value = record.get("ArrayTaskThrottle", "")
    return int(value) if value.isdigit() and int(value) > 0 else None
