"""A user's own workload arguments: the file they are written in, and what they may not
say. Pure.

Read at submit (so bad input is refused before anything is written) and by the Megatron
argv builder (so the arguments the appliance owns are set in one place). The option
strings below are Megatron-LM's, checked against the pinned megatron-core's own parser
by tests/unit/test_megatron_parser.py, aliases included.
"""

from __future__ import annotations

import shlex

# Megatron flags the appliance sets itself, each with the rest of the line that refuses
# it in a user's arguments: argparse keeps the last value, so a user's --save would
# silently move checkpoints away from the tracker the chain reads. (The parallel and
# batch sizes are not here: a user's arguments may state them, settings/megatron/parallel.py.)
OWNED_MEGATRON_FLAGS: dict[str, str] = {
    "--save": "is the appliance's (checkpoints go to <work dir>/checkpoints); remove it",
    "--load": "is the appliance's (every generation resumes from <work dir>/checkpoints); "
    "to start from another checkpoint, use --pretrained-checkpoint DIR",
    "--save-interval": "is a chain setting; remove it and set --save-interval",
    "--persistent-save-interval": "is a chain setting; remove it and set --save-interval",
    "--enable-ft-package": "is the appliance's (NVRx's sections are always on); remove it",
    "--train-samples": "is a chain setting; remove it and set --train-samples "
    "(or --train-iters in your arguments)",
    "--exit-duration-in-mins": "is a chain setting; remove it and set --exit-duration-min",
    # The time-limit save: Megatron saves and exits on the signal the appliance sends.
    "--exit-signal-handler": "is the appliance's (the time-limit save; see --time-limit-margin); "
    "remove it",
    "--exit-signal": "is the appliance's (the time-limit save; see --time-limit-margin); remove it",
}
# Every --fault-injector-* flag: faults are the demo modes' business (--fault-* settings).
OWNED_MEGATRON_PREFIXES: dict[str, str] = {
    "--fault-injector-": "is the demo modes' (the --fault-* settings); remove it",
}
# Flags that break resuming in a chain: every generation and every in-job restart loads
# the checkpoint the tracker names, and each of these drops, pins or hides what it holds.
RESUME_BREAKING_FLAGS: dict[str, str] = {
    "--finetune": "restarts training at iteration 0 on every resume (generations and "
    "in-job restarts); to fine-tune, use --pretrained-checkpoint DIR alone, which Megatron "
    "reads only while <work dir>/checkpoints holds nothing",
    "--no-load-optim": "drops the optimizer state on every resume; remove it "
    "(--pretrained-checkpoint DIR starts a fresh optimizer on a pretrained model)",
    "--no-load-rng": "drops the RNG state on every resume; remove it",
    "--no-save-optim": "saves checkpoints no generation can resume from (no optimizer "
    "state); remove it",
    "--ckpt-step": "pins every resume to one iteration; remove it (each generation resumes "
    "from the tracker)",
    "--override-ckpt-iteration": "rewrites the iteration on every resume; remove it",
    "--yaml-cfg": "makes Megatron ignore the command line, the appliance's flags included; "
    "put the arguments in your --megatron-args file instead",
}

# Our fault kinds as Megatron's injector names them (NVRx's shared_utils Fault enum):
# an asynchronous exception in the training thread, SIGKILL of the rank, and a thread
# that takes the GIL and never lets go, so the step hangs until NVRx's section timeout.
MEGATRON_FAULT_TYPES = {"exception": "async_exc", "exit": "sigkill", "hang": "lock_gil"}


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


def refusal(megatron_flag: str) -> str | None:
    """Why a Megatron flag may not be in a user's arguments and what to use instead;
    None: the user may set it."""
    for table in (OWNED_MEGATRON_FLAGS, RESUME_BREAKING_FLAGS):
        if megatron_flag in table:
            return table[megatron_flag]
    for prefix, why in OWNED_MEGATRON_PREFIXES.items():
        if megatron_flag.startswith(prefix):
            return why
    return None


def refused(args: list[str]) -> list[str]:
    """One line per refused flag in the user's arguments: the flag, why, and the fix."""
    return [f"{f} {why}" for f in flags_in(args) if (why := refusal(f)) is not None]


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
