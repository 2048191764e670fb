"""How a node judges task 0's lease (issue 24, section 2): by how long it has seen the
lease's stat go unchanged, by its own clock. A stall can only shorten that figure, and
neither the lease's mtime nor any wall clock enters it, so a clock that leads or lags
cannot age a live task 0's lease or keep a dead one's fresh."""

from __future__ import annotations

import json
import os

from nvrx_appliance import lease
from nvrx_appliance.layout import ControlFiles
from nvrx_appliance.node import control, controldir, gate, lease_watch

OURS = control.generation("chain-1", "4242", "2026-01-01T00:00:00")
STALE_AFTER = 10.0


class Clock:
    """This node's clock, as the test moves it: each read returns the current time, then
    applies the next scheduled jump (a stall of the process between two reads)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.jumps: list[float] = []

    def __call__(self) -> float:
        reading = self.now
        if self.jumps:
            self.now += self.jumps.pop(0)
        return reading


def _lease(tmp_path):
    directory = tmp_path / "control"
    controldir.prepare(directory, os.geteuid())
    path = ControlFiles(directory).lease
    path.write_text(json.dumps({"generation": OURS}) + "\n")
    return directory, path


def _refresh(path, stamped_at: float) -> None:
    """Task 0's refresh, as a file system whose clock reads `stamped_at` stamps it."""
    os.utime(path, (stamped_at, stamped_at))


def _stale(unchanged: float | None) -> bool:
    verdict = gate.while_running(
        closed=False, lease_age=unchanged, watch_lease=True, stale_after=STALE_AFTER
    )
    return verdict is not None and verdict.fence


def test_a_stall_while_the_lease_is_read_never_ages_a_live_lease(tmp_path):
    # The case: a lease refreshed 0.7 s ago looked 12.3 s old after a 12 s stall
    # between its stat and the clock probe. Here the stall falls between the two clock
    # reads around the stat, on a look that follows a refresh: the figure starts from
    # the later read, and the next look measures from there.
    directory, path = _lease(tmp_path)
    clock = Clock()
    watch = controldir.LeaseWatch(directory, OURS, clock)
    assert watch.look() == 0.0
    clock.now += 0.7
    _refresh(path, 1.0e9)
    clock.jumps = [12.0]  # stalled between `before` and `after` of this look
    assert watch.look() == 0.0
    clock.now += 0.5
    assert watch.look() == 0.5
    assert not _stale(watch.look())


def test_a_stall_between_two_looks_is_seen_through_by_the_next_stat(tmp_path):
    # Task 0 refreshed while this node was stopped: the look after the stall sees it.
    directory, path = _lease(tmp_path)
    clock = Clock()
    watch = controldir.LeaseWatch(directory, OURS, clock)
    watch.look()
    clock.now += 60.0
    _refresh(path, 1.0e9)
    assert watch.look() == 0.0


def test_a_lease_that_stops_changing_goes_stale_one_threshold_later_by_this_nodes_clock(
    tmp_path,
):
    directory, path = _lease(tmp_path)
    clock = Clock()
    watch = controldir.LeaseWatch(directory, OURS, clock)
    for second in range(5):  # refreshed every second, then never again
        _refresh(path, 1.0e9 + second)
        assert watch.look() == 0.0
        clock.now += 1.0
    clock.now += STALE_AFTER - 1.0
    assert not _stale(watch.look())  # unchanged for exactly the threshold: not yet
    clock.now += 0.5
    assert _stale(watch.look())


def test_a_clock_an_hour_ahead_or_behind_stamping_the_lease_changes_nothing(tmp_path):
    # On Lustre the writing client stamps the mtime with its own clock; anywhere, a
    # node's wall clock may be far off. Neither enters the verdict: a lease stamped an
    # hour in the future still goes stale when it stops changing, and one stamped an
    # hour in the past is fresh while it changes.
    for offset in (+3600.0, -3600.0):
        directory, path = _lease(tmp_path / str(offset))
        clock = Clock()
        watch = controldir.LeaseWatch(directory, OURS, clock)
        wall = os.stat(path).st_mtime + offset
        for second in range(3):
            _refresh(path, wall + second)
            assert not _stale(watch.look())
            clock.now += 1.0
        clock.now += STALE_AFTER + 1.0
        assert _stale(watch.look()), offset


def test_a_lease_of_another_run_or_none_is_no_lease(tmp_path):
    directory, path = _lease(tmp_path)
    other = control.generation("chain-0", "4242", "2025-06-01T00:00:00")
    path.write_text(json.dumps({"generation": other}) + "\n")
    assert controldir.LeaseWatch(directory, OURS, Clock()).look() is None
    path.unlink()
    assert controldir.LeaseWatch(directory, OURS, Clock()).look() is None


def test_task_0s_deadline_counts_a_suspend_and_is_not_stretched_by_a_slewed_clock():
    # (RAW, BOOTTIME) readings. Suspended for 60 s: RAW stops, BOOTTIME goes on.
    assert lease_watch.elapsed((100.0, 500.0), (101.0, 561.0)) == 61.0
    # NTP slewing BOOTTIME slow (it may, up to 8 %): RAW, which it does not slew, counts.
    assert lease_watch.elapsed((100.0, 500.0), (110.0, 509.2)) == 10.0


def test_the_margins_hold_with_every_clock_off_by_the_rate_bound_in_the_worst_direction():
    # Task 0's clock slow, every peer's fast, by lease.CLOCK_RATE_ERROR: task 0 still has
    # stopped (deadline, a poll, the grace, the safety) before a peer may call it dead.
    slow, fast = 1 - lease.CLOCK_RATE_ERROR, 1 + lease.CLOCK_RATE_ERROR
    for stale in (6, 10, 15, 45, 120, 600, 3600):
        for grace in (0, 1, 3, 10, 30):
            if lease.problem(stale, grace) is not None:
                continue
            deadline = lease.self_fence_after(stale, grace)
            stopped_by = (deadline + lease.POLL_S + grace) / slow + lease.SAFETY_S
            earliest_fence = stale / fast
            assert stopped_by <= earliest_fence + 1e-9, (stale, grace)


def test_peers_and_task_0_read_clocks_that_exist_and_move_forward():
    first, then = lease_watch.peer_clock(), lease_watch.task0_reading()
    assert lease_watch.peer_clock() >= first
    assert lease_watch.elapsed(then, lease_watch.task0_reading()) >= 0.0
