"""The click commands of the Slurm side: submit, status, cancel."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.live import Live

from nvrx_appliance import exitcodes
from nvrx_appliance.chain import derive, spec_fields
from nvrx_appliance.slurm import cancel, resolve, slurmcli, sources, status_view
from nvrx_appliance.slurm import extra as extra_args
from nvrx_appliance.slurm import submit as submitting
from nvrx_appliance.slurm.options import spec_flags, spec_options


def _fail(message: str) -> NoReturn:
    """One line naming what is wrong and the fix; exit 2 (usage), nothing done."""
    click.echo(f"nvrx-appliance: {message}", err=True)
    sys.exit(exitcodes.USAGE)


def resolve_from_cli(params: dict[str, Any], config_file: str | None) -> resolve.Resolved:
    config: dict[str, Any] = {}
    if config_file:
        try:
            text = Path(config_file).read_text()
        except OSError as exc:
            _fail(f"--config {config_file}: cannot read it ({exc.strerror}); fix the path")
        except UnicodeDecodeError:
            _fail(f"--config {config_file}: not UTF-8 text; save it as UTF-8 TOML")
        config = resolve.parse_config(text, config_file)
    return resolve.resolve(
        spec_flags(params),
        os.environ,
        config,
        config_source=config_file or "",
        cwd=os.getcwd(),
        python=sys.executable,
    )


def _config_rows(resolved: resolve.Resolved) -> list[tuple[str, Any, str]]:
    return [
        (f.name, getattr(resolved.spec, f.name), resolved.origins[f.name]) for f in spec_fields()
    ]


def _sbatch_env() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("SBATCH_")}


def show_config(resolved: resolve.Resolved, as_json: bool) -> None:
    shape = dataclasses.asdict(derive(resolved.spec))
    if as_json:
        settings = {name: {"value": v, "from": o} for name, v, o in _config_rows(resolved)}
        doc = {"settings": settings, "shape": shape, "sbatch_env": _sbatch_env()}
        click.echo(json.dumps(doc, indent=2))
        return
    rows = _config_rows(resolved)
    width = max(len(name) for name, _, _ in rows)
    vwidth = max(len(json.dumps(v)) for _, v, _ in rows)
    for name, value, origin in rows:
        click.echo(f"{name:<{width}}  {json.dumps(value):<{vwidth}}  {origin}")
    click.echo("")
    click.echo("derived: " + ", ".join(f"{k}={v}" for k, v in shape.items()))
    for key, value in _sbatch_env().items():
        click.echo(f"sbatch environment: {key}={value}")


def _check_extra(extra: tuple[str, ...]) -> None:
    found = extra_args.problem(extra)
    if found:
        _fail(f"after `--`: {found}")


@click.command("submit", context_settings={"show_default": False})
@spec_options
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    help="TOML file of settings, keyed like the flags (train_tasks = 4). "
    "Flags beat the environment, which beats this file.",
)
@click.option("--print-config", is_flag=True, help="Show every resolved value and its origin.")
@click.option("--dry-run", is_flag=True, help="Print the sbatch lines and script; change nothing.")
@click.option("--force", is_flag=True, help="Submit although the job name is in use.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED, metavar="[-- SBATCH_ARGS...]")
def submit_command(
    config_file: str | None,
    print_config: bool,
    dry_run: bool,
    force: bool,
    as_json: bool,
    extra: tuple[str, ...],
    **params: Any,
) -> None:
    """Queue a chain of job-array generations (flags > NVRX_* env > --config > defaults).

    Arguments after `--` go to every sbatch unchanged; SBATCH_* variables apply as usual.
    """
    _check_extra(extra)
    try:
        resolved = resolve_from_cli(params, config_file)
    except resolve.SettingError as exc:
        _fail(str(exc))
    if print_config:
        show_config(resolved, as_json)
        return
    user = slurmcli.current_user()
    try:
        plan = submitting.plan(resolved, dry_run=dry_run, force=force, user=user, extra=extra)
    except submitting.Refused as exc:
        for problem in exc.problems:
            click.echo(f"nvrx-appliance submit: {problem}", err=True)
        click.echo("nvrx-appliance submit: nothing was written or submitted", err=True)
        sys.exit(exitcodes.USAGE)
    for warning in plan.warnings:
        click.echo(f"warning: {warning}", err=True)
    if plan.image_note:
        # stderr, so that --json and the dry run's script stay clean on stdout.
        click.echo(plan.image_note, err=True)
    if dry_run:
        _print_dry_run(plan, as_json)
        return
    try:
        done = submitting.submit(plan)
    except submitting.SubmitFailed as exc:
        click.echo(f"nvrx-appliance submit: {exc}", err=True)
        sys.exit(1)
    _print_submitted(done, as_json)


def _print_dry_run(plan: submitting.Plan, as_json: bool) -> None:
    if as_json:
        doc = {
            "commands": plan.command_lines,
            "script_path": str(plan.script_path),
            "script": plan.script,
            "warnings": list(plan.warnings),
            "image_qualification": plan.image_standing and plan.image_standing.to_json(),
        }
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo("# dry run: nothing was written or submitted")
    for argv in plan.command_lines:
        click.echo(shlex.join(argv))
    click.echo(f"# ---- {plan.script_path} ----")
    click.echo(plan.script, nl=False)


def _print_submitted(done: submitting.Submitted, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(done.to_json(), indent=2))
        return
    spec, shape = done.plan.manifest.spec, done.plan.manifest.shape
    click.echo(
        f"Queued chain {spec.job_name!r}: {spec.depth} generation(s) of array {shape.array_spec} "
        f"({spec.train_tasks} training + {spec.hot_spares} hot + {spec.cold_spares} cold spare tasks)"
    )
    click.echo(f"  jobs:     {' '.join(done.job_ids)}")
    click.echo(f"  work dir: {spec.work_dir}")
    click.echo(f"  follow:   nvrx-appliance status {done.job_ids[0]}")


def _work_dir_of(target: str, work_dir: str | None, user: str) -> Path:
    if work_dir:
        return Path(work_dir).resolve()
    try:
        return sources.locate(target, user=user)
    except sources.NotFound as exc:
        _fail(str(exc))


# Each refresh asks the shared controller twice (squeue, sacct): no faster than this.
MIN_WATCH_S = 2.0


@click.command("status")
@click.argument("target", metavar="JOB_ID|NAME")
@click.option("--work-dir", help="The chain's work dir, if Slurm no longer knows the job.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--watch",
    "every",
    type=click.FloatRange(min=MIN_WATCH_S),
    default=None,
    is_flag=False,
    flag_value=5.0,
    help=f"Refresh every N seconds (default 5, at least {MIN_WATCH_S:g}) until Ctrl-C.",
)
def status_command(target: str, work_dir: str | None, as_json: bool, every: float | None) -> None:
    """The chain at a glance: generations, tasks, NVRx cycles, checkpoint iterations."""
    user = slurmcli.current_user()
    folder = _work_dir_of(target, work_dir, user)

    def look():
        try:
            return sources.read_chain(folder, user=user)
        except sources.NotFound as exc:
            _fail(str(exc))

    if as_json:
        click.echo(json.dumps(look().to_json(), indent=2))
        return
    console = Console()
    if every is None:
        console.print(status_view.render(look()))
        return
    with Live(status_view.render(look()), console=console, auto_refresh=False) as live:
        try:
            while True:
                time.sleep(every)
                live.update(status_view.render(look()), refresh=True)
        except KeyboardInterrupt:
            pass


@click.command("cancel")
@click.argument("target", metavar="JOB_ID|NAME")
@click.option("--work-dir", help="The chain's work dir, if Slurm no longer knows the job.")
def cancel_command(target: str, work_dir: str | None) -> None:
    """Cancel a whole chain (every generation, queued or running); only your own jobs."""
    user = slurmcli.current_user()
    folder = _work_dir_of(target, work_dir, user)
    try:
        done = cancel.cancel_chain(folder, user=user)
    except sources.NotFound as exc:
        _fail(str(exc))
    except slurmcli.SlurmUnavailable as exc:
        click.echo(f"nvrx-appliance cancel: scancel failed: {exc}; nothing more was done", err=True)
        sys.exit(1)
    if not done.running and not done.queued:
        click.echo(f"Nothing of chain {done.job_name!r} was queued or running; marked it ended")
        return
    click.echo(
        f"Cancelled chain {done.job_name!r}: running {', '.join(done.running) or 'none'}; "
        f"queued {', '.join(done.queued) or 'none'}"
    )
