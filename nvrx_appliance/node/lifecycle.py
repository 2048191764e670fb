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

import os
import signal
import socket
import time
from pathlib import Path

from nvrx_appliance import exitcodes, files, lease
from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.checkpoints import retention
from nvrx_appliance.checkpoints.checkpoint_dir import tracker_text
from nvrx_appliance.clock import now_iso
from nvrx_appliance.node import (
    control,
    controldir,
    detect,
    env,
    gate,
    health_check,
    launch,
    launcher_end,
    node_probe,
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
from nvrx_appliance.node.supervise import Decision, Save, SaveSignal, Supervisor
from nvrx_appliance.observe import run_files
from nvrx_appliance.rank import guard
from nvrx_appliance.settings import generation_end

# Every node reads the control directory this often at the gate; task 0 and the
# watchers also while training.
GATE_POLL_S = RUN_POLL_S = lease.POLL_S
WATCH_POLL_S = lease.WATCH_POLL_S  # a watcher, while ft_launcher runs
# The workload's verdict and the time-limit notice are read at most this often: a second
# or two matters to neither (the guard holds its rank's place meanwhile, the margin is
# minutes), and reading them on every look of a watcher was two thirds of its file
# system calls (bench row 7: 7.6 calls/s against 3.6 before the verdict was read).
SLOW_LOOK_S = 2.0
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


def watch(
    manifest: run_manifest.Manifest,
    node: Node,
    directory: Path,
    lease_watch: controldir.LeaseWatch,
    *,
    is_task0: bool,
    period: float,
    exit_at: float | None = None,
):
    """The supervisor's look at the control directory (file system calls: it runs where
    a hang cannot keep task 0 from fencing itself), at most once per `period`: task 0
    reads the closed flag, any other node the closed flag and the lease (a node that
    looks rarely judges the lease from those sparse looks); then the time-limit notice.
    `exit_at`: task 0's monotonic deadline for the exit duration, at which it writes
    that notice."""
    spec = manifest.spec
    token = lease_watch.generation
    due = time.monotonic()
    # Task 0 closes the generation the moment its ft_launcher decides to end it
    # (launcher_end.py), and from then on leaves that ft_launcher to end on its own.
    ending = (
        launcher_end.EndWatch(launch.nvrx_logfile(manifest, node.array_job_id), node.hostname)
        if is_task0
        else None
    )

    slow_due = due

    def check() -> Decision:
        nonlocal due, slow_due
        now = time.monotonic()
        if now < due:
            return None
        due = now + period
        if ending is not None:
            if ending.decided is None and (why := ending.look()):
                say(f"{node.label}: {why}; closing the generation now")
                announce_end(directory, token, why)
            if ending.decided is not None:
                return None
        verdict = gate.while_running(
            closed=controldir.closed(directory, token),
            lease_age=None if is_task0 else lease_watch.look(),
            watch_lease=not is_task0,
            stale_after=spec.lease_stale_after,
        )
        if verdict is not None and verdict.fence:
            fence(node, directory, token, verdict.message)
        if verdict is not None:
            return verdict
        if now < slow_due:
            return None
        slow_due = now + max(period, SLOW_LOOK_S)
        given = controldir.workload_verdict(directory, token)
        if given is not None:
            return Leave(
                exitcodes.WORKLOAD_VERDICT,
                f"the workload's verdict ({given.get('action')}): {given.get('words')}; "
                "stopping ft_launcher",
                over=True,
            )
        reason = time_limit.noticed(directory, token)
        if reason is None and exit_at is not None and now >= exit_at:
            reason = f"exit duration of {spec.exit_duration_min} min since task 0 started reached"
            time_limit.write_notice(directory, token, reason)
        return Save(reason) if reason is not None else None

    return check


def linger(
    manifest: run_manifest.Manifest,
    node: Node,
    directory: Path,
    lease_watch: controldir.LeaseWatch,
) -> None:
    """A watcher whose ft_launcher ended on its own with a failure, unasked: the usual
    cause is task 0's store gone with task 0, and if the watchers all left now, nobody
    would fence it. So it stays, reading as before, until task 0 shows it lives (its
    lease changes), the closed flag appears, or the lease has gone unchanged past the
    threshold (it fences): the threshold and two polls at most."""
    spec, token = manifest.spec, lease_watch.generation
    say(f"{node.label}: ft_launcher ended on its own; making sure task 0 lives before "
        f"leaving (up to {spec.lease_stale_after + 2 * WATCH_POLL_S:.0f} s)")  # fmt: skip
    deadline = time.monotonic() + spec.lease_stale_after + 2 * WATCH_POLL_S
    try:
        lease_watch.look()  # a change seen only now may be task 0's last refresh
        while time.monotonic() < deadline:
            time.sleep(WATCH_POLL_S)
            closed = controldir.closed(directory, token)
            unchanged = lease_watch.look()
            if unchanged is None or (unchanged == 0.0 and not closed):
                return  # task 0 refreshed its lease since: it lives
            verdict = gate.while_running(
                closed=closed,
                lease_age=unchanged,
                watch_lease=True,
                stale_after=spec.lease_stale_after,
            )
            if verdict is not None:
                say(f"{node.label}: {verdict.message}")
                if verdict.fence:
                    fence(node, directory, token, verdict.message)
                relay(node, directory, token, verdict.message)
                return
    except OSError as exc:
        say(f"{node.label}: could not read {directory} ({exc}); leaving")


def look_period(
    manifest: run_manifest.Manifest, node: Node, *, is_task0: bool, active_tasks: int
) -> float:
    """Seconds between two looks at the control directory while ft_launcher runs."""
    spec = manifest.spec
    if is_task0:
        return RUN_POLL_S
    if lease.watches(node.task_id, node.node_id, spec.lease_watchers):
        return WATCH_POLL_S
    return lease.backstop_period(active_tasks * spec.nodes_per_task)


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
):
    """ft_launcher under a Supervisor; `stop_signals` collects the stopping signals
    Slurm sent a peer (task 0 answers them by closing the generation); `health_endpoint`
    is the drain check NVRx asks before each rendezvous."""
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
    period = look_period(
        pre.manifest,
        pre.node,
        is_task0=keeper is not None,
        active_tasks=active_tasks or pre.manifest.shape.active_tasks,
    )
    check = watch(
        pre.manifest, pre.node, directory, lease_watch, is_task0=keeper is not None,
        period=period, exit_at=exit_deadline(pre.manifest, started) if keeper else None,
    )  # fmt: skip
    try:
        return Supervisor(
            argv,
            child_env,
            check=check,
            urgent=self_fence_watch(pre.manifest, keeper) if keeper is not None else None,
            grace=pre.manifest.spec.closed_flag_grace,
            poll=min(RUN_POLL_S, period),
            log=say,
            on_stop_signal=closer(pre.node, directory, record.generation)
            if keeper
            else stop_signals.append,
            # Task 0 lets a workload finish (save) after Slurm's TERM, as its batch shell does.
            drain=term_drain(os.environ) if keeper else None,
            save=save_signal(pre.workload),
        ).run()
    except OSError as exc:
        raise Refused(exitcodes.LAUNCH_FAILED, f"cannot start ft_launcher: {exc}") from None


def retention_keeper(manifest: run_manifest.Manifest) -> retention.Keeper | None:
    """Task 0 keeps the newest --save-retention checkpoints when the workload does not
    (Megatron); started here, it runs as long as the generation does."""
    if not manifest.policy.checkpoints_kept:
        return None
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
    directory = make_dirs(manifest, node)
    keeper = None
    if record is not None:
        keeper = publish(pre, record, directory)
    else:
        record = gate_loop(manifest, node, pre.fabric, directory, generation(manifest, node))
        say(f"{node.label} joins rendezvous {record.endpoint} (segment {record.segment})")
    kept = retention_keeper(manifest) if keeper is not None else None
    lease_watch = controldir.LeaseWatch(directory, record.generation)
    stop_signals: list[int] = []
    try:
        # Drained nodes leave at a rendezvous through NVRx's node health check.
        with health_check.endpoint(manifest, node, record.generation, say) as health:
            outcome = supervise(
                pre, record, directory, keeper, lease_watch, stop_signals, started, health
            )
    finally:
        if keeper is not None:
            keeper.stop()
        if kept is not None:
            kept.stop()
    if keeper is not None:
        mark_megatron_done(manifest)
    if outcome.stopped is not None and outcome.stopped.over:
        relay(node, directory, record.generation, outcome.stopped.message)
    elif (
        lease.watches(node.task_id, node.node_id, manifest.spec.lease_watchers)
        and outcome.stopped is None
        and not stop_signals
        and outcome.exit_code not in (exitcodes.OK, exitcodes.NVRX_NO_RESTART)
    ):
        linger(manifest, node, directory, lease_watch)
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
    tracked = checkpoint_start(manifest)
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
