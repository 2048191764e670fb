"""Task 0's node fails NVRx's health check -> the successor's first step; and the dying
path on its own (issue 30).

The commonest loss of task 0 on a GPU cluster (a GPU off the bus, an XID), as the demo
plays it: one chain of repeat+1 generations in handoff mode, where NVRx's GPU-failure
injector fails task 0's node at its cycle-1 rendezvous. For each generation: NVRx's
decision (task 0's line in ft_launcher's log), task 0's log server told to stop and done
(its own log), every task's end and the successor's start (Slurm), the successor's
restore and first step (the progress log).
"""

from __future__ import annotations

import datetime
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from bench import chains
from bench.extract import Incomplete
from bench.harness import Harness
from bench.report import Metric, Result, phase_metrics
from bench.timing import Mark, Task, generation_end, segments, task0
from nvrx_appliance.layout import Layout
from nvrx_appliance.node import launcher_end
from nvrx_appliance.observe.slurm_output import expand_nodelist

NAME = "healthcheck"
TITLE = "2d task 0 fails the health check"
# Issue 30: at most 1 s of the appliance's own time in the dying path. Measured as all
# that follows NVRx's last wait, which holds ft_launcher's and Slurm's part too.
DYING_TARGET_S = 1.0

# NVRx's own logs stamp lines "2026-12-03 07:34:05,746" in the node's local time.
_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
_TERM = re.compile(_STAMP + r" .*Received signal 15, initiating graceful shutdown")
_SERVED = re.compile(_STAMP + r" .*Server shutdown complete")
_DRAIN_TIMEOUT = re.compile(_STAMP + r" .*Graceful shutdown timeout \(")


def local(stamp: str) -> float:
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def first(pattern: re.Pattern[str], text: str, **groups: str) -> float | None:
    for found in pattern.finditer(text):
        if all(found[k] == v for k, v in groups.items()):
            return local(found[1])
    return None


@dataclass(frozen=True)
class Seen:
    launcher_log: str  # the dying generation's ft_launcher log
    server_log: str  # its task 0's gRPC log server's own log
    task0_host: str
    # The closed flag's last write: task 0's trap, once its entrypoint has exited
    # (task 0 wrote it first at NVRx's decision; the trap rewrites it with the code).
    trap_closed: float | None
    generation: Sequence[Task]
    successor: Sequence[Task]
    resumed: dict  # the successor's "start" event (after the restore)
    first_step: dict


_DECIDED = re.compile(_STAMP + r" .*?" + launcher_end.DECIDED.pattern)


def sample(seen: Seen) -> dict:
    decided = first(_DECIDED, seen.launcher_log, host=seen.task0_host)
    told, served = first(_TERM, seen.server_log), first(_SERVED, seen.server_log)
    ended = generation_end(seen.generation)
    zero = task0(seen.successor)
    started = zero.start if zero is not None else None
    needed = {
        "NVRx's decision line": decided, "the log server's TERM": told,
        "the log server's end": served, "the generation's end": ended,
        "the successor's start": started,
    }  # fmt: skip
    missing = [name for name, value in needed.items() if value is None]
    if missing:
        raise Incomplete(", ".join(missing))
    assert decided is not None and told is not None and served is not None
    assert ended is not None and started is not None
    marks = [
        Mark("decided", decided, "ft_launcher log"),
        Mark("log server told to stop", told, "gRPC server log",
             "NVRx: store-host grace (3.0 s) and launcher cleanup"),
        Mark("log server done", served, "gRPC server log", "NVRx: log server drain"),
        *([Mark("task 0's trap", seen.trap_closed, "closed flag mtime",
                 "ft_launcher's exit, task 0's entrypoint and srun ending")]
          if seen.trap_closed is not None and seen.trap_closed > served else []),
        Mark("generation's last task ends", ended[0], f"Slurm ({ended[1]})",
             "teardown, relay, Slurm's step end"),
        Mark("successor's task 0 starts", started, "Slurm", "scheduler (the floor's part)"),
        Mark("successor trains", seen.resumed["time"], "progress log",
             "successor's start-up and checkpoint restore"),
        Mark("first step", seen.first_step["time"], "progress log", "first step"),
    ]  # fmt: skip
    return {
        "generation": seen.generation[0].array_job_id if seen.generation else "",
        "decided_at": decided,
        "total_s": marks[-1].time - decided,
        "dying_s": ended[0] - decided,
        # What is left once NVRx's launcher has nothing more to wait for: its process's
        # exit, then ours (entrypoint, trap, teardown, relay) and Slurm's step end.
        "after_nvrx_waits_s": ended[0] - served,
        "drain_timed_out": first(_DRAIN_TIMEOUT, seen.server_log) is not None,
        "phases": dict(segments(marks)),
    }


def one(
    h: Harness, work, gen: str, successor: str, array_size: int = chains.ARRAY_SIZE,
    timeout: float = chains.START_TIMEOUT_S,
) -> dict:  # fmt: skip
    layout = Layout(work)
    resumed, step = h.wait_resumed(
        work, f"generation {successor}", timeout, slurm_array_job_id=successor
    )
    generation = h.wait_final([gen], 120, array_size)
    zero = task0(generation)
    return sample(
        Seen(
            launcher_log=_text(layout.launcher_log(gen)),
            # NVRx names its log server's own log after --ft-nvrx-logfile.
            server_log=_text(layout.nvrx_logs(gen) / "ft_launcher_grpc_root.log"),
            # Task 0's first node publishes and hosts the store: its launcher decides.
            task0_host=expand_nodelist(zero.node)[0] if zero is not None else "",
            trap_closed=h.mtime(layout.control_files(gen).closed),
            generation=generation,
            successor=h.wait_started(successor),
            resumed=resumed,
            first_step=step,
        )
    )


def _text(path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def collect(h: Harness, repeat: int, result: Result) -> None:
    work, name = h.workdir(NAME), h.job_name(NAME)
    ids = h.submit(work, name, *chains.FAST, *chains.SHAPE, "--mode", "handoff",
                   "--fault-delay", "5", "--depth", str(repeat + 1))  # fmt: skip
    result.notes.append(f"generations: {', '.join(ids)}")
    try:
        for gen, successor in itertools.pairwise(ids):
            try:
                result.samples.append(one(h, work, gen, successor))
            except Incomplete as exc:
                result.notes.append(f"sample {gen} -> {successor} dropped: {exc}")
            h.say(f"{NAME}: {len(result.samples)}/{repeat} samples")
    finally:
        h.drain(name)


def finish(result: Result, floor: float | None) -> None:
    samples = result.samples
    result.metrics = [
        Metric("NVRx's decision -> successor's first step", [s["total_s"] for s in samples]),
        *phase_metrics(samples),
        Metric("dying path: decision -> the generation's last task ends",
               [s["dying_s"] for s in samples]),
        Metric("of which after NVRx's waits (its log server done -> the last task ends)",
               [s["after_nvrx_waits_s"] for s in samples], target_s=DYING_TARGET_S, indent=True),
    ]  # fmt: skip
    timed_out = sum(s["drain_timed_out"] for s in samples)
    result.notes.append(
        f"samples where task 0's log server waited out its drain with a client connected: "
        f"{timed_out} of {len(samples)}"
    )
