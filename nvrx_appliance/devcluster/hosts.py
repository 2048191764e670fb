"""The cluster's names in /etc/hosts: one marked block, added and removed as a whole.

Pure: functions from the file's text to its new text. Every namespace shares the
machine's /etc/hosts, so this block is how node1 finds ctl and node2 finds node1.
"""

from __future__ import annotations

import re

BEGIN = "# >>> nvrx-appliance devcluster (removed by `nvrx-appliance cluster down`) >>>"
END = "# <<< nvrx-appliance devcluster <<<"


def block(entries: list[tuple[str, str]]) -> str:
    """entries: (address, name) pairs."""
    body = "".join(f"{address}\t{name}\n" for address, name in entries)
    return f"{BEGIN}\n{body}{END}\n"


# A line as `block` writes it: an address, a tab, one name.
_ENTRY = re.compile(r"^[0-9.]+\t[A-Za-z0-9-]+$")


def without_block(text: str) -> str:
    """The text with our block removed. A torn block (no END line, from a write that
    was cut short) ends at the first line we would not have written, so lines added
    after it by someone else survive."""
    kept, inside = [], False
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        if stripped == BEGIN:
            inside = True
        elif stripped == END:
            inside = False
        elif inside and _ENTRY.match(line.rstrip("\n")):
            pass
        else:
            inside = False
            kept.append(line)
    return "".join(kept)


def with_block(text: str, entries: list[tuple[str, str]]) -> str:
    rest = without_block(text)
    if rest and not rest.endswith("\n"):
        rest += "\n"
    return rest + block(entries)


def has_block(text: str, entries: list[tuple[str, str]]) -> bool:
    return block(entries) in text and text.count(BEGIN) == 1


def foreign_names(text: str, names: list[str]) -> list[str]:
    """Names the machine already defines outside our block: taking them would change
    what those names mean to the machine, so `up` refuses instead."""
    taken = set()
    for line in without_block(text).splitlines():
        fields = line.split("#", 1)[0].split()
        taken.update(fields[1:])
    return [name for name in names if name in taken]
