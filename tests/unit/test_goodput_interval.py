"""The save interval that maximises expected goodput: the model's formula against a
brute-force simulation of the same model, and the estimate on recorded chains whose save
costs and failure times are known."""

from __future__ import annotations

import json
import math
import random

import pytest

from nvrx_appliance.goodput import save_interval, summary
from nvrx_appliance.goodput.account import Allocation, Inputs, account
from nvrx_appliance.observe.training_log import from_progress_log
from nvrx_appliance.observe.types import Cycle
from tests.unit.test_goodput import T0, chain_inputs

# --- the model ------------------------------------------------------------------------------


def simulate(tau: float, save_s: float, restart_s: float, rate: float, segments: int) -> float:
    """The model played out: each segment is tau seconds of work then a save of save_s; an
    interruption (exponential gaps at `rate`) loses the segment under way and costs
    restart_s, during which another may strike. Work kept over time spent."""
    rng = random.Random(30)
    spent = 0.0
    for _ in range(segments):
        while (gap := rng.expovariate(rate)) < tau + save_s:
            spent += gap
            while (again := rng.expovariate(rate)) < restart_s:
                spent += again
            spent += restart_s
        spent += tau + save_s
    return segments * tau / spent


SAVE_S, RESTART_S, RATE = 30.0, 120.0, 1 / 3600.0  # a 30 s save, a 2 min restart, MTBF 1 h


@pytest.mark.parametrize("tau", [60.0, 300.0, 600.0, 1200.0, 3600.0])
def test_the_expected_goodput_is_what_a_simulation_of_the_model_gives(tau):
    simulated = simulate(tau, SAVE_S, RESTART_S, RATE, segments=40_000)
    assert save_interval.expected_goodput(tau, SAVE_S, RESTART_S, RATE) == pytest.approx(
        simulated, rel=0.015
    )


def test_the_optimum_is_the_best_interval_of_a_brute_force_search():
    best = save_interval.optimal_tau(SAVE_S, RATE)
    grid = [0.5 * i for i in range(1, 20_000)]
    searched = max(grid, key=lambda t: save_interval.expected_goodput(t, SAVE_S, RESTART_S, RATE))
    assert best == pytest.approx(searched, abs=0.5)
    # The simulation agrees that shorter and longer intervals lose goodput.
    at_best = simulate(best, SAVE_S, RESTART_S, RATE, segments=40_000)
    assert at_best > simulate(best / 3, SAVE_S, RESTART_S, RATE, segments=40_000)
    assert at_best > simulate(best * 3, SAVE_S, RESTART_S, RATE, segments=40_000)


def test_the_optimum_is_youngs_square_root_when_saves_are_cheap_against_the_mtbf():
    # sqrt(2 C MTBF): 30 s saves, a failure every 100 h
    rate = 1 / (100 * 3600.0)
    assert save_interval.optimal_tau(SAVE_S, rate) == pytest.approx(
        save_interval.young_tau(SAVE_S, rate), rel=0.01
    )
    assert save_interval.optimal_tau(SAVE_S, 0.0) == math.inf


def test_the_rate_bounds_are_the_exact_poisson_ones():
    # chi-square quantiles / 2: (0, 3.00) for none, (1.97, 10.51) for five, per unit exposure
    assert save_interval.rate_interval(0, 1.0) == pytest.approx((0.0, 2.996), abs=1e-3)
    assert save_interval.rate_interval(5, 2.0) == pytest.approx((1.970 / 2, 10.513 / 2), abs=1e-3)


# --- recorded chains -------------------------------------------------------------------------

STEP_S, SAVE_EVERY, SAVE_COST = 1.0, 10, 2.0


def recorded_chain(failures_after: list[int], restart_gaps: list[float]) -> Inputs:
    """One generation on node1 and node2 (one hot spare, node3): cycle n trains from where
    cycle n-1's last save left it, saving every 10 iterations at 2 s a save, and fails
    `failures_after[n]` iterations in; the next cycle trains `restart_gaps[n]` seconds
    after the failed one's last progress. The last cycle trains on to its time limit."""
    events, cycles = [], []
    clock, kept = 100.0, 0
    plan = [*failures_after, 55]
    for number, trains in enumerate(plan):
        start = clock - 3  # NVRx's cycle start; training begins 3 s later
        events.append({"event": "start", "slurm_array_job_id": "7", "cycle": number,
                       "time": T0 + clock, "iteration": kept})  # fmt: skip
        iteration = kept
        for _ in range(trains):
            iteration += 1
            clock += STEP_S
            events.append({"event": "step", "slurm_array_job_id": "7", "cycle": number,
                           "time": T0 + clock, "iteration": iteration})  # fmt: skip
            if iteration % SAVE_EVERY == 0:
                clock += SAVE_COST
                events.append({"event": "checkpoint", "slurm_array_job_id": "7", "cycle": number,
                               "time": T0 + clock, "iteration": iteration,
                               "seconds": SAVE_COST})  # fmt: skip
                kept = iteration
        end = clock + 1 if number < len(failures_after) else None
        cycles.append(Cycle("7", 0, number, T0 + start, None if end is None else T0 + end,
                            "node[1-2]"))  # fmt: skip
        if number < len(restart_gaps):
            clock += restart_gaps[number]
    stop = clock + 1
    allocations = tuple(
        Allocation("7", task, (node,), "TIMEOUT", T0, T0 + stop)
        for task, node in enumerate(("node1", "node2", "node3"))
    )
    return Inputs(
        job_name="rec", work_dir="/shared/rec", now=T0 + stop + 10, allocations=allocations,
        cycles={"7": cycles}, work=from_progress_log(events), work_source="progress log",
        save_interval=SAVE_EVERY,
    )  # fmt: skip


def test_a_recorded_chain_gives_its_save_cost_failure_rate_and_restart_cost():
    gaps = [20.0, 30.0, 25.0, 40.0, 35.0, 22.0]
    inputs = recorded_chain([17, 23, 9, 31, 14, 26], gaps)
    result = save_interval.recommend(account(inputs))
    assert result.save_s == pytest.approx(SAVE_COST) and result.saves > 6
    assert result.rate is not None and result.rate.interruptions == 6
    assert result.restart_s == pytest.approx(statistics_median(gaps)) and result.restarts == 6
    stop = inputs.allocations[0].end - T0
    assert result.rate.node_hours == pytest.approx(2 * stop / 3600)  # node3 stood by
    assert result.rate.per_node_hour == pytest.approx(6 / (2 * stop / 3600))
    assert result.nodes == 2 and result.certainty == "fair"
    per_s = 6 / stop  # two nodes at the per-node rate: six interruptions in `stop` seconds
    best = save_interval.optimal_tau(SAVE_COST, per_s)
    assert result.recommended_iterations == round(best / STEP_S)
    assert result.current_iterations == SAVE_EVERY
    assert result.current_goodput == pytest.approx(
        save_interval.expected_goodput(SAVE_EVERY * STEP_S, SAVE_COST, result.restart_s, per_s)
    )
    assert result.recommended_goodput > result.current_goodput
    low, high = result.range_iterations
    assert low < result.recommended_iterations < high


def statistics_median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return (ordered[middle - 1] + ordered[middle]) / 2 if len(ordered) % 2 == 0 else ordered[middle]


def test_the_report_says_the_interval_to_set_and_how_sure_it_is():
    inputs = recorded_chain([17, 23, 9, 31, 14, 26], [20.0, 30.0, 25.0, 40.0, 35.0, 22.0])
    result = account(inputs)
    rec = save_interval.recommend(result)
    text = "\n".join(summary.lines(result))
    assert (
        f"save interval: 10 iterations (10.0 s of training) today, {rec.recommended_iterations} "
        in text
    )
    assert "a save blocks training 2.00 s (median of" in text
    assert "6 interruption(s) in " in text and "of the training nodes" in text
    assert f"apply it: --save-interval {rec.recommended_iterations} (NVRX_SAVE_INTERVAL)" in text
    assert "only 6 interruption(s)" not in text
    doc = json.loads(json.dumps(summary.to_json(result)))["save_interval"]
    assert doc["recommended_iterations"] == rec.recommended_iterations
    assert doc["interruptions"] == 6 and doc["certainty"] == "fair"
    assert doc["expected_goodput"]["current"] == pytest.approx(rec.current_goodput)


def test_a_chain_with_two_failures_says_the_rate_is_uncertain():
    # The goodput tests' chain: a hang restarted in place, then task 0's node lost.
    result = account(chain_inputs(save_interval=50))
    rec = save_interval.recommend(result)
    assert rec.rate is not None and rec.rate.interruptions == 2 and rec.certainty == "low"
    # In-job: the last logged step at 22.5 -> training again at 47; hand-off: the last step
    # at 55.5 -> the generation's last task at 101, then the successor's 13 s start-up.
    assert sorted(save_interval.history(result)[1]) == pytest.approx([24.5, 45.5 + 13])
    assert rec.save_s == pytest.approx(0.5)
    text = "\n".join(summary.lines(result))
    assert "only 2 interruption(s): the rate is known to a factor of 18" in text


@pytest.mark.parametrize(
    "entry, counted",
    [
        ({"action": "fenced"}, True),
        ({"action": "released_spares", "exit_code": 1}, True),
        ({"action": "cancelled_chain", "exit_code": 93}, False),
        ({"action": "completed", "exit_code": 0}, False),
        ({"action": "cancelled_chain", "exit_code": 143}, False),
    ],
)
def test_only_a_failure_ends_a_generation_as_an_interruption(entry, counted):
    result = account(chain_inputs(ledger=[{"array_job_id": "10", **entry}]))
    assert result.generations[0].interrupted is counted
    assert save_interval.history(result)[0] == 1 + counted  # plus generation 10's in-job restart


def test_no_interruption_yet_gives_no_interval_but_says_why_and_its_bound():
    inputs = recorded_chain([], [])
    result = account(inputs)
    rec = save_interval.recommend(result)
    assert rec.recommended_iterations is None and rec.certainty == "none"
    assert rec.reason == "no interruption yet: nothing to trade the save cost against"
    assert rec.range_iterations[0] is not None  # what the highest plausible rate would want
    text = "\n".join(summary.lines(result))
    assert "no recommendation: no interruption yet" in text
    assert summary.to_json(result)["save_interval"]["recommended_iterations"] is None


def test_without_a_save_measured_there_is_no_recommendation():
    result = account(chain_inputs(work={}, work_source="no progress log"))
    rec = save_interval.recommend(result)
    assert rec.recommended_iterations is None
    assert rec.reason.startswith("no save was measured; no step time was measured")
