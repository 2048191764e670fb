"""qualify takes what submit takes (the same definitions): options, --config, extra
sbatch arguments after `--`, and refuses bad ones the same way, before anything runs."""

import pytest
from click.testing import CliRunner

from nvrx_appliance.cli.main import cli

IMAGE = ["--image", "/shared/images/x.sqsh", "--work-dir", "/shared/alice/q"]


def _qualify(*args, env=None):
    return CliRunner().invoke(
        cli, ["qualify", *args], env={"SLURM_CONF": "/nonexistent", **(env or {})}
    )


def test_qualify_lists_submits_options_config_json_and_sbatch_arguments():
    submit = CliRunner().invoke(cli, ["submit", "--help"]).output
    qualify = CliRunner().invoke(cli, ["qualify", "--help"]).output
    for option in ("--train-tasks", "--mem", "--config FILE", "--json", "[-- SBATCH_ARGS...]"):
        assert option in submit and option in qualify, option


def test_extra_sbatch_arguments_are_accepted_and_checked_like_submits():
    result = _qualify(*IMAGE, "--", "--array=0-3")
    assert result.exit_code == 2
    assert result.stderr.startswith("nvrx-appliance: after `--`: ")
    assert "--array" in result.stderr
    assert "unexpected extra argument" not in result.output


def test_a_config_file_is_read_and_its_errors_name_it(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('time = "00:20:00"\nnot_a_setting = 1\n')
    result = _qualify(*IMAGE, "--config", str(config))
    assert result.exit_code == 2
    assert "not_a_setting" in result.stderr and str(config) in result.stderr


@pytest.mark.parametrize(
    ("source", "env"),
    [("config", {}), ("env NVRX_CHAIN_DEPTH", {"NVRX_CHAIN_DEPTH": "1"})],
)
def test_a_depth_below_two_from_anywhere_is_refused_naming_where_it_came_from(
    tmp_path, source, env
):
    config = tmp_path / "run.toml"
    config.write_text("depth = 1\n" if not env else "")
    result = _qualify(*IMAGE, "--config", str(config), env=env)
    assert result.exit_code == 2
    assert "--depth 1 (from " + source in result.stderr
    assert "at least 2 generations" in result.stderr
