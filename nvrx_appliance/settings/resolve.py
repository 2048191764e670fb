"""One ChainSpec from flags > environment > config file > defaults, with each value's origin.

Pure but for one injected reader: the caller hands in the flags click parsed, a copy of
the environment, the text of the config file, the few defaults that depend on where
submit runs (its current directory and its Python), and how to read the arguments files
that --megatron-args and --script-args name. Every value remembers where it came from, so
`submit --print-config` can answer "why is this 8?" without guessing.

Unset versus empty matters for two settings, as in the reference deployment: `mounts` and
`gpu_failure` unset take the default, an explicit empty value (flag, environment or
config file) turns them off. Everywhere else an empty environment variable counts as set.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the backport the wheel requires there
    import tomli as tomllib

from nvrx_appliance.settings import declared, reference, workload_args
from nvrx_appliance.settings.chain import (
    ChainSpec,
    effective_profile,
    effective_runtime,
    flag,
    is_path_value,
    path_settings,
    read_on_host,
    spec_fields,
)

# The reference deployment's environment names that do not map one to one onto a field.
# NVRX_NO_RESTART_DEMO=1 is the reference deployment's default demo, =0 its hand-off demo.
_LEGACY_MODE = {"NVRX_NO_RESTART_DEMO": {"1": "no-restart", "0": "handoff"}}
# The reference scripts' own environment names, honoured with a notice naming ours.
SEED_NAMES = {
    "GPUS_PER_NODE": "gpus_per_node",
    "NODES_PER_TASK": "nodes_per_task",
    "RDZV_PORT": "rdzv_port",
    "MICRO_BATCH_SIZE": "micro_batch",
    "GLOBAL_BATCH_SIZE": "global_batch",
    "TENSOR_PARALLEL": "tensor_parallel",
    "PIPELINE_PARALLEL": "pipeline_parallel",
    "SAVE_INTERVAL": "save_interval",
    "TRAIN_SAMPLES": "train_samples",
    "EXIT_DURATION_IN_MINS": "exit_duration_min",
}
# The reference deployment names fault kinds as Megatron's injector does (async_exc); ours are plainer.
_FAULT_KIND_OF = {megatron: ours for ours, megatron in workload_args.MEGATRON_FAULT_TYPES.items()}
# The reference deployment turns segment-aware mode off with an explicitly empty NVRX_SEGMENT.
_EMPTY_MEANS = {"segment": "off"}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
# More digits than Python reads as an int.
_TOO_LONG = f"{{{declared.READABLE_DIGITS + 1},}}"
_INTEGER = re.compile(r"[+-]?[0-9]+")
_LONG_TOML_INTEGER = re.compile(
    rf"(?m)^[ \t]*[\"']?([A-Za-z0-9_-]+)[\"']?[ \t]*=[ \t]*[+-]?([0-9_]{_TOO_LONG})"
)
# Integers a float holds without rounding them to Infinity, by far.
_FLOAT_INTEGERS = 2**1000
# Runtimes whose nodes start nvrx-entrypoint with a Python of the host's (not the image's).
HOST_PYTHON_RUNTIMES = ("bare", "bwrap-standin")


_KIND_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "optional": "a string",
    "list[str]": "a list of strings (or the path of an arguments file)",
}
# Reads an arguments file (--megatron-args, --script-args); tests hand in their own.
ReadFile = Callable[[str], str]


def read_text(path: str) -> str:
    # A path from the environment or a config file reaches here with its ~ unexpanded.
    return Path(path).expanduser().read_text(encoding="utf-8")


class SettingError(ValueError):
    """A value that cannot be a setting; the message names its source and the fix."""


@dataclass(frozen=True)
class Resolved:
    spec: ChainSpec
    origins: dict[str, str]  # field name -> "flag --x", "env NVRX_X", "config F", "default"


def _kind(field: dataclasses.Field) -> str:
    kind = str(field.type).replace(" ", "")
    return {"str|None": "optional"}.get(kind, kind)


def env_name(field: dataclasses.Field) -> str | None:
    return field.metadata.get("env")


def _file_text(path: str, source: str, read_file: ReadFile, kind: str = "") -> str:
    """A settings file's text; one that cannot be read is a SettingError naming it."""
    try:
        return read_file(path)
    except OSError as exc:
        raise SettingError(
            f"{source} {path}: cannot read it ({exc.strerror}); fix the path"
        ) from None
    except UnicodeDecodeError:
        raise SettingError(f"{source} {path}: not UTF-8 text; save it as UTF-8{kind}") from None


def args_from_file(path: str, source: str, read_file: ReadFile) -> list[str]:
    """An arguments file's words; `source` says where its path came from."""
    text = _file_text(path, source, read_file)
    try:
        return workload_args.parse_args_file(text, f"{source} {path}")
    except workload_args.ArgsFileError as exc:
        raise SettingError(str(exc)) from None


def from_text(field: dataclasses.Field, text: str, source: str, read_file: ReadFile) -> Any:
    """An environment variable's (or a flag's) text as the field's type."""
    kind = _kind(field)
    if kind == "list[str]":
        return args_from_file(text, source, read_file)
    if kind in ("str", "optional"):
        if text == "" and field.name in _EMPTY_MEANS:
            return _EMPTY_MEANS[field.name]
        return text
    if kind == "bool":
        lowered = text.strip().lower()
        if not lowered:
            # Empty is neither: the reference scripts read some of these as off and
            # others as their default, so guessing would turn a default off unasked.
            default = "on" if field.default else "off"
            raise SettingError(
                f"{source} is set but empty; set it to 1 (on) or 0 (off), or unset it for "
                f"the default ({default})"
            )
        if lowered in _TRUE or lowered in _FALSE:
            return lowered in _TRUE
        raise SettingError(f"{source}={text!r} is not a boolean; use 1 or 0")
    return _number_from_text(field, kind, text.strip(), source)


def _number_from_text(field: dataclasses.Field, kind: str, text: str, source: str) -> Any:
    """A number as the field's type. One that no type can hold (an integer of more than
    the 4,300 digits Python reads, a float beyond its range, NaN) is refused here, in the
    words of what was given: past this point it would read as Infinity or crash. An
    empty `source` is a flag's, which click names itself."""
    given = f"{source}={_given(text)}" if source else _given(text)
    named = f"{source} ({flag(field.name)}): " if source else ""
    if _INTEGER.fullmatch(text):
        digits = len(text.lstrip("+-"))
        sign = -1 if text.startswith("-") else 1
        whole = (
            int(text)
            if digits <= declared.READABLE_DIGITS
            else sign * declared.too_long_integer(digits)
        )
        if digits > declared.READABLE_DIGITS or abs(whole) > _FLOAT_INTEGERS:
            raise SettingError(f"{named}{declared.problem(field, whole)}")
        return whole if kind == "int" else float(whole)
    try:
        value = int(text) if kind == "int" else float(text)
    except ValueError:
        raise SettingError(f"{given} is not {_KIND_WORDS[kind]}") from None
    if kind == "float" and not math.isfinite(value):
        raise SettingError(
            f"{named}{_given(text)} is not a finite number (it reads as {value}); give "
            f"{_KIND_WORDS[kind]} such as {field.default:g}"
        )
    return value


def _given(text: str) -> str:
    """What the user gave, quoted, cut short when it is long."""
    return repr(text) if len(text) <= 80 else repr(text[:60]) + f"... ({len(text)} characters)"


def from_config(
    field: dataclasses.Field, value: Any, source: str, read_file: ReadFile, key: str = ""
) -> Any:
    """A TOML value checked against the field's type (TOML already typed it); `key` is the
    setting's name as the file wrote it."""
    key = key or field.name
    kind = _kind(field)
    if kind == "list[str]":
        # A list is the arguments themselves; a string names an arguments file.
        if isinstance(value, str):
            return args_from_file(value, f"{source}: {key} =", read_file)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise SettingError(f"{source}: {key} should be {_KIND_WORDS[kind]}")
        return list(value)
    expected: tuple[type, ...] = {
        "int": (int,),
        "float": (int, float),
        "bool": (bool,),
        "str": (str,),
        "optional": (str,),
    }[kind]
    # bool is an int in Python; a TOML `true` for a count is a mistake, not 1.
    typed = isinstance(value, expected)
    if (isinstance(value, bool) and kind != "bool") or not typed:
        raise SettingError(
            f"{source}: {key} = {declared.shown(value)} should be {_KIND_WORDS[kind]}"
        )
    if kind != "float":
        return value
    # TOML reads nan and inf as floats, and an integer beyond a float's range raises in float().
    if isinstance(value, int) and abs(value) > _FLOAT_INTEGERS:
        raise SettingError(f"{source}: {key} {declared.problem(field, value)}")
    if not math.isfinite(value):
        raise SettingError(
            f"{source}: {key} = {value} (as TOML reads it) is not a finite number; give "
            f"{_KIND_WORDS[kind]} such as {field.default:g}"
        )
    return float(value)


def parse_config(text: str, source: str, read_file: ReadFile = read_text) -> dict[str, Any]:
    """The config file: a flat TOML table keyed by flag name (docs/knobs.md says how)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SettingError(f"--config {source}: not valid TOML: {exc}") from None
    except ValueError:
        # Python refuses to read an integer of more than 4,300 digits: find whose it is.
        raise SettingError(_too_long_in_config(text, source)) from None
    fields = {f.name: f for f in spec_fields()}
    keys = _config_keys()
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = keys.get(_config_key(key))
        if name is None:
            raise SettingError(
                f"--config {source}: unknown setting {key!r}; keys are the flags' names "
                "(see `nvrx-appliance submit --help`)"
            )
        if name in values:
            raise SettingError(f"--config {source}: {key!r} sets {flag(name)} a second time")
        values[name] = from_config(fields[name], value, f"--config {source}", read_file, key)
    return values


def _config_keys() -> dict[str, str]:
    """Every way a config key may name a setting -> the setting."""
    return {_config_key(flag(f.name)): f.name for f in spec_fields()} | {
        f.name: f.name for f in spec_fields()
    }


def _too_long_in_config(text: str, source: str) -> str:
    """The refusal of a config file whose integer Python will not read, naming the key."""
    found = _LONG_TOML_INTEGER.search(text)
    if found is None:
        return (
            f"--config {source}: holds an integer of more than 4,300 digits; no setting takes one"
        )
    key, digits = found.group(1), len(found.group(2).replace("_", ""))
    name = _config_keys().get(_config_key(key))
    if name is None:
        return f"--config {source}: unknown setting {key!r} (holding an integer of {digits} digits)"
    huge = declared.too_long_integer(digits)
    field = next(f for f in spec_fields() if f.name == name)
    return f"--config {source}: {key} {declared.problem(field, huge)}"


def read_config(path: str) -> dict[str, Any]:
    """The --config file read and parsed; an unreadable one is a SettingError naming it."""
    return parse_config(_file_text(path, "--config", read_text, " TOML"), path)


def _config_key(text: str) -> str:
    """--train-tasks, train-tasks and train_tasks are one key."""
    return text.lstrip("-").replace("-", "_")


def environment_values(
    environ: Mapping[str, str], read_file: ReadFile = read_text
) -> dict[str, tuple[Any, str]]:
    """Settings found in the environment: name -> (value, variable)."""
    found: dict[str, tuple[Any, str]] = {}
    for variable, table in _LEGACY_MODE.items():
        if variable in environ:
            text = environ[variable].strip()
            if text not in table:
                raise SettingError(
                    f"{variable}={text!r}: use 1 (no-restart demo) or 0 (hand-off demo)"
                )
            found["mode"] = (table[text], variable)
    fields = {f.name: f for f in spec_fields()}
    for seed, ours, name in seed_names():
        if seed in environ and ours in environ and environ[seed].strip() != environ[ours].strip():
            raise SettingError(
                f"{seed}={environ[seed]!r} and {ours}={environ[ours]!r} disagree; {seed} is "
                f"the reference scripts' name for {ours}: unset one of them"
            )
        if seed in environ:
            found[name] = (from_text(fields[name], environ[seed], seed, read_file), seed)
    for field in fields.values():
        env_var = env_name(field)
        if env_var and env_var in environ:
            text = environ[env_var]
            if field.name == "fault_types":
                text = ",".join(_FAULT_KIND_OF.get(k.strip(), k) for k in text.split(","))
            found[field.name] = (from_text(field, text, env_var, read_file), env_var)
    return found


def seed_names() -> list[tuple[str, str, str]]:
    """(the reference scripts' variable, ours, the setting) for each renamed variable."""
    fields = {f.name: f for f in spec_fields()}
    return [(seed, str(env_name(fields[name])), name) for seed, name in SEED_NAMES.items()]


def seed_notices(resolved: Resolved, environ: Mapping[str, str]) -> list[str]:
    """One line per reference-script name that was read, naming this tool's name."""
    notices = reference.notices(resolved.spec, environ)
    for seed, ours, name in seed_names():
        if resolved.origins.get(name) == f"env {seed}":
            notices.append(f"{seed} read as {ours} ({flag(name)}); the reference scripts' name")
    kinds = environ.get("NVRX_FAULT_TYPES", "").split(",")
    for kind in (k.strip() for k in kinds if k.strip() in _FAULT_KIND_OF):
        notices.append(f"NVRX_FAULT_TYPES: {kind} (Megatron's name) read as {_FAULT_KIND_OF[kind]}")
    return notices


def resolve(
    flags: Mapping[str, Any],
    environ: Mapping[str, str],
    config: Mapping[str, Any],
    *,
    config_source: str = "",
    cwd: str,
    python: str,
    read_file: ReadFile = read_text,
) -> Resolved:
    """Flags (None = not given) > environment > config file > defaults.

    Flags of list settings are the paths of arguments files, read with `read_file`.
    """
    env = environment_values(environ, read_file)
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for field in spec_fields():
        name = field.name
        if flags.get(name) is not None:
            value, origins[name] = flags[name], f"flag {flag(name)}"
            # A flag names an arguments file; the Python API may pass the arguments.
            if _kind(field) == "list[str]" and isinstance(value, str):
                value = args_from_file(flags[name], flag(name), read_file)
                origins[name] += f" {flags[name]}"
            values[name] = value
        elif name in env:
            values[name], origins[name] = env[name][0], f"env {env[name][1]}"
        elif name in config:
            values[name], origins[name] = config[name], f"config {config_source}"
        else:
            origins[name] = "default"
    spec = ChainSpec(**values)
    refused = reference.problems(spec, environ)
    if refused:
        raise SettingError("; ".join(refused))
    home = environ.get("HOME", "")
    return _fill_implicit(Resolved(spec, origins), cwd=cwd, python=python, home=home)


def absolute_path(path: str, *, cwd: str, home: str) -> str:
    """A path as every node must be given it: ~ (the submitting user's home) and a
    relative path (from where submit runs) made absolute. A symlink is kept, not resolved:
    a venv's bin/python is one, and its neighbours are what the nodes need. ~user is left
    as it is (check() refuses it): naming another user's home is not submit's to guess."""
    if home and (path == "~" or path.startswith("~/")):
        path = home + path[1:]
    if path.startswith("~"):
        return path
    return os.path.normpath(os.path.join(cwd, path))


def _fill_implicit(resolved: Resolved, *, cwd: str, python: str, home: str) -> Resolved:
    """The defaults that depend on where submit runs, made concrete for run.json; every
    path submit sees where the nodes do made absolute, so that the nodes, which run in
    the work dir, read the same file (`--print-config` shows both)."""
    spec, origins = resolved.spec, dict(resolved.origins)
    changes: dict[str, Any] = {}
    if not spec.work_dir:
        changes["work_dir"] = os.path.join(cwd, "nvrx-run")
        origins["work_dir"] = "default (./nvrx-run)"
    for field in path_settings():
        given = changes.get(field.name, getattr(spec, field.name))
        if is_path_value(field.name, given) and read_on_host(spec, field.name):
            made = absolute_path(given, cwd=cwd, home=home)
            if made != given:
                changes[field.name] = made
                origins[field.name] += f", {given} made absolute"
    if not spec.python and effective_runtime(spec) in HOST_PYTHON_RUNTIMES:
        changes["python"] = python
        origins["python"] = "default (the Python running submit)"
    if not spec.runtime:
        changes["runtime"] = effective_runtime(spec)
        origins["runtime"] = "default (pyxis with an image, else bare)"
    if not spec.profile and spec.workload == "megatron":
        changes["profile"] = effective_profile(spec)
        origins["profile"] = "default (none with --megatron-args, else small)"
    return Resolved(dataclasses.replace(spec, **changes), origins)
