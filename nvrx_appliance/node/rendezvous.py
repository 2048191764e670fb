"""Task 0 publishes the generation's rendezvous and keeps its lease; every other node
gates on that record. Also who ends the generation for whom: the closed flag task 0
writes when its ft_launcher decides (or Slurm's TERM comes), the fence a peer writes for
a task 0 whose lease went stale, and the relay claim whose batch script cancels the
array's other tasks. Our own failures use the codes in exitcodes.py, never 93.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from nvrx_appliance import exitcodes, files, lease
from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.checkpoints import checkpoint_dir
from nvrx_appliance.clock import now_iso
from nvrx_appliance.node import (
    control,
    controldir,
    detect,
    gate,
    node_probe,
)
from nvrx_appliance.node.identity import Node
from nvrx_appliance.node.preflight import (
    Preflight,
    Refused,
    say,
)
from nvrx_appliance.observe import run_files

GATE_POLL_S = lease.POLL_S


WAIT_REPORT_S = 60.0


# Polls in a row that may fail to read the control dir before a peer gives up: a minute
# of a flaky shared file system is ridden out; a broken one must not hold the node for
# ever.
MAX_READ_FAILURES = 60


def make_dirs(manifest: run_manifest.Manifest, node: Node) -> Path:
    layout = manifest.layout
    directory = layout.control(node.array_job_id)
    try:
        if node.hosts_rendezvous:
            aside = controldir.set_aside_stale(directory)
            if aside is not None:
                say(f"{directory} held another run's record (a reused job id); moved to {aside}")
        controldir.prepare(directory, os.geteuid())
        for path in (
            layout.cycle_infos(node.array_job_id),
            layout.nvrx_logs(node.array_job_id),
            layout.logs,
            layout.checkpoints,
        ):
            files.make_private_dirs(path)
        problem = checkpoint_dir.problem_at(layout.checkpoints, os.geteuid())
        if problem:
            raise Refused(exitcodes.RECORD_REFUSED, problem)
    except controldir.ControlDirError as exc:
        raise Refused(exitcodes.RECORD_REFUSED, str(exc)) from None
    except OSError as exc:
        raise Refused(exitcodes.LAUNCH_FAILED, f"cannot prepare {directory}: {exc}") from None
    return directory


def fence(node: Node, directory: Path, token: str, reason: str) -> None:
    """Close the generation on behalf of a task 0 whose lease went stale: its node died
    or hangs, and no trap of its own will. Exactly one peer wins the claim; it writes
    the closed flag at once (every other node and every late spare leaves on it), and
    its batch script, on the host where Slurm's commands are, cancels task 0's job and
    the pending spares and writes the ledger entry. Exit 93 stays task 0's decision:
    the chain is never cancelled here."""
    if node.task_id == 0:
        # Another node of task 0's own job: its batch script runs on task 0's node,
        # which is the one that died, so a claim made here would never be acted on.
        return
    holder = controldir.lease_holder(directory, token)
    claim = {
        "generation": token,
        "job_id": node.job_id,
        "task_id": node.task_id,  # the relay spares this task: its script cancels task 0's job
        "by": node.label,
        "reason": reason,
        "time": now_iso(),
        "task0_host": holder.get("host", ""),
        "task0_started": holder.get("started", ""),
        "checkpoint_start": holder.get("checkpoint_start"),
    }
    try:
        if not controldir.claim_fence(directory, claim):
            say(f"{node.label}: another peer has already fenced task 0")
            return
        flag = {"generation": token, "exit_code": None, "time": claim["time"]}
        controldir.close(directory, flag | {"reason": f"fenced by {node.label}: {reason}"})
    except OSError as exc:
        say(f"could not fence the generation in {directory}: {exc}; nvrx-watch "
            "(orphaned_generation) is the backstop")  # fmt: skip
        return
    say(f"{node.label} fenced task 0: closed flag written; this task's batch script "
        "cancels task 0's job and this generation's pending spares")  # fmt: skip


def relay(node: Node, directory: Path, token: str, reason: str) -> None:
    """The generation is over and this node leaves on it: the first peer to do so claims
    the relay, and its batch script (where Slurm's commands are) cancels every other
    task of the array but task 0, whose own teardown must run. So the nodes that poll
    rarely learn of the end from Slurm's TERM, within seconds. Task 0's own nodes never
    claim it: their batch script is task 0's."""
    if node.task_id == 0:
        return
    claim = {"generation": token, "job_id": node.job_id, "by": node.label,
             "reason": reason, "time": now_iso()}  # fmt: skip
    try:
        if controldir.claim_relay(directory, claim):
            say(f"{node.label}: this task's batch script cancels the array's other tasks")
    except OSError as exc:
        say(f"could not claim the relay in {directory}: {exc}; the other nodes leave on "
            "the closed flag instead")  # fmt: skip


def gate_loop(
    manifest: run_manifest.Manifest,
    node: Node,
    fabric: detect.Fabric,
    directory: Path,
    token: str,
) -> control.Record:
    spec = manifest.spec
    peer = gate.Peer(
        node=node, uid=os.geteuid(), own_names=node_probe.own_names(os.environ), fabric=fabric
    )
    limits = gate.Limits(record_wait=spec.rdzv_host_wait, lease_stale_after=spec.lease_stale_after)
    lease_watch = controldir.LeaseWatch(directory, token)
    state, last_reason, reported = gate.Waiting(), None, time.monotonic()
    failures = 0
    while True:
        try:
            seen = controldir.observe(directory, lease_watch, token)
            failures = 0
        except OSError as exc:
            # The closed flag alone may still be readable, and it ends the wait.
            if controldir.closed(directory, token):
                raise Refused(
                    exitcodes.TASK0_GONE,
                    f"{node.label}: generation {node.array_job_id} is closed; leaving",
                ) from None
            failures += 1
            if failures >= MAX_READ_FAILURES:
                raise Refused(
                    exitcodes.RECORD_REFUSED,
                    f"could not read {directory} {failures} times in a row ({exc}); giving up",
                ) from None
            say(f"could not read {directory}: {exc}; retrying")
            time.sleep(GATE_POLL_S)
            continue
        state, decision = gate.step(state, seen, time.monotonic(), peer, limits)
        if isinstance(decision, gate.Join):
            return decision.record
        if isinstance(decision, gate.Leave):
            if decision.fence:
                fence(node, directory, token, decision.message)
            if decision.over:
                relay(node, directory, token, decision.message)
            raise Refused(decision.exit_code, decision.message)
        if decision.reason.split(" (")[0] != last_reason or (
            time.monotonic() - reported >= WAIT_REPORT_S
        ):
            say(f"{node.label}: {decision.reason}")
            last_reason, reported = decision.reason.split(" (")[0], time.monotonic()
        time.sleep(GATE_POLL_S)


def self_fence_watch(manifest: run_manifest.Manifest, keeper: controldir.LeaseKeeper):
    """Task 0's own deadline, from its own clock alone: no file system call, which may
    be what hangs."""
    deadline = lease.self_fence_after(
        manifest.spec.lease_stale_after, manifest.spec.closed_flag_grace
    )
    return lambda: gate.self_fence(keeper.unrefreshed_for(), deadline)


def checkpoint_start(manifest: run_manifest.Manifest) -> int | None:
    try:
        text = files.read_text(manifest.layout.tracker, 64)
    except OSError:
        return None
    return run_files.tracker_value(text) if text is not None else None


def publish(pre: Preflight, record: control.Record, directory: Path) -> controldir.LeaseKeeper:
    spec = pre.manifest.spec
    if pre.manifest.policy.progress_frozen:
        controldir.seed_static_tracker(Path(pre.manifest.policy.progress_file))
    holder = {
        "host": pre.node.hostname,
        "pid": os.getpid(),
        "started": record.started,
        "generation": record.generation,
        # Where this generation started from: a peer that fences task 0 puts it in the
        # ledger, so that the burn guard can tell whether the generation trained.
        "checkpoint_start": checkpoint_start(pre.manifest),
    }
    keeper = controldir.LeaseKeeper(
        directory, lease.refresh_period(spec.lease_stale_after), holder=holder, warn=say
    )
    keeper.start()  # before the record: a peer never joins a record without a lease
    controldir.publish(directory, record)
    say(f"task 0 published rendezvous {record.endpoint} (segment {record.segment})")
    return keeper


def closer(node: Node, directory: Path, token: str):
    """Task 0's answer to Slurm's TERM: the generation ends now, whether or not a trap
    will run (its batch shell may be the one that was killed, and then Slurm kills this
    step within a second), so the closed flag goes out at once and the peers leave
    instead of waiting for the lease to go stale. Task 0's own ft_launcher, told to stop
    by the same TERM, is still let finish (the supervisor's drain)."""

    def close(signum: int) -> None:
        announce_end(
            directory, token, f"task 0 ({node.label}) got {signal.Signals(signum).name} from Slurm"
        )

    return close


def announce_end(directory: Path, token: str, why: str) -> None:
    """Task 0's closed flag before its exit code is known: the peers leave on it now; the
    trap, if it runs, rewrites it with the code (exit 93 and the chain's fate stay the
    trap's decision)."""
    try:
        controldir.close(
            directory, {"generation": token, "exit_code": None, "reason": why, "time": now_iso()}
        )
    except OSError as exc:
        say(f"could not write the closed flag ({why}): {exc}")
