"""The progress log: structured events for the watcher, status and tests (SEAMS.md).

One JSON object per line, appended with a single write to a file opened O_APPEND, so
lines from several ranks (a faulting rank writes its own "fault") never interleave,
and a rank killed right after emitting has already handed its line to the kernel.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from nvrx_appliance.files import make_private_dirs


class ProgressLog:
    """`context` rides on every event (cycle, Slurm ids), so a reader of a chain-long log
    can tell which generation and which cycle wrote each line."""

    def __init__(self, path: Path | None, **context: Any) -> None:
        self._fd: int | None = None
        self._context = context
        if path is not None:
            make_private_dirs(path.parent)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def emit(self, event: str, **fields: Any) -> None:
        if self._fd is None:
            return
        record = {"event": event, **self._context, **fields, "time": round(time.time(), 3)}
        os.write(self._fd, (json.dumps(record) + "\n").encode())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
