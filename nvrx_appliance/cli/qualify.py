"""`nvrx-appliance qualify --image X [submit options]`: the command line of
workflows/qualify.py."""

from __future__ import annotations

import functools
import sys
from typing import Any

import click

from nvrx_appliance import jsondoc
from nvrx_appliance.cli.chain import resolve_chain
from nvrx_appliance.cli.fail import fail, submit_failures
from nvrx_appliance.cli.options import chain_options
from nvrx_appliance.workflows import qualify

QUALIFY = "nvrx-appliance qualify"  # who speaks in its one-line failures


@click.command("qualify", context_settings={"show_default": False})
@chain_options
@click.option(
    "--deadline",
    type=float,
    default=qualify.DEFAULT_DEADLINE_S,
    help=f"Seconds to wait for the checks to be decided.  [default: {qualify.DEFAULT_DEADLINE_S}]",
)
@click.option("--json", "as_json", is_flag=True, help="Print the qualification record as JSON.")
def qualify_command(
    deadline: float,
    as_json: bool,
    config_file: str | None,
    extra: tuple[str, ...],
    **params: Any,
) -> None:
    """Run the hand-off demo with --image here and record whether recovery worked.

    Takes submit's options, --config file and extra sbatch arguments after `--`; the
    mode is always the hand-off demo, with at least two generations (two unless
    --depth, NVRX_CHAIN_DEPTH or the config file says more). Writes
    <image>.qualification.json and <work>/qualification.json.
    """
    if params.get("mode") not in (None, "handoff"):
        fail(
            f"--mode {params['mode']}: qualify always runs the hand-off demo; drop --mode",
            prefix=QUALIFY,
        )
    params["mode"] = "handoff"  # as a flag, so it beats NVRX_MODE and the config file
    resolved = resolve_chain(params, config_file, extra)
    # Progress goes to stderr under --json, so that stdout is the one document.
    say = functools.partial(click.echo, err=as_json)

    def warn(line: str) -> None:
        click.echo(f"warning: {line}", err=True)

    with submit_failures(QUALIFY):
        outcome = qualify.run(resolved, sbatch_args=extra, deadline=deadline, say=say, warn=warn)
    for path in outcome.written:
        say(f"Qualification record: {path}")
    image = outcome.submitted.plan.manifest.spec.image
    if as_json:
        doc = {**outcome.record, "written": [str(p) for p in outcome.written]}
        click.echo(jsondoc.dumps("qualification", doc))
    if not outcome.passed:
        click.echo(f"{image}: qualification FAILED on this cluster", err=True)
        sys.exit(1)
    say(f"{image}: qualified on this cluster (hand-off recovered)")
