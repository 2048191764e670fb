"""The drain consumer: NVRx's node health check, answered from task 0's drain marker.

ft_launcher asks a node health check service before this node joins each rendezvous,
and only then (NVRx 0.7.0: `--ft-node-health-check-endpoint`; launcher.py's
init_node_health_check builds shared_utils/health_check.py's NodeHealthCheck, and
ft_rendezvous_barrier.py's ensure_node_is_healthy calls it from _perform_rendezvous's
pre_join_hook). So a drained node leaves at the next rendezvous, not at once: a running
cycle is never disturbed. A node that fails the check makes its ft_launcher exit 1
(never 93); its array task ends, a hot spare takes its place in that rendezvous, and the
throttle admits a cold spare. When the node is task 0's, the generation ends through
task 0's teardown (the hand-off) instead of task 0 hosting the next rendezvous.

The service is gRPC over a Unix socket (nvhcd's HealthCheckService.RunHealthCheck); this
module serves it from the entrypoint, on a socket in a private directory, and answers
it by reading this task's marker once (Layout.drain_marker, written by the drain poller,
jobhost/drain_poller.py). Why not NVRx's `--ft-segment-health-check-dir`, which reads a
per-task file too (segment_health_check.py, SegmentHealthCheck): it judges a file by its
size alone, so a marker cannot carry the allocation's identity, and a marker of another
allocation could not be ignored.

Failing open, as NVRx's own checks do: no marker yet, a marker of another generation,
task, job or node, a marker another user could have written, or a service that does not
answer, all read as healthy. A site's own health check service (the chain's
health_check_endpoint) is still asked, after the marker, with NVRx's own request.

judge() is pure; the server is the thin shell around it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvrx_appliance import files
from nvrx_appliance.manifest import Manifest
from nvrx_appliance.node import control, straggler_leave
from nvrx_appliance.node.identity import Node
from nvrx_appliance.observe import deaths

MARKER_BYTES = 64 << 10
# NVRx waits this long for the site's service (NodeHealthCheck's request timeout).
SITE_TIMEOUT_S = 60.0
DRY_RUN_SOCKET = "/tmp/nvrx-drain-XXXXXXXX/health.sock"


@dataclass(frozen=True)
class Identity:
    """This node's allocation, as the drain poller names it in a marker."""

    generation: str  # control.generation(): chain / array job / submit time
    task: int  # SLURM_ARRAY_TASK_ID
    job_id: str  # SLURM_JOB_ID: the array task's own job, one allocation
    node: str  # Slurm's name for this node (SLURMD_NODENAME)


@dataclass(frozen=True)
class Answer:
    healthy: bool
    why: str  # for the log: why it left, or why a marker was ignored; "" when nothing to say
    check: str = "slurm drain"  # which check failed, as NVRx's log names it


def judge(text: str | None, me: Identity) -> Answer:
    """Is this node fit to join the next rendezvous, by its task's marker?"""
    if not text:
        return Answer(True, "")  # not polled yet
    fields = control.decode_fields(text)
    theirs = fields.get("generation", "")
    if not control.same_generation(theirs, me.generation):
        return Answer(True, f"ignored a drain marker of generation {theirs!r}, not this one")
    if fields.get("task") != str(me.task) or fields.get("job_id") != me.job_id:
        return Answer(
            True,
            f"ignored a drain marker of task {fields.get('task')} job {fields.get('job_id')}: "
            f"another allocation than task {me.task} job {me.job_id}",
        )
    if me.node not in fields.get("nodes", "").split():
        return Answer(True, f"ignored a drain marker that does not name this node ({me.node})")
    drained = fields.get("drained", "").split()
    if not drained:
        return Answer(True, "")
    return Answer(
        False,
        f"Slurm has drained {' '.join(drained)} of task {me.task} "
        f"({fields.get('reason') or 'no reason given'}); {me.node} leaves at this rendezvous",
    )


def answer(found: Answer) -> dict[str, Any]:
    """The JSON NVRx reads from a health check's output: fail_count > 0 is unhealthy,
    and failed_checks is what its log says."""
    if found.healthy:
        return {"fail_count": 0, "failed_checks": []}
    return {"fail_count": 1, "failed_checks": [f"{found.check}: {found.why}"]}


def judge_hang(text: str | None, withdrawn: bool, me: Identity) -> Answer:
    """Is this node named by a hang verdict of this generation (rank/stacks.py's
    `hangs/hung.<node>`), not withdrawn since? Then it leaves at this rendezvous."""
    if not text or withdrawn:
        return Answer(True, "")
    try:
        marker = json.loads(text)
    except ValueError:
        return Answer(True, "")
    if not isinstance(marker, dict) or not control.same_generation(
        str(marker.get("generation", "")), me.generation
    ):
        return Answer(True, "")
    return Answer(
        False,
        f"{marker.get('words') or 'its ranks hung'}; {me.node} leaves at this rendezvous",
        check="hung",
    )


def judge_dead(text: str | None, me: Identity) -> Answer:
    """Did task 0's liveness judge take this node for dead in this generation
    (deaths/dead.<node>)? It came back (thawed, or its link did): it leaves."""
    death = deaths.parse(text, me.generation) if text else None
    if death is None:
        return Answer(True, "")
    return Answer(False, f"{death.words}; {me.node} leaves at this rendezvous", check="dead")


def site_target(endpoint: str) -> str | None:
    """The gRPC target of a site's service, as NVRx resolves it: Unix sockets only."""
    if endpoint.startswith("unix://"):
        return endpoint
    if endpoint.startswith(("/", "./")):
        return f"unix://{endpoint}"
    return None


# --- the shell ------------------------------------------------------------------------


def read_marker(path: Path, uid: int) -> tuple[str | None, str]:
    """(the marker's text or None, why it was not read). A marker only this job's
    user could have written is trusted; anything else is ignored."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        return None, f"could not read the drain marker {path}: {exc}"
    if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_mode & 0o022:
        return None, f"ignored the drain marker {path}: not a file of this job's user"
    try:
        return files.read_text(path, MARKER_BYTES), ""
    except OSError as exc:
        return None, f"could not read the drain marker {path}: {exc}"


class DrainCheck:
    """NVRx's node health check service, served on a Unix socket for one ft_launcher."""

    def __init__(
        self,
        marker: Path,
        me: Identity,
        *,
        site_endpoint: str,
        log: Callable[[str], None],
        uid: int | None = None,
        hangs: Path | None = None,
        deaths: Path | None = None,
    ):
        self.marker = marker
        self.hangs = hangs  # the generation's hang records (docs/hangs.md); None: not read
        self.deaths = deaths  # the generation's node deaths (docs/liveness.md); None: not read
        self.me = me
        self.site = site_target(site_endpoint) if site_endpoint else None
        self.log = log
        self.uid = os.geteuid() if uid is None else uid
        self._said: set[str] = set()
        self._lock = threading.Lock()
        self.leave: Path | None = None  # a straggler's decision to leave (straggler_leave.py)

    def check(self) -> Answer:
        for found in (self.dead_check(), self.hang_check()):
            if not found.healthy:
                self.log(found.why)
                return found
        if self.leave is not None:
            text = straggler_leave.read_decision(self.leave, self.uid)
            if why := straggler_leave.leaving(text, self.me.generation, self.me.node):
                self.log(why)
                return Answer(False, why, check="straggler")
        text, problem = read_marker(self.marker, self.uid)
        if problem:
            self._say_once(problem)
        found = judge(text, self.me)
        if found.healthy and found.why:
            self._say_once(found.why)
        elif not found.healthy:
            self.log(found.why)
        return found

    def dead_check(self) -> Answer:
        """Task 0 took this node for dead (deaths/dead.<node>)."""
        if self.deaths is None:
            return Answer(True, "")
        text, problem = read_marker(self.deaths / deaths.dead_name(self.me.node), self.uid)
        if problem:
            self._say_once(problem)
        return judge_dead(text, self.me)

    def hang_check(self) -> Answer:
        """A hang verdict on this node (hangs/hung.<node>), unless withdrawn."""
        if self.hangs is None:
            return Answer(True, "")
        text, problem = read_marker(self.hangs / f"hung.{self.me.node}", self.uid)
        if problem:
            self._say_once(problem)
        withdrawn = os.path.lexists(self.hangs / f"withdrawn.{self.me.node}")
        return judge_hang(text, withdrawn, self.me)

    def _say_once(self, message: str) -> None:
        with self._lock:
            if message not in self._said:
                self._said.add(message)
                self.log(message)

    def RunHealthCheck(self, request, context):
        from nvidia_resiliency_ext.shared_utils.proto import nvhcd_pb2

        found = self.check()
        if found.healthy and self.site is not None:
            site = self._ask_site(request)
            if site is not None:
                return site
        output = json.dumps(answer(found))
        return nvhcd_pb2.HealthCheckResponse(success=True, exit_code=0, output=output)

    def _ask_site(self, request):
        """The site's own answer to NVRx's request, unchanged; None (healthy, as NVRx
        treats it) when the site's service cannot be reached."""
        import grpc
        from nvidia_resiliency_ext.shared_utils.proto import nvhcd_pb2_grpc

        try:
            with grpc.insecure_channel(self.site) as channel:
                stub = nvhcd_pb2_grpc.HealthCheckServiceStub(channel)
                return stub.RunHealthCheck(request, timeout=SITE_TIMEOUT_S)
        except grpc.RpcError as exc:
            self._say_once(f"the site's health check at {self.site} did not answer ({exc.code()})")
            return None


@contextmanager
def serving(check: DrainCheck) -> Iterator[str | None]:
    """The endpoint to hand ft_launcher while the service runs; None when it could not
    start (no gRPC here, no socket): the run goes on without drain awareness."""
    try:
        import grpc
        from nvidia_resiliency_ext.shared_utils.proto import nvhcd_pb2_grpc
    except ImportError as exc:
        check.log(f"no drain awareness in this generation: {exc}")
        yield None
        return
    # A private directory (0700, mkdtemp): no other user can connect, or plant a socket.
    # In /tmp, short, since a Unix socket's path is limited to 107 bytes.
    private = tempfile.mkdtemp(prefix="nvrx-drain-")
    socket = os.path.join(private, "health.sock")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    try:
        nvhcd_pb2_grpc.add_HealthCheckServiceServicer_to_server(check, server)
        server.add_insecure_port(f"unix://{socket}")
        server.start()
    except RuntimeError as exc:
        check.log(f"no drain awareness in this generation: the health check socket: {exc}")
        shutil.rmtree(private, ignore_errors=True)
        yield None
        return
    try:
        yield socket
    finally:
        server.stop(grace=None)
        shutil.rmtree(private, ignore_errors=True)


def _import_grpc() -> None:
    with contextlib.suppress(ImportError):
        import grpc  # noqa: F401
        from nvidia_resiliency_ext.shared_utils.proto import nvhcd_pb2_grpc  # noqa: F401


def warm_up(manifest: Manifest) -> None:
    """Import gRPC on a thread of its own while the node does its other start-up work
    (a peer waits at the gate, task 0 publishes): a few tenths of a second that would
    otherwise come between the record and ft_launcher's start, on the hand-off's path."""
    if serves(manifest):
        threading.Thread(target=_import_grpc, name="drain-check-imports", daemon=True).start()


def dry_run_endpoint(manifest: Manifest) -> str | None:
    """What a dry run shows for the socket a real run creates."""
    return DRY_RUN_SOCKET if serves(manifest) else None


def serves(manifest: Manifest) -> bool:
    """Whether the entrypoint serves NVRx's node health check: drained nodes, hung ones,
    or ones task 0 took for dead."""
    spec = manifest.spec
    return spec.drain_poll_interval > 0 or spec.stack_sampling > 0 or spec.node_silence_timeout > 0


def slurm_node(node: Node) -> str:
    """Slurm's name for the node, which sinfo and squeue print; the host name only where
    Slurm did not say (a NodeName may differ from the NodeHostname)."""
    return os.environ.get("SLURMD_NODENAME") or node.hostname


@contextmanager
def endpoint(
    manifest: Manifest, node: Node, generation: str, log: Callable[[str], None]
) -> Iterator[str | None]:
    """The health check endpoint ft_launcher is to name while this node runs: the drain
    check's socket when the chain polls for drained nodes, samples stacks (a hung node
    leaves at the next rendezvous, docs/hangs.md) or replaces stragglers, else None (the
    spec's own)."""
    replacing = straggler_leave.wanted(manifest)
    if not serves(manifest) and not replacing:
        yield None
        return
    me = Identity(
        generation=generation, task=node.task_id, job_id=node.job_id, node=slurm_node(node)
    )
    marker = manifest.layout.drain_marker(node.array_job_id, node.task_id)
    hangs = manifest.layout.hangs(node.array_job_id) if manifest.spec.stack_sampling > 0 else None
    dead = manifest.layout.deaths(node.array_job_id) if manifest.spec.node_silence_timeout else None
    check = DrainCheck(
        marker, me, site_endpoint=manifest.spec.health_check_endpoint, log=log, hangs=hangs,
        deaths=dead,
    )  # fmt: skip
    if replacing:
        check.leave = manifest.layout.straggler_leave(node.array_job_id, me.node)
    with serving(check) as socket:
        yield socket
