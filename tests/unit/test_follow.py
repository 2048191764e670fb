"""The follow loop `status --watch`, the demo and qualify share. The clock and the sleep
are handed in, so the loop's decisions are tested without waiting for anything."""

from nvrx_appliance.observe import follow


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_following_stops_at_the_first_tick_that_sees_the_end():
    clock, seen = Clock(), iter(["queued", "running", "ended", "never read"])
    followed = follow.follow(
        lambda slurm: next(seen), lambda s: s == "ended", deadline_s=60, poll_s=2,
        clock=clock, sleep=clock.sleep,
    )  # fmt: skip
    assert followed == follow.Followed("ended", timed_out=False)
    assert clock.slept == [2, 2]  # no sleep after the last tick


def test_a_chain_not_ended_by_the_deadline_is_reported_as_timed_out_with_what_was_seen():
    clock = Clock()
    followed = follow.follow(
        lambda slurm: clock.now, lambda s: False, deadline_s=5, poll_s=2,
        clock=clock, sleep=clock.sleep,
    )  # fmt: skip
    assert followed.timed_out and followed.last == 6.0
