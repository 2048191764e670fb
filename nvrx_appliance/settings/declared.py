"""What one setting's value may be by its own declaration: its type, bounds, choices or
pattern (ChainSpec's fields declare them through chain._opt). A value reaches a ChainSpec
from a flag, the environment, the config file or a run.json read back, and only the
first three are typed on the way in; run.json's JSON can hold anything, so the type is
judged here too, before any rule that does arithmetic with the value.

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

# No count or time this tool hands to Slurm, NVRx or a sleep is larger; a setting that
# needs more declares its own `largest` (or a maximum, which then says the range). It also keeps a 5,000-digit integer in run.json
# from reaching arithmetic that Python refuses to print.
LARGEST = 2**31 - 1

_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "str|None": "a string (or unset)",
    "list[str]": "a list of strings",
}


def kind(field: dataclasses.Field) -> str:
    """The declared type: int, float, bool, str, str|None or list[str]."""
    return str(field.type).replace(" ", "")


def shown(value: Any) -> str:
    """A value as run.json spells it (true, null, NaN), shortened when it is huge."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        # str() of an integer of more than 4,300 digits raises; the bit length does not.
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def type_problem(field: dataclasses.Field, value: Any) -> str | None:
    """Why the value is not of the field's declared type, or None."""
    declared = kind(field)
    # bool is an int in Python, but `true` for a count is a mistake, not 1.
    fits = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "str|None": value is None or isinstance(value, str),
        "list[str]": isinstance(value, list) and all(isinstance(v, str) for v in value),
    }.get(declared, True)
    if not fits:
        return f"{shown(value)} is not {_WORDS[declared]}"
    # An int is finite, and math.isfinite of one beyond a float's range raises.
    if declared == "float" and isinstance(value, float) and not math.isfinite(value):
        return f"{shown(value)} is not a finite number"
    return None


# Python reads an integer of at most this many digits (sys.get_int_max_str_digits).
READABLE_DIGITS = 4300


def too_long_integer(digits: int) -> int:
    """An integer of `digits` digits, made without reading them: Python refuses to read
    one of more than 4,300 digits, but the bounds can still judge one, and shown() words it."""
    return 10 ** (digits - 1)


def _string_problem(field: dataclasses.Field, value: str | None, hint: str) -> str | None:
    meta = field.metadata
    # An empty default makes empty a valid value: unset, the default decides.
    if value in ("", None) and field.default in ("", None):
        return None
    choices, pattern = meta.get("choices"), meta.get("pattern")
    if choices is not None and value not in choices:
        label = field.name.replace("_", " ")
        return f"unknown {label} {value!r}; choose one of {', '.join(choices)}{hint}"
    if pattern is not None and not pattern[0].fullmatch(value or ""):
        return f"{value!r} {pattern[1]}{hint}"
    return None


def problem(field: dataclasses.Field, value: Any) -> str | None:
    """What is wrong with one setting's value by its own declaration, or None."""
    wrong_type = type_problem(field, value)
    if wrong_type:
        return wrong_type
    meta = field.metadata
    hint = f"; {meta['hint']}" if meta.get("hint") else ""
    if isinstance(value, str) or value is None:
        return _string_problem(field, value, hint)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    low, unit = meta.get("minimum"), meta.get("unit", "")
    high = meta.get("maximum")
    units = f" {unit}" if unit else ""
    if low is not None and high is not None and not low <= value <= high:
        return f"must be between {low:g} and {high:g}{units} (got {shown(value)}){hint}"
    if low is not None and value < low:
        if low == 0:
            rule = "cannot be negative"
        elif low == 1 and unit:
            rule = f"must be a positive number of {unit}"
        else:
            rule = f"must be at least {low:g}"
        return f"{rule} (got {shown(value)}){hint}"
    largest = meta.get("largest", LARGEST)
    if high is None and value > largest:
        return f"must be at most {largest}{units} (got {shown(value)}){hint}"
    return None
