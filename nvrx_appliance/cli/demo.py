"""`nvrx-appliance demo` (`make demo`): the command line of workflows/demo.py."""

from __future__ import annotations

import sys

import click

from nvrx_appliance.cli.fail import fail, submit_failures
from nvrx_appliance.workflows import demo

DEMO = "nvrx-appliance demo"


@click.command("demo")
@click.option(
    "--segment",
    is_flag=True,
    help="Segment mode: six nodes in NVLink domains of two (a stand-in nvidia-smi), "
    "two-node tasks, NVRx training on whole domains (--ft-segment 2).",
)
def demo_command(segment: bool) -> None:
    """Run the hand-off demo on the local Slurm cluster and report how it recovered."""
    try:
        with submit_failures(DEMO):
            outcome = demo.run(click.echo, segment=segment)
    except demo.DemoFailed as exc:
        fail(str(exc), prefix=DEMO, code=1)
    sys.exit(0 if outcome.report.resumed_ok else 1)
