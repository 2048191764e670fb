"""The help reads as a manual: every command summarised in full, one style for defaults
and environment variables, completion that works, and a top-level help that imports
no subcommand (its speed is measured in bench/, row 0)."""

import os
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from nvrx_appliance.cli.entrypoint import cli as entrypoint_cli
from nvrx_appliance.cli.main import COMMANDS, LOCAL_COMMANDS, cli
from nvrx_appliance.cli.watch import watch as watch_cli


def test_top_level_help_imports_no_subcommand():
    probe = (
        "import sys; from nvrx_appliance.cli.main import cli; "
        "cli.main(['--help'], prog_name='nvrx-appliance', standalone_mode=False); "
        "print(sorted(m for m in sys.modules if m.startswith(('nvrx_appliance', 'rich'))))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.strip().splitlines()[-1]
    assert (
        loaded
        == "['nvrx_appliance', 'nvrx_appliance.cli', 'nvrx_appliance.cli.help', 'nvrx_appliance.cli.main']"
    )


@pytest.mark.parametrize("name", [*COMMANDS, *LOCAL_COMMANDS])
def test_each_listed_command_loads_under_its_own_name(name):
    command = cli.get_command(None, name)
    assert command is not None
    assert command.name == name


def test_the_top_level_help_shows_every_summary_whole_and_the_cluster_apart():
    result = CliRunner().invoke(cli, ["--help"], terminal_width=80)
    assert result.exit_code == 0
    commands, local = result.output.split("Local cluster (one machine: demo and tests):")
    for name, (_, summary) in COMMANDS.items():
        assert re.search(rf"^  {name} +{re.escape(summary)}$", commands, re.M), name
    for name, (_, summary) in LOCAL_COMMANDS.items():
        assert re.search(rf"^  {name} +{re.escape(summary)}$", local, re.M), name
    assert "..." not in result.output.split("Commands:")[1]


def _help(command, args=()):
    return " ".join(
        CliRunner().invoke(command, [*args, "--help"], terminal_width=200).output.split()
    )


def test_defaults_and_environment_variables_read_alike_in_all_three_commands():
    submit, watch, entry = _help(cli, ["submit"]), _help(watch_cli), _help(entrypoint_cli)
    assert "[env var: NVRX_TRAIN_TASKS; default: 2]" in submit
    assert "[env var: NVRX_WATCH_PLATFORM; default: slurm]" in watch
    assert "[env var: NVRX_RUN_MANIFEST]" in entry
    for text in (submit, watch, entry):
        assert "; env:" not in text
        assert not re.search(r"\[default: [^\]]*; env var", text)
    assert "..." not in _help(entrypoint_cli).split("Commands:")[1]


def test_shell_completion_as_documented_completes_command_names():
    env = {
        **os.environ,
        "_NVRX_APPLIANCE_COMPLETE": "bash_complete",
        "COMP_WORDS": "nvrx-appliance su",
        "COMP_CWORD": "1",
    }
    tool = os.path.join(os.path.dirname(sys.executable), "nvrx-appliance")
    done = subprocess.run([tool], capture_output=True, text=True, env=env)
    assert done.stdout.split() == ["plain,submit"]
