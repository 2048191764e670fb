"""Task 0's lease margins: a task 0 that cannot refresh stops before any peer may call
it dead, and a live one rides out a slow write."""

import pytest

from bench import chains
from nvrx_appliance import lease
from nvrx_appliance.settings.chain import ChainSpec, check
from nvrx_appliance.workflows.demo import QUICK


def _flag(flags: tuple[str, ...], name: str, default: float) -> float:
    return float(flags[flags.index(name) + 1]) if name in flags else default


DEFAULT = ChainSpec()


@pytest.mark.parametrize(
    "stale, grace",
    [
        (DEFAULT.lease_stale_after, DEFAULT.closed_flag_grace),
        (QUICK["lease_stale_after"], DEFAULT.closed_flag_grace),  # the demo and the tests
        (
            _flag(chains.FAST, "--lease-stale-after", DEFAULT.lease_stale_after),
            _flag(chains.FAST, "--closed-flag-grace", DEFAULT.closed_flag_grace),
        ),  # the benchmarks
    ],
)
def test_every_shipped_setting_stops_task_0_before_its_peers_may_call_it_dead(stale, grace):
    deadline = lease.self_fence_after(stale, grace)
    # Task 0 notices within a poll of its deadline and needs at most the grace to stop.
    assert deadline + lease.POLL_S + grace < stale
    assert deadline >= 2 * lease.refresh_period(stale)
    assert lease.problem(stale, grace) is None


def test_a_threshold_too_short_for_the_grace_is_refused_naming_the_option_and_the_fix():
    def lease_problems(**settings):
        return [p for p in check(ChainSpec(**settings)) if p.option == "--lease-stale-after"]

    [problem] = lease_problems(lease_stale_after=5, closed_flag_grace=3)
    assert "use at least 8 s" in problem.message
    assert lease_problems(lease_stale_after=8, closed_flag_grace=3) == []


@pytest.mark.parametrize("grace", [0, 1, 3, 10, 30])
def test_the_shortest_threshold_offered_is_the_shortest_that_nests(grace):
    shortest = lease.shortest(grace)
    assert lease.problem(shortest, grace) is None
    assert lease.problem(shortest - 1, grace) is not None
