"""The waits a healthy run reports: which cycles trained, and its longest save so far.

A rank's guard takes a blocking native dump of its workload only when the rank has stood
still longer than any wait the run itself reports, and (in the first cycle) after it
trained (rank/sampler.py). The evidence is the workload's progress log (the contract's
optional `checkpoint` events carry `seconds`). Read by every still rank every period,
that log cost the shared file system 256 kB per rank per period; so the node's publisher
reads the lines it gained once per period (node/stack_publisher.py) and keeps the
answer in the node-local directory (FILE), where the guards read it. A guard without a
publisher reads the log's tail itself, as before.

Pure but for `read`, which reads one small local file.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

FILE = "run_waits.json"  # in the node-local stacks directory


@dataclass
class RunWaits:
    """What the progress log said so far, of one generation."""

    trained: set[int] = field(default_factory=set)  # cycles with a step or checkpoint
    longest: float = 0.0  # the longest save the run reported (s), any cycle

    def add(self, lines: Iterable[bytes | str], array_job_id: str | None) -> None:
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if not isinstance(event, dict) or event.get("slurm_array_job_id") != array_job_id:
                continue
            if event.get("event") == "checkpoint":
                with contextlib.suppress(TypeError, ValueError):
                    self.longest = max(self.longest, float(event.get("seconds") or 0.0))
            if event.get("event") in ("step", "checkpoint") and isinstance(event.get("cycle"), int):
                self.trained.add(event["cycle"])

    def of(self, cycle: int) -> tuple[bool, float]:
        """(has this cycle trained, the longest save the run reported, s)."""
        return cycle in self.trained, self.longest

    def body(self, array_job_id: str) -> str:
        return json.dumps({"generation": array_job_id, "trained": sorted(self.trained),
                           "longest": self.longest}) + "\n"  # fmt: skip


def of_text(text: str, array_job_id: str | None, cycle: int) -> tuple[bool, float]:
    """(has this cycle trained, the longest save the run reported) from the log's text."""
    found = RunWaits()
    found.add(text.splitlines(), array_job_id)
    return found.of(cycle)


def read(local: Path, array_job_id: str | None, cycle: int) -> tuple[bool, float] | None:
    """What the node's publisher last found; None where it found nothing yet."""
    try:
        data = json.loads((local / FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("generation") != array_job_id:
        return None
    trained = {c for c in data.get("trained") or [] if isinstance(c, int)}
    longest = data.get("longest")
    return cycle in trained, float(longest) if isinstance(longest, (int, float)) else 0.0
