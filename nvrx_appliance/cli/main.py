"""`nvrx-appliance`: the host-side tool, one module of cli/ per subcommand.

The group imports a subcommand's module only when that subcommand is run (or its own
help asked for): `nvrx-appliance --help` and shell completion of command names stay
fast on a login node, and a broken optional part cannot stop the rest from starting.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from nvrx_appliance import __version__
from nvrx_appliance.cli import help as clihelp

# name: (module:attribute of the click command, its line in the top-level help).
COMMANDS = {
    "submit": ("nvrx_appliance.cli.chain:submit_command", "Queue a chain of generations."),
    "status": ("nvrx_appliance.cli.chain:status_command", "Show a chain at a glance."),
    "logs": ("nvrx_appliance.cli.chain:logs_command", "Show a generation's logs."),
    "report": (
        "nvrx_appliance.cli.report:report_command",
        "Show where a chain's allocation went (goodput).",
    ),
    "plan": (
        "nvrx_appliance.cli.plan:plan_command",
        "Plan a run at scale: its effective training time and best settings.",
    ),
    "cancel": (
        "nvrx_appliance.cli.chain:cancel_command",
        "Cancel every generation of a chain.",
    ),
    "watch": (
        "nvrx_appliance.cli.watch:watch",
        "Watch a chain from outside the job (nvrx-watch).",
    ),
    "qualify": (
        "nvrx_appliance.cli.qualify:qualify_command",
        "Qualify an image on this cluster.",
    ),
    "image": ("nvrx_appliance.cli.image:image", "Build, inspect and verify appliance images."),
}
# The local test cluster and the demo on it: for trying the appliance on one machine,
# never for a production cluster; listed apart so nobody mistakes them for the latter.
LOCAL_COMMANDS = {
    "cluster": (
        "nvrx_appliance.cli.cluster:cluster_group",
        "A local Slurm cluster on this machine (demo, tests; root).",
    ),
    "demo": (
        "nvrx_appliance.cli.demo:demo_command",
        "Run the hand-off demo on the local cluster.",
    ),
}


class LazyGroup(click.Group):
    """A group whose commands are imported on first use, from a name -> module table."""

    def __init__(self, *args: Any, sections: dict[str, dict[str, tuple[str, str]]], **kw: Any):
        super().__init__(*args, **kw)
        self.sections = sections
        self.table = {name: row for rows in sections.values() for name, row in rows.items()}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.table)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.table:
            return None
        module, attribute = self.table[cmd_name][0].split(":")
        return getattr(importlib.import_module(module), attribute)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        for title, rows in self.sections.items():
            with formatter.section(title):
                formatter.write_dl([(name, summary) for name, (_, summary) in rows.items()])


@click.group(
    cls=LazyGroup,
    sections={"Commands": COMMANDS, "Local cluster (one machine: demo and tests)": LOCAL_COMMANDS},
    context_settings=clihelp.CONTEXT,
    epilog="\b\nEach command's --help is its reference. Shell completion (bash; zsh, fish alike):\n"
    '  eval "$(_NVRX_APPLIANCE_COMPLETE=bash_source nvrx-appliance)"',
)
@click.version_option(__version__, prog_name="nvrx-appliance")
def cli() -> None:
    """Fault-tolerant Megatron training on Slurm with NVRx ft_launcher.

    Submit a chain of job-array generations around an appliance image, follow and
    watch it, qualify images; try all of it on a local multi-node Slurm cluster.
    """


def main() -> None:
    cli()
