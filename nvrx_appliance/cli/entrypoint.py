"""`nvrx-entrypoint`: what srun starts on every node of every generation
(node/lifecycle.py), plus the operator's views: `--dry-run` and `detect`."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import click

from nvrx_appliance import __version__, exitcodes
from nvrx_appliance.cli import help as clihelp
from nvrx_appliance.node import node_probe
from nvrx_appliance.node.lifecycle import plan_dry_run, run
from nvrx_appliance.node.preflight import Refused, say


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


OWN_CODES = "\b\nOwn exit codes:\n" + "\n".join(
    f"  {code}  {meaning}" for code, meaning in sorted(exitcodes.ENTRYPOINT_CODES.items())
)


@click.group(
    invoke_without_command=True,
    context_settings=clihelp.CONTEXT,
    epilog=OWN_CODES,
)
@click.option(
    "--manifest",
    "manifest_path",
    type=click.Path(path_type=Path, dir_okay=False),
    envvar="NVRX_RUN_MANIFEST",
    show_envvar=True,
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

    Exits with ft_launcher's exit code unchanged (93: NVRx says do not restart);
    its own failures have codes of their own, listed below.
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


@cli.command("detect", short_help="This node's ClusterUUID and segment decision.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def detect_cmd(as_json: bool) -> None:
    """What this node's GPUs report as ClusterUUID, and the segment decision auto takes."""
    report = node_probe.detect_report()
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        _print_detect(report)


def main() -> None:
    cli()
