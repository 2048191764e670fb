"""How a generation ended and what its teardown does about it: the pure part of
teardown.py (which reads the files and calls Slurm), apart so that each file stays short.

Stdlib only, Python 3.6 syntax: it runs on the host's python3 beside the teardown, and
submit copies it there with the rest of nvrx_appliance/jobhost/ (hostlib.py says what
3.6 rules out).
"""

import json
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

if __package__:
    from . import hostlib
else:  # run as a script on the job's host: the copy beside this file
    import hostlib  # type: ignore[import-not-found,no-redef]

NO_RESTART = 93  # NVRx's "do not restart"; see nvrx_appliance/exitcodes.py
ARRAY_JOB_ID_FIELD = "{array_job_id}"  # in a generation's path in run.json (layout.py)
# Long enough for a busy controller; short enough to finish inside Slurm's KillWait
# when the teardown runs because the generation hit its time limit.
SCANCEL_TIMEOUT_S = 20

# What scancel says when a --state=PENDING filter matches nothing of an array id.
BENIGN_SCANCEL = "Invalid job id specified"
# Bounds on every read, so that no file can hold the teardown past KillWait or exhaust the
# node's memory (a tracker that is a FIFO or /dev/zero, a ledger grown to gigabytes): the
# tracker is one number; run.json and a fence claim are small; the burn guard needs only
# the ledger's newest lines (an entry is about 400 bytes: this is ~2,500 generations).
TRACKER_BYTES = 64
CONTROL_BYTES = 64 << 10  # a control file: a few key=value lines
SMALL_FILE_BYTES = 4 << 20
LEDGER_TAIL_BYTES = 1 << 20
# Python 3.11 refuses int() of more than 4,300 digits; no run trains 10**18 iterations.
MAX_ITERATION_DIGITS = 18

RELEASED_SPARES = "released_spares"
# The workload saved and ended before the time limit (the time-limit notice, exit 0).
SAVED_AT_TIME_LIMIT = "saved_at_time_limit"
# The workload finished training (its training-done marker names the tracked iteration).
COMPLETED = "completed"
CANCELLED_CHAIN = "cancelled_chain"
# The workload's own verdict (rank/guard.py): no restart on the same GPUs can
# change it, so the chain stops (stop-chain), or the next generation resumes from the
# checkpoint on other nodes (resume-elsewhere), once per iteration.
STOPPED_BY_WORKLOAD = "stopped_by_workload"
RESUME_ELSEWHERE = "resume_elsewhere"
BURN_GUARD = "burn_guard"
FENCED = "fenced"
NONE = "none"
# The actions that end the chain: every queued generation is cancelled.
CHAIN_ENDS = (CANCELLED_CHAIN, BURN_GUARD, COMPLETED, STOPPED_BY_WORKLOAD)
# The guards write one account per node and cycle (--max-restarts bounds them).
MAX_EXIT_FILES = 1000
# A straggler's file (node/straggler_leave.py), as the ledger keeps it; at most one per
# node of the generation.
STRAGGLER_FIELDS = ("node", "cycle", "slowdown", "lost_s", "action", "words")
MAX_STRAGGLER_FILES = 1000
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


def advanced(entry: Dict[str, Any]) -> bool:
    """Did the generation move the checkpoint iteration forward?"""
    end = entry.get("checkpoint_iteration")
    start = entry.get("checkpoint_iteration_start")
    if end is None:
        return False
    return start is None or end > start


def burnt(entry: Dict[str, Any]) -> bool:
    """A generation that never trained: it completed no cycle (ft_launcher did not end
    cleanly, exit != 0) and left the checkpoint iteration where it found it."""
    return entry.get("exit_code") != 0 and not advanced(entry)


def consecutive_burnt(entries: List[Dict[str, Any]]) -> int:
    count = 0
    for entry in reversed(entries):
        if not burnt(entry):
            break
        count += 1
    return count


def decide(
    exit_code: int,
    history: List[Dict[str, Any]],
    this: Dict[str, Any],
    burn_guard: int,
    no_restart_witness: bool = False,
    done: Optional[int] = None,
    time_limit_notice: bool = False,
    verdict: Optional[Dict[str, Any]] = None,
    exits: Optional[List[Dict[str, Any]]] = None,
) -> Tuple[str, str]:
    """(action, reason) for a generation whose task 0 ended with exit_code.

    history: this chain's earlier ledger entries, oldest first. no_restart_witness: a
    node left the control dir's no-restart file (its ft_launcher exited 93 even if
    task 0's srun reports another code). done: the final iteration, when the workload
    marked training done there (training_done). time_limit_notice: the generation
    was told to save and end before its time limit. verdict: the workload's own (the
    guard's verdict file), exits: each cycle's failed worker, as its guard told.
    """
    if exit_code == NO_RESTART or no_restart_witness:
        told = repeated_failure(exits or [])
        return (
            CANCELLED_CHAIN,
            f"ft_launcher exited {NO_RESTART}: NVRx decided not to restart"
            + (f" after the workload {told}" if told else "")
            + "; cancelling every queued generation of the chain",
        )
    if verdict is not None:
        return judge_verdict(verdict, history, this)
    if done is not None:
        return (
            COMPLETED,
            f"training completed at iteration {done}; cancelling every queued generation "
            "of the chain",
        )
    if exit_code == 0 and time_limit_notice:
        return (
            SAVED_AT_TIME_LIMIT,
            f"saved at the time limit (checkpoint iteration {this.get('checkpoint_iteration')}); "
            "releasing this generation's pending spares so the next generation resumes there",
        )
    streak = consecutive_burnt([*history, this])
    if burn_guard > 0 and streak >= burn_guard:
        return (
            BURN_GUARD,
            f"burn guard: {streak} consecutive generations ended without training (non-zero "
            f"exit, checkpoint iteration stayed at {this.get('checkpoint_iteration')}); "
            "cancelling the rest of the chain. Read the task logs, fix the cause, resubmit",
        )
    return (
        RELEASED_SPARES,
        f"task 0 exited {exit_code}; releasing this generation's pending spares so the "
        "next generation can start",
    )


def _where(entry: Dict[str, Any]) -> str:
    iteration = entry.get("iteration")
    return f" at iteration {iteration}" if iteration is not None else ""


def repeated_failure(exits: List[Dict[str, Any]]) -> str:
    """What the workload did, when it failed the same way in several cycles: "failed 4
    times at iteration 60 with exit 17: <meaning>"; "" otherwise. NVRx's no-progress 93
    is then its answer to the workload, and the words must say so."""
    stalls = [e for e in exits if isinstance(e.get("hang"), dict)]
    if len(stalls) >= 2 and len(stalls) * 2 > len(exits):
        return hang_failures(stalls)
    counts = {}  # type: Dict[Tuple[Any, Any], int]
    for entry in exits:
        key = (entry.get("code"), entry.get("iteration"))
        counts[key] = counts.get(key, 0) + 1
    if not counts:
        return ""
    (code, iteration), times = max(counts.items(), key=lambda item: item[1])
    if times < 2:
        return ""
    first = next(e for e in exits if (e.get("code"), e.get("iteration")) == (code, iteration))
    meaning, line = str(first.get("meaning") or ""), str(first.get("line") or "")
    where = f" at iteration {iteration}" if iteration is not None else ""
    return "failed {} times{} with exit {}{}{}".format(
        times, where, code, ": " + meaning if meaning else "",
        f" (its log: {line!r})" if line else "",
    )  # fmt: skip


def hang_failures(stalls: List[Dict[str, Any]]) -> str:
    """ "failed 4 times, each time a timeout ended its own stall (rank 3 on node2 stood in
    its own code in `upload_metrics` (state S)), which names no node": the guards'
    accounts of kills that a hang's verdict explained."""
    kinds = {str(e["hang"].get("verdict")) for e in stalls}
    last = str(stalls[-1]["hang"].get("words") or "")
    if kinds == {"workload"}:
        # "the workload stalled in cycle 3: <who, where> while ...": the who and where
        _, _, told = last.partition(": ")
        held = told.split(" while ", 1)[0]
        what = "its own stall" + (f" ({held})" if held else "") + ", which names no node"
    elif kinds == {"hung"}:
        what = "a hang whose verdict named a node (" + last.split("; ", 1)[0] + ")"
    else:
        what = "a hang no evidence pinned on a node (" + last.split("; ", 1)[0] + ")"
    return f"failed {len(stalls)} times, each time a timeout ended {what}"


def judge_verdict(
    verdict: Dict[str, Any], history: List[Dict[str, Any]], this: Dict[str, Any]
) -> Tuple[str, str]:
    """(action, reason) for the workload's own verdict. resume-elsewhere is honoured once
    per iteration: the same verdict at the same iteration again, after a generation on
    other nodes, is the data's, and the chain stops rather than loop (same_place says
    when two are at the same iteration, whichever rank wrote them)."""
    words = str(verdict.get("words") or "the workload gave its verdict")
    line = str(verdict.get("line") or "")
    quoted = f" (its log: {line!r})" if line else ""
    keep = "; every checkpoint is kept. Fix the cause (data, configuration) and resubmit"
    if verdict.get("action") == "resume-elsewhere":
        before = [
            e for e in history
            if e.get("action") == RESUME_ELSEWHERE
            and isinstance(e.get("verdict"), dict)
            and e["verdict"].get("code") == verdict.get("code")
            and same_place(e, verdict, this)
        ]  # fmt: skip
        if not before:
            return (
                RESUME_ELSEWHERE,
                f"the workload asks to be resumed elsewhere: {words}{quoted}; the next generation resumes "
                "from the checkpoint, kept off this generation's nodes where the cluster has "
                "others",
            )
        return (
            STOPPED_BY_WORKLOAD,
            "the workload asked again to be resumed elsewhere{} after generation {} already "
            "ran it on other nodes ({}; this time on {}): the data, not a GPU; stopping the "
            "chain{}{}".format(
                _where(verdict if verdict.get("iteration") is not None else before[-1]["verdict"])
                or " at checkpoint {}".format(this.get("checkpoint_iteration")),
                before[-1].get("array_job_id"),
                ", ".join(before[-1]["verdict"].get("nodes") or []) or "nodes unknown",
                ", ".join(verdict.get("nodes") or []) or "nodes unknown", quoted, keep,
            ),
        )  # fmt: skip
    return (
        STOPPED_BY_WORKLOAD,
        f"the workload's verdict: {words}{quoted}; no restart on the same GPUs can change it, so the "
        f"chain stops{keep}",
    )


def same_place(before: Dict[str, Any], verdict: Dict[str, Any], this: Dict[str, Any]) -> bool:
    """Did an earlier generation's verdict (its ledger entry) come at the same iteration
    as this one? By the iterations the verdicts name when both do; when either names
    none (the rank that wrote it first printed no training line: Megatron prints them on
    the last rank), by the checkpoint each generation ended at, which is where the next
    one resumes: Megatron saves one before its first 16 and none before a 16 again, so
    two 16s of one iteration leave the tracker at one checkpoint."""
    theirs, ours = before["verdict"].get("iteration"), verdict.get("iteration")
    if theirs is not None and ours is not None:
        return bool(theirs == ours)
    ended, now = before.get("checkpoint_iteration"), this.get("checkpoint_iteration")
    return ended is not None and ended == now


def verdict_iteration(verdict: Dict[str, Any], accounts: List[Dict[str, Any]]) -> Any:
    """The verdict's iteration; when the rank that wrote it named none, the newest that
    a guard of the same generation named with the same code (each node's account)."""
    if verdict.get("iteration") is not None:
        return verdict.get("iteration")
    named = [
        a["iteration"] for a in accounts
        if a.get("code") == verdict.get("code") and isinstance(a.get("iteration"), int)
    ]  # type: List[int]  # fmt: skip
    return max(named) if named else None


def verdict_of(text: str, chain: str, array_job_id: str) -> Optional[Dict[str, Any]]:
    """The guard's verdict file, if it names this generation (chain and array job: a file
    another run left under a reused array job id is never obeyed)."""
    try:
        verdict = json.loads(text)
    except ValueError:
        return None
    if not isinstance(verdict, dict):
        return None
    generation = str(verdict.get("generation", "")).split("/")
    if len(generation) != 3 or generation[:2] != [chain, array_job_id] or not chain:
        return None
    return verdict


def parse_exits(texts: List[str], chain: str, array_job_id: str) -> List[Dict[str, Any]]:
    """Each cycle's failure, oldest cycle first: of the guards' accounts (one per node and
    cycle) the earliest, since a dead worker takes its peers down a moment later."""
    first = {}  # type: Dict[str, Dict[str, Any]]
    for text in texts:
        entry = verdict_of(text, chain, array_job_id)
        if entry is None:
            continue
        cycle = str(entry.get("cycle", ""))
        known = first.get(cycle)
        if known is None or _epoch(entry) < _epoch(known):
            first[cycle] = entry
    return [first[c] for c in sorted(first, key=lambda c: int(c) if c.isdigit() else -1)]


def _epoch(entry: Dict[str, Any]) -> float:
    value = entry.get("epoch")
    return float(value) if isinstance(value, (int, float)) else float("inf")


def scancel_argv(
    action: str, *, job_name: str, user: str, array_job_id: str, chain_ids: Sequence[str] = ()
) -> List[str]:
    """The one scancel the action needs. Always PENDING-only and scoped to the user:
    running peers are stopped by the closed flag, and another user's jobs are never ours.
    The chain is its own array job ids, as submit recorded them (chain_ids), with this
    one: another chain that `submit --force` queued under the same name is not ours.
    By name only where none was recorded (a work dir without submitted.json)."""
    if action in CHAIN_ENDS:
        if chain_ids:
            ids = list(chain_ids) + [array_job_id] * (array_job_id not in chain_ids)
            return ["scancel", "--state=PENDING", f"--user={user}", *ids]
        return ["scancel", "--state=PENDING", f"--name={job_name}", f"--user={user}"]
    return ["scancel", "--state=PENDING", f"--user={user}", array_job_id]


def fence_argvs(*, user: str, array_job_id: str) -> List[List[str]]:
    """What a fence cancels: task 0's job, which sits on a node that stopped answering
    (Slurm counts a cancelled job as ended for the singleton dependency at once, while
    it would otherwise wait for the node to be declared dead), and this generation's
    pending spares. Scoped to the user and this array; never the chain: whether the
    chain goes on is task 0's decision (exit 93), and a dead task 0 made none."""
    return [
        ["scancel", "--user=" + user, array_job_id + "_0"],
        ["scancel", "--state=PENDING", "--user=" + user, array_job_id],
    ]


def others(task_id: int, last_task: int, spared: Sequence[int] = ()) -> str:
    """Slurm's array index expression for tasks 1..last_task but `task_id` and `spared`,
    e.g. "[1,3-7]"; "" when there is none."""
    left = [t for t in range(1, last_task + 1) if t != task_id and t not in spared]
    spans = []  # type: List[List[int]]
    for task in left:
        if spans and spans[-1][1] == task - 1:
            spans[-1][1] = task
        else:
            spans.append([task, task])
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in spans]
    return "[" + ",".join(parts) + "]" if parts else ""


def relay_argv(
    *, user: str, array_job_id: str, task_id: int, last_task: int, spared: Sequence[int] = ()
) -> List[str]:
    """What a relay cancels: every task of this array but task 0, whose own trap must
    run (and decide exit 93's fate), the relaying task, whose script is running this,
    and `spared`: the task that fenced a dead task 0, whose script must live to cancel
    task 0's job (a TERM in the middle of that would leave the successor waiting for
    Slurm to find the node dead). Running tasks get Slurm's TERM at once; pending spares
    are cancelled. One scancel, scoped to the user and this array; [] when no other task
    exists."""
    expression = others(task_id, last_task, spared)
    if not expression:
        return []
    return ["scancel", "--user=" + user, array_job_id + "_" + expression]


def parse_ledger(text: str) -> List[Dict[str, Any]]:
    """Ledger lines; a torn or foreign line is skipped rather than stopping the teardown."""
    return [entry for entry in hostlib.json_lines(text) if "array_job_id" in entry]


def chain_history(entries: List[Dict[str, Any]], chain: str) -> List[Dict[str, Any]]:
    """Only this chain's entries: a work dir reused by a later submit starts a new count.
    One per generation, its last: a fenced task 0 that was alive after all (a partition)
    writes its own entry after the fencer's, and a generation counts once."""
    last = {}  # type: Dict[str, Dict[str, Any]]
    for entry in entries:
        if entry.get("chain") == chain:
            last.pop(str(entry["array_job_id"]), None)
            last[str(entry["array_job_id"])] = entry
    return list(last.values())


def parse_iteration(text: str) -> Optional[int]:
    text = text.strip()
    # isdecimal, not isdigit: "²" is a digit that int() refuses.
    return int(text) if text.isdecimal() and len(text) <= MAX_ITERATION_DIGITS else None


def training_done(marker_text: str, tracked: Optional[int]) -> Optional[int]:
    """The final iteration when the training-done marker names the checkpoint the tracker
    holds; None otherwise (no marker, or one another run left behind)."""
    done = parse_iteration(marker_text)
    return done if done is not None and done == tracked else None


# The options a generation passes; every path the teardown uses is run.json's (paths).
OPTIONS = ("run-json", "array-job-id", "generation", "job-name", "user", "task0-node",
           "start", "checkpoint-start", "job-id", "task-id")  # fmt: skip
# run.json's `paths` key -> the attribute the teardown reads it as.
PATHS = {"ledger": "ledger", "tracker": "tracker", "training_done": "training_done",
         "chain_marker": "marker", "exclusions": "exclusions", "submitted": "submitted",
         "launcher_log": "launcher_log", "drain_poll": "drain_poll", "fence": "fence_claim",
         "relay": "relay_claim", "no_restart": "no_restart", "time_limit": "time_limit",
         "verdict": "verdict", "workload_exits": "exits_dir", "hangs": "hangs",
         "stragglers": "stragglers", "deaths": "deaths"}  # fmt: skip


def generation_paths(paths: Any, array_job_id: str) -> Dict[str, str]:
    """run.json's paths for this generation, by the attribute names of PATHS; "" for one
    it does not carry (nothing is read or written there)."""
    paths = paths if isinstance(paths, dict) else {}
    found = {}  # type: Dict[str, str]
    for key, attribute in PATHS.items():
        value = paths.get(key)
        ok = isinstance(value, str) and bool(array_job_id)
        found[attribute] = value.replace(ARRAY_JOB_ID_FIELD, array_job_id) if ok else ""
    return found


def names_ours(text: str, generation: str) -> bool:
    """Does a control file (the no-restart witness, the time-limit notice) name this
    generation? One that names another or none may be another run's, left under a reused
    array job id: the entrypoint and the spare check ignore it, and so does the teardown."""
    theirs = hostlib.key_values(text).get("generation")
    return theirs is not None and hostlib.same_generation(theirs, generation)
