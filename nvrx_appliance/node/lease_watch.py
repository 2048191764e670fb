"""How a node judges task 0's lease, and the clocks both sides judge it with.

A peer never compares the lease's mtime with a clock, neither its own nor the file
system's: who stamps an mtime differs between file systems (the server on a local
disk or NFS, the writing client on Lustre), and a clock that leads or lags would age
the lease by its error. Instead a peer watches the lease's stat for change. Every
refresh changes it (utime stamps a new mtime and ctime, and refreshes come at least a
second apart, so even a file system that keeps whole seconds shows each one), so the
time for which this node has seen the same stat is, by its own clock, a lower bound on
how long task 0 has gone without a refresh:

    before = clock(); stat the lease; after = clock()

    a new stat: task 0 refreshed at or before this stat ended, so at or before `after`
    the same stat: no refresh landed between the stat that first showed it (ended by
        `seen_at`) and this one (issued after `before`): unchanged for before - seen_at

A stall anywhere in this (between the clock reads and the stat, or between two looks)
can only make the figure smaller, never larger: a look after the stall sees any
refresh made during it. The figure never depends on the clock's reading, only on how
fast it runs (lease.CLOCK_RATE_ERROR).

The clocks: a peer reads CLOCK_MONOTONIC_RAW, which NTP never slews and a wall-clock
step never moves (it stops while the node is suspended, which can only make a peer
late, never early). Task 0 judges its own deadline by the larger of MONOTONIC_RAW and
BOOTTIME elapsed: BOOTTIME counts a suspend, so a task 0 that wakes past its deadline
stops itself at its next poll, and RAW keeps an NTP slew of BOOTTIME from stretching
the deadline. Pure but for reading those clocks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# The parts of a stat that a refresh changes: inode (a lease replaced), mtime, ctime.
Stamp = tuple[int, int, int]

_RAW = getattr(time, "CLOCK_MONOTONIC_RAW", None)
_BOOT = getattr(time, "CLOCK_BOOTTIME", None)


def peer_clock() -> float:
    """Seconds, for measuring how long a peer has watched the lease go unchanged."""
    return time.clock_gettime(_RAW) if _RAW is not None else time.monotonic()


def task0_reading() -> tuple[float, float]:
    """Task 0's clocks at one moment: (RAW, BOOTTIME)."""
    boot = time.clock_gettime(_BOOT) if _BOOT is not None else time.monotonic()
    return peer_clock(), boot


def elapsed(since: tuple[float, float], now: tuple[float, float]) -> float:
    """Seconds between two task-0 readings: the larger of the two clocks' counts, so a
    suspend (BOOTTIME only) and a slewed-slow BOOTTIME (RAW is not) both count."""
    return max(now[0] - since[0], now[1] - since[1])


@dataclass(frozen=True)
class Track:
    """What a node has seen of the lease: its stat, and when that stat first showed."""

    stamp: Stamp | None = None
    seen_at: float = 0.0  # this node's clock just after the stat that first returned it


def observe(track: Track, stamp: Stamp | None, before: float, after: float):
    """Fold one look at the lease in. Returns the new track and the seconds for which
    the lease has at least gone unrefreshed (0.0 when it just changed; None: no lease).
    `before`/`after`: this node's clock just before the stat and just after it."""
    if stamp is None:
        return Track(), None
    if stamp != track.stamp:
        return Track(stamp, after), 0.0
    return track, max(0.0, before - track.seen_at)
