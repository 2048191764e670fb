"""How a command names a chain: one argument (its name, or any job id of it) and
`--work-dir` (for a chain Slurm has forgotten), found through the one resolution,
api.find_chain. status, logs, report, cancel and watch all take a chain this way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import click

from nvrx_appliance import api
from nvrx_appliance.cli.fail import fail

METAVAR = "NAME|JOB_ID"
WORK_DIR_HELP = "The chain's work dir: finds it without Slurm, once Slurm has forgotten it."


def chain_argument(command: Callable[..., Any]) -> Callable[..., Any]:
    """The chain's name or job id (optional: --work-dir names it too), and --work-dir."""
    command = click.option("--work-dir", help=WORK_DIR_HELP)(command)
    return click.argument("target", metavar=f"[{METAVAR}]", required=False)(command)


def find(command: str, target: str | None, work_dir: str | None) -> api.Located:
    """The chain a person named, or a one-line failure that says what to pass instead."""
    if not target and not work_dir:
        fail(f"name a chain: its name, a job id of it, or --work-dir (`{command} --help`)")
    try:
        return api.find_chain(target, work_dir=work_dir)
    except api.ChainNotFound as exc:
        fail(str(exc))
    except api.SlurmUnreachable as exc:
        unreachable(command, str(exc), "pass the chain's --work-dir to read its files")


def unreachable(command: str, detail: str, then: str) -> NoReturn:
    fail(f"Slurm could not be reached: {detail}; {then}", prefix=command, code=1)


def not_readable(exc: api.ChainNotFound, name: str | None) -> str:
    """A chain that cannot be read: why, and, for a hand-edited run.json, that cancel
    still ends it (from what Slurm knows: its name, or, where only a work dir was given,
    the name squeue shows for it)."""
    if not isinstance(exc, api.RunManifestUnreadable):
        return str(exc)
    if name:
        return f"{exc}; `nvrx-appliance cancel {name}` still ends the chain"
    return f"{exc}; `nvrx-appliance cancel NAME` (its job name in squeue) still ends the chain"
