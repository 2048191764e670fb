"""The chain's commands: submit, status, logs, cancel; each a thin face of api.py."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.live import Live

from nvrx_appliance import api, jsondoc
from nvrx_appliance.chain.status import shape_text
from nvrx_appliance.cli import status_view
from nvrx_appliance.cli.fail import fail, refused, submit_failures
from nvrx_appliance.cli.options import chain_options, spec_flags
from nvrx_appliance.cli.target import chain_argument, find, not_readable, unreachable
from nvrx_appliance.manifest import Manifest
from nvrx_appliance.observe.follow import follow
from nvrx_appliance.observe.slurmcli import Slurm
from nvrx_appliance.settings import policy
from nvrx_appliance.settings.chain import derive

# Who speaks in each command's one-line failures.
SUBMIT, STATUS = "nvrx-appliance submit", "nvrx-appliance status"
CANCEL, LOGS = "nvrx-appliance cancel", "nvrx-appliance logs"


def _config_rows(resolved: api.Resolution) -> list[tuple[str, Any, str]]:
    # What the chain will do: a value the mode decides is shown as decided, with why.
    return policy.config_rows(resolved.spec, resolved.origins)


def _sbatch_env() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("SBATCH_")}


def show_config(resolved: api.Resolution, as_json: bool) -> None:
    shape = dataclasses.asdict(derive(resolved.spec))
    if as_json:
        settings = {name: {"value": v, "from": o} for name, v, o in _config_rows(resolved)}
        doc = {"settings": settings, "shape": shape, "sbatch_env": _sbatch_env()}
        click.echo(jsondoc.dumps("config", doc))
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


def resolve_chain(
    params: dict[str, Any], config_file: str | None, extra: tuple[str, ...]
) -> api.Resolution:
    """What submit and qualify do first: check the extra sbatch arguments, resolve every
    setting (flags > env > config > defaults), tell about the reference names read."""
    try:
        resolved = api.resolve_settings(spec_flags(params), config_file, sbatch_args=extra)
    except api.SettingsError as exc:
        fail("; ".join(exc.problems))
    for line in resolved.notices:
        notice(line)
    return resolved


def notice(line: str) -> None:
    click.echo(f"notice: {line}", err=True)


@click.command("submit", context_settings={"show_default": False})
@chain_options
@click.option("--print-config", is_flag=True, help="Show every resolved value and its origin.")
@click.option("--dry-run", is_flag=True, help="Print the sbatch lines and script; change nothing.")
@click.option("--force", is_flag=True, help="Submit although the job name is in use.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
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
    resolved = resolve_chain(params, config_file, extra)
    if os.environ.get("NVRX_DRY_RUN", "").strip() not in ("", "0") and not dry_run:
        notice("NVRX_DRY_RUN is set: a dry run, as --dry-run")
        dry_run = True
    if print_config:
        show_config(resolved, as_json)
        return
    try:
        plan = api.prepare(
            resolved.spec, sbatch_args=extra, force=force, dry_run=dry_run,
            origins=resolved.origins,
        )  # fmt: skip
    except api.SettingsError as exc:
        refused(exc.problems, prefix=SUBMIT)
    for warning in plan.warnings:
        click.echo(f"warning: {warning}", err=True)
    if plan.image_note:
        # stderr, so that --json and the dry run's script stay clean on stdout.
        click.echo(plan.image_note, err=True)
    if dry_run:
        _print_dry_run(plan, as_json)
        return
    with submit_failures(SUBMIT):
        done = api.submit(plan, on_wait=notice)
    _print_submitted(done, as_json)


def _print_dry_run(plan: api.SubmitPlan, as_json: bool) -> None:
    if as_json:
        doc = {
            "mode": plan.manifest.spec.mode,
            "shape": dataclasses.asdict(plan.manifest.shape),
            "wandb_run_id": plan.manifest.wandb_run_id or None,
            "workload": list(plan.manifest.workload),
            "commands": plan.command_lines,
            "script_path": str(plan.script_path),
            "script": plan.script,
            "warnings": list(plan.warnings),
            "image_qualification": plan.image_qualification and plan.image_qualification.to_json(),
        }
        click.echo(jsondoc.dumps("dry-run", doc))
        return
    click.echo(dry_run_text(plan), nl=False)


def dry_run_text(plan: api.SubmitPlan) -> str:
    """What `submit --dry-run` prints: the mode, the workload, the sbatch lines, the script."""
    lines = [
        "# dry run: nothing was written or submitted",
        f"# mode: {mode_line(plan.manifest)}",
        f"# shape: {shape_text(dataclasses.asdict(plan.manifest.shape), every_size=True)}",
        f"# W&B run: {wandb_line(plan.manifest)}",
        f"# workload ({plan.manifest.spec.workload}), after the interpreter, on every rank:",
        "#   " + shlex.join(plan.manifest.workload),
        *(shlex.join(argv) for argv in plan.command_lines),
        f"# ---- {plan.script_path} ----",
    ]
    return "\n".join(lines) + "\n" + plan.script


def wandb_line(manifest: Manifest) -> str:
    if manifest.wandb_run_id:
        return f"{manifest.wandb_run_id} (every generation and restart logs to it)"
    return "none (the workload is given no --wandb-project)"


def mode_line(manifest: Manifest) -> str:
    mode, faults = manifest.spec.mode, manifest.policy.faults_active
    if mode == "train":
        return "train (no injected faults)"
    return f"{mode} demo ({'injects faults' if faults else 'no workload fault'})"


def _print_submitted(done: api.Submitted, as_json: bool) -> None:
    if as_json:
        click.echo(jsondoc.dumps("submitted", done.to_json()))
        return
    for line in submitted_lines(done):
        click.echo(line)


def submitted_lines(done: api.Submitted) -> list[str]:
    """What a person reads once the chain is queued: what, which jobs, where, what next."""
    spec, shape = done.plan.manifest.spec, done.plan.manifest.shape
    return [
        f"Queued chain {spec.job_name!r}: {spec.depth} generation(s) of array {shape.array_spec} "
        f"({spec.train_tasks} training + {spec.hot_spares} hot + {spec.cold_spares} cold spare "
        "tasks)",
        f"  mode:     {mode_line(done.plan.manifest)}",
        f"  jobs:     {' '.join(done.job_ids)}",
        f"  work dir: {spec.work_dir}",
        f"  follow:   nvrx-appliance status {done.job_ids[0]}",
    ]


# Each refresh asks the shared controller twice (squeue, sacct): no faster than this.
MIN_WATCH_S = 2.0


@click.command("status")
@chain_argument
@click.option("--all", "all_users", is_flag=True, help="Without a chain: every user's chains.")
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
def status_command(
    target: str | None, work_dir: str | None, all_users: bool, as_json: bool, every: float | None
) -> None:
    """One chain at a glance: where it stands and what to run next, its generations,
    tasks, NVRx cycles and checkpoint iterations. Without a chain: your chains, one line
    each (--all: every user's)."""
    if not target and not work_dir:
        _list_chains(all_users, as_json, every)
        return
    if all_users:
        fail("--all lists every user's chains; give it without a chain")
    found = find(STATUS, target, work_dir)

    def look(slurm: Slurm | None = None) -> api.ChainView:
        try:
            return api.status(found, slurm=slurm)
        except api.ChainNotFound as exc:
            fail(not_readable(exc, found.job_name))

    if every is None:
        view = look()
        if as_json:
            click.echo(jsondoc.dumps("status", view.to_json()))
        else:
            status_view.console().print(status_view.render(view))
        if not view.slurm_reachable:
            unreachable(STATUS, "; ".join(view.blind), "only the work dir's records are shown")
        return
    _refresh(lambda slurm: status_view.render(look(slurm)), every)


def _list_chains(all_users: bool, as_json: bool, every: float | None) -> None:
    if every is not None:
        _refresh(
            lambda slurm: status_view.listing(
                api.chains(all_users=all_users, slurm=slurm), all_users
            ),
            every,
        )
        return
    listing = api.chains(all_users=all_users)
    if as_json:
        doc = {
            "chains": [dataclasses.asdict(row) for row in listing.chains],
            "others": listing.others,
            "blind": list(listing.blind),
            "slurm_reachable": listing.slurm_reachable,
        }
        click.echo(jsondoc.dumps("chains", doc))
    else:
        status_view.console().print(status_view.listing(listing, all_users))
    if not listing.slurm_reachable:
        unreachable(STATUS, "; ".join(listing.blind), "pass a chain's --work-dir to read it")


def _refresh(draw: Callable[[Slurm], Any], every: float) -> None:
    with (
        Live(console=status_view.console(), auto_refresh=False) as live,
        contextlib.suppress(KeyboardInterrupt),
    ):
        follow(
            lambda slurm: live.update(draw(slurm), refresh=True),
            lambda _: False,  # until Ctrl-C
            deadline_s=math.inf,
            poll_s=every,
        )


@click.command("cancel")
@chain_argument
def cancel_command(target: str | None, work_dir: str | None) -> None:
    """Cancel a whole chain (every generation, queued or running); only your own jobs."""
    found = find(CANCEL, target, work_dir)
    try:
        done = api.cancel(found)
    except api.ChainNotFound as exc:
        fail(str(exc))
    except api.SlurmUnreachable as exc:
        unreachable(CANCEL, str(exc), "nothing more was done")
    click.echo(cancelled_line(done))


def cancelled_line(done: api.Cancelled) -> str:
    if not done.running and not done.queued:
        return f"Nothing of chain {done.job_name!r} was queued or running; marked it ended"
    return (
        f"Cancelled chain {done.job_name!r}: running {', '.join(done.running) or 'none'}; "
        f"queued {', '.join(done.queued) or 'none'}"
    )


@click.command("logs")
@chain_argument
@click.option("--task", type=click.IntRange(min=0), default=0, help="This array task's batch log.")
@click.option("--cycle", type=click.IntRange(min=0), help="The workload's output in NVRx cycle N.")
@click.option("--launcher", is_flag=True, help="ft_launcher's own log.")
@click.option(
    "--follow", "-f", is_flag=True, help="Keep printing as it grows, on into later generations."
)
@click.option(
    "--stacks", is_flag=True, help="Every hang's judgement and the ranks' stacks, grouped."
)
def logs_command(
    target: str | None,
    work_dir: str | None,
    task: int,
    cycle: int | None,
    launcher: bool,
    follow: bool,
    stacks: bool,
) -> None:
    """A generation's output: task 0's batch log unless --task, --cycle or --launcher.

    A job id means its generation; a name, the newest generation that wrote that log.
    Each path read is named on stderr; docs/logs.md lists them all.
    """
    if sum((task != 0, cycle is not None, launcher, stacks)) > 1:
        fail("--task, --cycle, --launcher and --stacks each pick one log; give one of them")
    located = find(LOGS, target, work_dir)
    chain: api.Target = target if target and target.isdigit() else located
    if stacks:
        try:
            lines = api.hang_stacks(chain, work_dir=located.work_dir)
        except api.ChainNotFound as exc:
            fail(not_readable(exc, located.job_name))
        click.echo("\n".join(lines) if lines else "no hang has been judged in this chain")
        return

    def announce(found: Path) -> None:
        click.echo(f"==> {found} <==", err=True)

    try:
        if follow:
            with contextlib.suppress(KeyboardInterrupt):
                api.follow_logs(
                    chain, sys.stdout, task=task, cycle=cycle, launcher=launcher,
                    work_dir=located.work_dir, announce=announce,
                )  # fmt: skip
            return
        log = api.logs(chain, task=task, cycle=cycle, launcher=launcher, work_dir=located.work_dir)
    except api.LogMissing as exc:
        fail(f"{exc}; is it still queued? see `nvrx-appliance status`", prefix=LOGS, code=1)
    except api.ChainNotFound as exc:
        fail(not_readable(exc, located.job_name))
    except LookupError as exc:
        fail(str(exc))
    announce(log.path)
    with log.path.open(errors="replace") as handle:
        shutil.copyfileobj(handle, sys.stdout)
    if log.others:
        click.echo(f"other logs of generation {log.generation}: {', '.join(log.others)}", err=True)
