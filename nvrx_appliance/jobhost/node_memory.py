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
teardown (Layout.node_memory; hostlib.py says what 3.6 rules out). The pure part is
bad_nodes.py; this is the shell.
"""

import json
import os
from typing import Any, Callable, Dict, List, Optional, Set

if __package__:
    from . import bad_nodes, hostlib
else:  # run on the job's host: the copies beside this file
    import bad_nodes  # type: ignore[import-not-found,no-redef]
    import hostlib  # type: ignore[import-not-found,no-redef]

# The exclusion record's entry kinds and version (bad_nodes.py reads them back).
EXCLUDED, APPLIED, VERSION = bad_nodes.EXCLUDED, bad_nodes.APPLIED, bad_nodes.RECORD_VERSION

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
    return bad_nodes.parse_record(_read(record, RECORD_TAIL_BYTES, tail=True))


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


def dead_nodes(deaths: str, chain: str, array_job_id: str) -> List[Dict[str, Any]]:
    """The nodes task 0's liveness judge found dead in this generation (node/dead_node.py's
    `dead.<node>` records): node, words, whether it handed the generation off; and how
    many times task 0 ended each node's own ranks for one (`stopped.<node>.cycle<N>`:
    those failures are nobody's). Nothing from a record of another run."""
    if not deaths:
        return []
    try:
        names = sorted(os.listdir(deaths))[:MAX_HANG_MARKERS]
    except OSError:
        return []
    found = []
    for name in names:
        if not name.startswith("dead."):
            continue
        try:
            record = json.loads(_read(os.path.join(deaths, name), HANG_MARKER_BYTES))
        except ValueError:
            continue
        if not isinstance(record, dict) or not isinstance(record.get("node"), str):
            continue
        if str(record.get("generation", "")).split("/")[:2] != [chain, array_job_id]:
            continue
        found.append({"node": bad_nodes.short_name(record["node"]),
                      "words": str(record.get("words", "")),
                      "hand_off": bool(record.get("hand_off"))})  # fmt: skip
    return found


def stopped_for_deaths(deaths: str) -> Dict[str, int]:
    """Node -> the cycles in which task 0 ended its ranks because another node died."""
    try:
        names = os.listdir(deaths) if deaths else []
    except OSError:
        return {}
    counts = {}  # type: Dict[str, int]
    for name in names:
        if name.startswith("stopped.") and ".cycle" in name:
            node = bad_nodes.short_name(name[len("stopped.") : name.rindex(".cycle")])
            counts[node] = counts.get(node, 0) + 1
    return counts


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
    deaths: str = "",
) -> List[Dict[str, str]]:
    """Judge the generation and append its exclusions to the record; what the ledger
    entry lists (node, reason). exits: the workload guards' account of each cycle's
    failure (the teardown reads them); without them, the NVRx log's count per node.
    hangs: the generation's hang records (a standing verdict: evidence "hung").
    deaths: the nodes task 0's liveness judge found dead (evidence "dead")."""
    exclude_for = int(spec.get("exclude_for", 0))
    if exclude_for <= 0:
        return []
    hung = hung_nodes(hangs, chain, array_job_id)
    dead = dead_nodes(deaths, chain, array_job_id)
    log_text = _read(launcher_log, LAUNCHER_LOG_TAIL_BYTES, tail=True)
    unhealthy, failures = bad_nodes.evidence(log_text.splitlines())
    for node, count in stopped_for_deaths(deaths).items():
        # NVRx logs the worker group task 0 ended for a dead node as failed: not its own.
        if node in failures:
            failures[node] = max(0, failures[node] - count)
    iterations = {}  # type: Dict[str, List[int]]
    if exits:
        # The guards tell each failure's node and iteration: only the node's own count.
        failures, iterations = bad_nodes.node_failures(exits)
        recurring = bad_nodes.workload_iterations(exits)
        if recurring:
            clear(record=record, nodes=[], chain=chain, log=log, recurring=recurring,
                  reason="its failures recurred at the same iteration on other nodes: the "
                  "workload's, not the node's")  # fmt: skip
    if unhealthy or failures or fenced_task0:
        unhealthy, failures, fenced_task0 = bad_nodes.by_node_name(
            unhealthy, failures, fenced_task0, _node_names(log)
        )
    found = bad_nodes.judge(
        unhealthy,
        failures,
        drained=drained,
        fenced_task0=fenced_task0,
        threshold=int(spec.get("exclude_after_failures", 0)),
    )
    since, until = hostlib.record_time(), hostlib.record_time(exclude_for)
    named = {h["node"] for h in hung}
    gone = [d for d in dead if d["node"] not in named]
    named |= {d["node"] for d in gone}
    found = (
        [(h["node"], bad_nodes.hung_reason(h["words"], exclude_for)) for h in hung]
        + [(d["node"], bad_nodes.dead_reason(d["words"], exclude_for)) for d in gone]
        + [(node, why) for node, why in found if node not in named]
    )
    stacks = {h["node"]: h["stacks"] for h in hung}
    died = {d["node"] for d in gone}
    entries = [
        {"kind": EXCLUDED, "version": VERSION, "node": node, "reason": why,
         "since": since, "until": until, "chain": chain, "generation": array_job_id,
         "by": "teardown", "iterations": sorted(set(iterations.get(node, [])))}
        for node, why in found
    ]  # fmt: skip
    for entry in entries:
        if entry["node"] in stacks:
            entry.update(evidence=bad_nodes.HUNG, stacks=stacks[entry["node"]])
        elif entry["node"] in died:
            entry.update(evidence=bad_nodes.DEAD)
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
        {"kind": EXCLUDED, "version": VERSION, "node": bad_nodes.short_name(node),
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
        wanted |= {node for node, _ in bad_nodes.to_clear(entries, now, recurring)}
    held = {str(e["node"]) for e in bad_nodes.active(entries, now)}
    lifted = sorted(wanted & held)
    if not lifted:
        return
    log("{} no longer kept out: {}".format(", ".join(lifted), reason))
    _append(record, [
        {"kind": EXCLUDED, "version": VERSION, "node": node, "reason": "cleared: " + reason,
         "since": now, "until": now, "chain": chain, "by": "teardown"}
        for node in lifted
    ])  # fmt: skip


def _node_names(log: Callable[[str], None]) -> Dict[str, str]:
    """Host name -> Slurm node name, where they differ; {} when Slurm does not answer
    (the host names stand then, as NVRx wrote them)."""
    out, why = hostlib.slurm(
        ["sinfo", "--noheader", "--Node", "--format=%n|%N"], bad_nodes.SLURM_TIMEOUT_S
    )
    if out is None:
        log(f"host names are taken for Slurm's node names ({why})")
        return {}
    return bad_nodes.parse_node_names(out)


def _slurm(argv: List[str]) -> str:
    out, why = hostlib.slurm(argv, bad_nodes.SLURM_TIMEOUT_S)
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
    wanted = [str(e["node"]) for e in bad_nodes.active(entries, hostlib.record_time())]
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
        row for row in bad_nodes.parse_pending(out)
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
        usable[partition] = bad_nodes.parse_usable(listed)
    targets, baselines, kept, capped = bad_nodes.plan(pending, wanted, usable, need, entries)
    for partition, eligible in sorted(capped.items()):
        log(f"the cap: {', '.join(eligible)} stay(s) eligible for the queued generations: the "
            f"partition {partition} has {len(usable[partition])} usable nodes and the array "
            f"needs {need}")  # fmt: skip
    for excluded, jobs in sorted(targets.items()):
        # One update for the jobs that get the same list. Slurm applies it to each job it
        # can and fails the call for any it cannot (one that stopped pending meanwhile).
        _slurm(["scontrol", "update", "JobId=" + ",".join(jobs), "ExcNodeList=" + excluded])
        log(f"queued generation(s) {', '.join(jobs)} now exclude {excluded or 'no node'}")
    applied = {"kind": APPLIED, "version": VERSION, "time": hostlib.record_time(),
               "generation": array_job_id, "jobs": [row[0] for row in pending],
               "nodes": sorted(kept), "need": need, "by": "teardown", "baselines": baselines,
               "capped": sorted({n for nodes in capped.values() for n in nodes})}  # fmt: skip
    try:
        _append(record, [applied])
    except OSError as exc:
        log(f"ERROR: could not append to the exclusion record {record}: {exc}")
