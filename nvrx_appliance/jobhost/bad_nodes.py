"""Which nodes a generation's evidence names bad, and the exclusion list each queued
generation should carry: the pure part of node_memory.py (which reads the files and calls
Slurm), apart so that each file stays short.

Stdlib only, Python 3.6 syntax: it runs on the host's python3 beside the teardown, and
submit copies it there with the rest of nvrx_appliance/jobhost/ (hostlib.py says what
3.6 rules out).
"""

import re
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

if __package__:
    from . import hostlib
else:  # run as a script on the job's host: the copy beside this file
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
DEAD = "dead"  # ... and of one task 0's liveness judge earned (a node that went silent)
_WORKERS_FAILED = re.compile(r"\] Worker group (?:FAILED|UNHEALTHY)\. ")


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
    data, the code), not the node. Nor is a kill a hang's verdict explained (`hang`: NVRx's
    timeout or the guard's stillness ended every rank of the cycle): the verdict named the
    hung node (remembered from its record) or the workload's own stall, or nobody."""
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
        if isinstance(entry.get("hang"), dict):
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


def dead_reason(words: str, exclude_for: int) -> str:
    """A death's words as an exclusion's reason: "node2 stopped answering at 18:33:41
    UTC; no reset, no exit: a silent death ...; kept out of this chain's generations for
    24 h"."""
    hours = exclude_for / 3600
    span = f"{hours:g} h" if exclude_for >= 3600 else f"{exclude_for} s"
    return f"{words}; kept out of this chain's generations for {span}"


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
