"""Task 0's liveness lease: every margin in one place, and why they nest.

Three durations decide who may act when task 0 stops answering, all measured from the
last refresh that task 0 started (the lease's mtime is stamped at or after that moment,
by the shared file system's clock):

    refresh period   task 0 touches its lease this often
    self-fence       task 0 has failed to refresh for this long: it stops its own
                     ft_launcher and workers (TERM, then KILL after the grace)
    stale threshold  a peer sees a lease this old: task 0 is dead; the first peer to
                     notice fences the generation and the successor may start

They must nest, or two task 0s could train at once: a task 0 that cannot refresh must
be stopped before any peer may call it dead. Task 0 notices within one poll of its
deadline and needs at most the grace to stop everything, so

    self-fence + poll + grace + safety  <=  stale threshold

and a live task 0 must ride out a slow write, so the self-fence deadline spans at least
two refresh periods. A threshold too short for that is refused at submit.

What the threshold trades: a shorter one hands off sooner after a real node death (the
successor starts about one threshold after it), a longer one rides out longer stalls of
the shared file system without stopping a healthy generation. Pure.
"""

from __future__ import annotations

import math

# How often the gate and the supervisor look at the control directory (and task 0 at
# its own deadline).
POLL_S = 1.0
# Room for scheduling delays of the stopping process on a loaded node.
SAFETY_S = 1.0
# Refresh often enough that several refreshes fit in the window, rarely enough that
# thousands of generations do not load the metadata server.
MIN_REFRESH_S, MAX_REFRESH_S = 1.0, 5.0
REFRESHES_PER_THRESHOLD = 6
# A live task 0 must survive this many refreshes in a row that fail or stall.
MISSED_REFRESHES_TOLERATED = 2


def refresh_period(stale_after: float) -> float:
    return max(MIN_REFRESH_S, min(MAX_REFRESH_S, stale_after / REFRESHES_PER_THRESHOLD))


def self_fence_after(stale_after: float, grace: float) -> float:
    """Seconds without a successful refresh after which task 0 stops itself."""
    return stale_after - POLL_S - grace - SAFETY_S


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
