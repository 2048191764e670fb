"""One node's part of a generation: publish or gate, then a supervised ft_launcher.

    task 0 (node 0 of array task 0)      every other node
    -------------------------------      ----------------
    read run.json                        read run.json
    detect ClusterUUID, decide segment   detect ClusterUUID
    write lease, publish record          gate: wait for task 0's record, or leave
    ft_launcher (hosts the store)        ft_launcher (dials the store)
              supervised: signals forwarded, closed flag and lease watched
    exit with ft_launcher's code         exit with ft_launcher's code

Our own failures use the codes in exitcodes.py, never 93.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from nvrx_appliance import exitcodes
from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.entrypoints import control, controldir, detect, env, gate, launch, probe
from nvrx_appliance.entrypoints.node import Node, NodeError, array_throttle, from_env
from nvrx_appliance.entrypoints.preflight import (
    Preflight,
    Refused,
    decide,
    load,
    preflight,
    say,
    task0_record,
    workload_argv,
)
from nvrx_appliance.entrypoints.supervise import Supervisor

GATE_POLL_S = 1.0
RUN_POLL_S = 1.0  # while training: every node stats the shared file system this often
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


def gate_loop(
    manifest: run_manifest.Manifest, node: Node, fabric: detect.Fabric, directory: Path
) -> control.Record:
    spec = manifest.spec
    peer = gate.Peer(
        node=node, uid=os.geteuid(), own_names=probe.own_names(os.environ), fabric=fabric
    )
    limits = gate.Limits(record_wait=spec.rdzv_host_wait, lease_stale_after=spec.lease_stale_after)
    clock = controldir.Clock(directory, node.hostname)
    state, last_reason, reported = gate.Waiting(), None, time.monotonic()
    failures = 0
    try:
        while True:
            try:
                seen = controldir.observe(directory, clock)
                failures = 0
            except OSError as exc:
                # The closed flag first: it needs no clock, and it ends the wait.
                if controldir.closed(directory):
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
                raise Refused(decision.exit_code, decision.message)
            if decision.reason.split(" (")[0] != last_reason or (
                time.monotonic() - reported >= WAIT_REPORT_S
            ):
                say(f"{node.label}: {decision.reason}")
                last_reason, reported = decision.reason.split(" (")[0], time.monotonic()
            time.sleep(GATE_POLL_S)
    finally:
        clock.remove()


def watch(manifest: run_manifest.Manifest, node: Node, directory: Path, clock):
    stale_after = manifest.spec.lease_stale_after
    watch_lease = not node.hosts_rendezvous

    def check() -> gate.Leave | None:
        return gate.while_running(
            closed=controldir.closed(directory),
            lease_age=controldir.lease_age(directory, clock) if watch_lease else None,
            watch_lease=watch_lease,
            stale_after=stale_after,
        )

    return check


def publish(pre: Preflight, record: control.Record, directory: Path) -> controldir.LeaseKeeper:
    spec = pre.manifest.spec
    if spec.mode == "no-restart":
        controldir.seed_static_tracker(pre.manifest.layout.static_tracker)
    keeper = controldir.LeaseKeeper(
        directory,
        gate.lease_refresh_interval(spec.lease_stale_after),
        holder={"host": pre.node.hostname, "pid": os.getpid(), "started": record.started},
        warn=say,
    )
    keeper.start()  # before the record: a peer never joins a record without a lease
    controldir.publish(directory, record)
    say(f"task 0 published rendezvous {record.endpoint} (segment {record.segment})")
    return keeper


def supervise(pre: Preflight, record: control.Record, directory: Path):
    argv = launch.command(
        pre.manifest,
        record,
        pre.workload,
        hosts_rendezvous=pre.node.hosts_rendezvous,
        launcher=pre.launcher,
        active_tasks=pre.active_tasks,
    )
    child_env = env.plan(pre.manifest, pre.node, os.environ).apply(os.environ)
    clock = controldir.Clock(directory, pre.node.hostname)
    try:
        return Supervisor(
            argv,
            child_env,
            check=watch(pre.manifest, pre.node, directory, clock),
            grace=pre.manifest.spec.closed_flag_grace,
            poll=RUN_POLL_S,
            log=say,
        ).run()
    except OSError as exc:
        raise Refused(exitcodes.LAUNCH_FAILED, f"cannot start ft_launcher: {exc}") from None
    finally:
        clock.remove()


def run(manifest_path: Path | None) -> int:
    pre = preflight(manifest_path)
    manifest, node = pre.manifest, pre.node
    # Decided before anything is created: a refusal leaves nothing behind.
    record = task0_record(manifest, node, pre.fabric) if node.hosts_rendezvous else None
    directory = make_dirs(manifest, node)
    keeper = None
    if record is not None:
        keeper = publish(pre, record, directory)
    else:
        record = gate_loop(manifest, node, pre.fabric, directory)
        say(f"{node.label} joins rendezvous {record.endpoint} (segment {record.segment})")
    try:
        outcome = supervise(pre, record, directory)
    finally:
        if keeper is not None:
            keeper.stop()
    if outcome.exit_code == exitcodes.NVRX_NO_RESTART and outcome.stopped is None:
        try:
            controldir.mark_no_restart(directory, outcome.exit_code)
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
    fabric = probe.node_fabric()
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
