"""What the flight recorder says at a hang: whom the waiting ranks wait for.

Each dump (rank/flight.py) is one rank's view: per process group, the last collective it
enqueued and completed (`pg_status`) and its newest entries (`collective_seq_id`,
`profiling_name`, `state`, `time_created_ns`, ...). Only a rank whose collective stood
still past the stall time writes one, so the dumps present are the waiting ranks'. Per
process group, the collective they wait in is the highest sequence number any of them
enqueued; a rank of the group that has not enqueued it (its dump says an earlier one, or
it wrote none) is behind: the others wait for it. A behind rank that itself waits, in
another group, is not the cause: what it waits for is. So the ranks held by nobody, behind
somewhere, are the ones the hang waits on.

On GPUs the recorder also tells a rank whose collective was enqueued but never started on
its device (NCCL's `scheduled` while its peers' entry of that collective is `started`):
that rank waits in nothing, its device does. gloo records every entry as `scheduled`
and starts nothing it reports, so this is never seen on CPUs; nor is it on NCCL unless
timing is on: torch 2.13 creates a work's start event only then
(`ncclStartEvent_ = enableTiming ? ... : nullptr`, TORCH_NCCL_ENABLE_TIMING or desync
debug), so without it every entry goes from `scheduled` to `completed`. The summaries
say whether the rank ran with timing (`timing`); the judgement says when it did not.

On NCCL "enqueued and not completed" is GPU work not finished (the watchdog reads CUDA
events), not a CPU waiting: a rank may stand far past it in its own code. And torch 2.13
gives point-to-point operations their own sequence (`seqP2P_`, entries with `is_p2p`)
while a group's status counts them with its collectives' (`seq_`), so the status of a
group that carries sends and receives (a pipeline's) says nothing sure: such a group is
left out, and said (`p2p`). Collectives captured in a CUDA graph are never enqueued to
the watchdog: the recorder says nothing of them, and the stacks decide alone.

The names, as torch 2.13 writes them: a group's entries carry `process_group` [name,
description] ("0" for the default group); `pg_config` is keyed by name with its global
ranks, except that gloo's default group appears as "" with the world's ranks, and a gloo
subgroup does not appear at all (its ranks are then those whose dumps name it).

Pure: dumps in, a Flight out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_GROUP = "0"
NCCL_RECORDER = "_dump_nccl_trace_json"  # rank/flight_site/sitecustomize.py's NCCL


@dataclass(frozen=True)
class Stall:
    """One process group's collective that ranks wait in."""

    group: str  # the group's name ("0": the default group)
    seq: int  # the collective's sequence number in the group
    op: str  # its profiling name (gloo:all_reduce, nccl:all_reduce, ...)
    ranks: tuple[int, ...]  # the group's global ranks, as far as known
    waiting: tuple[int, ...]  # ranks whose dump shows a collective of it pending
    behind: tuple[int, ...]  # ranks of the group not in it yet, nor waiting in an earlier one
    device: tuple[int, ...] = ()  # ranks that enqueued it, never started on their device
    arrived: dict[int, int] = field(default_factory=dict)  # rank -> time it entered (ns)

    def words(self) -> str:
        return f"`{self.op}` #{self.seq} of process group {self.group}"


@dataclass(frozen=True)
class Flight:
    stalls: tuple[Stall, ...]
    dumped: tuple[int, ...]  # the ranks that wrote a dump
    nccl: bool = False  # the dumps are NCCL's recorder's (GPU work, not CPU waits)
    timing: bool = False  # NCCL recorded starts (TORCH_NCCL_ENABLE_TIMING was on)
    p2p: tuple[str, ...] = ()  # groups left out: their status mixes sends with collectives

    @property
    def waiting(self) -> frozenset[int]:
        return frozenset(r for s in self.stalls for r in s.waiting) - self.device

    @property
    def device(self) -> frozenset[int]:
        return frozenset(r for s in self.stalls for r in s.device)

    def held_by(self) -> tuple[int, ...]:
        """The ranks the hang waits on: behind somewhere and waiting nowhere, or stuck
        on their device."""
        behind = {r for s in self.stalls for r in s.behind}
        return tuple(sorted((behind - self.waiting) | self.device))


def _int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _ranks(text: Any) -> tuple[int, ...]:
    """A group's ranks as torch writes them ("[0, 1]"), or as a summary keeps them: a
    list, or an arithmetic run {"start", "stop", "step"}."""
    if isinstance(text, dict):
        try:
            return tuple(range(int(text["start"]), int(text["stop"]), int(text["step"]) or 1))
        except (KeyError, TypeError, ValueError):
            return ()
    return tuple(sorted({int(n) for n in re.findall(r"-?\d+", str(text))}))


def _names(trace: dict[str, Any]) -> dict[str, str]:
    """pg id (the rank's own) -> the group's name, from its entries."""
    found = {}
    for entry in trace.get("entries") or []:
        if isinstance(entry, dict) and entry.get("process_group"):
            found[str(entry.get("pg_id"))] = str(entry["process_group"][0])
    return found


def _p2p(dumps: Sequence[dict[str, Any]]) -> set[str]:
    """The groups whose entries hold a point-to-point operation, in any dump."""
    return {
        str(e["process_group"][0])
        for d in dumps for e in d["trace"].get("entries") or []
        if isinstance(e, dict) and e.get("process_group") and e.get("is_p2p") is True
    }  # fmt: skip


def _members(name: str, dumps: Sequence[dict[str, Any]], world_size: int) -> tuple[int, ...]:
    for dump in dumps:
        config = dump["trace"].get("pg_config") or {}
        ranks = _ranks((config.get(name) or {}).get("ranks", ""))
        if ranks:
            return ranks
    if name == DEFAULT_GROUP:
        return tuple(range(world_size))
    return ()


def analyse(dumps: Sequence[dict[str, Any]], world_size: int) -> Flight:
    """The stalls the waiting ranks' dumps show (dump: {"rank", "trace"})."""
    position: dict[str, dict[int, tuple[int, int]]] = {}  # group -> rank -> (enq, done)
    entry_at: dict[tuple[str, int, int], dict[str, Any]] = {}  # (group, rank, seq) -> entry
    p2p = _p2p(dumps)
    for dump in dumps:
        rank, trace = _int(dump.get("rank")), dump["trace"]
        names = _names(trace)
        for pg, counts in (trace.get("pg_status") or {}).items():
            if str(pg) in names and isinstance(counts, dict):
                enq = _int(counts.get("last_enqueued_collective"))
                done = _int(counts.get("last_completed_collective"))
                position.setdefault(names[str(pg)], {})[rank] = (enq, done)
        for entry in trace.get("entries") or []:
            if isinstance(entry, dict) and entry.get("process_group") and not entry.get("is_p2p"):
                name = str(entry["process_group"][0])
                entry_at[(name, rank, _int(entry.get("collective_seq_id")))] = entry
    stalls = []
    for name, at in sorted(position.items()):
        if name in p2p:
            continue
        waiting = {r: enq for r, (enq, done) in at.items() if enq > done}
        if not waiting:
            continue
        seq = max(waiting.values())
        # Every rank with a collective pending waits; those in the newest one show its
        # name, when they entered it, and how far their device got.
        inside = sorted(r for r, enq in waiting.items() if enq == seq)
        members = _members(name, dumps, world_size) or tuple(sorted(at))
        # Behind: not in it yet, nor waiting in an earlier one of the group (a node that
        # froze inside a ring all-reduce can leave one rank done with it and the next
        # still in it: both wait for that node).
        behind = tuple(r for r in members if at.get(r, (-1, -1))[0] < seq and r not in waiting)
        entries = {r: entry_at.get((name, r, seq)) or {} for r in inside}
        started = any(e.get("state") == "started" for e in entries.values())
        device = tuple(r for r in inside if started and entries[r].get("state") == "scheduled")
        op = next(
            (str(e["profiling_name"]) for e in entries.values() if e.get("profiling_name")), "?"
        )
        stalls.append(
            Stall(
                group=name, seq=seq, op=op, ranks=members, waiting=tuple(sorted(waiting)),
                behind=behind, device=device,
                arrived={r: _int(e.get("time_created_ns"), 0) for r, e in entries.items()},
            )
        )  # fmt: skip
    nccl = any(d.get("recorder") == NCCL_RECORDER for d in dumps)
    timing = any(d.get("timing") is True for d in dumps) or any(
        e.get("state") == "started" for e in entry_at.values()
    )
    return Flight(tuple(stalls), tuple(sorted(_int(d.get("rank")) for d in dumps)), nccl=nccl,
                  timing=timing, p2p=tuple(sorted(p2p & set(position))))  # fmt: skip
