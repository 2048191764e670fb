"""Every declared setting, walked through each way in: the command line, the environment
and a run.json read back. Each is refused the same way below its bound, with a value of
the wrong type, and accepted empty where its help says what empty means. Adding a setting
adds its cases here without a line of test."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from click.testing import CliRunner

from nvrx_appliance import manifest
from nvrx_appliance.cli.main import cli
from nvrx_appliance.settings.chain import ChainSpec, flag, spec_fields
from nvrx_appliance.settings.declared import kind

FIELDS = spec_fields()
BOUNDED = [f for f in FIELDS if f.metadata.get("minimum") is not None]
NUMERIC = [f for f in FIELDS if kind(f) in ("int", "float")]
WITH_ENV = [f for f in FIELDS if f.metadata.get("env")]
# Where the help says what an empty value means, empty is a value the user can give.
EMPTY_MEANS = [
    f for f in FIELDS if "empty" in f.metadata["help"].lower() and kind(f) != "list[str]"
]
WORK = "/shared/alice/run"


def below(f: dataclasses.Field):
    low = f.metadata["minimum"]
    return int(low) - 1 if kind(f) == "int" else low - 0.5


def dry_run(args=(), env=None):
    base = {"SLURM_CONF": "/nonexistent/slurm.conf", "NVRX_WORK_DIR": WORK}
    argv = ["submit", "--dry-run", "--runtime", "bare", "--workload", "cpu", *args]
    return CliRunner().invoke(cli, argv, env={**base, **(env or {})})


def refused_naming(result, *words):
    assert result.exit_code == 2, result.output
    assert "#!/bin/bash" not in result.stdout
    lines = [line for line in result.output.splitlines() if all(w in line for w in words)]
    assert lines, (words, result.output)


def run_json(**spec_values):
    """A run.json as submit writes it, with spec values written over by hand."""
    built = manifest.build(ChainSpec(work_dir=WORK, workload="cpu", runtime="bare"),
                           created="2026-12-05T00:00:00Z", user="alice")  # fmt: skip
    data = json.loads(json.dumps(built.to_json()))
    data["spec"].update(spec_values)
    return data


def test_the_walk_covers_every_setting_that_has_a_bound_a_type_or_an_empty_meaning():
    assert {f.name for f in BOUNDED} >= {"lease_stale_after", "train_tasks", "fault_delay"}
    assert {f.name for f in EMPTY_MEANS} >= {"mem", "partition", "image", "mounts"}
    assert len(WITH_ENV) == len(FIELDS)


@pytest.mark.parametrize("f", BOUNDED, ids=lambda f: f.name)
def test_below_its_bound_a_setting_is_refused_from_the_command_line(f):
    refused_naming(dry_run([flag(f.name), str(below(f))]), flag(f.name), f"(got {below(f)})")


@pytest.mark.parametrize("f", BOUNDED, ids=lambda f: f.name)
def test_below_its_bound_a_setting_is_refused_from_the_environment(f):
    result = dry_run(env={f.metadata["env"]: str(below(f))})
    refused_naming(result, flag(f.name), f"(got {below(f)})")


@pytest.mark.parametrize("f", BOUNDED, ids=lambda f: f.name)
def test_below_its_bound_a_setting_is_refused_from_run_json(f):
    with pytest.raises(manifest.ManifestError) as refused:
        manifest.parse(run_json(**{f.name: below(f)}))
    assert flag(f.name) in str(refused.value) and f"(got {below(f)})" in str(refused.value)


@pytest.mark.parametrize("value", ["0", "-5"])
def test_the_lease_cannot_be_turned_off_with_zero_from_any_source(value):
    fix = "the lease cannot be turned off; leave it at the default 46"
    refused_naming(dry_run(["--lease-stale-after", value]), "--lease-stale-after", fix)
    refused_naming(dry_run(env={"NVRX_LEASE_STALE_AFTER": value}), "--lease-stale-after", fix)
    with pytest.raises(manifest.ManifestError, match=fix):
        manifest.parse(run_json(lease_stale_after=int(value)))


@pytest.mark.parametrize("f", NUMERIC, ids=lambda f: f.name)
def test_a_number_that_is_not_one_is_refused_from_the_command_line_and_the_environment(f):
    refused_naming(dry_run([flag(f.name), "many"]), "'many'")
    refused_naming(dry_run(env={f.metadata["env"]: "many"}), f.metadata["env"], "'many'")


@pytest.mark.parametrize("f", NUMERIC, ids=lambda f: f.name)
def test_a_number_beyond_any_use_is_refused_from_every_source(f):
    huge = "9" * 40
    refused_naming(dry_run([flag(f.name), huge]), flag(f.name))
    refused_naming(dry_run(env={f.metadata["env"]: huge}), flag(f.name))
    with pytest.raises(manifest.ManifestError, match=flag(f.name)):
        manifest.parse(run_json(**{f.name: 10**5000 if kind(f) == "int" else 1e300}))


WRONG = {
    "int": [True, 2.5, "2", None, [2]],
    "float": [True, "1", None, math.nan, math.inf],
    "bool": ["no", 1, None],
    "str": [None, 5, False],
    "str|None": [5, False, ["a"]],
    "list[str]": ["args.txt", [1], None],
}


@pytest.mark.parametrize(
    ("f", "value"),
    [(f, v) for f in FIELDS for v in WRONG[kind(f)]],
    ids=lambda x: x.name if isinstance(x, dataclasses.Field) else repr(x),
)
def test_run_json_of_the_wrong_type_is_refused_naming_the_setting_and_the_value(f, value):
    with pytest.raises(manifest.ManifestError) as refused:
        manifest.parse(run_json(**{f.name: value}))
    said = str(refused.value)
    assert flag(f.name) in said and json.dumps(value) in said, said  # true, null, NaN


# An integer a float cannot hold, and one of more digits than Python will read.
HUGE = {"1 and 400 zeros": ("1" + "0" * 400, "about 401 digits"),
        "5000 digits": ("7" * 5000, "about 5000 digits")}  # fmt: skip


@pytest.mark.parametrize("huge", HUGE, ids=str)
@pytest.mark.parametrize("f", NUMERIC, ids=lambda f: f.name)
def test_a_huge_integer_is_refused_naming_the_setting_and_the_value_from_every_source(
    f, huge, tmp_path
):
    digits, words = HUGE[huge]
    refused_naming(dry_run([flag(f.name), digits]), flag(f.name), words)
    refused_naming(dry_run(env={f.metadata["env"]: digits}), flag(f.name), words)
    config = tmp_path / "huge.toml"
    config.write_text(f"{flag(f.name)[2:]} = {digits}\n")
    refused_naming(dry_run(["--config", str(config)]), flag(f.name)[2:], words)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run_json(**{f.name: "HUGE"})).replace('"HUGE"', digits))
    with pytest.raises(manifest.ManifestError) as refused:
        manifest.load(path)
    assert flag(f.name) in str(refused.value) and words in str(refused.value)


def test_a_fault_delay_of_nan_from_the_environment_is_refused_and_nothing_is_written():
    result = dry_run(env={"NVRX_FAULT_DELAY": "nan"})
    refused_naming(result, "NVRX_FAULT_DELAY", "--fault-delay", "'nan' is not a finite number")


@pytest.mark.parametrize("given", ["1e400", "-1e400", "nan", "inf"])
def test_a_number_beyond_a_float_is_refused_in_the_words_it_was_given(given, tmp_path):
    said = f"{given!r} is not a finite number"
    refused_naming(dry_run(["--fault-delay", given]), "--fault-delay", said)
    refused_naming(dry_run(env={"NVRX_FAULT_DELAY": given}), "--fault-delay", said)
    config = tmp_path / "delay.toml"
    config.write_text(f"fault-delay = {given.replace('1e400', '1e400')}\n")
    result = dry_run(["--config", str(config)])
    assert result.exit_code == 2 and "fault-delay" in result.output, result.output
    assert "Traceback" not in result.output


def test_print_config_never_prints_a_value_that_is_not_json():
    result = dry_run(["--print-config", "--json"], env={"NVRX_FAULT_DELAY": "nan"})
    refused_naming(result, "NVRX_FAULT_DELAY", "'nan' is not a finite number")
    assert "NaN" not in result.stdout


@pytest.mark.parametrize("f", EMPTY_MEANS, ids=lambda f: f.name)
def test_an_empty_value_is_taken_where_the_help_says_what_empty_means(f):
    for result in (dry_run([flag(f.name), ""]), dry_run(env={f.metadata["env"]: ""})):
        assert result.exit_code == 0, result.output
    manifest.parse(run_json(**{f.name: ""}))


BOOLEAN = [f for f in FIELDS if kind(f) == "bool"]


@pytest.mark.parametrize("f", BOOLEAN, ids=lambda f: f.name)
def test_an_empty_boolean_variable_is_refused_rather_than_read_as_off(f):
    # NVRX_ASYNC_SAVE= turned asynchronous saving off without a word.
    result = dry_run(env={f.metadata["env"]: ""})
    refused_naming(result, f.metadata["env"], "is set but empty", "unset it for the default")


@pytest.mark.parametrize(("word", "value"), [("1", True), ("true", True), ("yes", True),
                                            ("on", True), ("0", False), ("false", False),
                                            ("no", False), ("off", False)])  # fmt: skip
def test_a_switch_variable_takes_the_words_the_knobs_page_lists(word, value):
    result = dry_run(["--print-config", "--json"], env={"NVRX_ASYNC_SAVE": word.upper()})
    assert json.loads(result.stdout)["settings"]["async_save"]["value"] is value


def test_an_empty_mem_gives_sbatch_no_mem_so_the_cluster_default_applies():
    result = dry_run(["--mem", ""])
    assert result.exit_code == 0, result.output
    assert "--mem" not in result.stdout
    assert "#SBATCH --mem=0" in dry_run().stdout


def test_only_the_samples_to_train_may_be_larger_than_any_slurm_count():
    many = str(2**40)
    assert dry_run(["--train-samples", many]).exit_code == 0
    refused_naming(
        dry_run(["--depth", many]), "--depth", f"must be at most 2147483647 (got {many})"
    )
