"""What the workload says about its own training, per generation and NVRx cycle: when
training began, the iterations it logged, its checkpoint saves, faults, the end. Pure.

Two sources give the same record:
- the progress log (JSON lines: the cpu trainer's, and a script's that keeps the
  format; docs/workload-contract.md), whose events name their generation and cycle;
- Megatron-LM's own lines in a per-cycle log (`logs/<name>_<array>_cycle<N>.log`), whose
  file name says which generation and cycle wrote them. Megatron stamps its lines with
  the node's local time and no zone; they are read as this host's local time, the same
  as sacct's.

Lines arrive while the writer is still writing: a torn or foreign line is skipped. Both
are read as they grow: a record is fed the lines appended since the last pass and keeps
only what it parsed, never the lines (a week of Megatron output is gigabytes).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from nvrx_appliance.observe.collective_waits import RankWaits
from nvrx_appliance.observe.times import parse_time

PROGRESS_LOG = "progress log"
MEGATRON_LOG = "Megatron's log lines"


@dataclass(frozen=True)
class Save:
    """One checkpoint save: training stood still from `began` to `ended` (its synchronous
    part); `committed` is when the tracker named it (None: it never did)."""

    iteration: int
    began: float
    ended: float
    committed: float | None


@dataclass(frozen=True)
class OwnSteps:
    """One logged interval's own step times: per node, the compute of a step without the
    wait for its peers (workloads/own_step.py), the mean over the interval's `steps`.
    From Megatron's straggler report the keys are ranks ("rank 3") and hold only the
    slowest and the fastest."""

    time: float
    iteration: int
    steps: int
    seconds: dict[str, float]


@dataclass
class CycleWork:
    """The workload's record of one NVRx cycle of one generation."""

    generation: str
    cycle: int
    source: str  # PROGRESS_LOG or MEGATRON_LOG
    started: float | None = None  # training began, after any checkpoint load
    start_iteration: int | None = None  # where it began (0: from scratch)
    # The workload's start-up, in order: (the step that ended, when); the last ends at
    # `started`.
    setup: list[tuple[str, float]] = field(default_factory=list)
    steps: list[tuple[float, int]] = field(default_factory=list)  # (time, iteration) logged
    step_seconds: list[float] = field(default_factory=list)  # measured time per iteration
    saves: list[Save] = field(default_factory=list)
    faults: list[tuple[float, str]] = field(default_factory=list)  # (time, what)
    finished: float | None = None  # training reached its end (not a failure)
    own_steps: list[OwnSteps] = field(default_factory=list)  # each node's own step time
    own_steps_by_rank: bool = False  # own_steps name ranks (Megatron's report), not nodes
    # each rank's time inside collectives (observe/collective_waits.py), from the
    # published stacks, whatever the workload
    waits: list[RankWaits] = field(default_factory=list)
    last_sign: float | None = None  # the last moment the workload showed life

    def seen(self, when: float) -> None:
        self.last_sign = when if self.last_sign is None else max(self.last_sign, when)

    @property
    def last_iteration(self) -> int | None:
        """The highest iteration this cycle is known to have trained."""
        found = [i for _, i in self.steps] + [s.iteration for s in self.saves]
        if self.start_iteration is not None:
            found.append(self.start_iteration)
        return max(found, default=None)

    @property
    def log_interval(self) -> int | None:
        """Iterations between logged steps (the most common gap), when known."""
        gaps = [b - a for (_, a), (_, b) in zip(self.steps[1:], self.steps[2:], strict=False)]
        gaps = [g for g in gaps if g > 0]
        return statistics.mode(gaps) if gaps else None


Key = tuple[str, int]  # (generation, cycle)


# --- the progress log ---------------------------------------------------------------------

# The cpu trainer's start event: when each step of its start-up ended, in order, and
# what a person calls the time up to it (a cycle's workers began when NVRx closed its
# rendezvous, so the first step runs from the cycle's start).
_SETUP_MARKS = (
    ("launched", "worker processes start"),
    ("imported", "import torch"),
    ("joined", "join the process group"),
    ("built", "build the model"),
)
CHECKPOINT_LOAD = "checkpoint load"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _iteration(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def from_progress_log(events: Iterable[dict[str, Any]]) -> dict[Key, CycleWork]:
    """Progress events -> one record per (generation, cycle); events that name no
    generation (a run outside Slurm) or carry no time are skipped."""
    record = ProgressRecord()
    for event in events:
        record.feed(event)
    return record.record()


class ProgressRecord:
    """The progress log's record, fed one event at a time as the log grows."""

    def __init__(self) -> None:
        self._found: dict[Key, CycleWork] = {}

    def feed(self, event: dict[str, Any]) -> None:
        generation, when = event.get("slurm_array_job_id"), _number(event.get("time"))
        cycle = _iteration(event.get("cycle", 0))
        if not isinstance(generation, str) or not generation or when is None or cycle is None:
            return
        key = (generation, cycle)
        work = self._found.setdefault(key, CycleWork(generation, cycle, PROGRESS_LOG))
        _progress_event(work, event, when)

    def record(self) -> dict[Key, CycleWork]:
        """The record so far, as copies: feeding more never changes what was returned."""
        out = {}
        for key, work in self._found.items():
            out[key] = _copy(work)
            out[key].step_seconds = _step_seconds(work)
        return out


def _copy(work: CycleWork) -> CycleWork:
    return dataclasses.replace(
        work, setup=list(work.setup), steps=list(work.steps),
        step_seconds=list(work.step_seconds), saves=list(work.saves), faults=list(work.faults),
        own_steps=list(work.own_steps), waits=list(work.waits),
    )  # fmt: skip


def _progress_event(work: CycleWork, event: dict[str, Any], when: float) -> None:
    kind, iteration = event.get("event"), _iteration(event.get("iteration"))
    work.seen(when)
    if kind == "start":
        work.started, work.start_iteration = when, iteration if iteration is not None else 0
        found = event.get("setup")
        setup: dict[str, Any] = found if isinstance(found, dict) else {}
        marks = [(label, _number(setup.get(key))) for key, label in _SETUP_MARKS]
        work.setup = [(label, at) for label, at in marks if at is not None]
        work.setup.append((CHECKPOINT_LOAD, when))
    elif kind == "step" and iteration is not None:
        work.steps.append((when, iteration))
        if (own := _own_steps(event, when, iteration)) is not None:
            work.own_steps.append(own)
    elif kind == "checkpoint" and iteration is not None:
        seconds = _number(event.get("seconds")) or 0.0
        # The event is written once the tracker names the checkpoint: committed.
        work.saves.append(Save(iteration, when - seconds, when, when))
    elif kind == "fault":
        work.faults.append((when, f"{event.get('kind', 'a')} fault on rank {event.get('rank')}"))
    elif kind == "done":
        work.finished = when


def _own_steps(event: dict[str, Any], when: float, iteration: int) -> OwnSteps | None:
    """A step event's own step times (the cpu trainer's `own_step_s`, `own_steps`)."""
    found, steps = event.get("own_step_s"), _iteration(event.get("own_steps"))
    if not isinstance(found, dict) or steps is None or steps < 1:
        return None
    seconds = {str(node): value for node, s in found.items() if (value := _number(s)) and value > 0}
    return OwnSteps(when, iteration, steps, seconds) if seconds else None


def _step_seconds(work: CycleWork) -> list[float]:
    """Seconds per iteration between consecutive logged steps, less the saves that
    happened in between (training stood still for them). One walk over the steps and
    the saves, both in time order: a long cycle has a million steps and thousands of saves."""
    out = []
    saves = sorted(work.saves, key=lambda s: s.ended)
    ends = [s.ended for s in saves]
    # Seconds saved up to (and including) each save's end, so a range sums in O(log n).
    saved = [0.0, *itertools.accumulate(s.ended - s.began for s in saves)]
    for (t0, i0), (t1, i1) in itertools.pairwise(work.steps):
        saving = saved[bisect.bisect_right(ends, t1)] - saved[bisect.bisect_right(ends, t0)]
        if i1 > i0 and t1 - t0 > saving:
            out.append((t1 - t0 - saving) / (i1 - i0))
    return out


# --- Megatron-LM's lines (megatron/training at the pinned release) -----------------------

_STAMP = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)\]"
# print_datetime(): "[after megatron is initialized] datetime: 2026-12-01 10:00:00.123456 "
_DATETIME = re.compile(r"\[([^\]]+)\] datetime: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)")
# training_log(): " [stamp] iteration      20/    1000 | ... elapsed time per iteration (ms): 812.3 |"
_ITERATION = re.compile(
    _STAMP + r" iteration\s+(\d+)/\s*\d+ \|.*?elapsed time per iteration \(ms\): ([\d.]+)"
)
_SAVING = re.compile(_STAMP + r" saving checkpoint at iteration\s+(\d+) ")
_SCHEDULED = re.compile(_STAMP + r" scheduled an async checkpoint save at iteration\s+(\d+)")
_SAVED = re.compile(_STAMP + r" successfully saved checkpoint from iteration\s+(\d+) ")
_LOADED = re.compile(r"successfully loaded checkpoint from .* at iteration (\d+)")
# megatron/core/fault_injector.py: "FAULT INJECTION: Rank 3 will inject fault X at <stamp>"
_FAULT = re.compile(
    r"FAULT INJECTION: Rank (\d+) will inject fault (\S+) at "
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)"
)
# StragglerDetector.report() (megatron/core/utils.py, `--log-straggler`), rank 0 every log
# interval: "[2026-12-01 10:00:00] | MnRtt/Rnk: 3453.08ms/8 | MxRtt/Rnk: 3468.20ms/0 | ..."
# (the forward step's time per iteration, the fastest and the slowest rank).
_RTT = re.compile(_STAMP + r" \| MnRtt/Rnk: ([\d.]+)ms/(\d+) \| MxRtt/Rnk: ([\d.]+)ms/(\d+)")
# What each print_datetime() mark before the first step closes.
_MEGATRON_SETUP = {
    "after megatron is initialized": "initialize Megatron",
    "after model, optimizer, and learning rate scheduler are built": (
        "model, optimizer and checkpoint load"
    ),
    "after dataloaders are built": "data loaders",
}
TRAINING_STARTS = "before the start of training step"
TRAINING_DONE = "after training is done"
# Cheap substrings a line must hold to be parsed at all: a week of Megatron output is
# mostly other lines.
_WORTH_PARSING = ("datetime:", "iteration", "FAULT INJECTION", "MnRtt/Rnk")


def megatron_line(line: str) -> bool:
    """Whether a line of a per-cycle log may be one this module reads."""
    return any(word in line for word in _WORTH_PARSING)


def from_megatron_log(lines: Iterable[str], generation: str, cycle: int) -> CycleWork | None:
    """One per-cycle log's Megatron lines -> the cycle's record; None when it holds none
    (not a Megatron run, or it died before printing any)."""
    record = MegatronRecord(generation, cycle)
    for line in lines:
        record.feed(line)
    return record.record()


class MegatronRecord:
    """One per-cycle log's record, fed a line at a time as the log grows; it keeps what
    it parsed, not the lines."""

    def __init__(self, generation: str, cycle: int) -> None:
        self._work = CycleWork(generation, cycle, MEGATRON_LOG)
        self._began: dict[int, float] = {}  # saves begun, by iteration
        self._async_ended: dict[int, float] = {}
        self._loaded = 0
        self._any_line = False

    def feed(self, line: str) -> None:
        if not megatron_line(line):
            return
        work = self._work
        if (found := _ITERATION.search(line)) and (at := parse_time(found[1])) is not None:
            work.steps.append((at, int(found[2])))
            work.step_seconds.append(float(found[3]) / 1000.0)
        elif (found := _SAVING.search(line)) and (at := parse_time(found[1])) is not None:
            self._began[int(found[2])] = at
        elif (found := _SCHEDULED.search(line)) and (at := parse_time(found[1])) is not None:
            self._async_ended[int(found[2])] = at
        elif (found := _SAVED.search(line)) and (at := parse_time(found[1])) is not None:
            iteration = int(found[2])
            start = self._began.get(iteration, at)
            work.saves.append(Save(iteration, start, self._async_ended.get(iteration, at), at))
        elif (found := _RTT.search(line)) and (at := parse_time(found[1])) is not None:
            self._rtt(at, found)
        elif found := _LOADED.search(line):
            self._loaded = int(found[1])
            return
        elif (found := _FAULT.search(line)) and (at := parse_time(found[3])) is not None:
            work.faults.append((at, f"{found[2]} fault on rank {found[1]}"))
        elif (found := _DATETIME.search(line)) and (at := parse_time(found[2])) is not None:
            _megatron_mark(work, found[1].strip(), at)
        else:
            return
        self._any_line = True
        work.seen(at)

    def _rtt(self, at: float, found: re.Match[str]) -> None:
        """A straggler report: its interval's steps are the iterations since the last
        one (the log interval), the iteration the last one logged."""
        work = self._work
        iteration = work.steps[-1][1] if work.steps else 0
        since = work.own_steps[-1].iteration if work.own_steps else None
        steps = iteration - since if since is not None else (work.log_interval or 1)
        fastest, slowest = f"rank {found[3]}", f"rank {found[5]}"
        seconds = {fastest: float(found[2]) / 1000.0, slowest: float(found[4]) / 1000.0}
        work.own_steps.append(OwnSteps(at, iteration, max(1, steps), seconds))
        work.own_steps_by_rank = True

    def record(self) -> CycleWork | None:
        """The record so far (a copy), or None while the log holds no Megatron line."""
        if not self._any_line:
            return None
        work = _copy(self._work)
        # A save whose tracker line never came (the run died first, or it is still
        # under way) still stood training still.
        committed = {s.iteration for s in work.saves}
        for iteration, start in self._began.items():
            if iteration not in committed:
                end = self._async_ended.get(iteration, start)
                work.saves.append(Save(iteration, start, end, None))
        work.saves.sort(key=lambda s: s.began)
        if work.started is not None:
            work.start_iteration = self._loaded
        return work


def _megatron_mark(work: CycleWork, name: str, at: float) -> None:
    if name in _MEGATRON_SETUP:
        work.setup.append((_MEGATRON_SETUP[name], at))
    elif name == TRAINING_STARTS:
        work.started = at
        work.setup.append(("data and the training loop", at))
    elif name == TRAINING_DONE:
        work.finished = at
