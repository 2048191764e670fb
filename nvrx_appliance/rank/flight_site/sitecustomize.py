"""The flight-recorder watch, run inside every rank's workload (docs/hangs.md).

The guard cannot call into the workload, and a user's script starts no thread of ours;
but Python imports `sitecustomize` at start-up from the first directory of the path that
has one. The guard puts this file's directory first on the workload's PYTHONPATH (with
the variables below), so every workload (the built-in trainer, Megatron, a user's
script) gets one daemon thread that:

- sleeps until torch.distributed is initialised (a workload that never initialises it
  pays a dictionary look-up a tick);
- reads PyTorch's flight recorders' process-group status (the last collective each
  group enqueued and completed) only while the process groups stand settled: torch 2.13
  builds that status from maps it reads without the recorder's lock
  (FlightRecorderDetail.hpp: getPgConfigJson, getPgStatusJson), which `new_group` and a
  group's first collective write into; so no read while any thread forms a group, while
  the set of groups changed since the last tick, or while a group's first collective
  happened since the last tick;
- when one collective has stood enqueued and not completed for NVRX_APPLIANCE_FLIGHT_STALL_S,
  writes once, owner-only, a summary of the recorder (its groups' status, the newest
  entries, the stalled groups' ranks) to NVRX_APPLIANCE_FLIGHT_DIR/<node>.rank<R>.json,
  which the guard names node-local where the node's publisher carries it (one shared
  file per node and period, node/stack_publisher.py); and removes it when the collective
  completes after all (the stall was not a hang).

It also measures the rank's share of time inside collectives (docs/stragglers.md): ten
times a second it asks the generic recorder (gloo's) whether a collective is enqueued
and not completed, and every stack-sampling period writes its cumulative counts, by its
own clock, with the collectives completed, owner-only, to the node-local directory in
NVRX_APPLIANCE_FLIGHT_WAITS. On NCCL that question means "GPU work queued", not "the CPU
waits", so NCCL's recorder is read once a second, for stalls only, and the figures say
`nccl` (not measured there).

A rank that is stopped or stuck in the kernel writes nothing; its peers' summaries say
whom they wait for. Nothing here changes what the workload does: the thread only reads
the recorder; an error is said once on stderr (each different one once) and the watch
goes on; the sitecustomize this one shadows (a distribution's or a site's) is run after
it, as Python would have run it. Standard library only: the workload's Python need not
have this package installed.
"""

from __future__ import annotations

import contextlib
import itertools
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
KEEP_ENTRIES = 32  # the newest entries kept in a summary: the stalled collective's are
VERSION = 2  # 2: a summary (status, newest entries, stalled groups' ranks), node-local
GENERIC, NCCL = "_dump_fr_trace_json", "_dump_nccl_trace_json"
# NCCL's collectives go to their own recorder (`_dump_nccl_trace_json`, CUDA builds only),
# gloo's and the CPU's to the generic one; both are read where present.
RECORDERS = (NCCL, GENERIC)
# Where a thread forms a process group (torch.distributed's group and device-mesh
# functions): the recorder's maps change under it.
FORMING = frozenset({"init_process_group", "new_group", "_new_group_with_tag",
                     "_new_process_group_helper", "split_group", "new_subgroups",
                     "new_subgroups_by_enumeration", "init_device_mesh"})  # fmt: skip
MAX_FAILURES = 100  # consecutive failed ticks (10 s) before the watch gives up, and says so
# torch 2.13 reads its start events only with timing on (ProcessGroupNCCL.hpp,
# TORCH_NCCL_ENABLE_TIMING; desync debug turns it on too): without, no entry is "started".
TIMING_ENVS = ("TORCH_NCCL_ENABLE_TIMING", "NCCL_ENABLE_TIMING", "TORCH_NCCL_DESYNC_DEBUG",
               "NCCL_DESYNC_DEBUG")  # fmt: skip
ENTRY_FIELDS = ("pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "is_p2p",
                "profiling_name", "state", "time_created_ns")  # fmt: skip

_said: set[str] = set()


def _say(words: str) -> None:
    try:
        sys.stderr.write(f"nvrx-flight-recorder: {words}\n")
        sys.stderr.flush()
    except Exception:  # a closed stderr must not end the workload
        pass


def _say_once(words: str) -> None:
    if words not in _said:
        _said.add(words)
        _say(words)


def status(raw: bytes | str) -> dict:
    """The recorder's `pg_status` from its JSON dump, parsed alone: the dump's keys come
    sorted (nlohmann's map), `pg_config` (every group's rank list, ~100 kB at 16,384
    ranks) before it and only `version` after, so the key is searched from the end (a
    string value cannot hold it: its quotes would be escaped)."""
    key = '"pg_status"'
    if isinstance(raw, str):
        at, text = raw.rfind(key), raw
    else:  # decode what follows the key only
        at = raw.rfind(key.encode())
        text, at = raw[max(at, 0) :].decode("utf-8", "replace"), 0 if at >= 0 else -1
    if at < 0:
        return {}
    at = text.index(":", at) + 1
    while text[at] in " \t\r\n":
        at += 1
    found, _ = json.JSONDecoder().raw_decode(text, at)
    return found if isinstance(found, dict) else {}


def _pending(groups: dict) -> dict[str, int]:
    """Each process group's collective enqueued and not yet completed: {pg id: seq}."""
    found = {}
    for pg, counts in groups.items():
        enqueued = int(counts.get("last_enqueued_collective", -1))
        if enqueued > int(counts.get("last_completed_collective", -1)):
            found[str(pg)] = enqueued
    return found


def _completed(groups: dict) -> int:
    """Collectives completed, over every group: a slow node is late to each of them."""
    return sum(max(0, int(c.get("last_completed_collective", -1))) for c in groups.values())


def timing() -> bool:
    return any(os.environ.get(name, "0") not in ("", "0") for name in TIMING_ENVS)


def compact_ranks(text: Any) -> Any:
    """A group's ranks as torch writes them ("[0, 1, ...]"), kept short: an arithmetic
    run becomes {"start", "stop", "step"} (a 16,384-rank group is ~90 kB as a list)."""
    try:
        ranks = [int(r) for r in str(text).strip("[]").split(",") if r.strip()]
    except ValueError:
        return text
    if len(ranks) > 2:
        step = ranks[1] - ranks[0]
        if step > 0 and all(b - a == step for a, b in itertools.pairwise(ranks)):
            return {"start": ranks[0], "stop": ranks[-1] + step, "step": step}
    return ranks


def summary(trace: dict) -> dict:
    """What the judgement needs of a dump (rank/flight_record.py): every group's status,
    the newest entries with the fields it reads, and the ranks of the groups they name."""
    entries = [
        {k: e.get(k) for k in ENTRY_FIELDS}
        for e in (trace.get("entries") or [])[-KEEP_ENTRIES:]
        if isinstance(e, dict)
    ]
    names = {str(g[0]) for e in entries if isinstance(g := e.get("process_group"), list) and g}
    config = trace.get("pg_config") or {}
    return {
        "pg_status": trace.get("pg_status") or {},
        "pg_config": {n: {"ranks": compact_ranks((config.get(n) or {}).get("ranks", ""))}
                      for n in sorted(names) if n in config},
        "entries": entries,
    }  # fmt: skip


class _Groups:
    """Whether the process groups stand settled (the module's doc): read from Python's own
    view of them, never from the recorder."""

    def __init__(self) -> None:
        self.seen: dict[int, int] | None = None

    def settled(self, dist: Any) -> bool:
        if self._forming():
            self.seen = None
            return False
        world = getattr(getattr(dist, "distributed_c10d", None), "_world", None)
        groups = getattr(world, "pg_map", None)
        if not isinstance(groups, dict):
            raise RuntimeError("torch.distributed keeps no pg_map: cannot tell when groups form")
        now = {}
        for pg in list(groups):
            with contextlib.suppress(Exception):  # a group being destroyed: seen next tick
                now[id(pg)] = int(pg._get_sequence_number_for_group() > 0)
        before, self.seen = self.seen, now
        return before is not None and before == now

    @staticmethod
    def _forming() -> bool:
        mine = threading.get_ident()
        for ident, top in sys._current_frames().items():
            frame: Any = top
            depth = 0
            while frame is not None and ident != mine and depth < 64:
                code = frame.f_code
                if code.co_name in FORMING and "torch/distributed/" in code.co_filename:
                    return True
                frame, depth = frame.f_back, depth + 1
        return False


class _Watch:
    def __init__(self, directory: str, stall_s: float, who: dict):
        self.directory, self.stall_s, self.who = directory, stall_s, who
        # each pending collective, (recorder, pg, seq): when first seen
        self.since: dict[tuple[str, str, int], float] = {}
        self.written: tuple[str, str, int] | None = None  # the stall whose summary stands
        self.waits: _Waits | None = None
        self.groups = _Groups()
        self.nccl = False  # the rank's collectives run on NCCL (its recorder has groups)

    def run(self) -> None:
        tick = failures = 0
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
            try:
                tick += 1
                self.tick(dist, tick, gap)
                failures = 0
            except Exception as exc:  # said once each; the watch goes on
                failures += 1
                _say_once(f"the flight-recorder watch failed a look ({exc!r}); it goes on")
                if failures >= MAX_FAILURES:
                    raise

    def tick(self, dist: Any, tick: int, gap: float) -> None:
        if not self.groups.settled(dist):
            return
        c10d = sys.modules["torch._C._distributed_c10d"]
        look = tick % LOOK_TICKS == 0
        # NCCL's recorder once a second (stalls only), the generic one every tick
        names = [n for n in RECORDERS if hasattr(c10d, n) and (look or n == GENERIC)]
        found = {n: getattr(c10d, n) for n in names}
        states = {n: status(dump(includeCollectives=False, onlyActive=True))
                  for n, dump in found.items()}  # fmt: skip
        if states.get(NCCL):
            self.nccl = True
        generic = states.get(GENERIC, {})
        if self.waits is not None:
            self.waits.count(bool(_pending(generic)), dist.get_rank(), gap, _completed(generic),
                             self.nccl)  # fmt: skip
        if look:
            pending = {(n, pg, seq) for n, st in states.items() for pg, seq in _pending(st).items()}
            self.look(found, dist.get_rank(), pending)

    def look(self, recorders: dict, rank: int, pending: set) -> None:
        now = time.time()
        self.since = {key: self.since.get(key, now) for key in pending}
        if self.written is not None and self.written not in pending:
            self.forget(rank)  # completed after all: a slow collective, not a hang
        stalled = [key for key, since in self.since.items() if now - since >= self.stall_s]
        if stalled and self.written is None:
            key = min(stalled, key=lambda k: self.since[k])
            trace = json.loads(recorders[key[0]](includeCollectives=True, onlyActive=True))
            self.write(summary(trace), key, rank)
            self.written = key

    def path(self, rank: int) -> str:
        return os.path.join(self.directory, f"{_node()}.rank{rank}.json")

    def write(self, trace: dict, key: tuple[str, str, int], rank: int) -> None:
        node = _node()
        record = {
            **self.who, "version": VERSION, "rank": rank, "node": node, "epoch": time.time(),
            "recorder": key[0], "timing": timing(),
            "stalled": {"pg": key[1], "seq": key[2], "since": self.since[key]}, "trace": trace,
        }  # fmt: skip
        _write_private(self.path(rank), record)

    def forget(self, rank: int) -> None:
        self.written = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(rank))


class _Waits:
    """The rank's polls, those that found a collective of it enqueued and not completed,
    and the collectives completed, cumulative, written every period by its own clock."""

    def __init__(self, directory: str, period: float, generation: str, cycle: int):
        self.directory, self.period = directory, max(0.5, period)
        self.generation, self.cycle = generation, cycle
        self.polls = self.waiting = self.completed = 0
        self.nccl = False
        self.history: list[list[float]] = []
        self.next_write = 0.0
        self.keep = int(KEEP_S / self.period) + 2

    def count(
        self, waiting: bool, rank: int, gap: float, completed: int = 0, nccl: bool = False
    ) -> None:
        if gap <= GAP_S:
            self.polls += 1
            self.waiting += waiting
        self.completed, self.nccl = max(self.completed, completed), nccl
        now = time.time()
        if now < self.next_write:
            return
        self.next_write = now + self.period
        self.history.append([now, self.polls, self.waiting, self.completed])
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
                  "rank": rank, "nccl": self.nccl, "history": self.history}  # fmt: skip
        _write_private(os.path.join(self.directory, f"{node}.rank{rank}.json"), record)


def _write_private(path: str, record: dict) -> None:
    """Owner-only, by rename: a reader sees the old file or the new one, whole."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
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
        _say(f"the flight-recorder watch stopped after {MAX_FAILURES} failed looks in a row "
             f"({exc!r}); a hang here is judged from stacks")  # fmt: skip


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
