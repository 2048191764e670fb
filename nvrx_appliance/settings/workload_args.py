"""A user's own workload arguments: the file they are written in, what they may not say,
and which of them name paths. Pure.

Read at submit (so bad input is refused before anything is written) and by the Megatron
argv builder (so the arguments the appliance owns are set in one place). The option
strings below are Megatron-LM's, checked against the pinned megatron-core's own parser
by tests/unit/test_megatron_parser.py, aliases included.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

# Megatron flags the appliance sets itself, and what the user sets instead. A user
# argument naming one of these is refused at submit: argparse keeps the last value, so a
# user's --save would silently move checkpoints away from the tracker the chain reads.
OWNED_MEGATRON_FLAGS: dict[str, str] = {
    "--save": "the appliance (checkpoints go to <work dir>/checkpoints)",
    "--load": "the appliance (every generation resumes from <work dir>/checkpoints)",
    "--save-interval": "--save-interval",
    "--persistent-save-interval": "--save-interval",
    "--save-retain-interval": "--save-retention",
    "--enable-ft-package": "the appliance (NVRx's sections are always on)",
    "--tensor-model-parallel-size": "--tensor-parallel",
    "--pipeline-model-parallel-size": "--pipeline-parallel",
    "--micro-batch-size": "--micro-batch",
    "--global-batch-size": "--global-batch",
    "--train-samples": "--train-samples",
    "--exit-duration-in-mins": "--exit-duration-min",
}
# Every --fault-injector-* flag: faults are the demo modes' business (--fault-* settings).
OWNED_MEGATRON_PREFIXES: dict[str, str] = {
    "--fault-injector-": "the --fault-* settings (demo modes only)",
}

# Our fault kinds as Megatron's injector names them (NVRx's shared_utils Fault enum):
# an asynchronous exception in the training thread, SIGKILL of the rank, and a thread
# that takes the GIL and never lets go, so the step hangs until NVRx's section timeout.
MEGATRON_FAULT_TYPES = {"exception": "async_exc", "exit": "sigkill", "hang": "lock_gil"}

# Megatron flags whose values are paths the nodes must see. "prefixes": a blend list of
# optional weights and dataset prefixes (PREFIX.bin and PREFIX.idx); "file"/"dir": must
# exist; "output": written by the job, so only its mount is checked.
MEGATRON_PATH_FLAGS: dict[str, str] = {
    "--data-path": "prefixes",
    "--train-data-path": "prefixes",
    "--valid-data-path": "prefixes",
    "--test-data-path": "prefixes",
    "--data-args-path": "file",
    "--per-split-data-args-path": "file",
    "--tokenizer-model": "file",
    "--vocab-file": "file",
    "--merge-file": "file",
    "--pretrained-checkpoint": "dir",
    "--data-cache-path": "output",
    "--tensorboard-dir": "output",
}


class ArgsFileError(ValueError):
    """An arguments file that cannot be read as arguments; the message names the line."""


def parse_args_file(text: str, source: str) -> list[str]:
    """One argument, or `--flag value [value..]`, per line; shell quoting; `#` comments."""
    args: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise ArgsFileError(f"{source}, line {number}: {exc}; fix the quoting") from None
        args += words
    return args


def flag_of(word: str) -> str | None:
    """`--flag` of `--flag` or `--flag=value`; None for a value."""
    if not word.startswith("--") or word == "--":
        return None
    return word.split("=", 1)[0]


def flags_in(args: list[str]) -> list[str]:
    return [f for f in map(flag_of, args) if f]


def owner_of(megatron_flag: str) -> str | None:
    """Who sets a Megatron flag the appliance owns (None: the user may set it)."""
    if megatron_flag in OWNED_MEGATRON_FLAGS:
        return OWNED_MEGATRON_FLAGS[megatron_flag]
    for prefix, owner in OWNED_MEGATRON_PREFIXES.items():
        if megatron_flag.startswith(prefix):
            return owner
    return None


def owned_conflicts(args: list[str]) -> list[tuple[str, str]]:
    """(user flag, who owns it) for every owned flag in the user's arguments."""
    return [(f, owner) for f in flags_in(args) if (owner := owner_of(f)) is not None]


def values_of(args: list[str], megatron_flag: str) -> list[str]:
    """Every value given to a flag, however often it appears (`--f a b` or `--f=a`)."""
    values: list[str] = []
    for i, word in enumerate(args):
        if word.startswith(megatron_flag + "="):
            values.append(word.split("=", 1)[1])
        elif word == megatron_flag:
            for value in args[i + 1 :]:
                if value.startswith("--"):
                    break
                values.append(value)
    return values


@dataclass(frozen=True)
class PathArg:
    flag: str
    path: str  # as the workload sees it (inside the container)
    kind: str  # "file", "dir", "prefix" or "output"


def _is_weight(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def path_args(args: list[str]) -> list[PathArg]:
    """The paths in a user's Megatron arguments, with what must exist for each."""
    found: list[PathArg] = []
    for megatron_flag, kind in MEGATRON_PATH_FLAGS.items():
        for value in values_of(args, megatron_flag):
            if kind == "prefixes":
                if not _is_weight(value):
                    found.append(PathArg(megatron_flag, value, "prefix"))
            else:
                found.append(PathArg(megatron_flag, value, kind))
    return found


def required_files(arg: PathArg) -> list[str]:
    """What must exist for a path argument to be usable (nothing for an output)."""
    if arg.kind == "prefix":
        return [arg.path + ".bin", arg.path + ".idx"]
    if arg.kind in ("file", "dir"):
        return [arg.path]
    return []
