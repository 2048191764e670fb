"""A CLI failure is one line on stderr and the exit code, whichever command fails."""

import click
from click.testing import CliRunner

from nvrx_appliance.cli.fail import fail


@click.command()
@click.option("--code", type=int, default=None)
def failing(code: int | None) -> None:
    click.echo("started")
    if code is None:
        fail("--depth 1: give 2 or more")
    fail("the build failed, no image written", prefix="error", code=code)
    click.echo("not reached")


def test_a_usage_failure_is_one_line_naming_the_tool_and_exits_2():
    result = CliRunner().invoke(failing, [])
    assert result.exit_code == 2
    assert result.stderr == "nvrx-appliance: --depth 1: give 2 or more\n"
    assert result.stdout == "started\n"


def test_a_failure_of_the_work_keeps_its_own_prefix_and_code():
    result = CliRunner().invoke(failing, ["--code", "1"])
    assert result.exit_code == 1
    assert result.stderr == "error: the build failed, no image written\n"
