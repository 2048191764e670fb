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
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from nvrx_appliance.observe.collective_waits import RankWaits

# The peers wait a fifth more of their time than the late node: the run trains at most
# four fifths of its speed (the own-step rule's 1.2 is five sixths). Healthy nodes' shares
# differ by a few hundredths; on the local test cluster's shared cores, see
# docs/stragglers.md.
EXCESS = 0.2
PARTS = 3
WINDOW_S = 30.0  # the recent past: a node that recovers is let go
MIN_POLLS = 10  # a part a node's ranks polled fewer times in (1 s at 10 Hz) judges nothing
TICK_S = 0.1  # the watch's poll interval (rank/flight_site/sitecustomize.py TICK_S)


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


def _at(history: Sequence[tuple[float, int, int]], when: float) -> tuple[float, int, int]:
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
        t0, p0, w0 = _at(rank.history, newest - start)
        t1, p1, w1 = _at(rank.history, newest - end)
        seconds, polls, waiting = seconds + t1 - t0, polls + p1 - p0, waiting + w1 - w0
    return seconds, polls, waiting


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
    by_node: dict[str, list[RankWaits]] = {}
    for rank in waits:
        by_node.setdefault(rank.node, []).append(rank)
    if len(by_node) < 2 or not all(_covers(r) for r in by_node.values()):
        return []
    size = WINDOW_S / PARTS
    parts = [_shares(by_node, WINDOW_S - p * size, WINDOW_S - (p + 1) * size) for p in range(PARTS)]
    whole = _shares(by_node, WINDOW_S, 0.0)
    cycle = _shares(by_node, float("inf"), 0.0)
    found = []
    for node in sorted(by_node):
        if not all(_excess(part, node) >= EXCESS for part in parts):
            continue
        own, peers = whole[node], _peers(whole, node)
        spans = [r.history[-1][0] - r.history[0][0] for r in by_node[node]]
        lost = max(0.0, _excess(cycle, node)) * statistics.median(spans)
        newest = max(r.history[-1][0] for r in by_node[node])
        found.append(LateNode(node, own, peers, lost, WINDOW_S, len(whole), newest))
    return sorted(found, key=lambda n: -n.excess)


def _peers(shares: dict[str, float], node: str) -> float:
    return statistics.median(s for n, s in shares.items() if n != node)


def _excess(shares: dict[str, float], node: str) -> float:
    """Its peers' median share over its own; -1 where either is not measured."""
    if node not in shares or len(shares) < 2:
        return -1.0
    return _peers(shares, node) - shares[node]
