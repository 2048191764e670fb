"""The sbatch arguments a user adds after `--`: any option except those the chain is built on.

Pure. Each argument must be an option with its value attached (--qos=high, -pgpu): a
separate word would be taken by sbatch as the batch script, or as the value of an
option we cannot see. sbatch reads long options with getopt_long, which also accepts
any unambiguous prefix (--arr=0-63 is --array), so a prefix of an owned name counts.
"""

from __future__ import annotations

from nvrx_appliance.settings.chain import control_character

# The options that make a generation a singleton job array of this chain (render.py).
OWNED_LONG = ("array", "dependency", "requeue", "no-requeue", "job-name", "wrap")
OWNED_SHORT = {"a": "array", "d": "dependency", "J": "job-name"}
# sbatch's short options that take no value: in a cluster like -vvJx the next letter
# is an option too, where after any other letter the rest is that option's value.
_SHORT_FLAGS = set("hHkOQsuvVW")


def problem(extra: tuple[str, ...]) -> str | None:
    """Why these extra arguments cannot go to sbatch, in one line; None when they can."""
    for arg in extra:
        found = control_character(arg)
        if found:
            return f"{arg!r} contains the control character {found!r}; remove it"
        owned = _owned(arg)
        if owned:
            return (
                f"{arg} would change --{owned}, which the chain sets itself (a singleton job "
                "array of one script); drop it"
            )
        if not arg.startswith("-") or arg in ("-", "--"):
            return (
                f"unexpected argument {arg!r}; give every extra sbatch option with its value "
                "attached, e.g. `-- --qos=high -pgpu`"
            )
    return None


def _owned(arg: str) -> str | None:
    if arg.startswith("--"):
        name = arg[2:].split("=", 1)[0]
        return next((o for o in OWNED_LONG if name and o.startswith(name)), None)
    if arg.startswith("-"):
        for letter in arg[1:]:
            if letter in OWNED_SHORT:
                return OWNED_SHORT[letter]
            if letter not in _SHORT_FLAGS:
                return None  # the rest of the word is this option's value
    return None
