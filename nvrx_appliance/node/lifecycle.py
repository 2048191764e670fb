"""One node's part of a generation: publish or gate, then a supervised ft_launcher.

    task 0 (node 0 of array task 0)      every other node
    -------------------------------      ----------------
    read run.json                        read run.json
    detect ClusterUUID, decide segment   detect ClusterUUID
    write lease, publish record          gate: wait for task 0's record, or leave
    ft_launcher (hosts the store)        ft_launcher (dials the store)
              supervised: signals forwarded, closed flag and lease watched
    stops itself if its lease fails      fences task 0 if its lease goes stale
    time-limit notice, or its own exit duration: the save signal to ft_launcher
    marks Megatron's training done
    exit with ft_launcher's code         exit with ft_launcher's code

While ft_launcher runs, task 0 reads the closed flag every poll; the watchers (node 0
of array tasks 1..lease_watchers) read the closed flag and the lease twice a second;
every other node only every backstop period (lease.py). The first peer to leave because the
generation is over claims the relay, and its batch script cancels the array's other
tasks: that, not polling, is how most nodes learn of the end. The time-limit notice is
read with the closed flag: task 0 sends its workers the save signal at its next poll,
and a workload that agrees across ranks on the stop (the workload contract) stops them
all at one iteration, whichever nodes read the notice themselves.

Our own failures use the codes in exitcodes.py, never 93.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from pathlib import Path

from nvrx_appliance import exitcodes, files, lease
from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.checkpoints import retention
from nvrx_appliance.checkpoints.checkpoint_dir import tracker_text
from nvrx_appliance.node import (
    control,
    controldir,
    dead_node,
    env,
    health_check,
    launch,
    liveness,
    looks,
    node_probe,
    rendezvous,
    stack_publisher,
    straggler_leave,
    time_limit,
)
from nvrx_appliance.node.gate import Leave
from nvrx_appliance.node.identity import Node, NodeError, array_throttle, from_env, term_drain
from nvrx_appliance.node.preflight import (
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
from nvrx_appliance.node.supervise import SaveSignal, Supervisor
from nvrx_appliance.rank import guard, stacks
from nvrx_appliance.settings import generation_end


def exit_deadline(manifest: run_manifest.Manifest, started: float) -> float | None:
    """Task 0's monotonic deadline for --exit-duration-min, counted from its own start (the
    generation's), so in-job restarts, which start new workers, cannot reset it."""
    minutes = manifest.spec.exit_duration_min
    return started + minutes * 60 if minutes else None


def save_signal(workload: list[str]) -> SaveSignal:
    signum = generation_end.SAVE_SIGNAL
    return SaveSignal(signum, lambda pid: time_limit.reachable(pid, workload, signum))


def supervise(
    pre: Preflight,
    record: control.Record,
    directory: Path,
    keeper: controldir.LeaseKeeper | None,
    lease_watch: controldir.LeaseWatch,
    stop_signals: list[int],
    started: float,
    health_endpoint: str | None = None,
    beater: liveness.Beater | None = None,
):
    """ft_launcher under a Supervisor; `stop_signals` collects the stopping signals
    Slurm sent a peer (task 0 answers them by closing the generation); `health_endpoint`
    is the drain check NVRx asks before each rendezvous; `beater`, a peer's liveness
    beats: when task 0 answers that it took this node for dead, the node leaves."""
    # The throttle task 0 read from the controller, for every node alike.
    active_tasks = record.active_tasks if record.active_tasks is not None else pre.active_tasks
    try:
        argv = launch.command(
            pre.manifest,
            record,
            # Each rank's workload under its guard: the training's own verdicts reach
            # the chain (guard.py); the workload's argv and exit code are unchanged.
            guard.argv(
                directory,
                pre.manifest.layout.exit_records(record.array_job_id),
                record.generation,
                pre.workload,
            ),
            hosts_rendezvous=pre.node.hosts_rendezvous,
            launcher=pre.launcher,
            active_tasks=active_tasks,
            health_endpoint=health_endpoint,
        )
    except launch.ShapeError as exc:
        raise Refused(exitcodes.LAUNCH_FAILED, str(exc)) from None
    child_env = env.plan(pre.manifest, pre.node, os.environ).apply(os.environ)
    if record.segment and pre.fabric.cluster_uuid:
        # The hang rule names a whole NVLink domain in segment mode (docs/hangs.md).
        child_env[stacks.DOMAIN_ENV] = pre.fabric.cluster_uuid
    period = looks.look_period(
        pre.manifest,
        pre.node,
        is_task0=keeper is not None,
        active_tasks=active_tasks or pre.manifest.shape.active_tasks,
    )
    check = looks.watch(
        pre.manifest, pre.node, directory, lease_watch, is_task0=keeper is not None,
        period=period, exit_at=exit_deadline(pre.manifest, started) if keeper else None,
    )  # fmt: skip
    try:
        return Supervisor(
            argv,
            child_env,
            check=check,
            urgent=rendezvous.self_fence_watch(pre.manifest, keeper)
            if keeper is not None
            else taken_out_watch(beater),
            grace=pre.manifest.spec.closed_flag_grace,
            poll=min(looks.RUN_POLL_S, period),
            log=say,
            on_stop_signal=rendezvous.closer(pre.node, directory, record.generation)
            if keeper
            else stop_signals.append,
            # Task 0 lets a workload finish (save) after Slurm's TERM, as its batch shell does.
            drain=term_drain(os.environ) if keeper else None,
            save=save_signal(pre.workload),
        ).run()
    except OSError as exc:
        raise Refused(exitcodes.LAUNCH_FAILED, f"cannot start ft_launcher: {exc}") from None


def taken_out_watch(beater: liveness.Beater | None):
    """A peer's urgent check: task 0 answered its beats with "out" (it took this node for
    dead while it was frozen or cut off, and the cycle went on without it)."""
    if beater is None:
        return None
    said = (
        "task 0 took this node for dead while it sent no liveness beat (frozen, or cut "
        "off) and went on without it; leaving"
    )
    return lambda: Leave(exitcodes.TAKEN_OUT, said) if beater.out.is_set() else None


def liveness_listener(
    pre: Preflight, record: control.Record, directory: Path
) -> liveness.Listener | None:
    """Task 0's end of the liveness beats, bound (its port goes in the record); None when
    the chain turned liveness off or this host has no UDP socket to give."""
    manifest, node = pre.manifest, pre.node
    timeout = manifest.spec.node_silence_timeout
    if timeout <= 0:
        return None
    on_dead = dead_node.DeadNodes(
        manifest, array_job_id=node.array_job_id, generation=record.generation,
        me=health_check.slurm_node(node), control_dir=directory, workload=pre.workload, log=say,
    )  # fmt: skip
    try:
        return liveness.Listener(
            record.generation, liveness.new_key(), timeout=timeout,
            nodes=generation_nodes(pre, record), on_dead=on_dead, log=say,
        )  # fmt: skip
    except OSError as exc:
        say(f"liveness: no UDP socket for the beats ({exc}); a silent node death waits for "
            "NVRx's section timeouts in this generation")  # fmt: skip
        return None


def generation_nodes(pre: Preflight, record: control.Record) -> int:
    """The nodes that beat: every node of every task Slurm runs at once."""
    tasks = record.active_tasks or pre.active_tasks or pre.manifest.shape.active_tasks
    return tasks * pre.manifest.spec.nodes_per_task


def liveness_beater(pre: Preflight, record: control.Record) -> liveness.Beater | None:
    """A peer's beats to task 0, started; None when the record names no listener."""
    if record.liveness_port is None or record.liveness_key is None:
        return None
    workload = pre.workload

    def leave_now() -> None:
        # At once, not at the supervisor's next poll: a rank that was frozen in a save
        # must not finish writing it beside the cycle that went on without it.
        say(f"{pre.node.label}: task 0 took this node for dead; ending its ranks")
        time_limit.end_workers(workload)

    beater = liveness.Beater(
        record.host, record.liveness_port, record.generation,
        bytes.fromhex(record.liveness_key), health_check.slurm_node(pre.node),
        task=pre.node.task_id, nodes=generation_nodes(pre, record), on_out=leave_now, log=say,
    )  # fmt: skip
    beater.start()
    return beater


def retention_keeper(manifest: run_manifest.Manifest) -> retention.Keeper:
    """Task 0 writes down each iteration the tracker names (the tracked record, which
    the fall-back and retention trust), for every workload, and keeps the newest
    --save-retention checkpoints when the workload does not (Megatron, a script);
    started here, it runs as long as the generation does."""
    kept = retention.Keeper(manifest.layout.checkpoints, manifest.policy.checkpoints_kept, say)
    kept.start()
    return kept


def run(manifest_path: Path | None) -> int:
    started = time.monotonic()
    pre = preflight(manifest_path)
    manifest, node = pre.manifest, pre.node
    health_check.warm_up(manifest)
    # Decided before anything is created: a refusal leaves nothing behind.
    record = (
        task0_record(manifest, node, pre.fabric, pre.active_tasks)
        if node.hosts_rendezvous
        else None
    )
    directory = rendezvous.make_dirs(manifest, node)
    keeper = None
    listener = beater = None
    if record is not None:
        listener = liveness_listener(pre, record, directory)
        if listener is not None:
            record = dataclasses.replace(
                record, liveness_port=listener.port, liveness_key=listener.key.hex()
            )
        keeper = rendezvous.publish(pre, record, directory)
        if listener is not None:
            listener.start()
    else:
        record = rendezvous.gate_loop(
            manifest, node, pre.fabric, directory, generation(manifest, node)
        )
        say(f"{node.label} joins rendezvous {record.endpoint} (segment {record.segment})")
        beater = liveness_beater(pre, record)
    kept = retention_keeper(manifest) if keeper is not None else None
    slow = None
    # Task 0 names the generation's stragglers for the ledger whatever the action; under
    # replace it also decides, and the named node leaves.
    replacing = straggler_leave.wanted(manifest)
    if replacing or keeper is not None:
        slow = straggler_leave.StragglerLeave(
            manifest, array_job_id=node.array_job_id, generation=record.generation,
            node=health_check.slurm_node(node), is_task0=keeper is not None,
            replacing=replacing, started=started, workload=pre.workload, log=say,
        )  # fmt: skip
        slow.start()
    # One writer per node for the ranks' stack samples (node/stack_publisher.py); the
    # guards find its node-local directory in their environment, inherited from ours.
    publisher = stack_publisher.start(
        manifest.layout.stacks(node.array_job_id), node.array_job_id,
        health_check.slurm_node(node), float(manifest.spec.stack_sampling), say,
        hangs=manifest.layout.hangs(node.array_job_id), progress=manifest.layout.progress_log,
    )  # fmt: skip
    if publisher is not None:
        os.environ[stack_publisher.LOCAL_STACKS_ENV] = str(publisher.local)
    lease_watch = controldir.LeaseWatch(directory, record.generation)
    stop_signals: list[int] = []
    try:
        # Drained nodes leave at a rendezvous through NVRx's node health check.
        with health_check.endpoint(manifest, node, record.generation, say) as health:
            outcome = supervise(
                pre, record, directory, keeper, lease_watch, stop_signals, started, health,
                beater,
            )  # fmt: skip
    finally:
        if keeper is not None:
            keeper.stop()
        for end in (listener, beater):
            if end is not None:
                end.stop()
        if kept is not None:
            kept.stop()
        if slow is not None:
            slow.stop()
        if publisher is not None:
            publisher.stop()
    if keeper is not None:
        mark_megatron_done(manifest)
    if outcome.stopped is not None and outcome.stopped.over:
        rendezvous.relay(node, directory, record.generation, outcome.stopped.message)
    elif (
        lease.watches(node.task_id, node.node_id, manifest.spec.lease_watchers)
        and outcome.stopped is None
        and not stop_signals
        and outcome.exit_code not in (exitcodes.OK, exitcodes.NVRX_NO_RESTART)
    ):
        looks.linger(manifest, node, directory, lease_watch)
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


def mark_megatron_done(manifest: run_manifest.Manifest) -> None:
    """Megatron writes no training-done marker: task 0 writes it for it once the tracker
    has reached the iteration at which Megatron ends training (settings/generation_end.py), so
    that the teardown ends the chain for Megatron as for every other workload."""
    if manifest.spec.workload != "megatron":
        return
    final = generation_end.megatron_final_iteration(manifest.spec, manifest.shape.global_batch)
    tracked = rendezvous.checkpoint_start(manifest)
    if final is None or tracked is None or tracked < final:
        return
    try:
        files.write_atomic(manifest.layout.training_done, tracker_text(tracked))
    except OSError as exc:
        say(f"could not mark training done at iteration {tracked}: {exc}")
        return
    say(f"Megatron reached its final iteration {final}: training done at iteration {tracked}")


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
        record = task0_record(manifest, node, fabric, array_throttle(os.environ))
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
            health_endpoint=health_check.dry_run_endpoint(manifest),
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
