"""A build is a list of steps: the front ends list them and build.py runs them. Pure."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Step:
    title: str  # what a person watching the build reads
    argv: tuple[str, ...]
    # The process's whole environment when set (None: inherit). Kept out of argv so
    # that nothing in it (an index URL with a token, a proxy password) reaches a log.
    env: dict[str, str] | None = field(default=None, compare=False)

    def command_line(self) -> str:
        return shlex.join(self.argv)


def step(title: str, *argv: str, env: dict[str, str] | None = None) -> Step:
    return Step(title, tuple(argv), env)
