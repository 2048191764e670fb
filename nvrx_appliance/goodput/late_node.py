"""A node the others wait for, whatever makes it late: from each rank's time inside
collectives (observe/collective_waits.py). Pure.

A node late to every collective (its workers descheduled part of the time, a slow data
loader, a slow NIC, or a slow compute) arrives last and barely waits, while its peers
wait for it. Its own step time can stay as fast as theirs. The rule
(docs/stragglers.md): over the last WINDOW_S seconds of each rank's own clock, cut into
PARTS consecutive parts, a node is late when in every part the median of its peers'
shares of wall time inside a collective exceeds its own share by at least EXCESS. Shares
only are compared across nodes, never their clocks. The excess over the whole window is
the share of the run's time spent waiting for it; the time lost is that excess over
the whole cycle the figures cover.

A node is named only when the lag is the node's: never from the workload's own work on
some ranks (rank 0's save, evaluation, logging, an upload), however long. So a
candidate is named only when, in every part,

- every rank of it lags, not some: rank 0 saving alone while its node's other ranks
  wait in the barrier after it lags by itself (ONE_RANK words), and a node of one rank
  cannot tell its rank's work from itself;
- its peers' wait is spread over collectives (at least MIN_COLLECTIVES completed): a
  slow node is late to each one, while a rank's own work makes the others wait in one
  collective for as long as it lasts (a wait that never ends is the hang rule's).

Figures of ranks whose collectives run on NCCL are not judged: there the recorder's
"enqueued and not completed" is GPU work queued, not a CPU waiting (their figures say
`nccl`). Where a candidate is not named, `withheld` says why, with what was seen.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from nvrx_appliance.observe.collective_waits import UNKNOWN, RankWaits

# The peers wait a fifth more of their time than the late node: the run trains at most
# four fifths of its speed (the own-step rule's 1.2 is five sixths). Healthy nodes' shares
# differ by a few hundredths; on the local test cluster's shared cores, see
# docs/stragglers.md.
EXCESS = 0.2
PARTS = 3
WINDOW_S = 30.0  # the recent past: a node that recovers is let go
MIN_POLLS = 10  # a part a node's ranks polled fewer times in (1 s at 10 Hz) judges nothing
TICK_S = 0.1  # the watch's poll interval (rank/flight_site/sitecustomize.py TICK_S)
# A slow node makes its peers wait a little in every collective; in a tenth of a second
# of training a data-parallel run completes several. Fewer than this in a part (10 s)
# is one long wait for someone's own work, or steps too long to tell: nobody is named.
MIN_COLLECTIVES = 3


@dataclass(frozen=True)
class LateNode:
    node: str
    own: float  # its ranks' share of time inside collectives in the window
    peers: float  # its peers' (the median of their nodes' shares)
    lost_s: float  # the cycle's wall seconds spent waiting for it, as far as measured
    window_s: float
    nodes: int  # the nodes whose figures were judged
    at: float  # the end of the window judged (its newest figure, by its own clock)

    @property
    def excess(self) -> float:
        return max(0.0, self.peers - self.own)

    @property
    def slowdown(self) -> float:
        """How much faster the run would train without the wait for it."""
        return 1.0 / max(1e-3, 1.0 - self.excess)


Snapshot = tuple[float, ...]


def _at(history: Sequence[Snapshot], when: float) -> Snapshot:
    """The snapshot at `when`: the newest not after it, else the oldest."""
    found = history[0]
    for snap in history:
        if snap[0] > when:
            break
        found = snap
    return found


def _span(ranks: Sequence[RankWaits], start: float, end: float) -> tuple[float, int, int]:
    """(seconds, polls, polls inside a collective) of a node's ranks from `start` to
    `end` seconds before each rank's newest figure, by its own clock."""
    seconds, polls, waiting = 0.0, 0, 0
    for rank in ranks:
        newest = rank.history[-1][0]
        t0, p0, w0 = _at(rank.history, newest - start)[:3]
        t1, p1, w1 = _at(rank.history, newest - end)[:3]
        seconds += t1 - t0
        polls, waiting = polls + int(p1 - p0), waiting + int(w1 - w0)
    return seconds, polls, waiting


def _completed(rank: RankWaits, start: float, end: float) -> int:
    """Collectives the rank completed from `start` to `end` seconds before its newest
    figure; UNKNOWN where its figures do not count them."""
    newest = rank.history[-1][0]
    first, last = _at(rank.history, newest - start), _at(rank.history, newest - end)
    counts = [int(s[3]) if len(s) > 3 else UNKNOWN for s in (first, last)]
    return UNKNOWN if UNKNOWN in counts else max(0, counts[1] - counts[0])


def _shares(by_node: dict[str, list[RankWaits]], start: float, end: float) -> dict[str, float]:
    """Each node's share of wall time seen inside a collective: a poll inside one stands
    for the TICK_S until the next. Time a rank took no polls (stopped, descheduled) is
    time it did not wait, which is what makes a descheduled node late."""
    out = {}
    for node, ranks in by_node.items():
        seconds, polls, waiting = _span(ranks, start, end)
        if polls >= MIN_POLLS and seconds > 0:
            out[node] = min(1.0, waiting * TICK_S / seconds)
    return out


def _covers(ranks: Sequence[RankWaits]) -> bool:
    return all(r.history[-1][0] - r.history[0][0] >= WINDOW_S for r in ranks)


def judge(waits: Sequence[RankWaits]) -> list[LateNode]:
    """The late nodes, latest first; none without peers or before the figures cover the
    window."""
    return _judged(waits)[0]


def withheld(waits: Sequence[RankWaits]) -> list[str]:
    """Why nodes the figures alone would name are not named (no verdict), with what was
    seen: the lag followed some of their ranks, or one long wait, or NCCL."""
    return _judged(waits)[1]


def _judged(waits: Sequence[RankWaits]) -> tuple[list[LateNode], list[str]]:
    said: list[str] = []
    on_nccl = sorted({w.node for w in waits if w.nccl})
    if on_nccl:
        said.append(f"time inside collectives is not measured on NCCL ({', '.join(on_nccl)}): "
                    "its recorder's pending work is GPU work queued, not a rank waiting")  # fmt: skip
    by_node: dict[str, list[RankWaits]] = {}
    for rank in waits:
        if not rank.nccl:
            by_node.setdefault(rank.node, []).append(rank)
    if len(by_node) < 2 or not all(_covers(r) for r in by_node.values()):
        return [], said
    size = WINDOW_S / PARTS
    bounds = [(WINDOW_S - p * size, WINDOW_S - (p + 1) * size) for p in range(PARTS)]
    parts = [_shares(by_node, start, end) for start, end in bounds]
    whole = _shares(by_node, WINDOW_S, 0.0)
    cycle = _shares(by_node, float("inf"), 0.0)
    found = []
    for node in sorted(by_node):
        if not all(_excess(part, node) >= EXCESS for part in parts):
            continue
        own, peers = whole[node], _peers(whole, node)
        why = _not_the_node(node, by_node, bounds, parts, (own, peers))
        if why:
            said.append(why)
            continue
        spans = [r.history[-1][0] - r.history[0][0] for r in by_node[node]]
        lost = max(0.0, _excess(cycle, node)) * statistics.median(spans)
        newest = max(r.history[-1][0] for r in by_node[node])
        found.append(LateNode(node, own, peers, lost, WINDOW_S, len(whole), newest))
    return sorted(found, key=lambda n: -n.excess), said


def _not_the_node(
    node: str,
    by_node: dict[str, list[RankWaits]],
    bounds: Sequence[tuple[float, float]],
    parts: Sequence[dict[str, float]],
    shares: tuple[float, float],
) -> str:
    """Why a node whose ranks together lag is not named: "" when the lag is its own."""
    ranks = sorted(by_node[node], key=lambda r: r.rank)
    own, peers = shares
    seen = (
        f"{node} lags (inside collectives {own:.0%} of the time against {peers:.0%} on its peers)"
    )
    if len(ranks) == 1:
        return (f"{seen}, but it runs one rank (rank {ranks[0].rank}): its lag "
                "cannot be told from that rank's own work (a save, evaluation, logging, an upload)")  # fmt: skip
    # Each rank's own share, part by part, against the peers' median of that part; a
    # rank that took too few polls in a part to measure (stopped throughout) waited in
    # none of it: it lags.
    waiting = []
    for rank in ranks:
        mine = [_shares({node: [rank]}, start, end).get(node) for start, end in bounds]
        if any(m is not None and _peers({**p, node: m}, node) - m < EXCESS
               for m, p in zip(mine, parts, strict=True)):  # fmt: skip
            waiting.append(rank.rank)
    if waiting:
        lagging = [r.rank for r in ranks if r.rank not in waiting]
        return (f"{seen}, but only its rank(s) {_list(lagging)} lag while "
                f"its rank(s) {_list(waiting)} wait like its peers: the lag follows those ranks' "
                "own work (rank 0's save, evaluation, logging, an upload), not the node")  # fmt: skip
    peer_ranks = [r for n, rs in by_node.items() if n != node for r in rs]
    for start, end in bounds:
        done = [_completed(r, start, end) for r in peer_ranks]
        if UNKNOWN in done:
            return (f"{seen}, but its figures do not count the collectives "
                    "completed, which tell a slow node from one long wait")  # fmt: skip
        if statistics.median(done) < MIN_COLLECTIVES:
            return (f"{seen}, but its peers completed "
                    f"{statistics.median(done):g} collective(s) in {start - end:g} s: one long "
                    "wait (a save, evaluation, an upload on its ranks), not a node late to each "
                    "collective; a wait that never ends is the hang rule's")  # fmt: skip
    return ""


def _list(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def _peers(shares: dict[str, float], node: str) -> float:
    return statistics.median(s for n, s in shares.items() if n != node)


def _excess(shares: dict[str, float], node: str) -> float:
    """Its peers' median share over its own; -1 where either is not measured."""
    if node not in shares or len(shares) < 2:
        return -1.0
    return _peers(shares, node) - shares[node]
