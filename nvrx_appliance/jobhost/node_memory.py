"""Memory across generations: the bad nodes of a generation, kept out of the next ones.

The teardown (task 0's trap, or the peer that fenced a dead task 0) imports this module
and calls two functions. judge() reads what the generation left and returns the nodes to
exclude, with the reason: a node that failed one of NVRx's health checks (its
ft_launcher left a rendezvous as unhealthy), the node of a task 0 that stopped
answering (fenced), and a node whose own ranks failed `exclude_after_failures` times.
A node Slurm drained is not one of them: draining is the administrator's, and Slurm
already keeps a drained node out of every job. remember() appends those to the
exclusion record (Layout.exclusions, JSON lines) for `exclude_for` seconds, and the
teardown puts them in its ledger entry. apply() then sets the ExcNodeList of the
chain's queued generations to what the record holds now: before the teardown ends,
so before the singleton dependency lets the next generation start.

apply() is scoped to this user's jobs of this chain (its name, and the array job ids
submit recorded), and capped: the partition keeps at least the array's size of usable
nodes (array tasks x nodes per task), the oldest exclusions first; a node the cap
leaves eligible is named in the record and the log. It never drains a node: that is the
administrator's. Its Slurm calls, when the record holds anything to apply: one squeue,
one sinfo per partition, one scontrol update per distinct list (one, as a rule).

nvrx-watch (--act) appends to the same record; the next teardown applies it.

Why stdlib only and Python 3.6 syntax: it runs on the host's python3, beside the
teardown (Layout.node_memory; hostlib.py says what 3.6 rules out). The pure part comes
first; the shell is thin.
"""

import json
import os
import re
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

if __package__:
    from . import hostlib
else:  # run on the job's host: the copy beside this file
    import hostlib  # type: ignore[import-not-found,no-redef]

RECORD_VERSION = 1
EXCLUDED, APPLIED = "excluded", "applied"
# Each Slurm call is bounded: the teardown must end within Slurm's KillWait.
SLURM_TIMEOUT_S = 10
# Usable for a job, as sinfo's %t prints a node's state (a suffix such as '*', not
# responding, makes it unusable: it is stripped only from these).
USABLE_STATES = {"idle", "mix", "alloc", "comp", "plnd", "npc"}

# NVRx's log lines: "<date> <time> [LEVEL] [host] ... message".
_LINE = re.compile(r"^\S+ \S+ \[[A-Z]+\] \[(?P<host>[^\]]+)\] (?P<rest>.*)$")
_UNHEALTHY = "Agent .run() raised UnhealthyNodeException: "
# What NVRx logs when the entrypoint's drain check (node/health_check.py) failed a
# node: that node left because Slurm drained it, which is not ours to remember.
_DRAIN_CHECK = "slurm drain: "  # in "Node health check failed: ... failed_checks=[...]"
LEFT_DRAINED = "drained by Slurm"
# ... and when it failed a node a hang verdict named (rank/stacks.py): the hang record is
# the evidence (remember() reads it), not NVRx's line.
_HANG_CHECK = "hung: "
LEFT_HUNG = "named by a hang verdict"
HUNG = "hung"  # the evidence kind of an exclusion a hang verdict earned
_WORKERS_FAILED = re.compile(r"\] Worker group (?:FAILED|UNHEALTHY)\. ")

# --- pure ---------------------------------------------------------------------------


def short_name(host: str) -> str:
    """NVRx tags a line with the host name; Slurm's node names are short."""
    return host.split(".", 1)[0]


def evidence(lines: Iterable[str]) -> Tuple[Dict[str, str], Dict[str, int]]:
    """From a generation's NVRx log: (node -> why it left a rendezvous as unhealthy,
    LEFT_DRAINED when the drain check sent it, node -> how many times its own worker
    group failed)."""
    unhealthy = {}  # type: Dict[str, str]
    failures = {}  # type: Dict[str, int]
    for line in lines:
        if (
            _UNHEALTHY not in line
            and "] Worker group " not in line
            and _DRAIN_CHECK not in line
            and _HANG_CHECK not in line
        ):
            continue  # the cheap test first: a long generation's log is large
        match = _LINE.match(line)
        if not match:
            continue
        node, rest = short_name(match.group("host")), match.group("rest")
        if _DRAIN_CHECK in rest and "failed_checks=" in rest:  # before the exception
            unhealthy.setdefault(node, LEFT_DRAINED)
        elif _HANG_CHECK in rest and "failed_checks=" in rest:
            unhealthy.setdefault(node, LEFT_HUNG)
        elif _UNHEALTHY in rest:
            unhealthy.setdefault(node, rest.split(_UNHEALTHY, 1)[1].strip())
        elif _WORKERS_FAILED.search(rest):
            failures[node] = failures.get(node, 0) + 1
    return unhealthy, failures


def judge(
    unhealthy: Dict[str, str],
    failures: Dict[str, int],
    *,
    drained: Iterable[str],
    fenced_task0: str,
    threshold: int,
) -> List[Tuple[str, str]]:
    """(node, reason) to exclude, in a stable order; never a drained node."""
    left = set(drained)
    found = {}  # type: Dict[str, str]
    for node, why in sorted(unhealthy.items()):
        if why == LEFT_DRAINED:
            left.add(node)  # drained then, perhaps resumed since: the administrator's
        elif why == LEFT_HUNG:
            continue  # remembered from its hang record, with the stacks (hung_entries)
        else:
            found.setdefault(node, "failed NVRx's health check: " + why)
    if fenced_task0:
        found.setdefault(
            short_name(fenced_task0), "hosted task 0, which stopped answering (fenced)"
        )
    for node, count in sorted(failures.items()):
        if threshold > 0 and count >= threshold:
            found.setdefault(node, f"its ranks failed {count} times in one generation")
    return [(node, why) for node, why in sorted(found.items()) if node not in left]


def node_failures(exits: List[Dict[str, Any]]) -> Tuple[Dict[str, int], Dict[str, List[int]]]:
    """From the workload guards' accounts (each cycle's failure, with its node and the
    iteration it reached): (node -> failures that are the node's to answer for, node ->
    the iterations they happened at). A failure is the workload's, never a node's, when
    the workload said so (a verdict of its exit table, a checkpoint it could not load), or
    when the same iteration failed on two nodes or more: it followed the iteration (the
    data, the code), not the node."""
    at = {}  # type: Dict[int, Set[str]]
    for entry in exits:
        iteration = entry.get("iteration")
        if isinstance(iteration, int):
            at.setdefault(iteration, set()).add(str(entry.get("node", "")))
    failures = {}  # type: Dict[str, int]
    iterations = {}  # type: Dict[str, List[int]]
    for entry in exits:
        node = short_name(str(entry.get("node", "")))
        iteration = entry.get("iteration")
        if not node or entry.get("action") != "restart" or entry.get("load_failed"):
            continue
        if isinstance(iteration, int) and len(at.get(iteration, ())) >= 2:
            continue
        failures[node] = failures.get(node, 0) + 1
        if isinstance(iteration, int):
            iterations.setdefault(node, []).append(iteration)
    return failures, iterations


def workload_iterations(exits: List[Dict[str, Any]]) -> Dict[int, Set[str]]:
    """Iterations that failed on two nodes or more in this generation -> those nodes."""
    at = {}  # type: Dict[int, Set[str]]
    for entry in exits:
        iteration = entry.get("iteration")
        if isinstance(iteration, int):
            at.setdefault(iteration, set()).add(short_name(str(entry.get("node", ""))))
    return {i: nodes for i, nodes in at.items() if len(nodes) >= 2}


def to_clear(
    entries: List[Dict[str, Any]], now: str, recurring: Dict[int, Set[str]]
) -> List[Tuple[str, int]]:
    """(node, iteration) of the exclusions in force for rank failures at an iteration
    that has since failed on other nodes: the workload's failure, the node was blamed for
    it. Pure."""
    found = []
    for entry in active(entries, now):
        for iteration in entry.get("iterations") or []:
            others = recurring.get(iteration, set()) - {entry["node"]}
            if others:
                found.append((str(entry["node"]), iteration))
                break
    return found


def hung_reason(words: str, exclude_for: int) -> str:
    """A hang verdict's words as an exclusion's reason: "hung in cycle 2: its 2 ranks
    stopped in `train_step` while the 4 others waited in `all_reduce`; kept out of the next
    rendezvous and of this chain's generations for 24 h"."""
    hours = exclude_for / 3600
    span = f"{hours:g} h" if hours >= 1 else f"{exclude_for} s"
    _, _, told = words.partition(" hung in ")
    said = "hung in " + told if told else words
    return f"{said}; kept out of the next rendezvous and of this chain's generations for {span}"


def parse_record(text: str) -> List[Dict[str, Any]]:
    """The record's lines; a torn or foreign line is skipped."""
    return [e for e in hostlib.json_lines(text) if e.get("kind") in (EXCLUDED, APPLIED)]


def active(entries: List[Dict[str, Any]], now: str) -> List[Dict[str, Any]]:
    """The exclusions in force at `now` (ISO 8601 UTC, comparable as text), the latest
    line per node, oldest first."""
    latest = {}  # type: Dict[str, Dict[str, Any]]
    for entry in entries:
        if entry.get("kind") == EXCLUDED and isinstance(entry.get("node"), str):
            latest.pop(entry["node"], None)
            latest[entry["node"]] = entry
    return [e for e in latest.values() if str(e.get("until", "")) > now]


def last_applied(entries: List[Dict[str, Any]], job: str) -> Tuple[Set[str], Optional[str]]:
    """(the nodes the record last put in this job's ExcNodeList, the job's own list as
    it was before the record first touched it); (empty, None) if it never did."""
    for entry in reversed(entries):
        if entry.get("kind") == APPLIED and job in entry.get("jobs", []):
            baselines = entry.get("baselines") or {}
            return set(entry.get("nodes", [])), str(baselines.get(job, ""))
    return set(), None


def cap(candidates: List[str], usable: Set[str], need: int) -> Tuple[List[str], List[str]]:
    """(kept, capped): the exclusions that leave at least `need` usable nodes, in the
    order given. A node that is not usable now costs nothing to exclude."""
    room = len(usable) - need
    kept, capped = [], []
    for node in candidates:
        if node not in usable:
            kept.append(node)
        elif room > 0:
            kept.append(node)
            room -= 1
        else:
            capped.append(node)
    return kept, capped


def plan(
    pending: List[Tuple[str, str, str]],
    wanted: List[str],
    usable: Dict[str, Set[str]],
    need: int,
    entries: List[Dict[str, Any]],
) -> Tuple[Dict[str, List[str]], Dict[str, str], Set[str], Dict[str, List[str]]]:
    """What to ask of Slurm for the queued generations (job, partition, its ExcNodeList
    as squeue prints it): (ExcNodeList -> the jobs to set it on, job -> its own list,
    the nodes kept out, partition -> the nodes the cap leaves eligible).

    A job's own exclusions (sbatch --exclude) are what its list held before the record
    first touched it; they stay, and ours that expired are taken back. Where the record
    holds no `applied` line for a job (its append failed, or one of several updates did),
    its own list is its current one without any node the record ever excluded: ours are
    then taken back when they expire, and stay within the cap meanwhile. A job already
    as it should be is left alone."""
    ever_ours = {str(e.get("node")) for e in entries if e.get("kind") == EXCLUDED}
    targets = {}  # type: Dict[str, List[str]]
    baselines = {}  # type: Dict[str, str]
    kept_all = set()  # type: Set[str]
    capped_by = {}  # type: Dict[str, List[str]]
    for job, partition, current in pending:
        kept, capped = cap(wanted, usable.get(partition, set()), need)
        kept_all |= set(kept)
        if capped:
            capped_by[partition] = capped
        ours, baseline = last_applied(entries, job)
        if baseline is None:
            listed = hostlib.expand_nodelist(current)
            mine = [node for node in listed if node not in ever_ours]
            baseline = current if len(mine) == len(listed) else ",".join(mine)
        baselines[job] = baseline
        if set(kept) == ours:
            continue  # as it should be (a job never touched, with nothing to keep out)
        target = ",".join([baselines[job]] * bool(baselines[job]) + sorted(kept))
        targets.setdefault(target, []).append(job)
    return targets, baselines, kept_all, capped_by


def parse_pending(out: str) -> List[Tuple[str, str, str]]:
    """squeue's `%F|%P|%x` lines: (array job id, partition(s), excluded nodes as Slurm
    compresses them; "" for none). The drain poller reads `%K|%P|%x` (a pending array
    task's id first) the same way."""
    rows = []
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) == 3 and fields[0].strip().isdigit():
            excluded = fields[2].strip()
            rows.append(
                (fields[0].strip(), fields[1].strip(), "" if excluded == "(null)" else excluded)
            )
    return rows


def parse_node_names(out: str) -> Dict[str, str]:
    """sinfo's `%n|%N` lines (a node's host name, its Slurm node name) -> host name (and
    its short form) -> node name, for the hosts whose node name differs."""
    names = {}  # type: Dict[str, str]
    for line in out.splitlines():
        host, _, node = (part.strip() for part in line.partition("|"))
        if host and node and host != node:
            names.setdefault(host, node)
            names.setdefault(short_name(host), node)
    return names


def by_node_name(
    unhealthy: Dict[str, str], failures: Dict[str, int], fenced_task0: str, names: Dict[str, str]
) -> Tuple[Dict[str, str], Dict[str, int], str]:
    """The evidence keyed by Slurm's node names: NVRx tags a line with the host name,
    and a node's NodeName may differ from its NodeHostname."""
    unhealthy_nodes = {}  # type: Dict[str, str]
    for host, why in unhealthy.items():
        unhealthy_nodes.setdefault(names.get(host, host), why)
    failed_nodes = {}  # type: Dict[str, int]
    for host, count in failures.items():
        node = names.get(host, host)
        failed_nodes[node] = failed_nodes.get(node, 0) + count
    fenced = short_name(fenced_task0)
    return unhealthy_nodes, failed_nodes, names.get(fenced, fenced) if fenced else ""


def parse_usable(out: str) -> Set[str]:
    """sinfo's `%N|%t` lines -> the nodes a job could be placed on."""
    usable = set()
    for line in out.splitlines():
        node, _, state = line.partition("|")
        if node.strip() and state.strip() in USABLE_STATES:
            usable.add(node.strip())
    return usable


# --- shell --------------------------------------------------------------------------


# Bounds on every read: the teardown runs this inside Slurm's KillWait. The record and
# submitted.json are small; of a generation's launcher log the newest part is read (the
# unhealthy-node lines are few; a log of a gigabyte would cost seconds).
SMALL_FILE_BYTES = 4 << 20
RECORD_TAIL_BYTES = 4 << 20
LAUNCHER_LOG_TAIL_BYTES = 32 << 20


def _read(path: str, limit: int = SMALL_FILE_BYTES, tail: bool = False) -> str:
    return hostlib.read_text(path, limit, tail) or ""


def _record_entries(record: str) -> List[Dict[str, Any]]:
    """The exclusion record's newest part: clear() and apply() judge the same entries
    (on a long chain its head is long stale)."""
    return parse_record(_read(record, RECORD_TAIL_BYTES, tail=True))


def _append(path: str, entries: List[Dict[str, Any]]) -> None:
    """One write with O_APPEND: a concurrent writer (nvrx-watch) never splits a line."""
    hostlib.append_lines(path, entries, mode=0o600)


HANG_MARKER_BYTES = 64 << 10
MAX_HANG_MARKERS = 1000


def hung_nodes(hangs: str, chain: str, array_job_id: str) -> List[Dict[str, Any]]:
    """The nodes this generation's hang verdicts named and still stand (rank/stacks.py's
    `hung.<node>` markers, less the `withdrawn.<node>` ones): node, words, the record's
    path, whether it handed the generation off. Nothing from a marker of another run
    under a reused array job id."""
    if not hangs:
        return []
    try:
        names = sorted(os.listdir(hangs))[:MAX_HANG_MARKERS]
    except OSError:
        return []
    found = []
    for name in names:
        node = name[len("hung.") :] if name.startswith("hung.") else ""
        if not node or "withdrawn." + node in names:
            continue
        try:
            marker = json.loads(_read(os.path.join(hangs, name), HANG_MARKER_BYTES))
        except ValueError:
            continue
        if not isinstance(marker, dict):
            continue
        if str(marker.get("generation", "")).split("/")[:2] != [chain, array_job_id]:
            continue
        found.append({"node": node, "words": str(marker.get("words", "")),
                      "stacks": os.path.join(hangs, str(marker.get("record", ""))),
                      "hand_off": bool(marker.get("hand_off"))})  # fmt: skip
    return found


def drained_nodes(drain_poll: str, chain: str, array_job_id: str) -> List[str]:
    """The generation's drained nodes, as its drain poller last found them; none from a
    record another run left under a reused array job id."""
    fields = hostlib.key_values(_read(drain_poll))
    if fields.get("generation", "").split("/")[:2] != [chain, array_job_id]:
        return []
    return fields.get("drained", "").split()


def remember(
    *,
    record: str,
    launcher_log: str,
    drained: List[str],
    fenced_task0: str,
    spec: Dict[str, Any],
    chain: str,
    array_job_id: str,
    log: Callable[[str], None],
    exits: Optional[List[Dict[str, Any]]] = None,
    hangs: str = "",
) -> List[Dict[str, str]]:
    """Judge the generation and append its exclusions to the record; what the ledger
    entry lists (node, reason). exits: the workload guards' account of each cycle's
    failure (the teardown reads them); without them, the NVRx log's count per node.
    hangs: the generation's hang records (a standing verdict: evidence "hung")."""
    exclude_for = int(spec.get("exclude_for", 0))
    if exclude_for <= 0:
        return []
    hung = hung_nodes(hangs, chain, array_job_id)
    log_text = _read(launcher_log, LAUNCHER_LOG_TAIL_BYTES, tail=True)
    unhealthy, failures = evidence(log_text.splitlines())
    iterations = {}  # type: Dict[str, List[int]]
    if exits:
        # The guards tell each failure's node and iteration: only the node's own count.
        failures, iterations = node_failures(exits)
        recurring = workload_iterations(exits)
        if recurring:
            clear(record=record, nodes=[], chain=chain, log=log, recurring=recurring,
                  reason="its failures recurred at the same iteration on other nodes: the "
                  "workload's, not the node's")  # fmt: skip
    if unhealthy or failures or fenced_task0:
        unhealthy, failures, fenced_task0 = by_node_name(
            unhealthy, failures, fenced_task0, _node_names(log)
        )
    found = judge(
        unhealthy,
        failures,
        drained=drained,
        fenced_task0=fenced_task0,
        threshold=int(spec.get("exclude_after_failures", 0)),
    )
    since, until = hostlib.record_time(), hostlib.record_time(exclude_for)
    named = {h["node"] for h in hung}
    found = [(h["node"], hung_reason(h["words"], exclude_for)) for h in hung] + [
        (node, why) for node, why in found if node not in named
    ]
    stacks = {h["node"]: h["stacks"] for h in hung}
    entries = [
        {"kind": EXCLUDED, "version": RECORD_VERSION, "node": node, "reason": why,
         "since": since, "until": until, "chain": chain, "generation": array_job_id,
         "by": "teardown", "iterations": sorted(set(iterations.get(node, [])))}
        for node, why in found
    ]  # fmt: skip
    for entry in entries:
        if entry["node"] in stacks:
            entry.update(evidence=HUNG, stacks=stacks[entry["node"]])
    for node, why in found:
        log(f"{node} is kept out of this chain's queued generations until {until}: {why}")  # fmt: skip
    try:
        _append(record, entries)
    except OSError as exc:
        log(f"ERROR: could not append to the exclusion record {record}: {exc}")
    return [{"node": node, "reason": why} for node, why in found]


# A resume-elsewhere verdict keeps the next generation off its nodes only that long:
# they are not bad, the workload asked for other GPUs once.
ELSEWHERE_FOR_S = 3600


def keep_elsewhere(
    *,
    record: str,
    nodes: List[str],
    chain: str,
    array_job_id: str,
    iteration: Any,
    log: Callable[[str], None],
) -> None:
    """The nodes that ran a resume-elsewhere verdict, out of the next generation (apply()
    keeps the partition room for the array, so the chain still starts where it must)."""
    since, until = hostlib.record_time(), hostlib.record_time(ELSEWHERE_FOR_S)
    reason = f"ran iteration {iteration} when the workload asked to resume elsewhere"
    entries = [
        {"kind": EXCLUDED, "version": RECORD_VERSION, "node": short_name(node),
         "reason": reason, "since": since, "until": until, "chain": chain,
         "generation": array_job_id, "by": "verdict"}
        for node in nodes
    ]  # fmt: skip
    if nodes:
        log(
            "{} kept out of the next generation until {}: {}".format(
                ", ".join(nodes), until, reason
            )
        )
    _append(record, entries)


def clear(
    *,
    record: str,
    nodes: List[str],
    chain: str,
    reason: str,
    log: Callable[[str], None],
    recurring: Optional[Dict[int, Set[str]]] = None,
) -> None:
    """Take back exclusions the workload, not the node, earned: `nodes` whatever kept
    them out, and (recurring) those kept out for failures at an iteration that has since
    failed on other nodes. Appended as an exclusion that ends now."""
    entries = _record_entries(record)
    now = hostlib.record_time()
    wanted = {n for n in nodes}
    if recurring:
        wanted |= {node for node, _ in to_clear(entries, now, recurring)}
    held = {str(e["node"]) for e in active(entries, now)}
    lifted = sorted(wanted & held)
    if not lifted:
        return
    log("{} no longer kept out: {}".format(", ".join(lifted), reason))
    _append(record, [
        {"kind": EXCLUDED, "version": RECORD_VERSION, "node": node, "reason": "cleared: " + reason,
         "since": now, "until": now, "chain": chain, "by": "teardown"}
        for node in lifted
    ])  # fmt: skip


def _node_names(log: Callable[[str], None]) -> Dict[str, str]:
    """Host name -> Slurm node name, where they differ; {} when Slurm does not answer
    (the host names stand then, as NVRx wrote them)."""
    out, why = hostlib.slurm(["sinfo", "--noheader", "--Node", "--format=%n|%N"], SLURM_TIMEOUT_S)
    if out is None:
        log(f"host names are taken for Slurm's node names ({why})")
        return {}
    return parse_node_names(out)


def _slurm(argv: List[str]) -> str:
    out, why = hostlib.slurm(argv, SLURM_TIMEOUT_S)
    if out is None:
        raise RuntimeError(why)
    return out


def apply(
    *,
    record: str,
    submitted: str,
    manifest: Dict[str, Any],
    user: str,
    array_job_id: str,
    log: Callable[[str], None],
) -> None:
    """Set the ExcNodeList of this chain's queued generations to what the record holds
    now (within the cap). Any Slurm failure leaves them as they were, and says so."""
    spec, shape = manifest.get("spec", {}), manifest.get("shape", {})
    name = spec.get("job_name", "")
    if int(spec.get("exclude_for", 0)) <= 0 or not name or not user:
        return
    entries = _record_entries(record)
    wanted = [str(e["node"]) for e in active(entries, hostlib.record_time())]
    ours_before = set()  # type: Set[str]
    for entry in entries:
        if entry.get("kind") == APPLIED:
            ours_before |= set(entry.get("nodes", []))
    if not wanted and not ours_before:
        return  # nothing to add and nothing of ours to take back: no Slurm call
    try:
        _apply(entries, wanted, spec, shape, user, name, submitted, record, array_job_id, log)
    except RuntimeError as exc:
        log(f"ERROR: the queued generations' excluded nodes may be unchanged ({exc}); the "
            "record keeps them, and the next generation's teardown applies it again")  # fmt: skip


def _apply(entries, wanted, spec, shape, user, name, submitted, record, array_job_id, log):
    # type: (List[Dict[str, Any]], List[str], Dict[str, Any], Dict[str, Any], str, str, str, str, str, Callable[[str], None]) -> None
    out = _slurm(["squeue", "--noheader", "--user=" + user, "--name=" + name,
                  "--states=PENDING", "--format=%F|%P|%x"])  # fmt: skip
    chain_ids = set(hostlib.submitted_ids(submitted))
    pending = [
        row for row in parse_pending(out)
        if row[0] != array_job_id and (not chain_ids or row[0] in chain_ids)
    ]  # fmt: skip
    if not pending:
        if wanted:
            log(f"no later generation of this chain is queued (none is left, or Slurm ended "
                f"this job itself and the next one started already): {', '.join(wanted)} "
                "stay(s) in the record for the generations queued after")  # fmt: skip
        return
    need = int(shape.get("array_size", 1)) * int(spec.get("nodes_per_task", 1))
    usable = {}  # type: Dict[str, Set[str]]
    for partition in sorted({row[1] for row in pending}):
        listed = _slurm(["sinfo", "--noheader", "--Node", "--partition=" + partition,
                         "--format=%N|%t"])  # fmt: skip
        usable[partition] = parse_usable(listed)
    targets, baselines, kept, capped = plan(pending, wanted, usable, need, entries)
    for partition, eligible in sorted(capped.items()):
        log(f"the cap: {', '.join(eligible)} stay(s) eligible for the queued generations: the "
            f"partition {partition} has {len(usable[partition])} usable nodes and the array "
            f"needs {need}")  # fmt: skip
    for excluded, jobs in sorted(targets.items()):
        # One update for the jobs that get the same list. Slurm applies it to each job it
        # can and fails the call for any it cannot (one that stopped pending meanwhile).
        _slurm(["scontrol", "update", "JobId=" + ",".join(jobs), "ExcNodeList=" + excluded])
        log(f"queued generation(s) {', '.join(jobs)} now exclude {excluded or 'no node'}")
    applied = {"kind": APPLIED, "version": RECORD_VERSION, "time": hostlib.record_time(),
               "generation": array_job_id, "jobs": [row[0] for row in pending],
               "nodes": sorted(kept), "need": need, "by": "teardown", "baselines": baselines,
               "capped": sorted({n for nodes in capped.values() for n in nodes})}  # fmt: skip
    try:
        _append(record, [applied])
    except OSError as exc:
        log(f"ERROR: could not append to the exclusion record {record}: {exc}")
