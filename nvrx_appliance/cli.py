"""`nvrx-appliance`: the host-side tool. Each subcommand lives beside the code it drives."""

from __future__ import annotations

import click

from nvrx_appliance import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nvrx-appliance")
def cli() -> None:
    """Fault-tolerant Megatron training on Slurm with NVRx ft_launcher.

    Submit a chain of job-array generations around an appliance image, watch it,
    and run the whole thing on a local multi-node Slurm cluster.
    """


def main() -> None:
    cli()


from nvrx_appliance.devcluster.cli import cluster_group  # noqa: E402

cli.add_command(cluster_group)


from nvrx_appliance.slurm.commands import (  # noqa: E402
    cancel_command,
    logs_command,
    status_command,
    submit_command,
)

cli.add_command(submit_command)
cli.add_command(status_command)
cli.add_command(cancel_command)
cli.add_command(logs_command)

from nvrx_appliance.slurm.demo import demo_command  # noqa: E402

cli.add_command(demo_command)

from nvrx_appliance.image.cli import image  # noqa: E402

cli.add_command(image)

from nvrx_appliance.watch.cli import watch  # noqa: E402

cli.add_command(watch)

from nvrx_appliance.image.qualify import qualify_command  # noqa: E402

cli.add_command(qualify_command)
