"""A setting declares what a value of it alone may be (bounds, choices, a pattern), and
check() judges every setting by its declaration: adding a setting is one field."""

from __future__ import annotations

import dataclasses
import json

import pytest

from nvrx_appliance.settings import policy
from nvrx_appliance.settings.chain import ChainSpec, check, flag, spec_fields

BASE = ChainSpec(work_dir="/shared/alice/run", workload="cpu")
BOUNDED = [f for f in spec_fields() if f.metadata.get("minimum") is not None]
CHOOSING = [f for f in spec_fields() if f.metadata.get("choices")]


def problems_of(name: str, spec: ChainSpec) -> list[str]:
    return [p.message for p in check(spec) if p.option == flag(name)]


def test_the_base_spec_is_sound():
    assert check(BASE) == []


@pytest.mark.parametrize("f", BOUNDED, ids=lambda f: f.name)
def test_a_value_below_its_declared_minimum_is_refused_naming_the_value(f):
    low = f.metadata["minimum"]
    below = low - (1 if isinstance(f.default, int) else 0.5)
    found = problems_of(f.name, dataclasses.replace(BASE, **{f.name: type(f.default)(below)}))
    assert [m for m in found if f"(got {type(f.default)(below)})" in m]


@pytest.mark.parametrize("f", BOUNDED, ids=lambda f: f.name)
def test_the_declared_minimum_itself_passes_its_own_check(f):
    at = dataclasses.replace(BASE, **{f.name: type(f.default)(f.metadata["minimum"])})
    assert not [m for m in problems_of(f.name, at) if "(got " in m]


def test_the_messages_say_the_rule_in_words():
    said = {
        "train_tasks": "must be at least 1 (got 0); set --train-tasks 1 or more",
        "hot_spares": "cannot be negative (got -1); use 0 for none",
        "step_timeout": "must be a positive number of seconds (got 0)",
        "rdzv_port": "must be between 1024 and 65535 (got 1023); ports below 1024 need "
        "root, and the job runs as you: pick one of 1024 to 65535",
    }
    for name, message in said.items():
        low = spec_fields()[[f.name for f in spec_fields()].index(name)].metadata["minimum"]
        assert problems_of(name, dataclasses.replace(BASE, **{name: low - 1})) == [message]
    above = dataclasses.replace(BASE, cpu_step_pause=11.0)
    assert problems_of("cpu_step_pause", above) == ["must be between 0 and 10 seconds (got 11.0)"]


@pytest.mark.parametrize("f", CHOOSING, ids=lambda f: f.name)
def test_a_value_outside_the_declared_choices_is_refused_listing_them(f):
    found = problems_of(f.name, dataclasses.replace(BASE, **{f.name: "bogus"}))
    assert found == [
        f"unknown {f.name.replace('_', ' ')} 'bogus'; choose one of "
        + ", ".join(f.metadata["choices"])
    ]


def test_a_rendezvous_port_only_root_could_listen_on_is_refused():
    assert problems_of("rdzv_port", dataclasses.replace(BASE, rdzv_port=80)) == [
        "must be between 1024 and 65535 (got 80); ports below 1024 need root, and the job "
        "runs as you: pick one of 1024 to 65535"
    ]


def test_an_empty_value_is_a_choice_only_where_empty_is_the_default():
    assert problems_of("runtime", dataclasses.replace(BASE, runtime="")) == []
    assert problems_of("mode", dataclasses.replace(BASE, mode="")) != []


def test_a_declared_pattern_names_what_to_write_instead():
    assert problems_of("time_limit", dataclasses.replace(BASE, time_limit="1h")) == [
        "'1h' is not a Slurm time; use e.g. 01:00:00 or 1-00:00:00"
    ]
    assert problems_of("gpu_failure", dataclasses.replace(BASE, gpu_failure="")) == []


def sample_policy() -> dict:
    decided = policy.decide(BASE, tracker="/w/t", static_tracker="/w/s")  # type: ignore[arg-type]
    return json.loads(json.dumps(dataclasses.asdict(decided)))


COUNTS = [f.name for f in dataclasses.fields(policy.Policy) if f.metadata.get("minimum") == 0]


def test_the_policy_declares_its_counts():
    assert set(COUNTS) == {"max_no_progress_cycles", "checkpoints_kept", "checkpoint_fallbacks"}


@pytest.mark.parametrize("name", COUNTS)
def test_run_json_with_a_negative_policy_count_is_refused(name):
    with pytest.raises(ValueError, match=f"'{name}' cannot be negative"):
        policy.from_dict({**sample_policy(), name: -1})


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(policy.Policy)])
def test_run_json_with_a_policy_field_of_the_wrong_type_is_refused(name):
    with pytest.raises(ValueError, match=f"'{name}' has the wrong type"):
        policy.from_dict({**sample_policy(), name: [1]})


def test_a_policy_read_back_is_the_policy_written():
    data = sample_policy()
    assert dataclasses.asdict(policy.from_dict(data)) == data
