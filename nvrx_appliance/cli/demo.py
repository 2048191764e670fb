"""`nvrx-appliance demo` (`make demo`): the command line of workflows/demo.py."""

from __future__ import annotations

import sys

import click

from nvrx_appliance.cli.fail import fail, submit_failures
from nvrx_appliance.workflows import demo

DEMO = "nvrx-appliance demo"


@click.command("demo")
def demo_command() -> None:
    """Run the hand-off demo on the local Slurm cluster and report how it recovered."""
    try:
        with submit_failures(DEMO):
            outcome = demo.run(click.echo)
    except demo.DemoFailed as exc:
        fail(str(exc), prefix=DEMO, code=1)
    sys.exit(0 if outcome.report.resumed_ok else 1)
