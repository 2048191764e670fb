"""`nvrx-appliance report`: goodput, what the chain spent its allocation on; a thin face
of api.report."""

from __future__ import annotations

from pathlib import Path

import click

from nvrx_appliance import api, jsondoc
from nvrx_appliance.cli.fail import fail
from nvrx_appliance.cli.target import chain_argument, find, not_readable
from nvrx_appliance.files import write_atomic
from nvrx_appliance.goodput import picture, summary

PREFIX = "nvrx-appliance report"


@click.command("report")
@chain_argument
@click.option(
    "--svg",
    "svg_path",
    type=click.Path(dir_okay=False, writable=True),
    help="Where to write the picture.  [default: <job name>-goodput.svg here]",
)
@click.option("--no-svg", is_flag=True, help="Write no picture.")
@click.option(
    "--json", "as_json", is_flag=True, help="Machine-readable output (no picture unless --svg)."
)
def report_command(
    target: str | None, work_dir: str | None, svg_path: str | None, no_svg: bool, as_json: bool
) -> None:
    """Goodput: the allocation (sacct) against the training it kept, and the rest by cause.

    Categories add up to the allocation in node-seconds; docs/goodput.md says how each
    is measured. The picture (SVG: open it in a browser) shows the timeline, the
    iterations trained and kept, and the breakdown as a bar.
    """
    if svg_path and no_svg:
        fail("--svg and --no-svg contradict each other; give one of them")
    found = find(PREFIX, target, work_dir)
    try:
        account = api.report(found)
    except api.ChainNotFound as exc:
        fail(not_readable(exc, found.job_name))
    except api.SlurmUnreachable as exc:
        fail(f"Slurm could not be reached: {exc}; pass the chain's --work-dir to read its files",
             prefix=PREFIX, code=1)  # fmt: skip
    written = None
    if svg_path or not (no_svg or as_json):
        written = Path(svg_path or f"{account.job_name}-goodput.svg")
        try:
            write_atomic(written, picture.svg(account), 0o644, durable=False)
        except OSError as exc:
            fail(f"cannot write the picture {written}: {exc.strerror}; choose another --svg",
                 prefix=PREFIX, code=1)  # fmt: skip
    if as_json:
        doc = summary.to_json(account)
        doc["node_deaths"] = api.node_deaths(found)
        doc["picture"] = str(written) if written else None
        click.echo(jsondoc.dumps("report", doc))
    else:
        for line in summary.lines(account):
            click.echo(line)
        for line in api.node_deaths(found):  # what each death cost is in the restarts above
            click.echo(f"  node death: {line}")
        for line in api.hang_verdicts(found):  # what each hang cost is in the restarts above
            click.echo(f"  hang: {line}")
        if written:
            click.echo(f"  picture: {written}")
    if account.allocation_node_s is None:
        fail("; ".join(account.blind) or "Slurm's accounting did not answer", prefix=PREFIX, code=1)
