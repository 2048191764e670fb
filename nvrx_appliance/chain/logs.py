"""`nvrx-appliance logs`: which of a chain's log files a person asked for, shown or followed.

Every file name comes from the work dir's Layout (manifest.py). A generation is known by
its array job id from what the work dir itself records (the ids submit queued, the
ledger, the per-generation NVRx directories), so `logs` works without Slurm.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from nvrx_appliance.layout import Layout
from nvrx_appliance.observe import workdir

# How often --follow looks for new output and for a newer generation's file.
FOLLOW_POLL_S = 0.5


@dataclass(frozen=True)
class Which:
    """One kind of log: a task's batch log, an NVRx cycle's application log, or
    ft_launcher's own log."""

    task: int = 0
    cycle: int | None = None
    launcher: bool = False

    def path(self, layout: Layout, job_name: str, array_job_id: str) -> Path:
        if self.launcher:
            return layout.launcher_log(array_job_id)
        if self.cycle is not None:
            return layout.app_log(job_name, array_job_id, self.cycle)
        return layout.batch_log(job_name, array_job_id, self.task)

    def describe(self) -> str:
        if self.launcher:
            return "ft_launcher's log"
        if self.cycle is not None:
            return f"application log of NVRx cycle {self.cycle}"
        return f"task {self.task}'s batch log"


def generations(layout: Layout) -> list[str]:
    """Array job ids of the chain's generations, oldest first."""
    ids = set(workdir.submitted_ids(layout))
    ids |= {str(e["array_job_id"]) for e in workdir.ledger(layout)}
    if layout.generations_root.is_dir():
        ids |= {p.name for p in layout.generations_root.iterdir() if p.name.isdigit()}
    return sorted(ids, key=lambda x: (len(x), x))


def pick(layout: Layout, job_name: str, which: Which, generation: str | None) -> tuple[str, Path]:
    """(generation, path): the one asked for, else the newest generation that has
    written this kind of log (the newest generation at all when none has yet)."""
    if generation is not None:
        return generation, which.path(layout, job_name, generation)
    known = generations(layout)
    for array_job_id in reversed(known):
        path = which.path(layout, job_name, array_job_id)
        if path.exists():
            return array_job_id, path
    if not known:
        raise LookupError(f"no generation of chain {job_name!r} is recorded in {layout.work_dir}")
    return known[-1], which.path(layout, job_name, known[-1])


def others(layout: Layout, job_name: str, array_job_id: str, array_size: int) -> list[str]:
    """The options that show this generation's other logs that exist, for a hint."""
    tasks = [t for t in range(array_size) if layout.batch_log(job_name, array_job_id, t).exists()]
    cycles: list[int] = []
    while layout.app_log(job_name, array_job_id, len(cycles)).exists():
        cycles.append(len(cycles))
    found = [f"--task {t}" for t in tasks]
    found += [f"--cycle {c}" for c in cycles]
    if layout.launcher_log(array_job_id).exists():
        found.append("--launcher")
    return found


def follow(
    choose: Callable[[], Path],
    out: TextIO,
    announce: Callable[[Path], None],
    *,
    poll_s: float = FOLLOW_POLL_S,
) -> None:
    """Print what is appended to the chosen file, moving on when `choose` names a newer
    file that exists (the next generation's), until interrupted."""
    current: Path | None = None
    handle: TextIO | None = None
    try:
        while True:
            wanted = choose()
            if wanted != current and wanted.exists():
                if handle is not None:
                    out.write(handle.read())
                    handle.close()
                announce(wanted)
                handle, current = wanted.open(errors="replace"), wanted
            chunk = handle.read() if handle is not None else ""
            if chunk:
                out.write(chunk)
                out.flush()
            else:
                time.sleep(poll_s)
    finally:
        if handle is not None:
            handle.close()
