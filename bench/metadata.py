"""Metadata operations on the control directory, counted from strace's output. Pure.

`strace -f -qq -e trace=%file,openat -p PID -o FILE` writes one line per system call
that names a path; the lines that name the control directory are what the lease and
its watchers cost the shared file system's metadata server. A call that another thread
interrupts is printed twice (`... <unfinished ...>`, then `<... openat resumed>`): only
the first line holds the path, so every call counts once.
"""

from __future__ import annotations

import re
from collections import Counter

# "12345 openat(AT_FDCWD, "/w/nvrx/7/control/closed", O_RDONLY...) = -1 ENOENT (...)"
# "[pid 12345] newfstatat(AT_FDCWD, "/w/nvrx/7/control/task0.lease", ...) = 0"
_CALL = re.compile(r"^(?:\[pid\s+\d+\]\s+|\d+\s+)?(\w+)\(")


def calls(trace: str, directory: str) -> Counter[str]:
    """System calls by name among the lines that name `directory` or a file in it."""
    inside, itself = f'"{directory.rstrip("/")}/', f'"{directory.rstrip("/")}"'
    counted: Counter[str] = Counter()
    for line in trace.splitlines():
        if inside not in line and itself not in line:
            continue
        found = _CALL.match(line)
        if found:
            counted[found.group(1)] += 1
    return counted


def per_second(counted: Counter[str], seconds: float) -> dict[str, float]:
    """Each call's rate, and "total"."""
    if seconds <= 0:
        raise ValueError(f"a trace of {seconds} s has no rate")
    rates = {name: n / seconds for name, n in sorted(counted.items())}
    rates["total"] = sum(counted.values()) / seconds
    return rates


def naming(trace: str, path: str) -> int:
    """Calls that name exactly this file."""
    return sum(1 for line in trace.splitlines() if f'"{path}"' in line)
