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


# --- who watches, and what a whole generation costs (issue 24) ---------------------------


def test_node_0_of_the_first_array_tasks_after_task_0_are_the_watchers():
    assert [t for t in range(6) if lease.watches(t, 0, 3)] == [1, 2, 3]
    assert not lease.watches(1, 1, 3)  # a task's other nodes leave its watching to node 0
    assert not lease.watches(0, 0, 3)  # task 0 judges its own lease by its refreshes


def test_a_generation_costs_the_metadata_server_no_more_at_ten_thousand_nodes_than_at_ten():
    # As measured on the local cluster with one node of each role.
    measured = lease.Measured(task0=1.2, watcher=2.0, other_per_look=2.0)
    loads = {n: lease.generation_load(measured, n, 3) for n in (10, 1_000, 10_000, 100_000)}
    ceiling = 1.2 + 3 * 2.0 + lease.BACKSTOP_CALLS_PER_S
    assert all(load <= ceiling for load in loads.values()), loads
    assert loads[10_000] <= 200  # the target
    # The design before it: every peer read the lease and stamped a probe every second.
    every_peer_watching = lease.Measured(task0=1.2, watcher=5.8, other_per_look=0.0)
    assert lease.generation_load(every_peer_watching, 10_000, 9_999) > 57_000


def test_the_backstop_period_grows_with_the_generation_and_never_falls_below_its_floor():
    assert lease.backstop_period(3) == lease.BACKSTOP_MIN_PERIOD_S
    assert lease.backstop_period(10_000) == 200.0  # 10,000 x 2 calls / 100 calls/s
