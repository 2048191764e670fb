"""What a node reads of the control directory while its ft_launcher runs: one listing of
the directory per look, and a read of a file only when the listing shows it (the closed
flag, the workload's verdict, the time-limit notice); the watchers also stat task 0's
lease. Task 0 looks every second, the watchers twice a second, every other node once per
backstop period (lease.py); task 0 also lists the hang records every HANG_LOOK_S, for a
hang verdict that asks for a hand-off (rank/stacks.py). A watcher whose ft_launcher
ended on its own lingers until it knows whether task 0 lives.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from nvrx_appliance import exitcodes, lease
from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.layout import ControlFiles
from nvrx_appliance.node import (
    controldir,
    gate,
    launch,
    launcher_end,
    rendezvous,
    time_limit,
)
from nvrx_appliance.node.gate import Leave
from nvrx_appliance.node.identity import Node
from nvrx_appliance.node.preflight import (
    say,
)
from nvrx_appliance.node.supervise import Decision, Save
from nvrx_appliance.rank import stacks

RUN_POLL_S = lease.POLL_S
# Task 0 lists the hang records this often (with stack sampling): a hand-off a second or
# two later costs nothing beside the step timeout that made it.
HANG_LOOK_S = 2.0


WATCH_POLL_S = lease.WATCH_POLL_S  # a watcher, while ft_launcher runs

# Once task 0's ft_launcher has decided to end the generation, how long it may take to
# end on its own before task 0 stops it: NVRx 0.7.0 waits 3.0 s as the store host, then
# up to its log server's graceful timeout and 5.0 s in gRPC's stop (launcher_end.py);
# about 14 s measured. A launcher hung past this would hold the generation, and a
# singleton chain, to its time limit.
ENDING_BOUND_S = 60.0


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
    a hang cannot keep task 0 from fencing itself), at most once per `period`: one
    listing, then the closed flag, the verdict and the time-limit notice, each read only
    when listed, and for any node but task 0 a stat of the lease (a node that looks
    rarely judges the lease from those sparse looks). `exit_at`: task 0's monotonic
    deadline for the exit duration, at which it writes that notice."""
    spec = manifest.spec
    token = lease_watch.generation
    names = ControlFiles(directory)
    due = time.monotonic()
    # Task 0 closes the generation the moment its ft_launcher decides to end it
    # (launcher_end.py), and from then on leaves that ft_launcher to end on its own,
    # within ENDING_BOUND_S.
    ending = (
        launcher_end.EndWatch(launch.nvrx_logfile(manifest, node.array_job_id), node.hostname)
        if is_task0
        else None
    )
    decided_at: float | None = None
    # A hang verdict without a free hot spare ends the generation (docs/hangs.md).
    sampled = is_task0 and spec.stack_sampling > 0
    hangs = manifest.layout.hangs(node.array_job_id) if sampled else None
    hangs_due = due

    def check() -> Decision:
        nonlocal due, decided_at, hangs_due
        now = time.monotonic()
        if now < due:
            return None
        due = now + period
        if ending is not None:
            if ending.decided is None and (why := ending.look()):
                say(f"{node.label}: {why}; closing the generation now")
                rendezvous.announce_end(directory, token, why)
                decided_at = now
            if ending.decided is not None:
                return _ended_too_slowly(ending, now - (decided_at or now))
        listed = set(os.listdir(directory))
        verdict = gate.while_running(
            closed=names.closed.name in listed and controldir.closed(directory, token),
            lease_age=None if is_task0 else lease_watch.look(),
            watch_lease=not is_task0,
            stale_after=spec.lease_stale_after,
        )
        if verdict is not None and verdict.fence:
            rendezvous.fence(node, directory, token, verdict.message)
        if verdict is not None:
            return verdict
        deciding = ending is not None and ending.decided is None
        if hangs is not None and deciding and now >= hangs_due:
            hangs_due = now + HANG_LOOK_S
            if why := stacks.hand_off_wanted(hangs, token):
                say(f"{node.label}: {why}; closing the generation now")
                rendezvous.announce_end(directory, token, why)
        given = (
            controldir.workload_verdict(directory, token) if names.verdict.name in listed else None
        )
        if given is not None:
            return Leave(
                exitcodes.WORKLOAD_VERDICT,
                f"the workload's verdict ({given.get('action')}): {given.get('words')}; "
                "stopping ft_launcher",
                over=True,
            )
        reason = time_limit.noticed(directory, token) if names.time_limit.name in listed else None
        if reason is None and exit_at is not None and now >= exit_at:
            reason = f"exit duration of {spec.exit_duration_min} min since task 0 started reached"
            time_limit.write_notice(directory, token, reason)
        return Save(reason) if reason is not None else None

    return check


def _ended_too_slowly(ending: launcher_end.EndWatch, since: float) -> Decision:
    """None while task 0's ft_launcher may still end on its own after deciding to; past
    ENDING_BOUND_S, stop it, with the code it said it would exit with."""
    if since < ENDING_BOUND_S:
        return None
    return Leave(
        ending.code if ending.code is not None else exitcodes.LAUNCH_FAILED,
        f"ft_launcher has not ended {since:.0f} s after it decided to end the generation "
        f"(bound {ENDING_BOUND_S:.0f} s): stopping it",
    )


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
                    rendezvous.fence(node, directory, token, verdict.message)
                rendezvous.relay(node, directory, token, verdict.message)
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
