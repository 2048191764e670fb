"""An async save's write behind it is work at risk (issue 54, item 5): the segment it
saved is durable only once the whole write ends, so a failure before then takes it too,
in the simulation and in the closed form alike."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from nvrx_appliance.cli.main import cli
from nvrx_appliance.plan import costs, model, rates, request
from nvrx_appliance.plan.simulate import APPLIANCE, Scenario, Settings, run_seeds

DAY = 86400.0
SETTINGS = Settings(600.0, 1, 10**4, 46.0, 10**5)


def crashes(save_s: float, checkpoint_gb: float) -> Scenario:
    """24 crashes a day on 1,000 nodes, free restarts and loads, a save of `save_s` and
    a checkpoint whose whole write at 1 GB/s takes `checkpoint_gb` seconds."""
    priced = costs.measured(
        costs.Shape(1000),
        checkpoint_gb=checkpoint_gb,
        storage_gbps=1.0,
        save_s=save_s,
        load_s=0.0,
        overrides={name: 0.0 for name in costs.STEPS},
    )
    zero = {name: 0.0 for name in rates.RATE_FIELDS}
    crash = rates.Rates(**{**zero, "rank_crash": 24.0})
    return Scenario(costs.Shape(1000), crash, priced, float("inf"), 20 * DAY, 3600.0)


def test_a_failure_during_the_write_behind_a_save_takes_that_segment_too():
    # A 1 s staging copy, then 300 s of write: a crash in those 300 s loses the segment
    # before it as well, tau * 300 / (tau + 1) more per crash on average.
    synchronous = crashes(save_s=1.0, checkpoint_gb=0.5)  # written within the block
    behind = crashes(save_s=1.0, checkpoint_gb=300.0)
    assert synchronous.costs.write_behind is None
    assert behind.costs.write_behind is not None
    assert behind.costs.write_behind.seconds == 300.0
    plain = run_seeds(synchronous, SETTINGS, APPLIANCE, seeds=8)
    risky = run_seeds(behind, SETTINGS, APPLIANCE, seeds=8)
    extra = (risky.seconds["training_lost"] - plain.seconds["training_lost"]) / (
        risky.interruptions["rank_crash"]
    )
    assert extra == pytest.approx(600.0 * 300.0 / 601.0, rel=0.15)
    assert risky.ettr < plain.ettr - 0.05


def test_the_closed_form_counts_the_write_behind_as_the_simulation_does():
    behind = crashes(save_s=1.0, checkpoint_gb=300.0)
    simulated = run_seeds(behind, SETTINGS, APPLIANCE, seeds=8).ettr
    assert simulated == pytest.approx(model.closed_form(behind, SETTINGS, APPLIANCE), abs=0.005)


def test_a_segment_shorter_than_the_write_waits_for_it_before_the_next_save():
    behind = crashes(save_s=1.0, checkpoint_gb=300.0)
    assert costs.blocking_save_s(behind.costs, 100.0) == pytest.approx(1.0 + 200.0)
    assert costs.blocking_save_s(behind.costs, 600.0) == pytest.approx(1.0)


def test_the_plan_says_the_write_follows_and_json_carries_it():
    args = ["plan", "--days", "10", "--seeds", "2", "--nodes", "2048", "--save-seconds", "1"]
    out = CliRunner().invoke(cli, args).output
    assert "its whole write follows it, 32.8 s: a failure before it ends takes that segment" in out
    doc = json.loads(CliRunner().invoke(cli, [*args, "--json"]).output)
    assert doc["assumptions"]["write_behind_seconds"] == pytest.approx(32.768)
    sync = request.scenario(request.Request(nodes=2048))
    assert sync.costs.write_behind is None  # the whole write blocks: nothing behind it
