"""The settings `plan` recommends, as a person applies them (issue 54, items 7 and 9):
today's time limit is submit's, the longest the partition allows is advised, the depth
stays within what a chain queues, the worths are the allocation's goodput and add up to
the gap they explain, and the output fits a terminal."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from nvrx_appliance.cli.main import cli
from nvrx_appliance.plan import model
from nvrx_appliance.settings.chain import ChainSpec
from nvrx_appliance.settings.generation_end import slurm_seconds


def plan(*args: str):
    result = CliRunner().invoke(cli, ["plan", "--days", "10", "--seeds", "2", *args])
    assert result.exit_code == 0, result.output
    return result.output


def plan_json(*args: str) -> dict:
    return json.loads(plan(*args, "--json"))


def test_todays_time_limit_is_submits_and_the_longest_allowed_is_advised():
    doc = plan_json("--nodes", "2048")
    assert doc["today_time_limit_seconds"] == slurm_seconds(ChainSpec().time_limit) == 3600
    assert doc["time_limit_seconds"] == 86400  # --max-time's default, a day
    limit = next(c for c in doc["choices"] if c["setting"].startswith("time limit"))
    assert (limit["today"], limit["recommended"]) == (3600, 86400)
    assert limit["worth_allocation_goodput"] > 0.05  # start-ups every hour, at 300 s each
    out = plan("--nodes", "2048")
    assert "  submit with: --time 1-00:00:00 --save-interval " in out
    assert "  time limit     60.0 min -> 24.0 h" in out


def test_at_hour_long_generations_the_advice_is_a_longer_time_not_thousands_of_generations():
    doc = plan_json("--nodes", "2048", "--days", "90")
    assert doc["recommended"]["depth"] < 100  # 90 day-long generations and a few more
    short = plan_json("--nodes", "2048", "--days", "90", "--max-time", "01:00:00")
    assert short["recommended"]["depth"] > 2000  # what hour-long ones need


def test_the_recommended_depth_is_never_more_than_a_chain_queues():
    out = plan("--time", "00:01:00", "--max-time", "00:01:00", "--days", "90")
    doc = plan_json("--time", "00:01:00", "--max-time", "00:01:00", "--days", "90")
    assert doc["recommended"]["depth"] == model.MOST_DEPTH
    assert doc["depth_needed"] > model.MOST_DEPTH
    text = " ".join(out.split())
    assert f"more than a chain queues ({model.MOST_DEPTH:,})" in text
    assert "a longer --time needs fewer" in text


@pytest.mark.parametrize("words", ["UNLIMITED", "infinite", "Unlimited"])
def test_slurms_own_words_for_no_limit_are_taken(words):
    doc = plan_json("--nodes", "64", "--time", words, "--max-time", words)
    assert doc["time_limit_seconds"] is None and doc["today_time_limit_seconds"] is None
    assert "--time 0 " in plan("--nodes", "64", "--time", words, "--max-time", words)


def test_the_worths_are_the_allocations_goodput_and_add_up_to_the_gap():
    doc = plan_json("--nodes", "1")  # a hot spare here is half the allocation
    gap = doc["appliance"]["allocation_goodput"] - (
        doc["appliance_today"]["ettr"] * 1 / (1 + doc["today"]["hot_spares"])
    )
    assert sum(c["worth_allocation_goodput"] for c in doc["choices"]) == pytest.approx(
        gap, abs=1e-9
    )
    out = plan("--nodes", "1")
    assert "points of the allocation's goodput, each given those above" in out
    all_of_them = next(x for x in out.splitlines() if x.startswith("  all of them") and "->" in x)
    assert f"{gap * 100:+.2f}" in all_of_them


def test_with_no_interruptions_the_interval_is_not_called_the_renewal_models_optimum():
    doc = plan_json("--total-rate", "0")
    interval = next(c for c in doc["choices"] if c["setting"].startswith("save interval"))
    assert interval["recommended"] == doc["time_limit_seconds"]
    assert interval["why"] == "no interruptions: nothing to lose between the time-limit saves"
    assert "the renewal model's optimum" not in interval["why"]


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("--profile", "local"),
        ("--nodes", "1"),
        ("--nodes", "16384", "--total-rate", "6.5"),
        ("--time", "00:01:00", "--max-time", "00:01:00"),
        ("--days", "0.1", "--seeds", "3"),
        ("--total-rate", "0"),
        ("--save-seconds", "1", "--load-seconds", "5", "--step-seconds", "4"),
    ],
)
def test_every_line_fits_a_terminal_and_the_answer_comes_second(args):
    lines = plan(*args).splitlines()
    assert max(len(line) for line in lines) <= 100
    assert lines[1].startswith("Predicted ETTR: ")
    assert len(lines) <= 75
    assert sum(line.startswith("  submit with: --time ") for line in lines) == 1


def test_submit_with_carries_the_save_interval_in_steps_when_the_step_is_known():
    out = plan("--nodes", "2048", "--step-seconds", "4")
    line = next(x for x in out.splitlines() if x.startswith("  submit with: "))
    steps = int(line.split("--save-interval ")[1].split()[0])
    tau = plan_json("--nodes", "2048", "--step-seconds", "4")["recommended"]
    assert steps == round(tau["save_interval_seconds"] / 4)
    assert not math.isnan(steps)


def test_a_time_limit_longer_than_the_partitions_most_is_kept():
    doc = plan_json("--nodes", "64", "--time", "2-00:00:00")
    assert doc["time_limit_seconds"] == doc["today_time_limit_seconds"] == 2 * 86400


def test_a_whole_write_over_30_days_is_taken_where_the_save_and_the_load_are_given():
    doc = plan_json("--checkpoint-gb", "1e9", "--storage-gbps", "1", "--save-seconds", "1",
                    "--load-seconds", "5")  # fmt: skip
    assert doc["schema_version"] == 2
    assert doc["assumptions"]["write_behind_seconds"] == 1e9
