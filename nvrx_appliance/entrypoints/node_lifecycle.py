"""One node's part of a generation: publish or gate, then a supervised ft_launcher.

    task 0 (node 0 of array task 0)      every other node
    -------------------------------      ----------------
    read run.json                        read run.json
    detect ClusterUUID, decide segment   detect ClusterUUID
    write lease, publish record          gate: wait for task 0's record, or leave
    ft_launcher (hosts the store)        ft_launcher (dials the store)
              supervised: signals forwarded, closed flag and lease watched
    stops itself if its lease fails      fences task 0 if its lease goes stale
    exit with ft_launcher's code         exit with ft_launcher's code

Our own failures use the codes in exitcodes.py, never 93.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from nvrx_appliance import exitcodes, files, lease
from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.clock import now_iso
from nvrx_appliance.entrypoints import (
    control,
    controldir,
    detect,
    drain_check,
    env,
    gate,
    launch,
    node_probe,
)
from nvrx_appliance.entrypoints.node import Node, NodeError, array_throttle, from_env
from nvrx_appliance.entrypoints.preflight import (
    Preflight,
    Refused,
    decide,
    generation,
    load,
    preflight,
    say,
    task0_record,
    workload_argv,
)
from nvrx_appliance.entrypoints.supervise import Supervisor
from nvrx_appliance.entrypoints.workloads.checkpoint_dir import parse_tracker

# Every node stats the shared file system this often, waiting or training.
GATE_POLL_S = RUN_POLL_S = lease.POLL_S
WAIT_REPORT_S = 60.0
# Polls in a row that may fail to read the control dir (its clock probe cannot be
# created: quota, a read-only mount) before a peer gives up: a minute of a flaky shared
# file system is ridden out; a broken one must not hold the node for ever.
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
            path.mkdir(parents=True, exist_ok=True)
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
    clock = controldir.Clock(directory, node.hostname)
    state, last_reason, reported = gate.Waiting(), None, time.monotonic()
    failures = 0
    try:
        while True:
            try:
                seen = controldir.observe(directory, clock, token)
                failures = 0
            except OSError as exc:
                # The closed flag first: it needs no clock, and it ends the wait.
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
                raise Refused(decision.exit_code, decision.message)
            if decision.reason.split(" (")[0] != last_reason or (
                time.monotonic() - reported >= WAIT_REPORT_S
            ):
                say(f"{node.label}: {decision.reason}")
                last_reason, reported = decision.reason.split(" (")[0], time.monotonic()
            time.sleep(GATE_POLL_S)
    finally:
        clock.remove()


def watch(
    manifest: run_manifest.Manifest,
    node: Node,
    directory: Path,
    clock,
    token: str,
    watch_lease: bool,
):
    """The supervisor's look at the control directory (file system calls: it runs where
    a hang cannot keep task 0 from fencing itself)."""
    spec = manifest.spec

    def check() -> gate.Leave | None:
        verdict = gate.while_running(
            closed=controldir.closed(directory, token),
            lease_age=controldir.lease_age(directory, clock, token) if watch_lease else None,
            watch_lease=watch_lease,
            stale_after=spec.lease_stale_after,
        )
        if verdict is not None and verdict.fence:
            fence(node, directory, token, verdict.message)
        return verdict

    return check


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
    return parse_tracker(text) if text is not None else None


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
    will run (its batch shell may be the one that was killed), so the closed flag goes
    out at once and the peers leave instead of waiting for the lease to go stale while
    task 0's ft_launcher shuts down. The trap, if it runs, rewrites it with the exit
    code; exit 93 and the chain's fate stay the trap's decision."""

    def close(signum: int) -> None:
        why = f"task 0 ({node.label}) got {signal.Signals(signum).name} from Slurm"
        try:
            controldir.close(
                directory,
                {"generation": token, "exit_code": None, "reason": why, "time": now_iso()},
            )
        except OSError as exc:
            say(f"could not write the closed flag on {signal.Signals(signum).name}: {exc}")

    return close


def supervise(
    pre: Preflight,
    record: control.Record,
    directory: Path,
    keeper: controldir.LeaseKeeper | None,
    health_endpoint: str | None = None,
):
    argv = launch.command(
        pre.manifest,
        record,
        pre.workload,
        hosts_rendezvous=pre.node.hosts_rendezvous,
        launcher=pre.launcher,
        active_tasks=pre.active_tasks,
        health_endpoint=health_endpoint,
    )
    child_env = env.plan(pre.manifest, pre.node, os.environ).apply(os.environ)
    clock = controldir.Clock(directory, pre.node.hostname)
    try:
        return Supervisor(
            argv,
            child_env,
            # Task 0 judges its own lease by its own refreshes, the others by its age.
            check=watch(
                pre.manifest, pre.node, directory, clock, record.generation, keeper is None
            ),
            urgent=self_fence_watch(pre.manifest, keeper) if keeper is not None else None,
            grace=pre.manifest.spec.closed_flag_grace,
            poll=RUN_POLL_S,
            log=say,
            on_stop_signal=closer(pre.node, directory, record.generation) if keeper else None,
        ).run()
    except OSError as exc:
        raise Refused(exitcodes.LAUNCH_FAILED, f"cannot start ft_launcher: {exc}") from None
    finally:
        clock.remove()


def run(manifest_path: Path | None) -> int:
    pre = preflight(manifest_path)
    manifest, node = pre.manifest, pre.node
    drain_check.warm_up(manifest)
    # Decided before anything is created: a refusal leaves nothing behind.
    record = task0_record(manifest, node, pre.fabric) if node.hosts_rendezvous else None
    directory = make_dirs(manifest, node)
    keeper = None
    if record is not None:
        keeper = publish(pre, record, directory)
    else:
        record = gate_loop(manifest, node, pre.fabric, directory, generation(manifest, node))
        say(f"{node.label} joins rendezvous {record.endpoint} (segment {record.segment})")
    try:
        # Drained nodes leave at a rendezvous through NVRx's node health check.
        with drain_check.endpoint(manifest, node, record.generation, say) as health:
            outcome = supervise(pre, record, directory, keeper, health)
    finally:
        if keeper is not None:
            keeper.stop()
    if outcome.exit_code == exitcodes.NVRX_NO_RESTART and outcome.stopped is None:
        try:
            controldir.mark_no_restart(directory, outcome.exit_code, record.generation)
        except OSError as exc:
            say(f"warning: could not write the no-restart flag: {exc}")
    if outcome.stopped is None and outcome.exit_code != exitcodes.OK:
        # ft_launcher writes its own account there, not to our stderr.
        log = launch.nvrx_logfile(manifest, node.array_job_id)
        say(f"ft_launcher exited {outcome.exit_code}; its log: {log}")
    say(f"{node.label}: exiting with {outcome.exit_code}")
    return outcome.exit_code


# --- dry run -------------------------------------------------------------------------------


def plan_dry_run(manifest_path: Path | None) -> dict:
    """Everything run() would do, computed without publishing or starting anything."""
    manifest = load(manifest_path)
    hostname = socket.gethostname()
    try:
        node = from_env(os.environ, hostname)
        assumed = []
    except NodeError:
        node = Node("ARRAY_JOB_ID", 0, 0, "JOB_ID", hostname)
        assumed = ["not under Slurm: shown as task 0 of array job ARRAY_JOB_ID"]
    fabric = node_probe.node_fabric()
    decision = decide(manifest, fabric)
    if node.hosts_rendezvous:
        record = task0_record(manifest, node, fabric)
    else:
        record = control.Record(
            host="TASK0_HOST",
            port=manifest.spec.rdzv_port,
            segment=decision.segment,
            cluster_uuid=None,
            started="",
            array_job_id=node.array_job_id,
            task_id=0,
            job_id="",
            generation=generation(manifest, node),
        )
        assumed.append("not task 0: task 0's host and segment decision are placeholders")
    workload = workload_argv(manifest)
    plan = env.plan(manifest, node, os.environ)
    try:
        head = launch.ft_launcher_argv(
            manifest,
            record,
            hosts_rendezvous=node.hosts_rendezvous,
            launcher=["ft_launcher"],
            active_tasks=array_throttle(os.environ),
            health_endpoint=drain_check.dry_run_endpoint(manifest),
        )
    except (NodeError, launch.ShapeError) as exc:
        raise Refused(exitcodes.LAUNCH_FAILED, str(exc)) from None
    return {
        "node": {
            "array_job_id": node.array_job_id,
            "task_id": node.task_id,
            "node_id": node.node_id,
            "hostname": node.hostname,
            "hosts_rendezvous": node.hosts_rendezvous,
        },
        "assumed": assumed,
        "cluster_uuid": fabric.cluster_uuid,
        "cluster_uuid_reason": fabric.reason,
        "segment": decision.segment,
        "segment_reason": decision.reason,
        "rendezvous": record.endpoint,
        "ft_launcher": head,
        "workload": workload,
        "env": {"set": plan.set, "unset": list(plan.unset)},
    }
