"""6. Watcher pass: one nvrx-watch pass, cold and warm, at 10,000 cycle-info files and
1,000 array tasks. Delegated to bench/watch_pass.py (the watcher's own benchmark,
which owns the synthetic run and says how its Slurm part is replayed)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.harness import BenchError, Harness
from bench.report import Metric, Result

NAME = "watcher"
TITLE = "6 watcher pass"
SCRIPT = Path(__file__).with_name("watch_pass.py")
TARGETS_S = {"cold": 0.5, "warm": 0.1, "warm_one_file_changed": 0.1}  # issue 7
LABELS = {
    "cold": "cold pass (no cycle cache)",
    "warm": "warm pass (cache, nothing changed)",
    "warm_one_file_changed": "warm pass, one cycle-info file changed",
}


def _figures(found: dict) -> dict:
    return {
        "n": found["runs"],
        "median_s": found["median_s"],
        "min_s": found["min_s"],
        "max_s": found["max_s"],
    }


def collect(h: Harness | None, repeat: int, result: Result) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-watcher-") as scratch:
        out = Path(scratch) / "watch_pass.json"
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--runs", str(max(repeat, 5)), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            raise BenchError(f"bench/watch_pass.py exited {done.returncode}: {done.stderr[-800:]}")
        report = json.loads(out.read_text())
    result.samples.append(report)
    result.notes += [
        f"{report['cycle_info_files']} cycle-info files, {report['array_tasks']} array tasks",
        f"Slurm: {report['slurm']}",
    ]


def finish(result: Result, floor: float | None) -> None:
    if not result.samples:
        return
    found = result.samples[0]["results"]
    result.metrics = [
        Metric(LABELS[key], [], target_s=TARGETS_S[key], given=_figures(found[key]))
        for key in LABELS
    ]
