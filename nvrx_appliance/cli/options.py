"""Click options for every ChainSpec field, generated from the field's metadata.

settings/chain.py is the one list of settings; this turns it into flags. No option carries a
default or an envvar of its own: an unset flag is None, and resolve.py applies the
environment, the config file and the defaults so that each value knows its origin.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click

from nvrx_appliance.cli import help as clihelp
from nvrx_appliance.settings import resolve
from nvrx_appliance.settings.chain import (
    MODES,
    PROFILES,
    RUNTIMES,
    WORKLOADS,
    flag,
    shown_default,
    spec_fields,
)

_CHOICES = {"runtime": RUNTIMES, "mode": MODES, "workload": WORKLOADS, "profile": PROFILES}


class _Number(click.ParamType):
    """A numeric setting's flag, read as its environment variable is (resolve.from_text):
    a value no number can hold is refused in the words it was given, not as Infinity."""

    def __init__(self, field: dataclasses.Field) -> None:
        self.field = field
        self.name = "integer" if str(field.type) == "int" else "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return resolve.from_text(self.field, value, "", resolve.read_text)
        except resolve.SettingError as exc:
            self.fail(str(exc), param, ctx)


def _help(field: dataclasses.Field) -> str:
    meta = field.metadata
    return f"{meta['help']}  {clihelp.extra(env=meta.get('env'), default=shown_default(field))}"


def _option(field: dataclasses.Field) -> Callable[[Any], Any]:
    name = field.name
    kind = str(field.type).replace(" ", "")
    if kind == "bool":
        long = flag(name)[2:]
        return click.option(f"--{long}/--no-{long}", name, default=None, help=_help(field))
    if kind == "list[str]":
        # The flag names an arguments file; resolve.py reads it.
        return click.option(
            flag(name), name, type=click.Path(dir_okay=False), default=None, metavar="FILE",
            help=_help(field),
        )  # fmt: skip
    if name in _CHOICES:
        # Where empty is the default, the help says what empty means: it is a choice too.
        empty = ("",) if field.default == "" else ()
        metavar = f"[{'|'.join(_CHOICES[name])}]"
        return click.option(
            flag(name), name, type=click.Choice(empty + _CHOICES[name]), default=None,
            metavar=metavar, help=_help(field),
        )  # fmt: skip
    kind_type = _Number(field) if kind in ("int", "float") else click.STRING
    return click.option(flag(name), name, type=kind_type, default=None, help=_help(field))


def spec_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate a click command with one option per ChainSpec field, in field order."""
    for field in reversed(spec_fields()):
        command = _option(field)(command)
    return command


def chain_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Everything a command that queues a chain takes (submit, qualify): one option per
    setting, a --config file and extra sbatch arguments after `--`."""
    command = click.argument(
        "extra", nargs=-1, type=click.UNPROCESSED, metavar="[-- SBATCH_ARGS...]"
    )(command)
    command = click.option(
        "--config",
        "config_file",
        type=click.Path(dir_okay=False),
        help='TOML file of settings keyed by flag name (time = "02:00:00"; docs/knobs.md). '
        "Flags beat the environment, which beats this file.",
    )(command)
    return spec_options(command)


def spec_flags(params: dict[str, Any]) -> dict[str, Any]:
    """The ChainSpec part of a command's parameters (None = not given on the command line)."""
    names = {f.name for f in spec_fields()}
    return {k: v for k, v in params.items() if k in names}
