"""`nvrx-entrypoint`: what srun starts on every node of every generation.

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

import datetime
import json
import os
import shlex
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click

from nvrx_appliance import __version__, exitcodes
from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.entrypoints import control, controldir, detect, env, gate, launch, probe
from nvrx_appliance.entrypoints.node import Node, NodeError, array_throttle, from_env
from nvrx_appliance.entrypoints.supervise import Supervisor
from nvrx_appliance.entrypoints.workloads import cpu, megatron

GATE_POLL_S = 1.0
RUN_POLL_S = 1.0  # while training: every node stats the shared file system this often
WAIT_REPORT_S = 60.0


class Refused(Exception):
    """We will not start, for the reason given, with our own exit code."""

    def __init__(self, exit_code: int, message: str):
        super().__init__(message)
        self.exit_code = exit_code


def say(message: str) -> None:
    print(f"nvrx-entrypoint: {message}", file=sys.stderr, flush=True)


def _load(manifest_path: Path | None) -> run_manifest.Manifest:
    if manifest_path is None:
        raise Refused(
            exitcodes.MANIFEST_INVALID,
            "no run manifest: pass --manifest PATH or set NVRX_RUN_MANIFEST",
        )
    try:
        manifest = run_manifest.load(manifest_path)
    except run_manifest.ManifestError as exc:
        raise Refused(exitcodes.MANIFEST_INVALID, str(exc)) from None
    if not Path(manifest.spec.work_dir).is_absolute():
        raise Refused(
            exitcodes.MANIFEST_INVALID,
            f"run manifest work_dir {manifest.spec.work_dir!r} is not an absolute path; resubmit",
        )
    return manifest


WORKLOADS = {"cpu": cpu.workload_argv, "megatron": megatron.workload_argv}


def _workload_argv(manifest: run_manifest.Manifest) -> list[str]:
    return list(WORKLOADS[manifest.spec.workload](manifest))


def _ft_launcher() -> list[str]:
    # The one beside our own interpreter first: same environment, same NVRx.
    found = shutil.which("ft_launcher", path=str(Path(sys.executable).parent)) or shutil.which(
        "ft_launcher"
    )
    if found is None:
        raise Refused(
            exitcodes.LAUNCH_FAILED,
            f"ft_launcher is neither beside {sys.executable} nor on PATH; "
            "install nvidia-resiliency-ext 0.7.0 in this environment",
        )
    return [found]


def _check_numactl(manifest: run_manifest.Manifest) -> None:
    if manifest.spec.gpus_per_numa and shutil.which("numactl") is None:
        raise Refused(
            exitcodes.LAUNCH_FAILED,
            f"gpus_per_numa is {manifest.spec.gpus_per_numa}, so NVRx wraps every rank in "
            "numactl, which is not installed on this node; install numactl (Debian package) "
            "or resubmit with --gpus-per-numa 0",
        )


def _fabric() -> detect.Fabric:
    fabric = probe.node_fabric()
    if fabric.valid:
        say(f"ClusterUUID {fabric.cluster_uuid}")
    elif fabric.gpus:
        say(f"no ClusterUUID on this node: {fabric.reason}")
    else:  # nvidia-smi missing, failing or hanging
        say(f"warning: no ClusterUUID on this node: {fabric.reason}")
    return fabric


def _decide(manifest: run_manifest.Manifest, fabric: detect.Fabric) -> detect.SegmentDecision:
    try:
        return detect.decide(manifest.spec.segment, fabric)
    except detect.SegmentError as exc:
        raise Refused(exitcodes.SEGMENT_MISMATCH, str(exc)) from None


def _task0_record(
    manifest: run_manifest.Manifest, node: Node, fabric: detect.Fabric
) -> control.Record:
    decision = _decide(manifest, fabric)
    return control.Record(
        host=node.hostname,
        port=manifest.spec.rdzv_port,
        segment=decision.segment,
        cluster_uuid=fabric.cluster_uuid,
        started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        array_job_id=node.array_job_id,
        task_id=0,
        job_id=node.job_id,
    )


def _make_dirs(manifest: run_manifest.Manifest, node: Node) -> Path:
    layout = manifest.layout
    directory = layout.control(node.array_job_id)
    try:
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


def _gate(
    manifest: run_manifest.Manifest, node: Node, fabric: detect.Fabric, directory: Path
) -> control.Record:
    spec = manifest.spec
    peer = gate.Peer(
        node=node, uid=os.geteuid(), own_names=probe.own_names(os.environ), fabric=fabric
    )
    limits = gate.Limits(record_wait=spec.rdzv_host_wait, lease_stale_after=spec.lease_stale_after)
    clock = controldir.Clock(directory, node.hostname)
    state, last_reason, reported = gate.Waiting(), None, time.monotonic()
    try:
        while True:
            try:
                seen = controldir.observe(directory, clock)
            except OSError as exc:
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


def _watch(manifest: run_manifest.Manifest, node: Node, directory: Path, clock):
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


@dataclass(frozen=True)
class Preflight:
    """Everything checked before this node creates or publishes anything."""

    manifest: run_manifest.Manifest
    node: Node
    fabric: detect.Fabric
    workload: list[str]
    launcher: list[str]
    active_tasks: int | None


def _preflight(manifest_path: Path | None) -> Preflight:
    manifest = _load(manifest_path)
    try:
        node = from_env(os.environ, socket.gethostname())
        active_tasks = array_throttle(os.environ)
    except NodeError as exc:
        raise Refused(exitcodes.USAGE, str(exc)) from None
    try:
        launch.nnodes(manifest, active_tasks)
    except launch.ShapeError as exc:
        raise Refused(exitcodes.LAUNCH_FAILED, str(exc)) from None
    fabric = _fabric()
    workload = _workload_argv(manifest)
    launcher = _ft_launcher()
    _check_numactl(manifest)
    return Preflight(manifest, node, fabric, workload, launcher, active_tasks)


def _publish(pre: Preflight, record: control.Record, directory: Path) -> controldir.LeaseKeeper:
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


def _supervise(pre: Preflight, record: control.Record, directory: Path):
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
            check=_watch(pre.manifest, pre.node, directory, clock),
            grace=pre.manifest.spec.closed_flag_grace,
            poll=RUN_POLL_S,
            log=say,
        ).run()
    except OSError as exc:
        raise Refused(exitcodes.LAUNCH_FAILED, f"cannot start ft_launcher: {exc}") from None
    finally:
        clock.remove()


def run(manifest_path: Path | None) -> int:
    pre = _preflight(manifest_path)
    manifest, node = pre.manifest, pre.node
    # Decided before anything is created: a refusal leaves nothing behind.
    record = _task0_record(manifest, node, pre.fabric) if node.hosts_rendezvous else None
    directory = _make_dirs(manifest, node)
    keeper = None
    if record is not None:
        keeper = _publish(pre, record, directory)
    else:
        record = _gate(manifest, node, pre.fabric, directory)
        say(f"{node.label} joins rendezvous {record.endpoint} (segment {record.segment})")
    try:
        outcome = _supervise(pre, record, directory)
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
    manifest = _load(manifest_path)
    hostname = socket.gethostname()
    try:
        node = from_env(os.environ, hostname)
        assumed = []
    except NodeError:
        node = Node("ARRAY_JOB_ID", 0, 0, "JOB_ID", hostname)
        assumed = ["not under Slurm: shown as task 0 of array job ARRAY_JOB_ID"]
    fabric = probe.node_fabric()
    decision = _decide(manifest, fabric)
    if node.hosts_rendezvous:
        record = _task0_record(manifest, node, fabric)
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
    workload = _workload_argv(manifest)
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


def _print_plan(plan: dict) -> None:
    n = plan["node"]
    role = "task 0, hosts the rendezvous" if n["hosts_rendezvous"] else "joins task 0"
    print(f"node:        task {n['task_id']} node {n['node_id']} on {n['hostname']} ({role})")
    print(f"generation:  array job {n['array_job_id']}")
    for line in plan["assumed"]:
        print(f"assumed:     {line}")
    print(f"ClusterUUID: {plan['cluster_uuid'] or 'none'} ({plan['cluster_uuid_reason']})")
    print(f"segment:     {plan['segment'] or 'off'} ({plan['segment_reason']})")
    print(f"rendezvous:  {plan['rendezvous']}")
    print("ft_launcher:\n  " + shlex.join(plan["ft_launcher"]))
    print("workload:\n  " + shlex.join(plan["workload"]))
    print("environment:")
    for key, value in sorted(plan["env"]["set"].items()):
        print(f"  {key}={shlex.quote(value)}")
    for key in plan["env"]["unset"]:
        print(f"  unset {key}")


# --- detect --------------------------------------------------------------------------------


def detect_report() -> dict:
    fabric = probe.node_fabric()
    auto = detect.decide("auto", fabric)
    return {
        "hostname": socket.gethostname(),
        "gpus": [
            {"bus_id": g.bus_id, "name": g.name, "uuid": g.uuid, "cluster_uuid": g.cluster_uuid}
            for g in fabric.gpus
        ],
        "cluster_uuid": fabric.cluster_uuid,
        "reason": fabric.reason,
        "auto_segment": auto.segment,
        "auto_reason": auto.reason,
    }


def _print_detect(report: dict) -> None:
    print(f"node: {report['hostname']}")
    for g in report["gpus"]:
        print(f"  GPU {g['bus_id']}  {g['name']}  ClusterUUID {g['cluster_uuid'] or '(none)'}")
    print(f"ClusterUUID: {report['cluster_uuid'] or 'none'} ({report['reason']})")
    segment = report["auto_segment"]
    flag = f"--ft-segment {segment}" if segment else "no --ft-segment (simple hot-spare mode)"
    print(f"segment auto would pass: {flag}")
    print(f"  because {report['auto_reason']}")


# --- CLI -----------------------------------------------------------------------------------


def _refuse(exc: Refused) -> None:
    say(str(exc))
    sys.exit(exc.exit_code)


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--manifest",
    "manifest_path",
    type=click.Path(path_type=Path, dir_okay=False),
    envvar="NVRX_RUN_MANIFEST",
    help="The run manifest (run.json) written by nvrx-appliance submit.",
)
@click.option(
    "--dry-run", is_flag=True, help="Print argvs, environment and decisions; run nothing."
)
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: print JSON.")
@click.version_option(__version__, prog_name="nvrx-entrypoint")
@click.pass_context
def cli(ctx: click.Context, manifest_path: Path | None, dry_run: bool, as_json: bool) -> None:
    """Run one node of a generation: gate on task 0, then a supervised ft_launcher.

    Exits with ft_launcher's exit code unchanged (93: NVRx says do not restart).
    Own failures: 70 manifest, 71 task 0 gone, 72 record refused, 73 segment
    mismatch, 74 record timeout, 75 launch failed, 76 stopped by the closed flag.
    """
    if ctx.invoked_subcommand is not None:
        return
    try:
        if dry_run:
            plan = plan_dry_run(manifest_path)
            if as_json:
                print(json.dumps(plan, indent=2))
            else:
                _print_plan(plan)
            sys.exit(exitcodes.OK)
        sys.exit(run(manifest_path))
    except Refused as exc:
        _refuse(exc)


@cli.command("detect")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def detect_cmd(as_json: bool) -> None:
    """What this node's GPUs report as ClusterUUID, and the segment decision auto takes."""
    report = detect_report()
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        _print_detect(report)


def main() -> None:
    cli()
