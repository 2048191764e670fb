"""The combined hang rule: the flight recorder says whom the others wait for; the stacks
and the process state say why that rank is not there (docs/hangs.md, "The rule").

A node is named only from evidence that the node is at fault, sustained, never from the
workload's own work on some ranks, however long; where the evidence cannot tell, no
verdict, with what was seen. For each rank the recorder shows the others waiting for
(flight_record.Flight.held_by):

- stopped (state T) for at least `still_s`: the node's fault (for less: unknown);
- stuck in the kernel (state D) for at least `still_s`, where the kernel says it waits
  (/proc/<pid>/wchan) and that wait is no file system's: the node's; in a file-system
  call (its frame or its kernel wait) the workload's stall; in D for less, or where the
  kernel does not say: unknown;
- its collective enqueued but never started on its device (NCCL with timing on), while
  its stack stood unchanged for `still_s` (its CPU waits on its GPU): the node's; while
  its CPU runs its own code (rank 0 queueing an all-reduce behind its own evaluation):
  the workload's;
- in the workload's own code: the workload's stall; on NCCL, with its frames unchanged
  for `still_s`, unknown (a CPU waiting on its own GPU looks so, and so does its work);
- waiting in a collective by its stack: not the cause after all (a peer of its own);
- no stack, or none fresh: unknown.

All held ranks the node's fault, on one node (segment mode: one NVLink domain) while
ranks elsewhere wait: that node hung. All of them the workload's: the workload stalled,
and no node is taken out, however often it stalls on one node (its ranks may differ each
time: a node is never named from stalls of the workload's own code). Anything else, or
an unknown rank: no verdict, with both kinds of evidence in the words.

Without any dump (no collective stood still long enough: a cycle's start-up before its
process group is formed, or a workload that never records), the stacks decide alone
(hang_rule.judge), and a node is named only when its outliers are stopped or in the
kernel as above; outliers in their own code are the workload's stall.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from nvrx_appliance.rank import flight_record, hang_rule
from nvrx_appliance.rank.hang_rule import STOPPED_STATES, Judgement, RankStack

NODE, WORKLOAD, WAITING, UNKNOWN = "node", "workload", "waiting", "unknown"
# Where the kernel keeps a rank (wchan) that is no node's fault: a file system's or the
# page cache's wait (a stalled shared file system holds every writer: rank 0 logging,
# `pickle.dump`, an `np.memmap` read), block I/O, a core dump being written.
NOT_THE_NODES_WAITS = (
    "nfs", "rpc_", "fuse", "lustre", "ll_", "ptlrpc", "cl_sync", "osc_", "mdc_", "ldlm",
    "ceph", "cifs", "smb", "p9_", "v9fs", "gpfs", "mmfs", "xfs", "ext4", "jbd2", "btrfs",
    "folio_wait", "wait_on_page", "io_schedule", "wait_on_buffer", "lock_page", "filemap",
    "writeback", "balance_dirty", "blk_", "bio_", "coredump", "dump_",
)  # fmt: skip


def file_system_wait(wchan: str) -> bool:
    return any(mark in wchan for mark in NOT_THE_NODES_WAITS)


def why(
    stack: RankStack | None,
    device: bool,
    *,
    now: float,
    fresh_s: float,
    still_s: float,
    nccl: bool = False,
) -> tuple[str, str]:
    """(NODE | WORKLOAD | WAITING | UNKNOWN, how a person says it) for one held rank."""
    if stack is None:
        return UNKNOWN, "has no stack"
    if now - stack.taken > fresh_s:
        return UNKNOWN, f"has no fresh stack (its last is {now - stack.taken:.0f} s old)"
    own = hang_rule.own_frame(stack)
    at = f" in `{own.name}`" if own is not None else ""
    if stack.state in STOPPED_STATES:
        if now - stack.still_since < still_s:  # a moment's stop (a debugger, a profiler)
            return UNKNOWN, f"was stopped for {now - stack.still_since:.0f} s only{at}"
        return NODE, f"stopped{at}"  # state T: the old words, which tests and people know
    unchanged = now - (stack.same_since if stack.same_since is not None else stack.still_since)
    if device:
        if unchanged >= still_s:
            return NODE, (f"enqueued its collective, which never started on its device, while "
                          f"its stack stood unchanged{at} for {unchanged:.0f} s")  # fmt: skip
        return (
            WORKLOAD,
            f"had not started its collective on its device while it ran its own code{at}",
        )
    if stack.state == "D":
        return _in_the_kernel(stack, now=now, still_s=still_s, at=at)
    if not stack.frames:
        return UNKNOWN, f"could not be read (state {stack.state or '?'})"
    if hang_rule.waits_in(stack) is not None:
        return WAITING, "waited in a collective itself"
    if nccl and unchanged >= still_s:
        return UNKNOWN, (
            f"stood{at} (state {stack.state or '?'}) unchanged for {unchanged:.0f} s: on NCCL a "
            "rank waiting on its own GPU stands so, and so does its own work"
        )
    return WORKLOAD, f"stood in its own code{at} (state {stack.state or '?'})"


def _in_the_kernel(stack: RankStack, *, now: float, still_s: float, at: str) -> tuple[str, str]:
    """A rank in an uninterruptible call (state D): the node's only when the kernel says it
    waits somewhere no file system is, and has for `still_s` (the others' step timeout
    passed meanwhile: a rank in D for a moment is cuInit, a pinned allocation, a page)."""
    io = hang_rule.io_frame(stack)
    if io is not None:
        return WORKLOAD, f"blocked in the file system (state D) in `{io.name}`"
    if file_system_wait(stack.wchan):
        return (
            WORKLOAD,
            f"blocked in the file system (state D, the kernel waits in `{stack.wchan}`)",
        )
    held = now - stack.still_since
    if held < still_s:
        return UNKNOWN, f"was in the kernel (state D) for {held:.0f} s only{at}"
    if not stack.wchan:
        return UNKNOWN, f"stood in the kernel (state D){at}, and the kernel does not say where"
    return NODE, f"stuck in the kernel (state D at `{stack.wchan}`){at}"


def judge(
    stacks: Sequence[RankStack],
    dumps: Sequence[dict],
    *,
    world_size: int,
    cycle: int,
    now: float,
    fresh_s: float,
    still_s: float,
    segment: bool = False,
) -> Judgement:
    """Name the node(s) the hang waits on, the workload's own stall, or none."""
    flight = flight_record.analyse(dumps, world_size)
    if not flight.stalls:
        return _stacks_alone(stacks, world_size=world_size, cycle=cycle, now=now,
                             fresh_s=fresh_s, still_s=still_s, segment=segment)  # fmt: skip
    by_rank = {s.rank: s for s in stacks}
    said = tuple(_stall_words(s) for s in flight.stalls) + tuple(
        f"process group {g} left out: its status counts point-to-point operations with its "
        "collectives"
        for g in flight.p2p
    )
    grouped = hang_rule.groups(stacks)

    def none(words: str) -> Judgement:
        return Judgement((), f"no verdict in cycle {cycle}: {words}", grouped, flight=said)

    seen = {
        r: why(by_rank.get(r), r in flight.device, now=now, fresh_s=fresh_s, still_s=still_s,
               nccl=flight.nccl)
        for r in flight.held_by()
    }  # fmt: skip
    held = {r: w for r, w in seen.items() if w[0] != WAITING}
    recorder = "; ".join(said)
    if not held:
        return none(
            f"the flight recorder shows every rank waiting ({recorder})"
            + (
                ""
                if not seen
                else f", and the stacks of rank(s) {_list(seen)} wait in a collective too"
            )
            + (
                "; NCCL records no start without TORCH_NCCL_ENABLE_TIMING, so whose GPU "
                "holds the others is not seen"
                if flight.nccl and not flight.timing
                else ""
            )
        )
    unknown = [r for r, (kind, _) in held.items() if kind == UNKNOWN]
    if unknown:
        return none(
            f"the flight recorder shows the others waiting for rank(s) {_list(held)} "
            f"({recorder}), but rank(s) {_list(unknown)} {held[unknown[0]][1]}: the stacks cannot "
            "say why"
        )
    waiting = [s for s in stacks if s.rank in flight.waiting or s.rank in seen.keys() - held.keys()]
    node_of = {r: (by_rank[r].node, by_rank[r].domain) for r in held}
    kinds = {kind for kind, _ in held.values()}
    if kinds == {NODE}:
        where = {(d or n) if segment else n for n, d in node_of.values()}
        culprits = sorted({n for n, _ in node_of.values()})
        if len(where) > 1:
            return none(
                f"the ranks the others wait for ({_list(held)}) are on {len(where)} "
                f"{'NVLink domains' if segment else 'nodes'} ({_list(sorted(where))})"
            )
        if not any(s.node not in culprits for s in waiting):
            return none("no rank on another node waited for them")
        words = _hung_words(culprits, held, waiting, cycle) + f" (flight recorder: {recorder})"
        return Judgement(tuple(culprits), words, grouped, kind="hung", flight=said,
                         held=_by_node(held, by_rank))  # fmt: skip
    if kinds == {WORKLOAD}:
        return Judgement((), _workload_words(held, by_rank, waiting, cycle, recorder), grouped,
                         kind="workload", stalled=_by_node(held, by_rank), flight=said)  # fmt: skip
    return none(
        f"the others waited for rank(s) {_list(held)} ({recorder}), and the evidence is "
        f"mixed: {_held_words(held, by_rank)}"
    )


def _stacks_alone(stacks: Sequence[RankStack], *, world_size: int, cycle: int, now: float,
                  fresh_s: float, still_s: float, segment: bool) -> Judgement:  # fmt: skip
    found = hang_rule.judge(stacks, world_size=world_size, cycle=cycle, now=now,
                            fresh_s=fresh_s, still_s=still_s, segment=segment)  # fmt: skip
    if not found.verdict:
        return found
    outliers = [s for s in stacks if hang_rule.waits_in(s) is None]
    held = {s.rank: why(s, False, now=now, fresh_s=fresh_s, still_s=still_s) for s in outliers}
    kinds = {kind for kind, _ in held.values()}
    by_rank = {s.rank: s for s in stacks}
    if kinds == {NODE}:
        words = _hung_words(found.nodes, held, [s for s in stacks if hang_rule.waits_in(s)], cycle)
        return replace(found, kind="hung", held=_by_node(held, by_rank), words=words)
    if kinds == {WORKLOAD}:
        waiting = [s for s in stacks if hang_rule.waits_in(s) is not None]
        words = _workload_words(held, by_rank, waiting, cycle, "")
        return Judgement((), words, found.groups, kind="workload", stalled=_by_node(held, by_rank))
    return Judgement((), f"no verdict in cycle {cycle}: the evidence is mixed: "
                     f"{_held_words(held, by_rank)}", found.groups)  # fmt: skip


def _by_node(
    held: Mapping[int, tuple[str, str]], by_rank: Mapping[int, RankStack]
) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for rank in sorted(held):
        found.setdefault(by_rank[rank].node, []).append(rank)
    return found


def _held_words(held: Mapping[int, tuple[str, str]], by_rank: Mapping[int, RankStack]) -> str:
    """ "rank 3 on node3 stood in its own code in `upload_metrics` (state S)"."""
    return "; ".join(
        f"rank {r} on {by_rank[r].node if r in by_rank else '?'} {how}"
        for r, (_, how) in sorted(held.items())
    )


def _waits(waiting: Sequence[RankStack]) -> str:
    names = sorted({f.name for s in waiting if (f := hang_rule.waits_in(s)) is not None})
    return " / ".join(f"`{n}`" for n in names) or "a collective"


def _others(waiting: Sequence[RankStack]) -> str:
    return f"the {len(waiting)} other{'' if len(waiting) == 1 else 's'}"


def _hung_words(culprits: Sequence[str], held: Mapping[int, tuple[str, str]],
                waiting: Sequence[RankStack], cycle: int) -> str:  # fmt: skip
    """ "node3 hung in cycle 2: its 2 ranks stopped (state T) in `train_step` while the 4
    others waited in `all_reduce`"."""
    # "stopped in `a`" and "stopped in `b`" read "stopped in `a` / `b`", as the stacks' rule said
    where: dict[str, set[str]] = {}
    for _, how in held.values():
        head, _, name = how.partition(" in `")
        where.setdefault(head, set()).update({f"`{name}"} if name else set())
    hows = [f"{h} in {' / '.join(sorted(n))}" if n else h for h, n in sorted(where.items())]
    its = "its" if len(culprits) == 1 else "their"
    n = len(held)
    return (
        f"{' and '.join(culprits)} hung in cycle {cycle}: {its} {n} rank{'' if n == 1 else 's'} "
        f"{' / '.join(hows)} while {_others(waiting)} waited in {_waits(waiting)}"
    )


def _workload_words(held: Mapping[int, tuple[str, str]], by_rank: Mapping[int, RankStack],
                    waiting: Sequence[RankStack], cycle: int, recorder: str) -> str:  # fmt: skip
    """ "the workload stalled in cycle 1: rank 3 on node3 stood in its own code in
    `upload_metrics` (state S) while the 3 others waited in `all_reduce` for it; no node is
    at fault, none is kept out"."""
    source = f"; flight recorder: {recorder}" if recorder else ""
    return (
        f"the workload stalled in cycle {cycle}: {_held_words(held, by_rank)} while "
        f"{_others(waiting)} waited in {_waits(waiting)} for it{source}; no node is at fault, "
        "none is kept out"
    )


def _stall_words(stall: flight_record.Stall) -> str:
    return (
        f"rank(s) {_list(stall.waiting)} waited in {stall.words()} for rank(s) "
        f"{_list(stall.behind) or 'none'}"
    )


def _list(items: object) -> str:
    return ", ".join(str(i) for i in sorted(items))  # type: ignore[call-overload]
