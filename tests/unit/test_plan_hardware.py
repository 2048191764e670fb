"""`plan`'s headline is for the hardware it plans for (issue 54, item 1): the real-hardware
profile by default, named in the headline, with the local cluster's CPU stand-in behind
--profile local; detection costs what the appliance's own settings make it cost."""

from __future__ import annotations

import json

from click.testing import CliRunner

from nvrx_appliance.cli.main import cli
from nvrx_appliance.plan import costs, profiles


def plan(*args: str):
    result = CliRunner().invoke(cli, ["plan", "--days", "10", "--seeds", "2", *args])
    assert result.exit_code == 0, result.output
    return result.output


def headline(output: str) -> str:
    return next(x for x in output.splitlines() if x.startswith("Predicted ETTR"))


def test_the_readmes_example_plans_real_hardware_and_its_headline_says_so():
    out = plan("--nodes", "2048")
    assert headline(out).endswith("with a real GPU cluster's costs (--profile cluster)")
    assert json.loads(plan("--nodes", "2048", "--json"))["costs"]["profile"] == "cluster"


def test_the_cpu_stand_in_is_an_explicit_choice_and_its_headline_says_so():
    out = plan("--nodes", "2048", "--profile", "local")
    assert headline(out).endswith("with the local cluster's CPU stand-in (--profile local)")


def test_a_silent_node_death_costs_the_appliances_silence_timeout_on_any_hardware():
    # Not Slurm's SlurmdTimeout (300 s): the appliance's own beats and timeout, so the
    # local figure holds on real hardware and both profiles use it.
    for profile in profiles.NAMES:
        doc = json.loads(plan("--nodes", "64", "--profile", profile, "--json"))["costs"]
        death = doc["detect_node_death"]
        assert death["seconds"] == costs.SILENT_DEATH_DETECTED_S
        assert "row silentdeath" in death["source"]
        assert death["holds_on_real_hardware"] is True
    assert profiles.HOLDS["detect_node_death"][0] is True
    assert "detect_node_death" not in profiles.CLUSTER_FIGURES
    # A longer silence timeout costs its difference.
    doc = json.loads(plan("--nodes", "64", "--node-silence-timeout", "30", "--json"))
    assert doc["costs"]["detect_node_death"]["seconds"] == costs.SILENT_DEATH_DETECTED_S + 20


def test_a_hang_costs_the_chains_step_timeout_not_an_nvrx_default():
    doc = json.loads(plan("--nodes", "64", "--json"))["costs"]["detect_hang"]
    assert doc["seconds"] == 180.0 and "the chain's --step-timeout" in doc["source"]
    assert "NVRx's default" not in doc["source"]
    given = json.loads(plan("--nodes", "64", "--step-timeout", "60", "--json"))
    assert given["costs"]["detect_hang"]["seconds"] == 60.0
