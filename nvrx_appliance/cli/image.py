"""`nvrx-appliance image build|inspect|verify`."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import click

from nvrx_appliance.cli.fail import fail
from nvrx_appliance.image import build as builder_mod
from nvrx_appliance.image import verify as verify_mod
from nvrx_appliance.image.inspect import ImageError, image_manifest_rows, read_image_manifest
from nvrx_appliance.image.pins import BUILDERS, FLAVORS, PinsError, load


@click.group("image")
def image() -> None:
    """Build, inspect and verify appliance images (.sqsh for enroot/pyxis, .sif for Apptainer)."""


@image.command("build")
@click.option(
    "--builder",
    type=click.Choice(BUILDERS),
    envvar="IMAGE_BUILDER",
    help="Front end to build with (default: enroot, else apptainer, else rootfs, whichever exists).",
)
@click.option(
    "--flavor",
    type=click.Choice(FLAVORS),
    envvar="IMAGE_FLAVOR",
    help="gpu (NGC PyTorch + Megatron-LM) or cpu (Debian + CPU PyTorch). Default: cpu for rootfs, else gpu.",
)
@click.option(
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("images"),
    envvar="IMAGE_OUTPUT_DIR",
    show_default=True,
    help="Where the image (and its build log) is written.",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar=builder_mod.CACHE_ENV,
    help="Download cache kept between builds (default: ~/.cache/nvrx-appliance).",
)
@click.option("-v", "--verbose", is_flag=True, help="Show every line the build prints.")
def build_command(
    builder: str | None, flavor: str | None, output_dir: Path, cache_dir: Path | None, verbose: bool
) -> None:
    """Build a versioned appliance image from the pins and the one install script."""
    # A build stopped with TERM still removes its partial image and work directory.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        pins = load()
        chosen = builder_mod.choose_builder(builder, builder_mod.available_builders())
    except (PinsError, builder_mod.BuildError) as exc:
        fail(str(exc), prefix="error")
    flavor = flavor or builder_mod.default_flavor(chosen)
    refusal = builder_mod.refusal(chosen, flavor, is_root=os.geteuid() == 0)
    if refusal:
        fail(refusal, prefix="error")
    try:
        outcome = builder_mod.build(
            pins,
            builder=chosen,
            flavor=flavor,
            output_dir=output_dir,
            cache=cache_dir or builder_mod.cache_dir(),
            echo=click.echo,
            verbose=verbose,
        )
    except builder_mod.BuildError as exc:
        fail(f"image build failed, no image written: {exc}", prefix="error", code=1)
    size = builder_mod.human_size(outcome.image.stat().st_size)
    minutes, seconds = divmod(round(outcome.seconds), 60)
    probed = outcome.image_manifest.get("probed", {})
    click.echo(
        f"Built {outcome.image} ({size}) with {outcome.builder} in {minutes}m{seconds:02d}s: "
        f"Python {probed.get('python')}, PyTorch {probed.get('pytorch')}, NVRx {probed.get('nvrx')}, "
        f"Megatron-LM {probed.get('megatron_commit')}"
    )
    click.echo(f"Next: nvrx-appliance image verify {outcome.image}")


@image.command("inspect")
@click.argument("image_path", metavar="IMAGE", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the image manifest as JSON.")
def inspect_command(image_path: Path, as_json: bool) -> None:
    """Print the image manifest baked into IMAGE (.sqsh or .sif): pins and probed versions."""
    try:
        image_manifest = read_image_manifest(image_path)
    except ImageError as exc:
        fail(str(exc), prefix="error")
    if as_json:
        click.echo(json.dumps(image_manifest, indent=2, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    click.echo(str(image_path))
    table = Table(show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for field, value in image_manifest_rows(image_manifest):
        table.add_row(field, value)
    Console().print(table)


@image.command("verify")
@click.argument("image_path", metavar="IMAGE", type=click.Path(path_type=Path))
@click.option(
    "--runtime",
    type=click.Choice(verify_mod.RUNTIMES),
    help="How to start the image (default: apptainer for .sif; enroot, else the bwrap stand-in, for .sqsh).",
)
def verify_command(image_path: Path, runtime: str | None) -> None:
    """Start IMAGE and check its entrypoint and ft_launcher answer."""
    try:
        image_manifest = read_image_manifest(image_path)
        chosen = verify_mod.choose_runtime(image_path, runtime, verify_mod.runtimes_here())
    except (ImageError, ValueError) as exc:
        fail(str(exc), prefix="error")
    note = " (a test stand-in for pyxis+enroot)" if chosen == "bwrap-standin" else ""
    click.echo(f"Verifying {image_path} with {chosen}{note}")
    failed = 0
    for check in verify_mod.verify(image_path, chosen, image_manifest):
        if check.problem is None:
            click.echo(f"  ok    {check.name}")
        else:
            failed += 1
            click.echo(f"  FAIL  {check.name}: {check.problem}")
            for line in check.output.strip().splitlines()[-5:]:
                click.echo(f"        | {line}")
    if failed:
        fail(f"{failed} check(s) failed for {image_path}", prefix="error", code=1)
    click.echo(f"{image_path} starts its entrypoint with {chosen}")
