"""`nvrx-appliance plan`: the simulation against the closed forms where they are exact,
the two designs' differences where they differ, and the command as a person reads it.
Horizons are short and seeds few: the whole file runs in a few seconds."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from click.testing import CliRunner

from nvrx_appliance.cli.main import cli
from nvrx_appliance.goodput import save_interval
from nvrx_appliance.goodput.account import account
from nvrx_appliance.plan import costs, history, model, rates, request
from nvrx_appliance.plan.simulate import (
    APPLIANCE,
    ENDING,
    SEEDS,
    Scenario,
    Settings,
    run_seeds,
    simulate,
)
from tests.unit.test_goodput import alloc, chain_inputs
from tests.unit.test_goodput_interval import SAVE_COST, T0, recorded_chain

DAY = 86400.0
FREE = {name: 0.0 for name in costs.STEPS}  # every recovery step costs nothing


def scenario(
    *,
    nodes: int = 1000,
    per_day: dict[str, float] | None = None,
    steps: dict[str, float] | None = None,
    save_s: float = 60.0,
    days: float = 20.0,
    time_limit: float = math.inf,
    unloadable: float = 0.0,
) -> Scenario:
    """A run whose interruptions come at `per_day` (each class, for the whole run)."""
    per_day = per_day or {}
    thousand = {k: v * 1000.0 / nodes for k, v in per_day.items()}
    if "task0_loss" in per_day:
        thousand["task0_loss"] = per_day["task0_loss"] * 1000.0  # of task 0's one node
    shape = costs.Shape(nodes)
    priced = costs.measured(
        shape,
        checkpoint_gb=0.0,
        storage_gbps=1.0,
        save_s=save_s,
        overrides={**FREE, **(steps or {})},
    )
    zero = {name: 0.0 for name in rates.RATE_FIELDS}
    return Scenario(
        shape,
        rates.Rates(**{**zero, **thousand}, unloadable=unloadable),
        priced,
        time_limit,
        days * DAY,
        response_s=3600.0,
    )


TODAY = Settings(save_interval_s=600.0, hot_spares=1, cold_spares=1000, lease_s=45.0, depth=10**6)


def test_without_failures_only_the_saves_cost_anything():
    # 20 days is a whole number of 660 s segments: the ETTR is exactly tau / (tau + C).
    run = scenario(days=660.0 * 2618 / DAY)
    outcome = simulate(run, TODAY, APPLIANCE, seed=1)
    assert outcome.ettr == pytest.approx(600.0 / 660.0, abs=1e-12)
    assert outcome.seconds["training_lost"] == 0.0


def test_poisson_crashes_that_cost_nothing_match_the_renewal_model():
    # 24 crashes a day for 20 days, about 480 a seed: 8 seeds' mean within 0.5 points.
    run = scenario(per_day={"rank_crash": 24.0})
    lam = 24.0 / DAY
    expected = save_interval.expected_goodput(600.0, 60.0, 0.0, lam)
    got = run_seeds(run, TODAY, APPLIANCE, seeds=8).ettr
    assert got == pytest.approx(expected, abs=0.005)


def test_a_fixed_restart_cost_matches_the_renewal_model_too():
    # Every crash costs 300 s of restart, and one that strikes during a restart starts it
    # over: the renewal model's rule, so its closed form is exact in expectation.
    run = scenario(per_day={"rank_crash": 24.0}, steps={"nvrx_waits": 300.0})
    lam, tau, save, restart = 24.0 / DAY, 600.0, 60.0, 300.0
    renewal = save_interval.expected_goodput(tau, save, restart, lam)
    assert run_seeds(run, TODAY, APPLIANCE, seeds=8).ettr == pytest.approx(renewal, abs=0.005)
    assert model.closed_form(run, TODAY, APPLIANCE) == pytest.approx(renewal, rel=1e-9)


def test_failures_strike_in_wall_time_and_one_during_a_recovery_restarts_it():
    # 24 crashes a day and 2 h of restart after each: they come at 24 a day of wall time,
    # recovering or not (over 4 seeds of 30 days, 2,880 expected), those that land in a
    # restart do so as often as the run restarts, and each starts the restart over, so the
    # ETTR is the renewal model's, e^(lam R) and all (80 seeds: a run of 30 days keeps
    # only about 70 segments, so one seed spreads widely).
    run = scenario(per_day={"rank_crash": 24.0}, steps={"nvrx_waits": 7200.0}, days=30.0)
    crashes = during = restarting = 0.0
    for seed in range(4):
        outcome = simulate(run, TODAY, APPLIANCE, seed=seed)
        crashes += outcome.interruptions["rank_crash"]
        during += outcome.interruptions["during_a_recovery"]
        restarting += outcome.seconds["in_job_restarts"]
    assert crashes == pytest.approx(4 * 30 * 24, rel=0.05)
    assert during / crashes == pytest.approx(restarting / (4 * 30 * DAY), abs=0.03)
    assert during / crashes > 0.8  # e^(-2): most restarts are struck before they end
    renewal = save_interval.expected_goodput(600.0, 60.0, 7200.0, 24.0 / DAY)
    assert run_seeds(run, TODAY, APPLIANCE, seeds=80).ettr == pytest.approx(renewal, abs=0.005)


def test_the_best_interval_beats_a_much_shorter_and_a_much_longer_one():
    run = scenario(per_day={"rank_crash": 24.0}, steps={"nvrx_waits": 60.0})
    best = model.best_interval(run)
    assert best == pytest.approx(save_interval.optimal_tau(60.0, 24.0 / DAY))

    def ettr(tau: float) -> float:
        return run_seeds(run, replace(TODAY, save_interval_s=tau), APPLIANCE, seeds=6).ettr

    assert ettr(best) > ettr(best / 4)
    assert ettr(best) > ettr(best * 4)


def test_a_lost_task0_costs_the_seeds_the_store_wait_and_the_appliance_its_lease():
    run = scenario(per_day={"task0_loss": 10.0}, steps={"store_wait": 300.0})
    appliance = run_seeds(run, TODAY, APPLIANCE, seeds=4)
    seeds = run_seeds(run, TODAY, SEEDS, seeds=4)
    # A loss that strikes while the last one's generation ends goes with it: each of the
    # others costs its detection whole.
    for run_of, detection in ((appliance, 45.0), (seeds, 300.0)):
        losses = run_of.interruptions["task0_loss"] - run_of.interruptions[ENDING]
        assert run_of.seconds["hand_offs"] == pytest.approx(detection * losses, rel=1e-9)
    assert appliance.ettr > seeds.ettr


def test_the_appliance_saves_at_the_time_limit_and_the_seeds_lose_half_a_segment():
    # Generations of 2 h 5 min, no failures, recovery free: every limit strikes the seeds
    # 7500 mod 660 = 240 s into a segment, and that work is lost.
    run = scenario(days=10.0, time_limit=7500.0)
    appliance = simulate(run, TODAY, APPLIANCE, seed=0)
    seeds = simulate(run, TODAY, SEEDS, seed=0)
    assert appliance.seconds["training_lost"] == 0.0
    limits = seeds.generations - 1
    assert seeds.seconds["training_lost"] == pytest.approx(limits * (7500.0 % 660.0))


def test_spares_run_out_as_often_as_the_poisson_tail_says():
    # 3 node deaths a generation on average, 2 spares: P(more than 2) = 0.577.
    run = scenario(per_day={"node_death": 3.0}, days=200.0, time_limit=DAY)
    settings = replace(TODAY, hot_spares=1, cold_spares=1)
    closed = model.spares_out_chance(run, settings)
    assert closed == pytest.approx(1 - math.exp(-3 * 0.999) * (1 + 2.997 + 2.997**2 / 2), rel=1e-3)
    assert run_seeds(run, settings, APPLIANCE, seeds=4).spares_out == pytest.approx(
        closed, abs=0.06
    )
    assert model.cold_spares_for(run, hot=1) == 7  # P(N > 8) < 1% at a mean of 3


def test_a_chain_too_shallow_stops_until_a_person_resubmits():
    run = scenario(days=10.0, time_limit=DAY)
    short = simulate(run, replace(TODAY, depth=3), APPLIANCE, seed=0)
    deep = replace(TODAY, depth=model.depth_for(run, TODAY, APPLIANCE))
    assert short.resubmits == 3 and short.seconds["waiting_for_a_person"] == 3 * 3600.0
    assert simulate(run, deep, APPLIANCE, seed=0).resubmits == 0


def test_an_unloadable_checkpoint_costs_the_appliance_a_segment_and_the_seeds_a_person():
    run = scenario(per_day={"rank_crash": 24.0}, unloadable=0.2)
    appliance = run_seeds(run, TODAY, APPLIANCE, seeds=3)
    seeds = run_seeds(run, TODAY, SEEDS, seeds=3)
    assert appliance.seconds.get("waiting_for_a_person", 0.0) == 0.0
    assert seeds.seconds["waiting_for_a_person"] > 0
    assert appliance.ettr > seeds.ettr


def test_a_hang_takes_a_spare_on_the_appliance_and_restarts_in_place_in_the_seeds_design():
    # 3 hangs a generation, a hot and a cold spare, a 30 s step timeout. On the appliance
    # the stacks name each hung node, which leaves as a dead one does (its ft_launcher
    # exits on the failed health check, so a cold spare is admitted): the spares run out
    # as often as for 3 deaths. NVRx alone restarts in place and never runs out.
    hung = scenario(per_day={"hang": 3.0}, days=200.0, time_limit=DAY, steps={"detect_hang": 30.0})
    dead = scenario(per_day={"node_death": 3.0}, days=200.0, time_limit=DAY)
    settings = replace(TODAY, hot_spares=1, cold_spares=1)
    closed = model.spares_out_chance(hung, settings)
    assert closed == model.spares_out_chance(dead, settings)
    appliance = run_seeds(hung, settings, APPLIANCE, seeds=4)
    assert appliance.spares_out == pytest.approx(closed, abs=0.06)
    seeds = run_seeds(hung, settings, SEEDS, seeds=4)
    assert seeds.spares_out == 0.0
    assert seeds.seconds["hangs_until_detected"] == pytest.approx(
        30.0 * seeds.interruptions["hang"], rel=0.02
    )


def test_llama3s_table_is_the_default_rate():
    defaults = rates.Rates()
    assert rates.LLAMA3_UNEXPECTED == 419
    assert defaults.interrupting() == pytest.approx(419 * 1000 / (2048 * 54))


def test_a_figure_used_beyond_the_measured_sizes_says_so_and_segment_mode_polls_slower():
    small = costs.measured(costs.Shape(8), checkpoint_gb=1, storage_gbps=1)
    large = costs.measured(costs.Shape(8192, segment=2), checkpoint_gb=1, storage_gbps=1)
    assert not small.steps["worker_start"].extrapolated
    assert "held at 8,192" in large.steps["worker_start"].extrapolated
    assert not large.steps["store_wait"].extrapolated  # a timeout: nothing to extrapolate
    assert large.s("nvrx_waits") == pytest.approx(small.s("nvrx_waits") + 8192 / 2000 - 1)


# --- the command -------------------------------------------------------------------------------


def plan(*args: str):
    return CliRunner().invoke(cli, ["plan", "--days", "10", "--seeds", "2", *args])


def section(lines: list[str], title: str) -> list[str]:
    """The lines of one part of the plan: from its title to the blank line after it."""
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    end = next((i for i in range(start, len(lines)) if not lines[i]), len(lines))
    return lines[start:end]


def test_the_plan_reads_as_a_person_needs_it():
    result = plan("--nodes", "512", "--step-seconds", "4")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == (
        "Plan for 4,096 GPUs (512 nodes x 8, 1 node(s) per task), 10 days, generations of 24.0 h"
    )
    assert lines[1].startswith("Predicted ETTR: ")  # the answer, second
    assert "closed form" in lines[2] and "goodput of the allocation" in lines[2]
    assert "dominant loss: " in "\n".join(lines[3:6])
    assert "from Llama 3 (arXiv 2407.21783, Table 5)" in result.output
    rows = [line.split()[0] for line in section(lines, "Settings (")[1:-2]]
    assert rows == ["time", "save", "hot", "cold", "lease", "depth", "all"]
    assert any(
        line.startswith("  submit with: --time 1-00:00:00 --save-interval ") for line in lines
    )
    assert any(line.startswith("    --hot-spares ") for line in lines)
    assert any(line.startswith("The seeds' design at the same settings: ETTR ") for line in lines)
    assert any("measured at 4-16 nodes, held at 512: " in line for line in lines)


def test_the_plan_as_json():
    result = plan("--nodes", "64", "--json")
    doc = json.loads(result.output)
    assert doc["schema"] == "nvrx-appliance/plan"
    assert doc["shape"]["gpus"] == 512
    assert set(doc["recommended"]) == {
        "save_interval_seconds",
        "hot_spares",
        "cold_spares",
        "lease_stale_after",
        "depth",
    }
    assert doc["appliance"]["ettr"] >= doc["seeds_design"]["ettr"] - 0.01
    assert sum(doc["appliance"]["breakdown"].values()) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--nodes", "0"], "nvrx-appliance plan: --nodes 0: the nodes that train, 1 to 10,000,000"),
        (["--nodes", "20000000"], "--nodes 20000000: the nodes that train, 1 to 10,000,000"),
        (
            ["--node-death", "-1"],
            "--node-death -1: interruptions per 1,000 node-days, 0 to 10,000,000",
        ),
        (["--rank-crash", "1e308"], "--rank-crash 1e+308: interruptions per 1,000 node-days"),
        (["--hang", "nan"], "--hang nan: interruptions per 1,000 node-days, 0 to 10,000,000"),
        (["--cost", "warp=1"], "--cost warp=1: 'warp' is no step; choose from detect_crash"),
        (["--cost", "worker_start=inf"], "--cost worker_start=inf: worker_start: the step's"),
        (["--queue-wait", "inf"], "--queue-wait inf: the seconds a generation waits for nodes"),
        (["--queue-wait", "nan"], "--queue-wait nan: the seconds a generation waits for nodes"),
        (["--save-seconds", "1e9"], "--save-seconds 1e+09: the seconds a save blocks training"),
        (["--checkpoint-gb", "inf"], "--checkpoint-gb inf: 0 to 1,000,000,000 GB"),
        (["--storage-gbps", "0"], "--storage-gbps 0: the storage's write and read rate, 0.001"),
        (["--days", "inf"], "--days inf: the run's length in days, above 0 and at most 3,650"),
        (["--time", "soon"], "is no Slurm time; give e.g. 1-00:00:00 (a day), 04:00:00, or 0 or"),
        (["--max-time", "soon"], "Invalid value for '--max-time': 'soon' is no Slurm time"),
    ],
)
def test_bad_input_names_the_option_and_the_fix(args, said):
    result = plan(*args)
    assert result.exit_code == 2
    assert said in result.output


def test_request_defaults_are_valid():
    assert request.problems(request.Request()) == []


# --- a chain's history -------------------------------------------------------------------------


def test_a_chains_history_gives_its_rates_and_costs_and_the_plan_uses_them():
    gaps = [20.0, 30.0, 25.0, 40.0, 35.0, 22.0]
    inputs = recorded_chain([17, 23, 9, 31, 14, 26], gaps)
    seen = history.read(account(inputs), nodes_per_task=1)
    stop = inputs.allocations[0].end - T0
    assert seen.in_job_restarts == 6 and seen.hand_offs == 0
    assert seen.rank_crash == pytest.approx(6 * 1000 / (2 * stop / DAY))
    assert seen.save_s == pytest.approx(SAVE_COST)
    assert seen.restart_s == pytest.approx(sum(gaps) / len(gaps))
    assert "6 in-job restart(s) (counted as rank crashes)" in seen.source
    asked = request.with_history(request.Request(nodes=2, days=1.0), seen)
    run = request.scenario(asked, seen)
    assert run.rates.rank_crash == seen.rank_crash and run.rates.node_death == 0.0
    assert run.costs.save.seconds == pytest.approx(SAVE_COST)
    assert costs.in_job_restart(run.costs, "detect_crash") == {
        "in_job_restarts": pytest.approx(sum(gaps) / len(gaps))
    }


def test_a_chains_interruptions_are_priced_by_what_they_led_to():
    # Cycles 1 and 3 trained on node3 in node2's place (a spare came in); the others on
    # the same two nodes. Each outcome gets its own mean; the plan uses each whole.
    gaps = [20.0, 30.0, 25.0, 40.0, 35.0, 22.0]
    inputs = recorded_chain([17, 23, 9, 31, 14, 26], gaps)
    moved = {1: "node[1,3]", 3: "node[1,3]"}
    cycles = [
        c._replace(active_nodes=moved.get(c.number, c.active_nodes)) for c in inputs.cycles["7"]
    ]
    inputs = replace(inputs, cycles={"7": cycles})
    found = save_interval.interruptions(account(inputs))
    # Cycle n comes after gap n-1; 1, 2, 3 and 4 moved from the cycle before.
    assert [i.outcome for i in found] == ["replaced", "replaced", "replaced", "replaced",
                                          "in_place", "in_place"]  # fmt: skip
    seen = history.read(account(inputs), nodes_per_task=1)
    assert seen.replaced_s == pytest.approx(sum(gaps[:4]) / 4) and seen.replaced_measured == 4
    assert seen.restart_s == pytest.approx(sum(gaps[4:]) / 2) and seen.restarts_measured == 2
    assert seen.hand_off_s is None
    run = request.scenario(request.with_history(request.Request(nodes=2), seen), seen)
    assert costs.in_job_restart(run.costs, "detect_hang", replaced=True) == {
        "in_job_restarts": pytest.approx(sum(gaps[:4]) / 4)
    }
    # A crash in place: the chain's in-place cost, its detection in it.
    assert costs.in_job_restart(run.costs, "detect_crash") == {
        "in_job_restarts": pytest.approx(sum(gaps[4:]) / 2)
    }


def test_interruptions_before_training_is_back_share_the_time_so_the_costs_add_up():
    # Cycle 2 never trained (its record is gone): the restarts into cycle 2 and cycle 3
    # share the stretch from cycle 1's last progress to cycle 3's training start, half
    # each, so the costs still add up to the time the chain spent recovering.
    gaps = [20.0, 30.0, 25.0, 40.0, 35.0, 22.0]
    inputs = recorded_chain([17, 23, 9, 31, 14, 26], gaps)
    work = {k: w for k, w in inputs.work.items() if w.cycle != 2}
    found = save_interval.interruptions(account(replace(inputs, work=work)))
    one, three = work[next(k for k in work if k[1] == 1)], work[next(k for k in work if k[1] == 3)]
    last = max([t for t, _ in one.steps] + [v.ended for v in one.saves])
    assert three.started is not None
    stretch = three.started - last
    assert [i.cost_s for i in found[1:3]] == [pytest.approx(stretch / 2)] * 2
    assert [i.cost_s for i in found] == pytest.approx([gaps[0], *[stretch / 2] * 2, *gaps[3:]])


def test_rates_given_with_a_chain_stand_and_the_chain_gives_its_costs():
    gaps = [20.0, 30.0, 25.0]
    seen = history.read(account(recorded_chain([17, 23, 9], gaps)), nodes_per_task=1)
    given = rates.Rates(node_death=7.0, rank_crash=3.0, hang=2.0, task0_loss=0.0)
    asked = request.with_history(request.Request(nodes=2, rates=given, rates_given=True), seen)
    assert (asked.rates.node_death, asked.rates.rank_crash, asked.rates.hang) == (7.0, 3.0, 2.0)
    assert f"costs from chain {seen.name}" in asked.rates.source
    run = request.scenario(asked, seen)
    assert run.costs.restart_whole is not None
    assert run.costs.restart_whole.seconds == pytest.approx(sum(gaps) / 3)
    # Without rates of its own, the chain's count stands (its restarts as crashes).
    plain = request.with_history(request.Request(nodes=2, rates=given), seen)
    assert plain.rates.rank_crash == seen.rank_crash and plain.rates.node_death == 0.0


def test_at_llama3s_shape_the_appliance_trains_over_90_percent_as_meta_published():
    # 2,048 nodes, 54 days, the 47 planned interruptions as generation ends (27.6 h):
    # docs/plan.md's check. The seeds' design loses a little more (time limits, task 0).
    asked = request.Request(
        nodes=2048, days=54.0, time_limit_s=54 * DAY / 47, seeds=4, profile="local"
    )
    found = model.plan(
        request.scenario(asked), asked.today, seeds=4, grace=3.0, storage_stall_s=40.0
    )
    assert 0.90 < found.appliance.ettr < 0.95
    assert found.seeds.ettr < found.appliance.ettr
    assert sum(found.appliance.interruptions.get(k, 0) for k in rates.RATE_FIELDS) == pytest.approx(
        419, rel=0.1
    )


def test_nothing_fails_while_no_node_is_held():
    # A 2 h queue wait before each generation and a crash an hour: every wait is whole.
    run = scenario(per_day={"rank_crash": 24.0}, days=10.0, time_limit=DAY)
    run = replace(run, costs=replace(run.costs, queue_wait=7200.0))
    outcome = simulate(run, TODAY, APPLIANCE, seed=3)
    assert outcome.seconds["queue_wait"] == pytest.approx(7200.0 * (outcome.generations - 1))


def test_a_generation_a_failure_ended_is_a_task0_loss_and_the_chains_own_end_is_not():
    # Generation 10 was fenced (task 0 lost) and 11 took over: a hand-off.
    inputs = chain_inputs()
    assert history.read(account(inputs), nodes_per_task=1).hand_offs == 1
    # The chain cancelled while 11 trained: its task 0 exits 143, which reads as a failure,
    # but it ends the chain and hands nothing off.
    cancelled = replace(
        inputs,
        allocations=(*inputs.allocations[:3], alloc("11", 0, "node2", 102, 200, "CANCELLED")),
        ledger=[*inputs.ledger, {"array_job_id": "11", "exit_code": 143}],
    )
    ended = account(cancelled)
    assert ended.generations[-1].interrupted
    seen = history.read(ended, nodes_per_task=1)
    assert seen.hand_offs == 1 and seen.in_job_restarts == 1
