"""Task 0's teardown decision, run from the generation's EXIT trap after the closed flag;
the host half of a fence, run by the batch script of the peer that fenced a dead task 0
(`--fence CLAIM`); and the relay of a generation's end, run by the batch script of the
first peer that left on it (`--relay CLAIM`).

Why Python and why stdlib only: in container mode the batch script runs on the host,
which may not have this package. The burn guard needs the ledger (JSON lines) and a
count over it, which is fragile in bash and easy here; submit copies this file into the
work dir beside run.json (Layout.teardown, owner-only) with the node memory and the
helper module it imports (hostlib.py), and the batch script checks their owner and mode
before it runs it with the host's python3, so the sbatch stays thin and the work dir's
files alone re-queue a generation. Tests import the same functions.
If no python3 can run it, or the file is not to be trusted, the sbatch falls back to
the two scancel lines in bash.

The pure part (decide, burnt, ...) comes first; `main` is the thin shell around it.
It runs on the host's own python3, which can be as old as RHEL 8's 3.6 (hostlib.py says
what that rules out).
"""

import argparse
import json
import os
import re
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

if __package__:
    from . import hostlib, node_memory
else:  # run as a script on the job's host: the copies beside this file
    import hostlib  # type: ignore[import-not-found,no-redef]
    import node_memory  # type: ignore[import-not-found,no-redef]

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

# --- pure ---------------------------------------------------------------------------


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


def others(task_id: int, last_task: int) -> str:
    """Slurm's array index expression for tasks 1..last_task but `task_id`, e.g.
    "[1,3-7]"; "" when there is none."""
    spans = [(1, task_id - 1), (task_id + 1, last_task)]
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in spans if a <= b]
    return "[" + ",".join(parts) + "]" if parts else ""


def relay_argv(*, user: str, array_job_id: str, task_id: int, last_task: int) -> List[str]:
    """What a relay cancels: every task of this array but task 0, whose own trap must
    run (and decide exit 93's fate), and the relaying task, whose script is running
    this. Running tasks get Slurm's TERM at once; pending spares are cancelled. One
    scancel, scoped to the user and this array; [] when no other task exists."""
    expression = others(task_id, last_task)
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


# --- shell --------------------------------------------------------------------------


def _read(path: str, limit: int, tail: bool = False) -> str:
    """hostlib.read_text: bounded, never blocking; "" for a file that is not there to read."""
    return hostlib.read_text(path, limit, tail) or ""


def _log(message: str) -> None:
    hostlib.log("teardown", message)


NOT_RELEASED = "THE CHAIN IS NOT RELEASED; run it by hand or let nvrx-watch reconcile"


def _scancel(argv: List[str], consequence: str = NOT_RELEASED) -> bool:
    out, why = hostlib.slurm(argv, SCANCEL_TIMEOUT_S)
    if out is None and BENIGN_SCANCEL in why:
        # Asked for PENDING tasks of an array that has none left: nothing to release.
        return True
    if out is None:
        _log(f"ERROR: {' '.join(argv)} failed ({why}). " + consequence)
        return False
    return True


def _load_manifest(path: str) -> Dict[str, Any]:
    distrust = hostlib.untrusted(path, os.geteuid())
    if distrust:
        _log(f"ERROR: ignoring {path} ({distrust}): no burn guard for this generation")
        return {}
    try:
        manifest = json.loads(_read(path, SMALL_FILE_BYTES) or "{}")
    except ValueError:
        return {}
    return manifest if isinstance(manifest, dict) else {}


def _history(path: str, chain: str) -> List[Dict[str, Any]]:
    ledger_text = _read(path, LEDGER_TAIL_BYTES, tail=True)
    entries = parse_ledger(ledger_text)
    skipped = sum(1 for line in ledger_text.splitlines() if line.strip()) - len(entries)
    if skipped:
        _log(f"skipped {skipped} unreadable line(s) of the ledger {path}")
    return chain_history(entries, chain)


def _record(path: str, entry: Dict[str, Any]) -> None:
    try:
        hostlib.append_lines(path, [entry], mode=0o644)
    except OSError as exc:
        _log(f"ERROR: could not append to the ledger {path}: {exc}")


def _claim(path: str, uid: int) -> Optional[Dict[str, Any]]:
    """The fence claim the entrypoint created, if it is ours to trust."""
    problem = hostlib.untrusted(path, uid)
    if problem:
        _log(f"ERROR: ignoring the fence claim {path} ({problem})")
        return None
    try:
        claim = json.loads(_read(path, SMALL_FILE_BYTES) or "null")
    except ValueError:
        claim = None
    return claim if isinstance(claim, dict) else None


def drained_nodes(args: argparse.Namespace, this: Dict[str, Any]) -> List[str]:
    """The generation's drained nodes, for its ledger entry (one small bounded read)."""
    try:
        return node_memory.drained_nodes(args.drain_poll, this["chain"], args.array_job_id)
    except Exception as exc:  # never at the cost of the ledger entry
        _log(f"ERROR: reading this generation's drained nodes failed: {exc}")
        return []


def workload_account(
    args: argparse.Namespace, chain: str
) -> Tuple[Optional[Dict[str, Any]], List[Dict[str, Any]], List[str]]:
    """(the workload's verdict, each cycle's failure, the nodes whose workers gave the
    verdict) of this generation, as its guards left them: nothing another user could
    have written, or that names another generation."""
    uid = os.geteuid()
    verdict = None
    if args.verdict and os.path.lexists(args.verdict):
        problem = hostlib.untrusted(args.verdict, uid)
        if problem:
            _log(f"ERROR: ignoring the workload's verdict {args.verdict} ({problem})")
        else:
            verdict = verdict_of(_read(args.verdict, CONTROL_BYTES), chain, args.array_job_id)
    texts = []
    nodes = []  # type: List[str]
    exits = args.exits_dir
    for name in _listdir(exits)[:MAX_EXIT_FILES]:
        path = os.path.join(exits, name)
        if name.startswith("cycle") and name.endswith(".json") and not hostlib.untrusted(path, uid):
            texts.append(_read(path, CONTROL_BYTES))
    for name in _listdir(os.path.join(exits, "verdict_nodes"))[:MAX_EXIT_FILES]:
        if NODE_NAME.match(name):
            nodes.append(name)
    if verdict is not None:
        # The guard of the verdict's first worker that named its iteration wrote this.
        named = os.path.join(exits, "verdict_iteration.json") if exits else ""
        extra = []  # type: List[str]
        if named and os.path.isfile(named) and not hostlib.untrusted(named, uid):
            extra.append(_read(named, CONTROL_BYTES))
        accounts = [
            a for a in (verdict_of(t, chain, args.array_job_id) for t in texts + extra) if a
        ]  # fmt: skip
        verdict = dict(verdict, iteration=verdict_iteration(verdict, accounts), nodes=sorted(nodes))
    return verdict, parse_exits(texts, chain, args.array_job_id), sorted(nodes)


def _listdir(path: str) -> List[str]:
    try:
        return sorted(os.listdir(path)) if path else []
    except OSError:
        return []


def elsewhere(
    args: argparse.Namespace,
    this: Dict[str, Any],
    action: str,
    nodes: List[str],
    history: List[Dict[str, Any]],
) -> None:
    """Keep the next generation off the nodes that ran a resume-elsewhere verdict; and
    when that verdict came back on other nodes (the data, not a GPU), take back what the
    first one kept out: those nodes were never bad."""
    if int(_load_manifest(args.run_json).get("spec", {}).get("exclude_for", 0)) <= 0:
        return
    try:
        if action == RESUME_ELSEWHERE:
            node_memory.keep_elsewhere(
                record=args.exclusions, nodes=nodes, chain=this["chain"],
                array_job_id=args.array_job_id, iteration=this["verdict"].get("iteration"),
                log=_log,
            )  # fmt: skip
        elif action == STOPPED_BY_WORKLOAD:
            cleared = [
                node for e in history if isinstance(e.get("verdict"), dict)
                for node in e["verdict"].get("nodes") or []
            ]  # fmt: skip
            node_memory.clear(
                record=args.exclusions, nodes=sorted(set(cleared)), chain=this["chain"],
                reason="the workload's verdict recurred on other nodes: the data, not a node",
                log=_log,
            )  # fmt: skip
    except Exception as exc:  # never at the cost of the ledger entry
        _log(f"ERROR: recording where the next generation must run failed: {exc}")


def hung_account(args: argparse.Namespace, chain: str) -> List[Dict[str, Any]]:
    """The generation's standing hang verdicts (docs/hangs.md), for the ledger's words;
    never at the cost of the entry."""
    try:
        return node_memory.hung_nodes(args.hangs, chain, args.array_job_id)
    except Exception as exc:
        _log(f"ERROR: reading this generation's hang verdicts failed: {exc}")
        return []


def straggler_account(args: argparse.Namespace, chain: str) -> List[Dict[str, Any]]:
    """The stragglers task 0 named in this generation, and what it did about each
    (node/straggler_leave.py's `named.<node>`), for the ledger; none from a file another
    run left under a reused array job id; never at the cost of the entry."""
    if not args.stragglers:
        return []
    try:
        names = sorted(n for n in os.listdir(args.stragglers) if n.startswith("named."))
    except OSError:
        return []  # no straggler was named
    found = []
    for name in names[:MAX_STRAGGLER_FILES]:
        try:
            named = json.loads(_read(os.path.join(args.stragglers, name), CONTROL_BYTES))
        except ValueError:
            continue
        if not isinstance(named, dict):
            continue
        if str(named.get("generation", "")).split("/")[:2] != [chain, args.array_job_id]:
            continue
        found.append({key: named.get(key) for key in STRAGGLER_FIELDS})
    return found


def remember_nodes(
    args: argparse.Namespace,
    this: Dict[str, Any],
    fenced_task0: str,
    exits: Optional[List[Dict[str, Any]]] = None,
) -> bool:
    """Judge this generation's bad nodes into the exclusion record, after the ledger entry
    is written: what node memory reads (the launcher log, the record) can never cost the
    generation its entry. Whether that worked, so that apply_exclusions may follow."""
    try:
        node_memory.remember(
            record=args.exclusions, launcher_log=args.launcher_log,
            drained=this.get("drained", []), fenced_task0=fenced_task0,
            spec=_load_manifest(args.run_json).get("spec", {}), chain=this["chain"],
            array_job_id=args.array_job_id, log=_log, exits=exits, hangs=args.hangs,
        )  # fmt: skip
    except Exception as exc:
        _log(f"ERROR: judging this generation's nodes failed: {exc}")
        return False
    return True


def apply_exclusions(remembered: bool, args: argparse.Namespace) -> None:
    """The exclusion record onto the chain's queued generations, after the ledger entry
    is written (the singleton dependency holds them until this trap ends)."""
    if not remembered:
        return
    try:
        node_memory.apply(
            record=args.exclusions, submitted=args.submitted,
            manifest=_load_manifest(args.run_json), user=args.user,
            array_job_id=args.array_job_id, log=_log,
        )  # fmt: skip
    except Exception as exc:
        _log(f"ERROR: excluding nodes from the queued generations failed: {exc}")


def fence(args: argparse.Namespace, this: Dict[str, Any]) -> int:
    """The host half of a fence: only the job whose entrypoint won the claim acts, so
    the ledger gets one entry however many peers raced."""
    claim = _claim(args.fence_claim, os.geteuid())
    if claim is None or claim.get("job_id") != args.job_id or not args.job_id:
        return 0
    reason = "fenced by {}: {}".format(claim.get("by", "a peer"), claim.get("reason", ""))
    this.update(
        task0_node=str(claim.get("task0_host", "")),
        start=str(claim.get("task0_started", "")),
        exit_code=None,
        checkpoint_iteration_start=claim.get("checkpoint_start"),
        action=FENCED,
        reason=reason,
    )
    _log(reason + "; cancelling task 0's job and this generation's pending spares")
    ok = bool(args.user) and bool(args.array_job_id)
    if ok:
        results = [_scancel(a) for a in fence_argvs(user=args.user, array_job_id=args.array_job_id)]
        ok = all(results)
    else:
        _log("ERROR: user or array job id unknown: nothing cancelled")
    this["scancel_ok"] = ok
    this["drained"] = drained_nodes(args, this)
    _record(args.ledger, this)
    remembered = remember_nodes(args, this, fenced_task0=this["task0_node"])
    apply_exclusions(remembered, args)
    return 0


def relay(args: argparse.Namespace, spec: Dict[str, Any]) -> int:
    """The generation is over; only the job whose entrypoint won the relay claim acts,
    so the array is cancelled once however many peers left on the end."""
    claim = _claim(args.relay_claim, os.geteuid())
    if claim is None or claim.get("job_id") != args.job_id or not args.job_id:
        return 0
    try:
        last_task = sum(int(spec[k]) for k in ("train_tasks", "hot_spares", "cold_spares")) - 1
        task_id = int(args.task_id)
    except (KeyError, TypeError, ValueError):
        _log("ERROR: the array's shape or this task's index is unknown: nothing relayed")
        return 0
    if not args.user or not args.array_job_id:
        _log("ERROR: user or array job id unknown: nothing relayed")
        return 0
    argv = relay_argv(
        user=args.user, array_job_id=args.array_job_id, task_id=task_id, last_task=last_task
    )
    if argv:
        _log(
            "{}; cancelling the other tasks of array {} ({})".format(
                claim.get("reason", "the generation is over"), args.array_job_id, argv[-1]
            )
        )
        _scancel(argv, "The other tasks leave on the closed flag instead, more slowly")
    return 0


def teardown(args: argparse.Namespace, this: Dict[str, Any], burn_guard: int) -> int:
    history = _history(args.ledger, this["chain"])
    marker = _read(args.training_done, TRACKER_BYTES) if args.training_done else ""
    done = training_done(marker, this["checkpoint_iteration"])
    if marker.strip() and done is None:
        _log(
            f"ignoring the training-done marker {args.training_done}: it names "
            f"{marker.strip()!r}, the tracker {this['checkpoint_iteration']}"
        )
    verdict, exits, verdict_nodes = workload_account(args, this["chain"])
    action, reason = decide(
        args.exit_code, history, this, burn_guard, bool(args.no_restart_witness),
        done=done, time_limit_notice=bool(args.time_limit_notice), verdict=verdict,
        exits=exits,
    )  # fmt: skip
    if verdict is not None:
        this["verdict"] = {
            key: verdict.get(key)
            for key in ("code", "action", "meaning", "iteration", "line", "node", "rank", "cycle")
        }
        this["verdict"]["nodes"] = verdict_nodes
    told = repeated_failure(exits)
    if told:
        this["workload"] = told
    job_name = this["job_name"]
    if not job_name or not args.user:
        action, reason = NONE, "job name or user unknown: refusing to scancel by name"
    _log(reason)

    ok = True
    if action != NONE:
        ok = _scancel(
            scancel_argv(
                action, job_name=job_name, user=args.user, array_job_id=args.array_job_id,
                chain_ids=hostlib.submitted_ids(args.submitted),
            )
        )  # fmt: skip
    hung = hung_account(args, this["chain"])
    handed = [h["words"] for h in hung if h.get("hand_off")]
    if handed and action == RELEASED_SPARES:
        reason = "{}; no hot spare was free, so the generation handed off and the next one starts without it. {}".format(
            "; ".join(handed), reason
        )
    this.update(action=action, reason=reason, scancel_ok=ok)
    if action == COMPLETED:
        this["final_iteration"] = done
    this["drained"] = drained_nodes(args, this)
    if hung:
        this["hung"] = [
            {"node": h["node"], "words": h["words"], "stacks": h["stacks"]} for h in hung
        ]
    stragglers = straggler_account(args, this["chain"])
    if stragglers:
        this["stragglers"] = stragglers
    _record(args.ledger, this)
    remembered = remember_nodes(args, this, fenced_task0="", exits=exits)
    if verdict is not None:
        elsewhere(args, this, action, verdict_nodes, history)
    # A chain that ends (completed, cancelled, burn guard) has no queued generation left.
    if action in (RELEASED_SPARES, SAVED_AT_TIME_LIMIT, RESUME_ELSEWHERE):
        apply_exclusions(remembered, args)
    if action in CHAIN_ENDS and ok and args.marker:
        # The chain ended on purpose: the watcher must not page "chain exhausted".
        try:
            os.unlink(args.marker)
        except FileNotFoundError:
            pass
        except OSError as exc:
            _log(f"could not remove the chain marker {args.marker}: {exc}")
    return 0


# The options a generation passes; every path the teardown uses is run.json's (paths).
OPTIONS = ("run-json", "array-job-id", "generation", "job-name", "user", "task0-node",
           "start", "checkpoint-start", "job-id", "task-id")  # fmt: skip
# run.json's `paths` key -> the attribute the teardown reads it as.
PATHS = {"ledger": "ledger", "tracker": "tracker", "training_done": "training_done",
         "chain_marker": "marker", "exclusions": "exclusions", "submitted": "submitted",
         "launcher_log": "launcher_log", "drain_poll": "drain_poll", "fence": "fence_claim",
         "relay": "relay_claim", "no_restart": "no_restart", "time_limit": "time_limit",
         "verdict": "verdict", "workload_exits": "exits_dir", "hangs": "hangs",
         "stragglers": "stragglers"}  # fmt: skip


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


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="nvrx-teardown")
    for name in OPTIONS:
        parser.add_argument("--" + name, default="")
    parser.add_argument("--exit-code", type=int)
    parser.add_argument("--fence", action="store_true", help="the host half of a fence")
    parser.add_argument("--relay", action="store_true", help="the relay of a generation's end")
    args = parser.parse_args(argv)
    if not (args.fence or args.relay) and args.exit_code is None:
        parser.error("--exit-code is required (or --fence, or --relay)")

    manifest = _load_manifest(args.run_json)
    spec = manifest.get("spec", {})
    vars(args).update(generation_paths(manifest.get("paths"), args.array_job_id))
    if not args.ledger:
        _log(f"ERROR: {args.run_json} names no ledger: this generation is not recorded")
    args.no_restart_witness = names_ours(_read(args.no_restart, CONTROL_BYTES), args.generation)
    args.time_limit_notice = names_ours(_read(args.time_limit, CONTROL_BYTES), args.generation)
    this = {
        "array_job_id": args.array_job_id,
        "job_name": args.job_name or spec.get("job_name", ""),
        "task0_node": args.task0_node,
        "start": args.start,
        "end": hostlib.record_time(),
        "exit_code": args.exit_code,
        "checkpoint_iteration": parse_iteration(_read(args.tracker, TRACKER_BYTES)),
        "checkpoint_iteration_start": parse_iteration(args.checkpoint_start),
        "chain": str(manifest.get("created", "")),
        "mode": spec.get("mode", ""),
    }
    if args.relay:
        return relay(args, spec)
    if args.fence:
        return fence(args, this)
    return teardown(args, this, int(spec.get("burn_guard", 0)))


if __name__ == "__main__":
    sys.exit(main())
