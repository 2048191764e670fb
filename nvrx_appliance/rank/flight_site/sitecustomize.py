"""The flight-recorder watch, run inside every rank's workload (docs/hangs.md).

The guard cannot call into the workload, and a user's script starts no thread of ours;
but Python imports `sitecustomize` at start-up from the first directory of the path that
has one. The guard puts this file's directory first on the workload's PYTHONPATH (with
the variables below), so every workload (the built-in trainer, Megatron, a user's
script) gets one daemon thread that:

- sleeps until torch.distributed is initialised (a workload that never initialises it
  pays a dictionary look-up a second);
- then asks PyTorch's flight recorders for their process groups' status each second
  (`_dump_fr_trace_json(includeCollectives=False, onlyActive=True)`, and NCCL's
  `_dump_nccl_trace_json` likewise where the build has it: the last collective each
  group enqueued and completed, a few microseconds, no entries);
- when one collective has stood enqueued and not completed for NVRX_APPLIANCE_FLIGHT_STALL_S,
  writes the recorder's full dump once, owner-only, to
  NVRX_APPLIANCE_FLIGHT_DIR/<node>.rank<R>.json, where the hang judgement reads it; and
  removes that file when the collective completes after all (the stall was not a hang).

It also measures the rank's share of time inside collectives (docs/stragglers.md): ten
times a second it asks the same status whether a collective is enqueued and not
completed, and every stack-sampling period writes its cumulative counts, by its own
clock, owner-only, to the node-local directory in NVRX_APPLIANCE_FLIGHT_WAITS
(`<node>.rank<R>.json`), which the node's publisher carries in its one file per node.

A rank that is stopped or stuck in the kernel writes nothing; its peers' dumps say whom
they wait for. Nothing here changes what the workload does: the thread only reads the
recorder, every error is swallowed and said once on stderr, and the sitecustomize this
one shadows (a distribution's or a site's) is run after it, as Python would have run it.
Standard library only: the workload's Python need not have this package installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from typing import Any

DIR_ENV = "NVRX_APPLIANCE_FLIGHT_DIR"
STALL_ENV = "NVRX_APPLIANCE_FLIGHT_STALL_S"
WHO_ENV = "NVRX_APPLIANCE_FLIGHT_WHO"  # {"generation", "cycle"} as JSON
WAITS_ENV = "NVRX_APPLIANCE_FLIGHT_WAITS"  # {"dir", "period", "generation"} as JSON
TICK_S = 0.1  # the status costs microseconds (bench/flight_watch.py): ten times a second
LOOK_TICKS = 10  # a stall is looked for each second, far below any step timeout
# A poll that comes this long after the last one follows a stop of the whole process
# (SIGSTOP, a descheduled node): it sees the state the rank was stopped in, most often
# inside a collective, not a share of the time it ran, so it is not counted.
GAP_S = 3 * TICK_S
KEEP_S = 120.0  # the figures' history kept: four times the late-node rule's window
KEEP_ENTRIES = 256  # the newest entries kept in a dump (2,000 are ~1 MB of JSON)
VERSION = 1
# NCCL's collectives go to their own recorder (`_dump_nccl_trace_json`, CUDA builds only),
# gloo's and the CPU's to the generic one; both are read where present.
RECORDERS = ("_dump_nccl_trace_json", "_dump_fr_trace_json")


def _say(words: str) -> None:
    try:
        sys.stderr.write(f"nvrx-flight-recorder: {words}\n")
        sys.stderr.flush()
    except Exception:  # a closed stderr must not end the workload
        pass


def _pending(status: dict) -> dict[str, int]:
    """Each process group's collective enqueued and not yet completed: {pg id: seq}."""
    found = {}
    for pg, counts in status.items():
        enqueued = int(counts.get("last_enqueued_collective", -1))
        if enqueued > int(counts.get("last_completed_collective", -1)):
            found[str(pg)] = enqueued
    return found


class _Watch:
    def __init__(self, directory: str, stall_s: float, who: dict):
        self.directory, self.stall_s, self.who = directory, stall_s, who
        # each pending collective, (recorder, pg, seq): when first seen
        self.since: dict[tuple[str, str, int], float] = {}
        self.written: tuple[str, str, int] | None = None  # the stall whose dump stands

        self.waits: _Waits | None = None

    def run(self) -> None:
        tick = 0
        last = time.monotonic()
        while True:
            time.sleep(TICK_S)
            now = time.monotonic()
            gap, last = now - last, now
            # Read only what the workload imported, and only once torch.distributed is
            # whole: its module is in sys.modules while torch is still importing it.
            dist: Any = sys.modules.get("torch.distributed")
            if getattr(dist, "is_initialized", None) is None or not dist.is_initialized():
                continue
            c10d = sys.modules["torch._C._distributed_c10d"]
            found = {n: getattr(c10d, n) for n in RECORDERS if hasattr(c10d, n)}
            pending = self.pending(found)
            if self.waits is not None:
                self.waits.count(bool(pending), dist.get_rank(), gap)
            tick += 1
            if tick % LOOK_TICKS == 0:
                self.look(found, dist.get_rank(), pending)

    @staticmethod
    def pending(recorders: dict) -> set[tuple[str, str, int]]:
        found = set()
        for name, dump in recorders.items():
            status = json.loads(dump(includeCollectives=False, onlyActive=True))
            found |= {
                (name, pg, seq) for pg, seq in _pending(status.get("pg_status") or {}).items()
            }
        return found

    def look(self, recorders: dict, rank: int, pending: set | None = None) -> None:
        now = time.time()
        if pending is None:
            pending = self.pending(recorders)
        self.since = {key: self.since.get(key, now) for key in pending}
        if self.written is not None and self.written not in pending:
            self.forget(rank)  # completed after all: a slow collective, not a hang
        stalled = [key for key, since in self.since.items() if now - since >= self.stall_s]
        if stalled and self.written is None:
            key = min(stalled, key=lambda k: self.since[k])
            trace = json.loads(recorders[key[0]](includeCollectives=True, onlyActive=False))
            self.write(trace, key, rank)
            self.written = key

    def path(self, rank: int) -> str:
        return os.path.join(self.directory, f"{_node()}.rank{rank}.json")

    def write(self, trace: dict, key: tuple[str, str, int], rank: int) -> None:
        trace["entries"] = (trace.get("entries") or [])[-KEEP_ENTRIES:]
        node = _node()
        record = {
            **self.who, "version": VERSION, "rank": rank, "node": node, "epoch": time.time(),
            "recorder": key[0], "stalled": {"pg": key[1], "seq": key[2], "since": self.since[key]},
            "trace": trace,
        }  # fmt: skip
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        path = self.path(rank)
        tmp = f"{os.path.dirname(path)}/.{os.path.basename(path)}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(record, out)
        os.replace(tmp, path)

    def forget(self, rank: int) -> None:
        self.written = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(rank))


class _Waits:
    """The rank's polls, and those that found a collective of it enqueued and not
    completed, cumulative, written every period by its own clock."""

    def __init__(self, directory: str, period: float, generation: str, cycle: int):
        self.directory, self.period = directory, max(0.5, period)
        self.generation, self.cycle = generation, cycle
        self.polls = self.waiting = 0
        self.history: list[list[float]] = []
        self.next_write = 0.0
        self.keep = int(KEEP_S / self.period) + 2

    def count(self, waiting: bool, rank: int, gap: float) -> None:
        if gap <= GAP_S:
            self.polls += 1
            self.waiting += waiting
        now = time.time()
        if now < self.next_write:
            return
        self.next_write = now + self.period
        self.history.append([now, self.polls, self.waiting])
        if len(self.history) > self.keep:  # the first stays: the cycle's whole cost
            del self.history[1]
        try:
            self.write(rank)
        except OSError as exc:  # the stall watch goes on without the figures
            _say(f"not measuring the time inside collectives: {exc}")
            self.next_write = float("inf")

    def write(self, rank: int) -> None:
        node = _node()
        record = {"generation": self.generation, "cycle": self.cycle, "node": node,
                  "rank": rank, "history": self.history}  # fmt: skip
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        path = os.path.join(self.directory, f"{node}.rank{rank}.json")
        tmp = f"{os.path.dirname(path)}/.{os.path.basename(path)}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(record, out)
        os.replace(tmp, path)


def _node() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".", 1)[0]


def _run(watch: _Watch) -> None:
    try:
        watch.run()
    except Exception as exc:  # never the workload's failure
        _say(f"the flight-recorder watch stopped ({exc!r}); a hang here is judged from stacks")


def _start() -> None:
    directory = os.environ.get(DIR_ENV)
    if not directory:
        return
    try:
        who = json.loads(os.environ.get(WHO_ENV) or "{}")
        watch = _Watch(directory, float(os.environ.get(STALL_ENV) or 10), who)
        waits = json.loads(os.environ.get(WAITS_ENV) or "null")
        if isinstance(waits, dict):
            watch.waits = _Waits(str(waits["dir"]), float(waits["period"]),
                                 str(waits["generation"]), int(who.get("cycle") or 0))  # fmt: skip
    except (ValueError, TypeError, KeyError) as exc:
        _say(f"not watching the flight recorder: {exc}")
        return
    threading.Thread(target=_run, args=(watch,), name="nvrx-flight-recorder", daemon=True).start()


def _chain() -> None:
    """Run the sitecustomize this one shadows, if any, as Python would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if __name__ == "sitecustomize":  # imported by name elsewhere (the guard), it does nothing
    try:
        _start()
    except Exception as exc:  # never the workload's failure
        _say(f"not watching the flight recorder: {exc!r}")
    _chain()
