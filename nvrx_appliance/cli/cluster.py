"""`nvrx-appliance cluster ...`: a real multi-node Slurm cluster on this one machine."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator

import click

from nvrx_appliance import jsondoc
from nvrx_appliance.cli.fail import fail
from nvrx_appliance.devcluster import cluster as shell
from nvrx_appliance.devcluster import packages
from nvrx_appliance.devcluster.daemons import DaemonError
from nvrx_appliance.devcluster.lock import cluster_lock
from nvrx_appliance.devcluster.net import NetError
from nvrx_appliance.devcluster.plan import (
    DEFAULT_CPUS_PER_NODE,
    DEFAULT_GPUS_PER_NODE,
    DEFAULT_NODES,
    DEFAULT_ROOT,
    DEFAULT_SUBNET,
    PlanError,
    make_plan,
)
from nvrx_appliance.devcluster.report import table
from nvrx_appliance.exitcodes import USAGE


def _say(command: str):
    started = time.monotonic()

    def say(line: str) -> None:
        click.echo(f"cluster {command} [{time.monotonic() - started:5.1f}s] {line}", err=True)

    return say


_EXPECTED = (shell.ClusterError, PlanError, DaemonError, NetError, packages.InstallError)


@contextlib.contextmanager
def _one_line_failures() -> Iterator[None]:
    """An expected failure ends the command with one line; the exit code is 2 when
    nothing was changed on purpose (a refusal, a bad plan), else 1."""
    try:
        yield
    except _EXPECTED as exc:
        unchanged = isinstance(exc, (shell.ClusterRefused, PlanError))
        fail(str(exc), prefix="error", code=USAGE if unchanged else 1)


@click.group(name="cluster")
def cluster_group() -> None:
    """A real Slurm cluster on this machine: a controller and N compute nodes, each in
    its own network namespace with its own hostname, munge, slurmdbd with MariaDB
    (so sacct works) and GPU stand-ins. Needs root on Debian or Ubuntu.

    Everything lives apart from any Slurm, munge or MariaDB the machine has: clients
    find it through SLURM_CONF (see `cluster env`).
    """


@cluster_group.command()
@click.option("--nodes", default=DEFAULT_NODES, show_default=True, help="Compute nodes.")
@click.option(
    "--gpus-per-node",
    default=DEFAULT_GPUS_PER_NODE,
    show_default=True,
    help="GPU GRES per node (stand-in device files: no GPU is needed).",
)
@click.option(
    "--cpus-per-node",
    default=DEFAULT_CPUS_PER_NODE,
    show_default=True,
    help="CPUs each node offers to the scheduler.",
)
@click.option(
    "--subnet",
    default=DEFAULT_SUBNET,
    show_default=True,
    envvar="NVRX_DEVCLUSTER_SUBNET",
    help="Private network for the controller and nodes.",
)
@click.option(
    "--nvlink-domain-size",
    default=0,
    show_default=True,
    help="Nodes per NVLink domain: a stand-in nvidia-smi on every job's PATH answers -q "
    "with one ClusterUUID per domain of this many nodes (segment mode). 0: no nvidia-smi.",
)
@click.option(
    "--no-cluster-uuid",
    multiple=True,
    metavar="NODE",
    help="A node whose nvidia-smi stand-in reports no ClusterUUID (repeatable).",
)
@click.option(
    "--mixed-cluster-uuid",
    multiple=True,
    metavar="NODE",
    help="A node whose GPU stand-ins disagree on their ClusterUUID (repeatable).",
)
@click.option("--force", is_flag=True, help="Rebuild even if that loses queued or running jobs.")
def up(
    nodes: int,
    gpus_per_node: int,
    cpus_per_node: int,
    subnet: str,
    nvlink_domain_size: int,
    no_cluster_uuid: tuple[str, ...],
    mixed_cluster_uuid: tuple[str, ...],
    force: bool,
) -> None:
    """Bring the cluster up, or repair it; a no-op when it is already up as asked.

    Dead daemons are restarted in place with their state (jobs and accounting survive);
    only a broken configuration or other settings rebuild, and not over live jobs
    without --force. A rebuild keeps the work root (every run's work dir); changing
    only the NVLink stand-in's answers rebuilds nothing."""
    say = _say("up")
    with _one_line_failures():
        shell.preflight()
        with cluster_lock(say=say):
            missing = packages.missing()
            if missing:
                say(f"installing missing Debian packages: {' '.join(missing)}")
                packages.install(missing, say)
            params = shell.machine_params(
                nodes,
                gpus_per_node,
                cpus_per_node,
                subnet,
                nvlink_domain_size=nvlink_domain_size,
                no_cluster_uuid=no_cluster_uuid,
                mixed_cluster_uuid=mixed_cluster_uuid,
            )
            plan = make_plan(params, DEFAULT_ROOT)
            shell.up(plan, say, force=force)
    click.echo(f"export SLURM_CONF={plan.paths.slurm_conf}")


@cluster_group.command()
def down() -> None:
    """Stop every daemon of the cluster and remove all it made; nothing else is touched."""
    say = _say("down")
    with _one_line_failures():
        shell.preflight()
        with cluster_lock(say=say):
            if not shell.down(DEFAULT_ROOT, say):
                say("nothing to remove: the cluster is not up")
                return
            say("down; the machine is as before `cluster up`")


@cluster_group.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(as_json: bool) -> None:
    """Per daemon and per node: running or not, and Slurm's view of each node.

    Exits 0 when the cluster is up with every node in service, 1 otherwise.
    """
    report = shell.status(DEFAULT_ROOT)
    click.echo(jsondoc.dumps("cluster-status", report) if as_json else table(report), nl=as_json)
    sys.exit(0 if report["up"] else 1)


@cluster_group.command()
def env() -> None:
    """Print the shell exports that point Slurm clients at the cluster.

    Use: eval "$(nvrx-appliance cluster env)"
    """
    report = shell.status(DEFAULT_ROOT)
    if "daemons" not in report:
        fail(report["reason"], prefix="error", code=1)
    click.echo(f"export SLURM_CONF={report['slurm_conf']}")
    click.echo(f"export NVRX_DEVCLUSTER_WORK_ROOT={report['work_root']}")


@cluster_group.command(name="kill-node")
@click.argument("name")
@click.option(
    "--silent",
    is_flag=True,
    help="Take the link down first, so the dead processes' connections close without a "
    "word to their peers (a power loss, not a crash): peers learn of it only from a "
    "timeout.",
)
def kill_node(name: str, silent: bool) -> None:
    """Crash node NAME: kill slurmd and every process in its namespace, link down."""
    with _one_line_failures():
        shell.preflight()
        shell.kill_node(name, _say("kill-node"), DEFAULT_ROOT, silent=silent)


@cluster_group.command(name="freeze-node")
@click.argument("name")
def freeze_node(name: str) -> None:
    """Hang node NAME's jobs: stop (SIGSTOP) every process of them; slurmd and the link stay up."""
    with _one_line_failures():
        shell.preflight()
        shell.freeze_node(name, _say("freeze-node"), DEFAULT_ROOT)


@cluster_group.command(name="thaw-node")
@click.argument("name")
def thaw_node(name: str) -> None:
    """Resume the processes of node NAME's jobs that freeze-node stopped."""
    with _one_line_failures():
        shell.preflight()
        shell.thaw_node(name, _say("thaw-node"), DEFAULT_ROOT)


@cluster_group.command(name="cut-link")
@click.argument("name")
@click.option(
    "--seconds",
    type=click.FloatRange(min=0.1, max=3600),
    required=True,
    help="How long the link stays down before it comes up again.",
)
def cut_link(name: str, seconds: float) -> None:
    """A network blip on node NAME: its link down for --seconds, then up; it keeps running."""
    with _one_line_failures():
        shell.preflight()
        shell.cut_link(name, seconds, _say("cut-link"), DEFAULT_ROOT)


@cluster_group.command(name="revive-node")
@click.argument("name")
def revive_node(name: str) -> None:
    """Bring node NAME back: link up, slurmd started, wait until Slurm uses it again."""
    with _one_line_failures():
        shell.preflight()
        shell.revive_node(name, _say("revive-node"), DEFAULT_ROOT)
