"""Benchmark: one nvrx-watch pass over a large run, cold and warm.

The run: 10,000 NVRx cycle-info files (100 generations x 100 cycles, in the
appliance's work-dir layout, written in NVRx's own JSON format) and 1,000 array tasks
in the queue (10 generations x 100 tasks). Cold: no cycle cache, every file is parsed.
Warm: the next pass, which re-reads only what changed (nothing here, one file in the
"warm + 1 changed" case). Each figure is over >= 5 runs: median, min, max.

Slurm part: there is no 1,000-task cluster here, so the squeue and sacct output for
1,000 tasks is synthesized in the exact format recorded from the local cluster
(tests/unit/fixtures/watch/slurm) and fed to the same platform code and parsers; only
the subprocess is replaced. The output says so.

Targets: a cold pass <= 0.5 s, a warm pass <= 0.1 s.

Usage: python bench/watch_pass.py [--runs N] [--out bench/results/watch_pass.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from nvrx_appliance.layout import Layout
from nvrx_appliance.watch.config import Settings, Thresholds
from nvrx_appliance.watch.findings import Run
from nvrx_appliance.watch.platform import SlurmPlatform
from nvrx_appliance.watch.target import cycle_glob
from nvrx_appliance.watch.watcher import Watcher

GENERATIONS_ON_DISK = 100
CYCLES_PER_GENERATION = 100
QUEUED_GENERATIONS = 10
TASKS_PER_GENERATION = 100
TARGET_COLD_S = 0.5
TARGET_WARM_S = 0.1
FIRST_ARRAY_ID = 5000
START = 1_790_000_000.0


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + ".000000Z"


def cycle_info(job: int, number: int, start: float) -> str:
    """The document NVRx's CycleInfoWriter writes (field set and order as recorded)."""
    return json.dumps(
        {
            "job_id": str(job),
            "cycle_number": number,
            "cycle_start_time": iso(start),
            "cycle_end_time": iso(start + 300),
            "active_nodes": f"node[{number % 50 + 1}-{number % 50 + 64}]",
            "generation": "1",
            "active_ranks": "0-511",
            "attempt_index": 0,
            "cycle_log_file": f"/shared/run/logs/chain_{job}_cycle{number}.log",
            "standby_nodes": "node[200-201]",
        },
        indent=2,
    )


def write_run(work: Path) -> Path:
    layout = Layout(work)
    for g in range(GENERATIONS_ON_DISK):
        job = FIRST_ARRAY_ID + g
        directory = layout.cycle_infos(job)
        directory.mkdir(parents=True)
        for n in range(CYCLES_PER_GENERATION):
            start = START + (g * CYCLES_PER_GENERATION + n) * 400
            (directory / f"cycle_info.{job}.0.{n}").write_text(cycle_info(job, n, start))
        os.symlink(
            f"cycle_info.{job}.0.{CYCLES_PER_GENERATION - 1}",
            directory / f"cycle_info.{job}.current",
        )
    layout.tracker.parent.mkdir(parents=True)
    layout.tracker.write_text("123400\n")
    return work


def squeue_text() -> str:
    """1,000 tasks: the newest generation running (task 0 included), the rest pending."""
    lines = []
    for g in range(QUEUED_GENERATIONS):
        array = FIRST_ARRAY_ID + GENERATIONS_ON_DISK + g
        for t in range(TASKS_PER_GENERATION):
            running = g == 0 and t < 64
            state = "RUNNING" if running else "PENDING"
            node = f"node{t + 1}" if running else ""
            lines.append(f"{array}|{t}|{state}|alice|2026-11-30T18:19:14|{node}")
    return "\n".join(lines) + "\n"


def sacct_text() -> str:
    """Every task of the generations that ended, as `sacct -X -P` prints them."""
    lines = []
    for g in range(GENERATIONS_ON_DISK):
        array = FIRST_ARRAY_ID + g
        for t in range(TASKS_PER_GENERATION // 10):
            lines.append(f"{array}_{t}|FAILED|1:0|2026-11-30T18:19:20")
    return "\n".join(lines) + "\n"


class Recorded:
    def __init__(self) -> None:
        self.outputs = {"squeue": squeue_text(), "sacct": sacct_text()}

    def __call__(self, argv: Sequence[str], timeout: float) -> str:
        return self.outputs[argv[0]]


def watcher(work: Path, state_dir: Path) -> Watcher:
    layout = Layout(work)
    run = Run(
        job_name="chain",
        owner="alice",
        work_dir=str(work),
        cycle_glob=cycle_glob(layout),
        tracker=str(layout.tracker),
        max_restarts=200,
        train_tasks=60,
    )
    settings = Settings(
        state_file=str(state_dir / "state.json"), metrics_file=str(state_dir / "nvrx.prom")
    )
    logger = logging.getLogger("bench.watch_pass")
    logger.handlers = [logging.NullHandler()]
    logger.propagate = False
    return Watcher(
        run=run,
        platform=SlurmPlatform(run=Recorded()),
        thresholds=Thresholds(),
        settings=settings,
        caller="alice",
        logger=logger,
    )


def timed(fn) -> tuple[float, object]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def figures(samples: list[float]) -> dict[str, float]:
    return {
        "median_s": statistics.median(samples),
        "min_s": min(samples),
        "max_s": max(samples),
        "runs": len(samples),
    }


def close_cycle(work: Path, i: int) -> None:
    """Rewrite one cycle-info file as NVRx records a cycle's end: temp file + rename."""
    closed = Layout(work).cycle_infos(FIRST_ARRAY_ID) / f"cycle_info.{FIRST_ARRAY_ID}.0.0"
    tmp = closed.with_name(closed.name + ".tmp")
    tmp.write_text(cycle_info(FIRST_ARRAY_ID, 0, START + i + 1))
    os.replace(tmp, closed)


def measure(work: Path, scratch: Path, runs: int) -> dict[str, dict]:
    cold, warm, touched = [], [], []
    reads = {}
    for i in range(runs):
        state = scratch / f"state-{i}"
        # Cold: a new process's first pass (fresh watcher, no cycle cache on disk).
        first = watcher(work, state)
        seconds, check = timed(first.pass_once)
        cold.append(seconds)
        reads["cold"] = first.last_scan.parsed
        # Warm: the next pass of a new process (cron), reading the cache it left.
        second = watcher(work, state)
        seconds, _ = timed(second.pass_once)
        warm.append(seconds)
        # Warm with one cycle-info file changed, as NVRx closes a cycle.
        close_cycle(work, i)
        third = watcher(work, state)
        seconds, _ = timed(third.pass_once)
        touched.append(seconds)
        reads["warm_one_file_changed"] = third.last_scan.parsed
    assert reads == {
        "cold": GENERATIONS_ON_DISK * CYCLES_PER_GENERATION,
        "warm_one_file_changed": 1,
    }, reads
    assert len(check.snapshot.cycles) == GENERATIONS_ON_DISK * CYCLES_PER_GENERATION
    tasks = sum(len(g.tasks) for g in check.snapshot.generations)
    assert tasks == QUEUED_GENERATIONS * TASKS_PER_GENERATION
    return {
        "cold": figures(cold),
        "warm": figures(warm),
        "warm_one_file_changed": figures(touched),
        "observed": {
            "cycles": len(check.snapshot.cycles),
            "tasks": tasks,
            "findings": len(check.findings),
            "files_parsed": reads,
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "watch_pass.json"))
    args = parser.parse_args()
    if args.runs < 5:
        parser.error("--runs: at least 5, so that a median means something")
    with tempfile.TemporaryDirectory(prefix="nvrx-watch-bench-") as scratch:
        work = write_run(Path(scratch) / "work")
        results = measure(work, Path(scratch), args.runs)
    report = {
        "benchmark": "nvrx-watch one pass",
        "cycle_info_files": GENERATIONS_ON_DISK * CYCLES_PER_GENERATION,
        "array_tasks": QUEUED_GENERATIONS * TASKS_PER_GENERATION,
        "slurm": "recorded-format squeue/sacct output for 1,000 tasks, replayed through the same "
        "platform code and parsers (no 1,000-task cluster here)",
        "targets": {"cold_s": TARGET_COLD_S, "warm_s": TARGET_WARM_S},
        "results": results,
        "machine": {
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(
        f"nvrx-watch pass: {report['cycle_info_files']} cycle-info files, {report['array_tasks']} array tasks"
    )
    print(f"Slurm: {report['slurm']}")
    for name, target in (
        ("cold", TARGET_COLD_S),
        ("warm", TARGET_WARM_S),
        ("warm_one_file_changed", TARGET_WARM_S),
    ):
        f = results[name]
        verdict = "ok" if f["median_s"] <= target else "OVER TARGET"
        print(
            f"  {name:22s} median {f['median_s'] * 1000:7.1f} ms  min {f['min_s'] * 1000:7.1f}  "
            f"max {f['max_s'] * 1000:7.1f}  ({f['runs']} runs; target {target * 1000:.0f} ms: {verdict})"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
