"""`plan` prints finite figures and strict JSON for every input it accepts, and refuses
the rest with exit 2, naming the option, the value given and the fix (issue 54, item 2)."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nvrx_appliance.cli.main import cli


def plan(*args: str):
    return CliRunner().invoke(cli, ["plan", "--days", "2", "--seeds", "2", *args])


def _refuse(constant: str) -> float:
    raise ValueError(f"not JSON: {constant}")


def strict(text: str) -> dict:
    """JSON as a strict parser reads it: NaN, Infinity and -Infinity are refused."""
    return json.loads(text, parse_constant=_refuse)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--step-seconds", "5e-324"], "--step-seconds 4.94066e-324: a training step's seconds, "
         "at least 0.001"),
        (["--step-seconds", "1e-300"], "--step-seconds 1e-300: a training step's seconds"),
        (["--checkpoint-gb", "1e9", "--storage-gbps", "1e-300"],
         "--storage-gbps 1e-300: the storage's write and read rate, 0.001 to"),
        (["--checkpoint-gb", "1e9", "--storage-gbps", "1"],
         "--checkpoint-gb 1e+09 at --storage-gbps 1: the whole write takes 1e+09 s, over"),
        (["--total-rate", "inf"], "--total-rate inf: interruptions per 1,000 node-days"),
        (["--cost", "worker_start=nan"], "--cost worker_start=nan: worker_start: the step's"),
        (["--response-minutes", "-5"], "--response-minutes -5: a person's answer in minutes"),
    ],
)  # fmt: skip
def test_a_value_that_cannot_give_a_finite_plan_is_refused_with_what_was_given(args, said):
    result = plan(*args)
    assert result.exit_code == 2, result.output
    assert said in result.output


def test_the_smallest_step_gives_a_save_interval_a_person_can_type():
    result = plan("--step-seconds", "0.001")
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if "--save-interval " in x)
    iterations = line.split("--save-interval ")[1].split()[0]
    assert len(iterations) <= 12


def test_no_interruptions_give_no_endless_interval_in_json():
    doc = strict(plan("--total-rate", "0", "--json").output)
    assert doc["young_interval_seconds"] is None
    assert doc["recommended"]["save_interval_seconds"] <= doc["time_limit_seconds"]


# Every option the command takes, each drawn from plain values and from the edges:
# zero, the tiniest and the largest floats, the bounds, inf and nan.
EDGES = [0.0, 5e-324, 1e-300, 1e-3, 1.0, 1e6, 1e9, 1e300, math.inf, math.nan, -1.0]


def _figure(low: float, high: float) -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from(EDGES), st.floats(low, high))


OPTIONS = {
    "--nodes": st.integers(-1, 300_000),
    "--gpus-per-node": st.integers(0, 2048),
    "--days": _figure(0.01, 30),
    "--node-death": _figure(0, 1e3),
    "--rank-crash": _figure(0, 1e3),
    "--hang": _figure(0, 1e3),
    "--task0-loss": _figure(0, 1e3),
    "--unloadable": _figure(0, 1),
    "--checkpoint-gb": _figure(0, 1e7),
    "--storage-gbps": _figure(1e-3, 1e4),
    "--save-seconds": _figure(0, 1e4),
    "--load-seconds": _figure(0, 1e4),
    "--step-seconds": _figure(1e-3, 1e3),
    "--queue-wait": _figure(0, 1e5),
    "--save-minutes": _figure(0, 1e4),
    "--lease-stale-after": _figure(0, 1e3),
    "--storage-stall": _figure(0, 1e3),
    "--time": st.sampled_from(["0", "00:00:01", "00:10:00", "01:00:00", "7-00:00:00"]),
    "--profile": st.sampled_from(["local", "cluster"]),
    "--total-rate": _figure(0, 1e3),
}


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(st.dictionaries(st.sampled_from(sorted(OPTIONS)), st.none(), max_size=6).flatmap(
    lambda keys: st.fixed_dictionaries({k: OPTIONS[k] for k in keys})
))  # fmt: skip
# The inputs the issue found, always tried beside what hypothesis draws.
@example({"--step-seconds": 5e-324})
@example({"--checkpoint-gb": 1e9, "--storage-gbps": 1e-300})
@example({"--total-rate": 0.0})
def test_every_accepted_input_gives_strict_json_and_every_refusal_names_its_option(chosen):
    args = [x for option, value in chosen.items() for x in (option, str(value))]
    result = CliRunner().invoke(cli, ["plan", "--seeds", "2", *args, "--json"])
    if result.exit_code == 0:
        strict(result.output)
        return
    assert result.exit_code == 2, (args, result.output, result.exception)
    named = result.output.splitlines()[-1]
    assert any(option in named for option in [*OPTIONS, "--checkpoint-gb", "--cost"]), named
