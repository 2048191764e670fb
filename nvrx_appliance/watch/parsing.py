"""Pure parsers: what Slurm prints, what NVRx and the ledger write, in; watch types, out.

Kept apart from the readers so that detectors can use the helpers here (nodelist
expansion) without importing anything that touches the file system or a subprocess.
Anything malformed is skipped, never raised: a half-written file or an unexpected
line must not stop a pass.

Pure: no I/O.
"""

from __future__ import annotations

import json
import posixpath
import re
from datetime import datetime

from nvrx_appliance.observe.types import LIVE_STATES, Cycle, Ending, Generation, LedgerEntry, Task

# One line per array task (squeue --array). %F is the array job id, which every task of
# one generation shares; %i is the task's own job id, which Slurm assigns as it starts.
# The node list goes last because it is the only field that can hold commas.
SQUEUE_FORMAT = "%F|%K|%i|%T|%u|%V|%N"
SACCT_FIELDS = "JobID,State,ExitCode,End"
DESCRIBE_FIELDS = "JobName,User,WorkDir,SubmitLine"  # SubmitLine last: it may hold '|'

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

_UNKNOWN_TIMES = {"", "unknown", "none", "n/a"}
_CYCLE_NAME = re.compile(r"^cycle_info\.(?P<job>[^.]*)\.(?P<attempt>\d+)\.(?P<cycle>\d+)$")


def parse_time(text: str | None) -> float | None:
    """ISO-8601 (NVRx writes UTC with 'Z') or Slurm's zone-less local time -> epoch seconds."""
    if not text or text.strip().lower() in _UNKNOWN_TIMES:
        return None
    value = text.strip()
    if value.endswith("Z"):
        value = value[:-1] + "+00:00"
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def age_text(seconds: float) -> str:
    if seconds < 90:
        return f"{int(seconds)}s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host lists: 'node[1-3,07],ctl' -> node1 node2 node3 node07 ctl."""
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", nodelist or ""):
        hosts.extend(_expand_one(part.strip()))
    return [h for h in hosts if h]


def _expand_one(pattern: str) -> list[str]:
    match = re.match(r"^(?P<pre>[^\[]*)\[(?P<ranges>[^\]]*)\](?P<post>.*)$", pattern)
    if not match:
        return [pattern]
    out: list[str] = []
    for item in match["ranges"].split(","):
        low, _, high = item.partition("-")
        if high and low.isdigit() and high.isdigit():
            out.extend(
                f"{match['pre']}{n:0{len(low)}d}{match['post']}"
                for n in range(int(low), int(high) + 1)
            )
        else:
            out.append(f"{match['pre']}{item}{match['post']}")
    return [host for one in out for host in (_expand_one(one) if "[" in one else (one,))]


# --- Slurm -----------------------------------------------------------------------------


def squeue_generations(out: str) -> tuple[Generation, ...]:
    """`squeue --noheader --array --format SQUEUE_FORMAT` -> generations, by array job id."""
    tasks: dict[str, list[Task]] = {}
    submitted: dict[str, float | None] = {}
    for line in out.splitlines():
        parts = line.strip().split("|", 6)
        if len(parts) < 7 or not parts[0].strip():
            continue
        array_job_id, task_raw, job_id, state, user, submit, nodes = (p.strip() for p in parts)
        task_id = _task_id(task_raw)
        if task_id == -1:
            continue  # an unexpanded range: --array was ignored, never guess
        tasks.setdefault(array_job_id, []).append(
            Task(task_id=task_id, job_id=job_id, state=state, user=user, nodes=nodes)
        )
        seen = parse_time(submit)
        if seen is not None and (
            submitted.get(array_job_id) is None or seen < submitted[array_job_id]
        ):
            submitted[array_job_id] = seen
    return tuple(
        Generation(array_job_id=a, tasks=tuple(ts), submitted=submitted.get(a))
        for a, ts in sorted(tasks.items(), key=lambda item: _numeric(item[0]))
    )


def _task_id(raw: str) -> int | None:
    if raw in ("", "N/A"):
        return None  # not an array job
    return int(raw) if raw.isdigit() else -1


def _numeric(job_id: str) -> tuple[int, str]:
    return (int(job_id), "") if job_id.isdigit() else (1 << 62, job_id)


def exit_code(raw: str) -> int | None:
    """Slurm's 'code:signal' -> the code the batch script (task 0's trap) exited with."""
    head = (raw or "").split(":")[0].strip()
    return int(head) if head.isdigit() else None


def first_word(state: str) -> str:
    return state.split()[0] if state.strip() else ""  # "CANCELLED by 0" -> CANCELLED


def terminal(state: str) -> bool:
    return bool(state) and state not in LIVE_STATES


def sacct_task0_endings(out: str) -> tuple[Ending, ...]:
    """`sacct -X -n -P -o SACCT_FIELDS` -> how each generation's task 0 ended.

    Only task 0 speaks for a generation: the others end whenever the pool drains. A
    plain job (an id without '_', from a chain that does not use arrays) speaks for itself.
    """
    endings: dict[str, Ending] = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 4:
            continue
        array_job_id, array, task = parts[0].partition("_")
        state = first_word(parts[1])
        if (array and task != "0") or not array_job_id.isdigit() or not terminal(state):
            continue
        endings[array_job_id] = Ending(
            array_job_id=array_job_id,
            state=state,
            exit_code=exit_code(parts[2]),
            end=parse_time(parts[3]),
            source="sacct",
        )
    return tuple(endings.values())


def sacct_identity(out: str) -> tuple[str, str, str, str] | None:
    """`sacct -X -n -P -j ID -o DESCRIBE_FIELDS` -> (name, owner, work dir, submit line)."""
    for line in out.splitlines():
        parts = line.rstrip("\n").split("|", 3)
        if len(parts) >= 3 and parts[0]:
            return parts[0], parts[1], parts[2], parts[3] if len(parts) > 3 else ""
    return None


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
        exit_code=exit_code(record.get("ExitCode", "")),
        end=parse_time(record.get("EndTime")),
        source="scontrol",
    )


# --- what NVRx and the appliance write ----------------------------------------------------


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
    if not isinstance(number, int) or not isinstance(attempt, int) or isinstance(number, bool):
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


def tracker_value(text: str) -> int | None:
    """latest_checkpointed_iteration.txt holds an iteration number (Megatron may write
    'release' for a converted checkpoint, which carries no progress)."""
    value = text.strip()
    return int(value) if value.isdecimal() else None  # not isdigit: int("²") raises


def ledger_entries(text: str) -> tuple[LedgerEntry, ...]:
    """<work>/chain.jsonl: one generation outcome per line; a torn last line is skipped."""
    entries: list[LedgerEntry] = []
    for line in text.splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if not isinstance(data, dict) or data.get("array_job_id") in (None, ""):
            continue
        code = data.get("exit_code")
        entries.append(
            LedgerEntry(
                array_job_id=str(data["array_job_id"]),
                end=parse_time(_text(data.get("end"))),
                exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
                action=_text(data.get("action")),
                reason=_text(data.get("reason")),
            )
        )
    return tuple(entries)
