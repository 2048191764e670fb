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

Why stdlib only, and Python 3.6 syntax: it runs on the host's python3, as the teardown
does; submit copies this file beside run.json (Layout.drain_poller), with the helper
module it imports (hostlib.py, which says what 3.6 rules out).
"""

import argparse
import os
import signal
import sys
import time
from typing import Dict, List, NamedTuple, Optional

if __package__:
    from . import hostlib
else:  # run as a script on the job's host: the copy beside this file
    import hostlib  # type: ignore[import-not-found,no-redef]

# Each Slurm call is bounded: a controller that does not answer must never hold a pass
# (nor read as "nothing drained").
SLURM_TIMEOUT_S = 20
# sinfo's state filter: the DRAIN flag covers draining and drained nodes.
DRAIN_STATES = "drain"
SINFO = ["sinfo", "--noheader", "--Node", "--states=" + DRAIN_STATES, "--format=%N|%E"]
# A marker names a task's nodes and their reasons: a few KiB even for a large task.
MARKER_BYTES = 1 << 20


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
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--timeout", type=float, default=SLURM_TIMEOUT_S)
    parser.add_argument("--once", action="store_true", help="one pass, then exit (tests)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        _prepare(args.dir)
    except OSError as exc:
        _log(f"cannot prepare {args.dir}: {exc}; no drain awareness in this generation")
        return 1
    parent = os.getppid()
    _log(f"polling Slurm every {args.interval:g} s for drained nodes of array {args.array_job_id}")  # fmt: skip
    while True:
        try:
            poll_once(args)
        except Exception as exc:  # any one pass's failure must not end drain awareness
            _log(f"pass failed, markers kept as they were: {exc!r}")
        if args.once:
            return 0
        time.sleep(args.interval)
        if os.getppid() != parent:  # task 0's batch shell is gone: so is the generation
            return 0


if __name__ == "__main__":
    sys.exit(main())
