"""Task 0's liveness lease: every margin in one place and why they nest, who watches
the lease, and what watching it costs the shared file system. Pure.

Three durations decide who may act when task 0 stops answering, all measured from the
last refresh that task 0 started:

    refresh period   task 0 touches its lease this often
    self-fence       task 0 has failed to refresh for this long: it stops its own
                     ft_launcher and workers (TERM, then KILL after the grace)
    stale threshold  a watcher has seen the lease go unchanged this long: task 0 is
                     dead; the first to notice fences the generation and the
                     successor may start

They must nest, or two task 0s could train at once: a task 0 that cannot refresh must
be stopped before any peer may call it dead. Task 0 notices within one poll of its
deadline and needs at most the grace to stop everything, so

    self-fence + poll + grace + safety  <=  stale threshold

and a live task 0 must ride out a slow write, so the self-fence deadline spans at least
two refresh periods. A threshold too short for that is refused at submit.

Clocks. No node compares its clock with another's or with the file system's: a peer
measures how long it has seen the lease's stat go unchanged, by its own clock, and task
0 how long ago its last successful refresh began, by its own (node/lease_watch.py).
A wall clock that leads or lags, or is stepped, changes nothing. What is left is how
fast each clock runs; both sides read clocks that NTP does not slew (task 0 also one
that counts a suspend), so that is the oscillator's error, tens of parts per million.
CLOCK_RATE_ERROR bounds it ten times over, on each side, and the margins absorb it.

What the threshold trades: a shorter one hands off sooner after a real node death (the
successor starts about one threshold after it), a longer one rides out longer stalls of
the shared file system without stopping a healthy generation.

Who watches (docs/liveness.md has the failure cases and their bounds): node 0 of array
tasks 1..W (the watchers) reads the closed flag and the lease twice a second. Every other
node reads them only every backstop period, which grows with the generation so that
all of them together stay within BACKSTOP_CALLS_PER_S: they learn that the generation
ended from Slurm (the first peer to leave on it cancels the rest of the array) and
need the file system only if that fails or every watcher is gone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# How often the gate and the supervisor look at the control directory (and task 0 at
# its own deadline).
POLL_S = 1.0
# How often a watcher looks while ft_launcher runs. A watcher learns of task 0's last
# refresh only at its next look, and of the threshold passing at the one after: two
# looks where comparing an mtime with a clock took one. Twice as many looks keep the
# fence as prompt as that was, for two more calls a second per watcher.
WATCH_POLL_S = 0.5
# Room for scheduling delays of the stopping process on a loaded node, and for the
# grace and the poll, which run on clocks NTP may slew (at most 8.3 %, chrony's limit).
SAFETY_S = 1.0
# Refresh often enough that several refreshes fit in the window, rarely enough that
# thousands of generations do not load the metadata server.
MIN_REFRESH_S, MAX_REFRESH_S = 1.0, 5.0
REFRESHES_PER_THRESHOLD = 6
# A live task 0 must survive this many refreshes in a row that fail or stall.
MISSED_REFRESHES_TOLERATED = 2
# How far any node's elapsed-time clock may run fast or slow (a fraction): a crystal
# oscillator is within 1e-4; the clocks read here are not slewed by NTP.
CLOCK_RATE_ERROR = 1e-3

# Node 0 of array tasks 1..W watch the lease every poll. Three: task 0 and all three
# must be lost together before only the backstop is left (docs/liveness.md).
DEFAULT_WATCHERS = 3
# What all the other nodes of one generation may cost the metadata server together,
# and the most often each of them looks (a small generation needs no less).
BACKSTOP_CALLS_PER_S = 100.0
BACKSTOP_MIN_PERIOD_S = 10.0
# One backstop look: the closed flag (an open) and the lease (a stat).
BACKSTOP_CALLS = 2


def refresh_period(stale_after: float) -> float:
    return max(MIN_REFRESH_S, min(MAX_REFRESH_S, stale_after / REFRESHES_PER_THRESHOLD))


def self_fence_after(stale_after: float, grace: float) -> float:
    """Seconds without a successful refresh (by task 0's clock) after which task 0 stops
    itself. A peer whose clock runs fast by e calls the lease stale after
    stale_after / (1 + e) real seconds at the earliest; task 0, whose clock may run slow
    by e, must have stopped by then, safety included: its deadline, a poll and the
    grace, counted on its clock, take up to 1 / (1 - e) times as long in real time."""
    earliest_fence = stale_after / (1 + CLOCK_RATE_ERROR)
    return (earliest_fence - SAFETY_S) * (1 - CLOCK_RATE_ERROR) - POLL_S - grace


def _nests(stale_after: float, grace: float) -> bool:
    tolerated = MISSED_REFRESHES_TOLERATED * refresh_period(stale_after)
    return self_fence_after(stale_after, grace) >= tolerated


def problem(stale_after: float, grace: float) -> str | None:
    """Why these margins cannot keep an old task 0 from training beside a new one."""
    if _nests(stale_after, grace):
        return None
    return (
        f"{stale_after:g} s is too short for a closed-flag grace of {grace:g} s: task 0 "
        f"must be able to stop itself before its peers call it dead; use at least "
        f"{shortest(grace)} s, or a shorter grace"
    )


def shortest(grace: float) -> int:
    """The shortest whole-second threshold that nests with this grace."""
    stale = math.ceil(POLL_S + grace + SAFETY_S)
    while not _nests(stale, grace):
        stale += 1
    return stale


# --- who watches, and what it costs --------------------------------------------------------


def watches(task_id: int, node_id: int, watchers: int) -> bool:
    """Is this node one of the generation's lease watchers?"""
    return node_id == 0 and 1 <= task_id <= watchers


def backstop_period(active_nodes: int) -> float:
    """Seconds between two looks of a node that is neither task 0 nor a watcher."""
    return max(BACKSTOP_MIN_PERIOD_S, active_nodes * BACKSTOP_CALLS / BACKSTOP_CALLS_PER_S)


@dataclass(frozen=True)
class Measured:
    """What one node of each role costs, as measured: task 0 and a watcher in calls
    per second, any other node in calls per look (it looks once per backstop period)."""

    task0: float
    watcher: float
    other_per_look: float


def generation_load(measured: Measured, nodes: int, watchers: int) -> float:
    """Control-directory calls per second of a whole generation of `nodes` active nodes
    while it trains: task 0, the watchers, and every other node once per backstop
    period."""
    watching = min(watchers, nodes - 1)
    others = max(0, nodes - 1 - watching)
    return (
        measured.task0
        + watching * measured.watcher
        + others * measured.other_per_look / backstop_period(nodes)
    )
