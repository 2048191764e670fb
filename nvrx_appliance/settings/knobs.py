"""docs/knobs.md, generated from ChainSpec so the reference cannot drift from the code.

    python -m nvrx_appliance.settings.knobs > docs/knobs.md

Pure apart from the print in __main__; a unit test compares the committed file.
"""

from __future__ import annotations

import dataclasses

from nvrx_appliance.settings import reference
from nvrx_appliance.settings.chain import flag, spec_fields
from nvrx_appliance.settings.resolve import seed_names

# The first setting of each group in chain.py, and the group's heading.
_GROUPS = {
    "train_tasks": "Shape of a generation and of the chain",
    "work_dir": "Where and how it runs",
    "mode": "What it runs",
    "setup_timeout": "NVRx ft_launcher",
    "fault_inject": "Fault injection (the demo modes)",
    "burn_guard": "The chain's own guards",
    "drain_poll_interval": "Bad nodes: drained nodes, and memory across generations",
}

_HEAD = """# Every knob of `nvrx-appliance submit`

Generated from `nvrx_appliance/settings/chain.py` by `python -m nvrx_appliance.settings.knobs`;
do not edit by hand.

Each setting is read from the flag, else the environment variable (the reference deployment's names),
else the `--config FILE.toml` key, else the default. A config key is the flag's name
without its leading dashes, written with `-` or `_` (`train-tasks = 4`,
`train_tasks = 4`, `time = "02:00:00"`); the setting's own name, where it differs from
the flag's (`time_limit`), is accepted too. `nvrx-appliance submit --print-config` shows
every resolved value and where it came from. Two settings tell unset from empty, as in
the reference deployment: `--mounts` and `--gpu-failure` unset take the default, an explicitly empty
value turns them off. `NVRX_SEGMENT=` (empty) means `off`, and the reference deployment's
`NVRX_NO_RESTART_DEMO=1|0` selects `--mode no-restart|handoff`. A switch's variable
(`NVRX_ASYNC_SAVE`, `NVRX_LOG_DEBUG`, ...) takes 1, true, yes or on, or 0, false, no or
off; an empty one is refused, not read as off. The arguments settings
(`--megatron-args`, `--script-args`) name a file on the flag and in the environment; in
the config file they are a TOML list of arguments, or a string naming such a file.

Every value is judged the same way however it arrives (flag, environment, config file,
or a run.json read back): by its type (a run.json `true` for a count, `2.5` for an
integer, `null` for a string or `NaN` for a number is refused, naming the value), its
bounds, and its choices or pattern. A number above 2147483647 is refused unless the
table's setting takes more (`--train-samples`). Where the meaning below says what empty
means (`--mem`, `--partition`, `--profile`, `--runtime`, ...), an empty value is taken.
`--lease-stale-after` has no "off": 0 or less is refused (task 0 would fence itself at
its first look). A number no type can hold (an integer of hundreds of digits, `1e400`,
`nan`) is refused in the words it was given, naming its setting.

The nodes run in the work dir (or inside the image), not where submit ran, so every path
is absolute by the time it reaches run.json and the batch script: `--work-dir`,
`--python`, an image file (`--image img/a.sqsh`), and on bare metal `--megatron-path` and
`--script`, given relative or under `~`, are made absolute from where submit runs (a
symlink is kept as given; `--print-config` shows the absolute path and what was given).
Paths read inside the image (`--megatron-path` and `--script` under a container
runtime), `--health-check-endpoint` and `--mounts` must be given absolute, and are
refused otherwise. The arguments files and `--config` are read at submit, from where it
runs (`~` included).
"""


def _default(field: dataclasses.Field) -> str:
    if field.default_factory is not dataclasses.MISSING:
        return "none"
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if value == "":
        return "empty"
    return f"`{value}`"


def _flag(field: dataclasses.Field) -> str:
    name = flag(field.name)
    if str(field.type) == "bool":
        return f"`{name}` / `--no-{name[2:]}`"
    if str(field.type) == "list[str]":
        return f"`{name}` FILE"
    return f"`{name}`"


def _seed_names() -> str:
    names = ", ".join(f"`{seed}` (`{ours}`)" for seed, ours, _ in seed_names())
    refused = ", ".join(f"`{name}`" for name in reference.REFUSED)
    return (
        f"\nThe reference scripts' environment names are read too, each with a one-line "
        f"notice naming this tool's: {names}. `NVRX_FAULT_TYPES` takes Megatron's kinds "
        "(`async_exc`, `sigkill`, `lock_gil`) as well, and `NVRX_DRY_RUN=1` makes `submit` "
        f"a dry run. {refused} have no setting here and are refused, naming what to use "
        "instead; `NVRX_ACTIVE_TASKS` is taken only when it equals `--train-tasks` + "
        "`--hot-spares`, and `NVRX_NO_RESTART_EXIT_CODE` only as 93 (docs/migrating.md)."
    )


def markdown() -> str:
    lines = [_HEAD.rstrip("\n"), _seed_names()]
    for field in spec_fields():
        if field.name in _GROUPS:
            lines += [
                "",
                f"## {_GROUPS[field.name]}",
                "",
                "| flag | environment | default | meaning |",
                "| --- | --- | --- | --- |",
            ]
        env = field.metadata.get("env")
        meaning = field.metadata["help"].replace("|", "\\|")
        lines.append(
            f"| {_flag(field)} | {f'`{env}`' if env else ''} | {_default(field)} | {meaning} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
