"""The peer gate: may this node join task 0's rendezvous, wait, or leave?

Every node but task 0 polls the control directory and feeds what it saw to `step`,
which answers Wait, Join or Leave. While ft_launcher runs, `while_running` judges the
same files. Both are pure; controldir.py reads the files and main.py loops.

Order matters and is the contract: the closed flag is checked before anything else on
every poll, because once task 0 is gone the record it left is stale; a stale lease
counts as a closed flag, since a task 0 whose node died never runs the trap that
writes one, and the peer that sees it first fences the generation (Leave.fence). Files
of another run (a reused array job id) never reach these functions: controldir drops
them on reading.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvrx_appliance import exitcodes
from nvrx_appliance.node import control, detect
from nvrx_appliance.node.identity import Node


@dataclass(frozen=True)
class DirSeen:
    mode: int
    owner: int
    is_dir: bool


@dataclass(frozen=True)
class FileSeen:
    text: str
    owner: int
    is_file: bool


@dataclass(frozen=True)
class Observation:
    """One poll of this generation's control directory."""

    directory: DirSeen | None  # read with the record (None: no record yet)
    closed: bool
    # Seconds for which this node has seen the lease go unrefreshed, by its own clock (a
    # lower bound on its age: lease_watch.py); None: no lease.
    lease_age: float | None
    record: FileSeen | None
    # A peer's ft_launcher exited 93: NVRx ends the whole generation, and task 0's own
    # closed flag follows once its ft_launcher has drained (seconds later).
    no_restart: bool = False


@dataclass(frozen=True)
class Peer:
    node: Node
    uid: int  # the job's user
    own_names: frozenset[str]  # every name and address this node answers to, lower case
    fabric: detect.Fabric


@dataclass(frozen=True)
class Limits:
    record_wait: float  # once task 0 has started, how long its record may take
    lease_stale_after: float


@dataclass(frozen=True)
class Waiting:
    task0_started_at: float | None = None  # monotonic seconds when task 0 was first seen


@dataclass(frozen=True)
class Wait:
    reason: str


@dataclass(frozen=True)
class Join:
    record: control.Record


@dataclass(frozen=True)
class Leave:
    exit_code: int
    message: str
    # Task 0's lease went stale: close the generation on its behalf before leaving.
    fence: bool = False
    # The generation is over (closed flag, stale lease): the first peer that leaves on
    # it claims the relay, and its batch script cancels the array's other tasks. Never
    # set for a peer's exit 93: NVRx ends every launcher itself, and each must be free
    # to leave its own witness.
    over: bool = False


Decision = Wait | Join | Leave


def _stale(lease_age: float | None, stale_after: float) -> str | None:
    if lease_age is not None and lease_age > stale_after:
        return (
            f"task 0's liveness lease has not been refreshed for {lease_age:.1f} s (stale "
            f"after {stale_after:.0f} s): task 0's node died or hangs, and no trap closed "
            "the generation"
        )
    return None


def _judge_record(seen: FileSeen, peer: Peer) -> Decision:
    problem = control.file_problem(owner=seen.owner, uid=peer.uid, is_file=seen.is_file)
    if problem:
        return Leave(exitcodes.RECORD_REFUSED, f"refusing the rendezvous record: it {problem}")
    try:
        record = control.decode(seen.text)
    except control.RecordError as exc:
        return Leave(exitcodes.RECORD_REFUSED, f"refusing the rendezvous record: {exc}")
    if record.array_job_id != peer.node.array_job_id:
        return Leave(
            exitcodes.RECORD_REFUSED,
            f"refusing the rendezvous record: it belongs to array job {record.array_job_id}, "
            f"this node runs in {peer.node.array_job_id}",
        )
    host = record.host.rstrip(".").lower()
    if host in peer.own_names or host.split(".")[0] in peer.own_names:
        # Slurm gave task 0's node to this task, so task 0 is gone. Hosting the store
        # here would start a generation without task 0, and without its teardown.
        return Leave(
            exitcodes.TASK0_GONE,
            f"the record names this node ({record.host}) as the rendezvous host, but "
            f"{peer.node.label} is not task 0: task 0 is gone; refusing to host the rendezvous",
        )
    mismatch = detect.disagreement(record.segment, peer.fabric)
    if mismatch:
        return Leave(
            exitcodes.SEGMENT_MISMATCH,
            f"segment mismatch between task 0 on {record.host} (ClusterUUID "
            f"{record.cluster_uuid or 'none'}) and {peer.node.label}: {mismatch}",
        )
    return Join(record)


def step(
    state: Waiting, seen: Observation, now: float, peer: Peer, limits: Limits
) -> tuple[Waiting, Decision]:
    d = seen.directory
    problem = (
        None
        if d is None
        else control.dir_problem(mode=d.mode, owner=d.owner, uid=peer.uid, is_dir=d.is_dir)
    )
    if problem:
        return state, Leave(
            exitcodes.RECORD_REFUSED, f"refusing the control directory: it {problem}"
        )
    if seen.closed:
        return state, Leave(
            exitcodes.TASK0_GONE,
            "the closed flag is present: task 0 has ended this generation",
            over=True,
        )
    if seen.no_restart:
        return state, Leave(
            exitcodes.TASK0_GONE,
            "a peer's ft_launcher exited 93: NVRx will not restart this generation",
        )
    stale = _stale(seen.lease_age, limits.lease_stale_after)
    if stale:
        return state, Leave(exitcodes.TASK0_GONE, stale, fence=True, over=True)

    # Anything but a regular file (a planted symlink, say) counts as published, so that
    # it is refused rather than waited on.
    published = seen.record is not None and (
        not seen.record.is_file or seen.record.text.strip() != ""
    )
    if published and seen.record is not None and seen.lease_age is not None:
        return state, _judge_record(seen.record, peer)

    if seen.lease_age is None and seen.record is None:
        # Unbounded on purpose: the scheduler may start task 0 long after its peers
        # (backfill), and a timeout here would kill a generation about to work.
        return state, Wait("task 0 has not started yet (no lease, no record)")

    started = state.task0_started_at if state.task0_started_at is not None else now
    state = Waiting(task0_started_at=started)
    waited = now - started
    if waited > limits.record_wait:
        return state, Leave(
            exitcodes.RECORD_TIMEOUT,
            f"task 0 started {waited:.0f} s ago but its rendezvous record is still "
            f"{'empty' if seen.record is not None else 'missing'} "
            f"(limit {limits.record_wait:.0f} s, rdzv_host_wait)",
        )
    if seen.record is None:
        return state, Wait(f"task 0 has started; waiting for its record ({waited:.0f} s)")
    if not published:
        return state, Wait(f"task 0's record is empty so far ({waited:.0f} s)")
    # Task 0 writes its lease before its record; a record without a lease is never
    # joined, or nothing would ever notice that task 0 died.
    return state, Wait(f"record present but no lease from task 0 yet ({waited:.0f} s)")


def while_running(
    *, closed: bool, lease_age: float | None, watch_lease: bool, stale_after: float
) -> Leave | None:
    """Whether to stop a running ft_launcher because the generation is over."""
    if closed:
        return Leave(
            exitcodes.STOPPED_BY_CLOSED_FLAG,
            "the closed flag appeared: task 0 has ended this generation; stopping ft_launcher",
            over=True,
        )
    stale = _stale(lease_age, stale_after) if watch_lease else None
    if stale:
        return Leave(exitcodes.TASK0_GONE, f"{stale}; stopping ft_launcher", fence=True, over=True)
    return None


def self_fence(unrefreshed_for: float, deadline: float) -> Leave | None:
    """Task 0's own verdict, from its own clock alone (no file system call, which may be
    what hangs): past the deadline its peers may soon call it dead, so it must stop
    training before a successor can start (lease.py has the margins)."""
    if unrefreshed_for < deadline:
        return None
    return Leave(
        exitcodes.SELF_FENCED,
        f"task 0 has not refreshed its liveness lease for {unrefreshed_for:.1f} s (limit "
        f"{deadline:.0f} s): the shared file system is failing or stalled here, and the "
        "peers will soon take task 0 for dead; stopping ft_launcher and its workers",
    )
