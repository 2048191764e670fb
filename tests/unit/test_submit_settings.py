"""Where each chain setting comes from: flags > environment > config file > defaults."""

import json
from pathlib import Path

import pytest

from nvrx_appliance.settings import resolve

CWD = "/shared/alice"
PY = "/opt/venv/bin/python"


def _resolve(flags=None, env=None, config=None, source="run.toml"):
    return resolve.resolve(
        flags or {}, env or {}, config or {}, config_source=source, cwd=CWD, python=PY
    )


def test_a_flag_beats_the_environment_which_beats_the_config_file():
    r = _resolve(
        flags={"train_tasks": 8},
        env={"NVRX_TRAIN_TASKS": "4", "NVRX_HOT_SPARES": "3"},
        config={"train_tasks": 2, "hot_spares": 2, "cold_spares": 5},
    )
    assert (r.spec.train_tasks, r.origins["train_tasks"]) == (8, "flag --train-tasks")
    assert (r.spec.hot_spares, r.origins["hot_spares"]) == (3, "env NVRX_HOT_SPARES")
    assert (r.spec.cold_spares, r.origins["cold_spares"]) == (5, "config run.toml")
    assert (r.spec.depth, r.origins["depth"]) == (3, "default")


def test_the_time_limit_flag_is_named_time():
    r = _resolve(flags={"time_limit": "00:10:00"})
    assert r.origins["time_limit"] == "flag --time"


def test_unset_mounts_stay_unset_but_an_empty_environment_value_mounts_nothing():
    assert _resolve().spec.mounts is None
    r = _resolve(env={"NVRX_CONTAINER_MOUNTS": ""})
    assert (r.spec.mounts, r.origins["mounts"]) == ("", "env NVRX_CONTAINER_MOUNTS")


def test_an_empty_gpu_failure_schedule_turns_the_injector_off_rather_than_defaulting():
    assert _resolve(env={"NVRX_INJECT_GPU_FAILURE": ""}).spec.gpu_failure == ""
    assert _resolve().spec.gpu_failure is None


def test_the_seeds_empty_segment_means_simple_hot_spare_mode():
    assert _resolve(env={"NVRX_SEGMENT": ""}).spec.segment == "off"


def test_the_seeds_no_restart_demo_switch_selects_the_mode():
    r = _resolve(env={"NVRX_NO_RESTART_DEMO": "0"})
    assert (r.spec.mode, r.origins["mode"]) == ("handoff", "env NVRX_NO_RESTART_DEMO")
    assert _resolve(env={"NVRX_NO_RESTART_DEMO": "0", "NVRX_MODE": "train"}).spec.mode == "train"


def test_boolean_environment_values_read_like_the_seeds():
    assert _resolve(env={"NVRX_FAULT_INJECT": "0"}).spec.fault_inject is False
    assert _resolve(env={"NVRX_LOG_DEBUG": "true"}).spec.log_debug is True


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"NVRX_TRAIN_TASKS": "four"}, "NVRX_TRAIN_TASKS='four' is not an integer"),
        ({"NVRX_FAULT_DELAY": "soon"}, "NVRX_FAULT_DELAY='soon' is not a number"),
        ({"NVRX_FAULT_INJECT": "maybe"}, "NVRX_FAULT_INJECT='maybe' is not a boolean; use 1 or 0"),
        ({"NVRX_NO_RESTART_DEMO": "2"}, "NVRX_NO_RESTART_DEMO='2': use 1"),
    ],
)
def test_a_malformed_environment_value_is_named(env, message):
    with pytest.raises(resolve.SettingError, match=message.replace("(", r"\(")):
        _resolve(env=env)


def test_the_config_file_takes_dashed_or_underscored_names():
    config = resolve.parse_config('train-tasks = 4\nhot_spares = 0\nmounts = ""\n', "c.toml")
    assert config == {"train_tasks": 4, "hot_spares": 0, "mounts": ""}


def test_a_config_key_is_the_flags_name_as_the_help_says(tmp_path):
    from click.testing import CliRunner

    from nvrx_appliance.cli.main import cli

    config = tmp_path / "run.toml"
    config.write_text('time = "02:00:00"\ntrain-tasks = 3\n')
    result = CliRunner().invoke(
        cli, ["submit", "--config", str(config), "--print-config", "--json"]
    )
    assert result.exit_code == 0, result.output
    settings = json.loads(result.stdout)["settings"]
    assert settings["time_limit"] == {"value": "02:00:00", "from": f"config {config}"}
    assert settings["train_tasks"]["value"] == 3
    assert resolve.parse_config('time_limit = "03:00:00"', "c.toml") == {"time_limit": "03:00:00"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("trian_tasks = 4", "unknown setting 'trian_tasks'"),
        ('time = "01:00:00"\ntime_limit = "02:00:00"', "'time_limit' sets --time a second time"),
        ('train_tasks = "4"', 'train_tasks = "4" should be an integer'),
        ("depth = true", "depth = true should be an integer"),
        ("train_tasks = ", "not valid TOML"),
    ],
)
def test_a_bad_config_file_is_refused_with_the_key_named(text, message):
    with pytest.raises(resolve.SettingError, match=f"--config c.toml: .*{message}"):
        resolve.parse_config(text, "c.toml")


def test_the_work_dir_defaults_to_nvrx_run_here_and_relative_paths_become_absolute():
    assert _resolve().spec.work_dir == "/shared/alice/nvrx-run"
    assert _resolve(flags={"work_dir": "runs/a"}).spec.work_dir == "/shared/alice/runs/a"


def test_bare_mode_records_the_python_that_ran_submit_but_a_container_does_not():
    r = _resolve()
    assert (r.spec.runtime, r.spec.python) == ("bare", PY)
    assert r.origins["python"].startswith("default")
    pyxis = _resolve(flags={"image": "/img/a.sqsh"}).spec
    assert (pyxis.runtime, pyxis.python) == ("pyxis", "")


# --- the reference scripts' environment names ---------------------------------------------


def _print_config(env, tmp_path):
    from click.testing import CliRunner

    from nvrx_appliance.cli.main import cli

    args = ["submit", "--work-dir", str(tmp_path), "--print-config", "--json"]
    return CliRunner().invoke(cli, args, env=env)


def test_the_reference_scripts_names_are_honoured_with_a_notice_naming_ours(tmp_path):
    seeds = {seed: "4" for seed, _, _ in resolve.seed_names()}
    result = _print_config({**seeds, "RDZV_PORT": "29600"}, tmp_path)
    assert result.exit_code == 0, result.output
    settings = json.loads(result.stdout)["settings"]
    for seed, ours, name in resolve.seed_names():
        assert settings[name]["from"] == f"env {seed}"
        assert f"notice: {seed} read as {ours} (" in result.stderr
    assert settings["rdzv_port"]["value"] == 29600
    assert settings["gpus_per_node"]["value"] == 4


def test_a_reference_name_that_disagrees_with_ours_is_refused(tmp_path):
    result = _print_config({"GPUS_PER_NODE": "4", "NVRX_GPUS_PER_NODE": "8"}, tmp_path)
    assert result.exit_code == 2
    assert "GPUS_PER_NODE='4' and NVRX_GPUS_PER_NODE='8' disagree" in result.stderr


def test_megatrons_fault_kinds_are_read_as_ours(tmp_path):
    result = _print_config({"NVRX_FAULT_TYPES": "async_exc,sigkill"}, tmp_path)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["settings"]["fault_types"]["value"] == "exception,exit"
    assert "NVRX_FAULT_TYPES: async_exc (Megatron's name) read as exception" in result.stderr


def test_nvrx_dry_run_makes_submit_a_dry_run(tmp_path):
    from click.testing import CliRunner

    from nvrx_appliance.cli.main import cli

    args = ["submit", "--work-dir", "/shared/nvrx-dry-run", "--workload", "cpu"]
    env = {"NVRX_DRY_RUN": "1", "SLURM_CONF": str(tmp_path / "none.conf")}
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    assert "notice: NVRX_DRY_RUN is set: a dry run, as --dry-run" in result.stderr
    assert result.stdout.startswith("# dry run: nothing was written or submitted")
    assert not Path("/shared/nvrx-dry-run").exists()
