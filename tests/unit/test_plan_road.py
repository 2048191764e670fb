"""The road to 98% (issue 54): for the run asked about, what each lever is worth past the
recommended plan, whether the appliance has it today and with which setting, or whose it
is where it is not the appliance's; every lever together."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from nvrx_appliance.cli.main import cli
from nvrx_appliance.plan import model, request
from nvrx_appliance.plan.simulate import APPLIANCE, Settings
from nvrx_appliance.settings.chain import ChainSpec

LEVERS = [
    "async save",
    "load",
    "hang detection",
    "node-death detection",
    "worker start",
    "hot spares",
    "generation length",
]


def plan(*args: str) -> str:
    result = CliRunner().invoke(cli, ["plan", "--days", "30", "--seeds", "2", *args])
    assert result.exit_code == 0, result.output
    return result.output


def road(out: str) -> dict[str, str]:
    lines = out.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("The road to 98%"))
    rows = lines[start + 1 : lines.index("", start)]
    names = ["all of them", *LEVERS]
    return {name: next(r for r in rows if r.startswith(f"  {name} ")) for name in names}


def test_every_lever_is_printed_with_whether_the_appliance_has_it_and_which_setting():
    rows = road(plan("--nodes", "2048"))
    assert rows["async save"].endswith("has it: --async-save (its copy: --save-seconds)")
    assert rows["hang detection"].endswith("has it: --step-timeout 180")
    assert rows["node-death detection"].endswith("has it: --node-silence-timeout 10")
    assert rows["hot spares"].endswith("has it: --hot-spares 1")
    assert rows["generation length"].endswith("has it: --time, up to the partition's MaxTime")
    # Costs that are not the appliance's say whose they are.
    assert rows["worker start"].endswith("your GPU stack's: CUDA, NCCL, the model")
    assert rows["load"].endswith("the workload's: a local or in-memory restore")
    assert "32.8 s -> 1.00 s" in rows["async save"]
    assert "5.0 min -> 60.0 s" in rows["worker start"]
    # The settings a person passes move the row with them.
    moved = road(plan("--nodes", "2048", "--step-timeout", "60", "--node-silence-timeout", "5"))
    assert moved["hang detection"].endswith("has it: --step-timeout 60")
    assert "60.0 s, as good" in moved["hang detection"]
    assert "+0.00" in moved["node-death detection"]


def test_each_lever_is_worth_what_the_closed_form_gains_with_it_alone():
    sc = request.scenario(request.Request(nodes=2048, days=30, time_limit_s=86400.0))
    found = model.plan(sc, request.Request().today, seeds=2, grace=3.0, storage_stall_s=40.0)
    by = {lever.name: lever for lever in found.levers}
    assert [lever.name for lever in found.levers] == LEVERS
    base = found.closed_goodput  # the closed form, the hot spares' idle nodes counted
    hot = found.recommended.hot_spares
    assert base == pytest.approx(
        model.closed_form(found.scenario, found.recommended, APPLIANCE) * 2048 / (2048 + hot)
    )
    # Async saves, and worker starts of a minute, are worth points at 16,384 GPUs; a
    # second hot spare holds idle nodes for nothing.
    assert by["async save"].worth > 0.03
    assert by["worker start"].worth > 0.01
    assert by["hot spares"].worth < 0.001
    assert found.all_levers > base + by["async save"].worth


def test_json_carries_the_road():
    doc = json.loads(plan("--nodes", "2048", "--json"))["road"]
    assert [lever["lever"] for lever in doc["levers"]] == LEVERS
    worker = next(x for x in doc["levers"] if x["lever"] == "worker start")
    assert worker["the_appliance"] == "your GPU stack's: CUDA, NCCL, the model"
    assert (worker["now"], worker["to"]) == (300.0, 60.0)
    assert doc["all_levers_allocation_goodput"] > doc["plan_allocation_goodput_closed_form"]


def test_the_async_lever_takes_the_interval_anew_and_the_appliance_saves_async_by_default():
    sc = request.scenario(request.Request(nodes=2048, days=30, time_limit_s=86400.0))
    best = Settings(model.best_interval(sc), 1, 12, 46.0, 95)
    name, now, to, move = model._moves(sc, best)[0]
    moved, settings = move(sc, best)
    assert (name, round(now, 1), to) == ("async save", 32.8, 1.0)
    assert moved.costs.save.seconds == 1.0 and moved.costs.write_behind is not None
    assert settings.save_interval_s == pytest.approx(model.best_interval(moved))
    assert settings.save_interval_s < best.save_interval_s / 4
    assert ChainSpec().async_save  # a Megatron chain saves asynchronously unless told not to
