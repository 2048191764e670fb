"""The combined hang rule: the flight recorder says whom the others wait for; the stacks
and the process state say why that rank is not there (docs/hangs.md, "The rule").

For each rank the recorder shows the others waiting for (flight_record.Flight.held_by):

- its collective enqueued but never started on its device (the recorder), stopped
  (state T), or stuck in the kernel (state D, outside a file-system call; a rank the
  sampler cannot read counts by its state): the node's fault;
- in the workload's own code (or blocked in a file-system call): the workload's stall;
- waiting in a collective by its stack: not the cause after all (a peer of its own);
- no stack, or none fresh: unknown.

All held ranks the node's fault, on one node (segment mode: one NVLink domain) while
ranks elsewhere wait: that node hung. All of them the workload's: the workload stalled,
and no node is taken out, unless the same node held a stall of this generation before
with other ranks on it (the ranks moved, the node stayed: the node's). Anything else, or
an unknown rank: no verdict, with both kinds of evidence in the words.

Without any dump (no collective stood still long enough: a cycle's start-up before its
process group is formed, or a workload that never records), the stacks decide alone
(hang_rule.judge), and a node is named only when its outliers are stopped or in the
kernel; outliers in their own code are the workload's stall.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from nvrx_appliance.rank import flight_record, hang_rule
from nvrx_appliance.rank.hang_rule import STOPPED_STATES, Judgement, RankStack

NODE, WORKLOAD, WAITING, UNKNOWN = "node", "workload", "waiting", "unknown"


def why(stack: RankStack | None, device: bool, *, now: float, fresh_s: float) -> tuple[str, str]:
    """(NODE | WORKLOAD | WAITING | UNKNOWN, how a person says it) for one held rank."""
    if device:
        return NODE, "enqueued its collective, which never started on its device"
    if stack is None:
        return UNKNOWN, "has no stack"
    if now - stack.taken > fresh_s:
        return UNKNOWN, f"has no fresh stack (its last is {now - stack.taken:.0f} s old)"
    own = hang_rule.own_frame(stack)
    at = f" in `{own.name}`" if own is not None else ""
    if stack.state in STOPPED_STATES:
        return NODE, f"stopped{at}"  # state T: the old words, which tests and people know
    if stack.state == "D":
        io = hang_rule.io_frame(stack)
        if io is None:
            return NODE, f"stuck in the kernel (state D){at}"
        return WORKLOAD, f"blocked in the file system (state D) in `{io.name}`"
    if not stack.frames:
        return UNKNOWN, f"could not be read (state {stack.state or '?'})"
    if hang_rule.waits_in(stack) is not None:
        return WAITING, "waited in a collective itself"
    return WORKLOAD, f"stood in its own code{at} (state {stack.state or '?'})"


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
    earlier: Mapping[str, Sequence[int]] = {},
) -> Judgement:
    """Name the node(s) the hang waits on, the workload's own stall, or none.
    `earlier`: the nodes of this generation's earlier workload stalls, with the ranks
    that held the others then."""
    flight = flight_record.analyse(dumps, world_size)
    if not flight.stalls:
        return _stacks_alone(stacks, world_size=world_size, cycle=cycle, now=now,
                             fresh_s=fresh_s, still_s=still_s, segment=segment, earlier=earlier)  # fmt: skip
    by_rank = {s.rank: s for s in stacks}
    said = tuple(_stall_words(s) for s in flight.stalls)
    grouped = hang_rule.groups(stacks)

    def none(words: str) -> Judgement:
        return Judgement((), f"no verdict in cycle {cycle}: {words}", grouped, flight=said)

    seen = {
        r: why(by_rank.get(r), r in flight.device, now=now, fresh_s=fresh_s)
        for r in flight.held_by()
    }
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
        return Judgement(tuple(culprits), words, grouped, kind="hung", flight=said)
    if kinds == {WORKLOAD}:
        stalled = _by_node(held, by_rank)
        again = sorted(
            n for n, ranks in stalled.items() if n in earlier and set(earlier[n]) != set(ranks)
        )
        if again:
            words = (
                f"{_list(again)} hung in cycle {cycle}: it held the others again with other "
                f"ranks on it ({_held_words(held, by_rank)}; flight recorder: {recorder})"
            )
            return Judgement(tuple(again), words, grouped, kind="hung", flight=said)
        return Judgement((), _workload_words(held, by_rank, waiting, cycle, recorder), grouped,
                         kind="workload", stalled=stalled, flight=said)  # fmt: skip
    return none(
        f"the others waited for rank(s) {_list(held)} ({recorder}), and the evidence is "
        f"mixed: {_held_words(held, by_rank)}"
    )


def _stacks_alone(stacks: Sequence[RankStack], *, world_size: int, cycle: int, now: float,
                  fresh_s: float, still_s: float, segment: bool,
                  earlier: Mapping[str, Sequence[int]]) -> Judgement:  # fmt: skip
    found = hang_rule.judge(stacks, world_size=world_size, cycle=cycle, now=now,
                            fresh_s=fresh_s, still_s=still_s, segment=segment)  # fmt: skip
    if not found.verdict:
        return found
    outliers = [s for s in stacks if hang_rule.waits_in(s) is None]
    held = {s.rank: why(s, False, now=now, fresh_s=fresh_s) for s in outliers}
    kinds = {kind for kind, _ in held.values()}
    if kinds == {NODE}:
        return replace(found, kind="hung")
    by_rank = {s.rank: s for s in stacks}
    if kinds == {WORKLOAD}:
        stalled = _by_node(held, by_rank)
        if not any(n in earlier and set(earlier[n]) != set(r) for n, r in stalled.items()):
            waiting = [s for s in stacks if hang_rule.waits_in(s) is not None]
            words = _workload_words(held, by_rank, waiting, cycle, "")
            return Judgement((), words, found.groups, kind="workload", stalled=stalled)
        return replace(found, kind="hung")
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
