"""Task 0's drain poller: Slurm's drained nodes, brought to the generation's nodes.

An in-job restart re-forms the rendezvous inside the same allocation, so without this it
would re-form on a node an administrator has drained. Only the host sees Slurm's state
(the nodes' entrypoints may run in a container without a Slurm client), so task 0's
batch script starts this in the background, and it writes one marker per running array
task into the generation's drain directory (Layout.drain). Each node's entrypoint reads
its own task's marker once per rendezvous, through NVRx's node health check
(node/health_check.py): a node of a task with a drained node leaves at the next
rendezvous, not at once, so a running cycle is never disturbed.

Cost independent of size: one sinfo and one squeue per pass for the whole generation,
each bounded by a timeout; the node lists are expanded here, not by one scontrol call
per task. A marker is rewritten only when what it says changes.

Failing safe: a sinfo or squeue that fails or times out skips the whole pass and leaves
every marker as it was. A stale "drained" is corrected by the next pass that Slurm
answers; a false "clean" could let a restart re-form on a drained node.

Identity: each marker names its generation, its task's Slurm job id and the task's
nodes. The reader ignores (fails open on) a marker that names another allocation.

Hung nodes (docs/hangs.md): where the chain samples stacks (--hangs), it also looks at
the generation's hang markers every HANG_LOOK_S (one listdir of a small directory) and,
when a verdict names a node, sets the ExcNodeList of the generation's own pending array
tasks (its cold spares, held back by the throttle) to include it, so that none of them
lands on the node when its task ends: one squeue, and one scontrol update per pending
task, per new verdict. A withdrawn verdict takes nothing back: the generation's last
tasks do without that node, and node memory does not remember it. With --interval 0 the
poller only does this.

Why stdlib only, and Python 3.6 syntax: it runs on the host's python3, as the teardown
does; submit copies this file beside run.json (Layout.drain_poller), with the helper
modules it imports (hostlib.py, which says what 3.6 rules out, node_memory.py and
bad_nodes.py).
"""

import argparse
import os
import signal
import sys
import time
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

if __package__:
    from . import bad_nodes, hostlib, node_memory
else:  # run as a script on the job's host: the copies beside this file
    import bad_nodes  # type: ignore[import-not-found,no-redef]
    import hostlib  # type: ignore[import-not-found,no-redef]
    import node_memory  # type: ignore[import-not-found,no-redef]

# Each Slurm call is bounded: a controller that does not answer must never hold a pass
# (nor read as "nothing drained").
SLURM_TIMEOUT_S = 20
# sinfo's state filter: the DRAIN flag covers draining and drained nodes.
DRAIN_STATES = "drain"
SINFO = ["sinfo", "--noheader", "--Node", "--states=" + DRAIN_STATES, "--format=%N|%E"]
# A marker names a task's nodes and their reasons: a few KiB even for a large task.
MARKER_BYTES = 1 << 20
# Between two looks at the hang markers: a named node's task ends seconds after the
# verdict (it leaves at the next rendezvous), and only then can a pending cold spare take
# its place, so the look must come sooner than that. One listdir; Slurm only on a verdict.
HANG_LOOK_S = 1.0
# A hang marker's name (rank/stacks.py: hung_name).
HUNG_PREFIX = "hung."


class RunningTask(NamedTuple):
    task: str
    job_id: str
    nodes: List[str]


# --- pure ---------------------------------------------------------------------------


def parse_drained(out: str) -> Dict[str, str]:
    """sinfo's `%N|%E` lines -> node -> the administrator's reason. A node in two
    partitions is listed twice; a reason may hold '|' itself."""
    drained = {}  # type: Dict[str, str]
    for line in out.splitlines():
        node, _, reason = line.partition("|")
        if node.strip():
            drained.setdefault(node.strip(), reason.strip())
    return drained


def parse_running(out: str) -> List[RunningTask]:
    """squeue's `%K|%A|%N` lines (task id, the task's own job id, its nodes). A job
    that is not an array says N/A for the task: it is the generation's task 0."""
    running = []
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) != 3 or not fields[1].strip().isdigit():
            continue
        task = fields[0].strip()
        task = "0" if task == "N/A" else task
        if task.isdigit():
            running.append(RunningTask(task, fields[1].strip(), hostlib.expand_nodelist(fields[2])))
    return running


def marker(generation: str, task: RunningTask, drained: Dict[str, str]) -> str:
    """One task's marker: key=value lines, its identity first. `drained` empty means
    the task's nodes are clean; it is never written when Slurm did not answer."""
    hit = [node for node in task.nodes if node in drained]
    reasons = "; ".join("{}: {}".format(node, drained[node] or "no reason given") for node in hit)
    lines = [
        "generation=" + generation,
        "task=" + task.task,
        "job_id=" + task.job_id,
        "nodes=" + " ".join(task.nodes),
        "drained=" + " ".join(hit),
        "reason=" + " ".join(reasons.splitlines()),
    ]
    return "\n".join(lines) + "\n"


def drained_in(text: Optional[str]) -> List[str]:
    """The nodes a marker (or the last-poll record) says are drained."""
    for line in (text or "").splitlines():
        if line.startswith("drained="):
            return line[len("drained=") :].split()
    return []


def generation_drained(running: List[RunningTask], drained: Dict[str, str]) -> List[str]:
    """The generation's own drained nodes, for the last-poll record and the teardown."""
    return sorted({node for task in running for node in task.nodes if node in drained})


def pending_exclusions(pending: List[Tuple[str, str, str]], hung: List[str]) -> Dict[str, str]:
    """Pending task -> the ExcNodeList to give it: its own list (squeue's `%K|%P|%x`
    rows, as bad_nodes.parse_pending reads them) and every hung node it lacks. A task
    that already keeps them all out is left alone."""
    targets = {}  # type: Dict[str, str]
    for task, _partition, current in pending:
        listed = hostlib.expand_nodelist(current)
        missing = [node for node in hung if node not in listed]
        if missing:
            targets[task] = ",".join(listed + missing)
    return targets


# --- shell --------------------------------------------------------------------------


def _log(message: str) -> None:
    hostlib.log("drain poller", message)


def _read(path: str) -> Optional[str]:
    return hostlib.read_text(path, MARKER_BYTES)


def publish(path: str, text: str) -> bool:
    """Write by rename, and only a change: a reader sees all of a marker or none of it,
    and an unchanged marker costs the shared file system nothing. True if written."""
    if _read(path) == text:
        return False
    hostlib.write_atomic(path, text)
    return True


def poll_once(args: argparse.Namespace) -> bool:
    """One pass; False when it was skipped because Slurm did not answer."""
    drained_out, why = hostlib.slurm(SINFO, args.timeout)
    running_out = None
    if drained_out is not None:
        squeue = ["squeue", "--noheader", "--array", "--jobs=" + args.array_job_id,
                  "--states=RUNNING", "--format=%K|%A|%N"]  # fmt: skip
        running_out, why = hostlib.slurm(squeue, args.timeout)
    last_poll = os.path.join(args.dir, "last_poll")
    if drained_out is None or running_out is None:
        _log("pass skipped, every marker kept as it was: " + why)
        # What the last pass that Slurm answered found still stands.
        _record(last_poll, args.generation, "skipped: " + why, drained_in(_read(last_poll)))
        return False
    drained = parse_drained(drained_out)
    running = parse_running(running_out)
    for task in running:
        path = os.path.join(args.dir, "task_" + task.task)
        before = drained_in(_read(path))
        text = marker(args.generation, task, drained)
        if not publish(path, text):
            continue
        now = drained_in(text)
        if now:
            _log(f"task {task.task} ({' '.join(task.nodes)}): Slurm drained {' '.join(now)}; "
                 "it leaves at the next rendezvous")  # fmt: skip
        elif before:
            _log(f"task {task.task}: {' '.join(before)} no longer drained")
    _record(last_poll, args.generation, "ok", generation_drained(running, drained))
    return True


def exclude_hung(args: argparse.Namespace, done: Set[str]) -> Set[str]:
    """Keep the generation's pending tasks off the nodes a standing hang verdict named;
    the nodes done so far. A Slurm call that fails is tried again at the next look."""
    try:
        names = os.listdir(args.hangs)
    except OSError:
        return done  # no hang yet (the directory comes with the first sample)
    fresh = [n for n in names if n.startswith(HUNG_PREFIX) and n[len(HUNG_PREFIX) :] not in done]
    if not fresh:
        return done
    chain = args.generation.split("/", 1)[0]
    standing = node_memory.hung_nodes(args.hangs, chain, args.array_job_id)
    hung = sorted(h["node"] for h in standing if h["node"] not in done)
    if not hung:
        return done
    squeue = ["squeue", "--noheader", "--array", "--jobs=" + args.array_job_id,
              "--states=PENDING", "--format=%K|%P|%x"]  # fmt: skip
    out, why = hostlib.slurm(squeue, args.timeout)
    if out is None:
        _log(f"could not list the pending tasks to keep them off hung {' '.join(hung)}: {why}")
        return done
    for task, excluded in sorted(pending_exclusions(bad_nodes.parse_pending(out), hung).items()):
        job = f"{args.array_job_id}_{task}"
        update = ["scontrol", "update", "JobId=" + job, "ExcNodeList=" + excluded]
        if hostlib.slurm(update, args.timeout)[0] is None:
            # One that started meanwhile can no longer be changed: its node's health check
            # keeps the hung node out of the rendezvous all the same.
            _log(f"pending task {job} could not be kept off {' '.join(hung)}")
        else:
            _log(f"pending task {job} now excludes {excluded}: a hang verdict named "
                 f"{' '.join(hung)}")  # fmt: skip
    return done | set(hung)


def _record(path: str, generation: str, outcome: str, drained: List[str]) -> None:
    """The last pass, for the teardown and a person: rewritten every pass."""
    lines = [
        "generation=" + generation,
        "time=" + hostlib.record_time(),
        "outcome=" + " ".join(outcome.splitlines()),
        "drained=" + " ".join(drained),
    ]
    try:
        publish(path, "\n".join(lines) + "\n")
    except OSError as exc:
        _log(f"could not write the last-poll record {path}: {exc}")


def _prepare(directory: str) -> None:
    """Owner-only: only this job's user may tell a node that it is drained."""
    old = os.umask(0o077)
    try:
        os.makedirs(directory, exist_ok=True)
    finally:
        os.umask(old)
    os.chmod(directory, 0o700)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="nvrx-drain-poller")
    parser.add_argument("--array-job-id", required=True)
    parser.add_argument("--generation", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--interval", type=float, required=True, help="0: no drain passes")
    parser.add_argument("--hangs", default="", help="the generation's hang directory")
    parser.add_argument("--timeout", type=float, default=SLURM_TIMEOUT_S)
    parser.add_argument("--once", action="store_true", help="one pass, then exit (tests)")
    args = parser.parse_args(argv)
    if args.interval <= 0 and not args.hangs:
        return 0  # nothing to do (the batch script does not start it so)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        _prepare(args.dir)
    except OSError as exc:
        _log(f"cannot prepare {args.dir}: {exc}; no drain awareness in this generation")
        return 1
    parent = os.getppid()
    if args.interval > 0:
        _log(f"polling Slurm every {args.interval:g} s for drained nodes of array {args.array_job_id}")  # fmt: skip
    if args.hangs:
        _log("keeping this generation's pending tasks off the nodes a hang verdict names")
    hung_done = set()  # type: Set[str]
    next_pass = time.monotonic()
    while True:
        if args.interval > 0 and time.monotonic() >= next_pass:
            try:
                poll_once(args)
            except Exception as exc:  # any one pass's failure must not end drain awareness
                _log(f"pass failed, markers kept as they were: {exc!r}")
            next_pass = time.monotonic() + args.interval
        if args.hangs:
            try:
                hung_done = exclude_hung(args, hung_done)
            except Exception as exc:  # nor one look's the later looks
                _log(f"the look at the hang verdicts failed: {exc!r}")
        if args.once:
            return 0
        time.sleep(HANG_LOOK_S if args.hangs else args.interval)
        if os.getppid() != parent:  # task 0's batch shell is gone: so is the generation
            return 0


if __name__ == "__main__":
    sys.exit(main())
