"""What every workload runs under: the interpreter. Pure: no I/O."""

from __future__ import annotations

import sys


def interpreter(python: str | None) -> list[str]:
    # The workload runs under the interpreter that runs the entrypoint (the image's, or
    # the spec's python on bare metal), unbuffered so its log lines reach the per-cycle
    # log as they happen. ft_launcher then needs --no-python.
    return [python or sys.executable, "-u"]
