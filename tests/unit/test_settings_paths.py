"""Every setting that names a path, given relative, under ~ and through a symlink, from
the command line, the environment and a config file: the nodes run in the work dir (or
inside the image), not where submit ran, so submit either makes the path absolute (and
--print-config shows it) or refuses it, naming the option and the value. Nothing is
written or queued on a refusal."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from nvrx_appliance import api
from nvrx_appliance.cli.main import cli
from nvrx_appliance.settings.chain import flag, path_settings, spec_fields

# How each path-valued setting is tried: the options it needs beside it, and whether
# submit makes it absolute ("absolute") or must refuse it ("refused").
BARE = ["--runtime", "bare", "--workload", "cpu"]
IMAGE = "/images/appliance.sqsh"
CASES = {
    "work_dir": (BARE, "absolute", "run"),
    "python": (BARE, "absolute", "venv/bin/python"),
    "image": (["--runtime", "pyxis", "--workload", "cpu"], "absolute", "img/a.sqsh"),
    "megatron_path": (["--runtime", "bare"], "absolute", "megatron-lm"),
    "script": (["--runtime", "bare", "--workload", "script"], "absolute", "train.py"),
    "megatron_path@pyxis": (["--runtime", "pyxis", "--image", IMAGE], "refused", "megatron-lm"),
    "script@pyxis": (
        ["--runtime", "pyxis", "--image", IMAGE, "--workload", "script"], "refused", "train.py",
    ),
    "health_check_endpoint": (BARE, "refused", "health.sock"),
    "mounts": (["--runtime", "pyxis", "--image", IMAGE, "--workload", "cpu"], "refused",
               "data:/data"),
}  # fmt: skip
FORMS = ("relative", "home", "symlinked")


def test_the_walk_covers_every_setting_that_names_a_path():
    named = {f.name for f in path_settings()} | {"mounts"}
    assert {case.split("@")[0] for case in CASES} == named
    # The arguments files are read at submit (tested below), not handed to the nodes.
    assert {f.name for f in spec_fields() if str(f.type) == "list[str]"} == {
        "megatron_args", "script_args"
    }  # fmt: skip


def given(form: str, value: str) -> str:
    return {"relative": value, "home": f"~/{value}", "symlinked": f"link/{value}"}[form]


def expected(form: str, value: str, cwd: Path, home: Path) -> str:
    return {
        "relative": str(cwd / value),
        "home": str(home / value),
        "symlinked": str(cwd / "link" / value),  # the link kept: a venv's python is one
    }[form]


@pytest.fixture
def places(tmp_path, monkeypatch):
    cwd, home, real = tmp_path / "cwd", tmp_path / "home", tmp_path / "real"
    for directory in (cwd, home, real):
        directory.mkdir()
    (cwd / "link").symlink_to(real)
    monkeypatch.chdir(cwd)
    return cwd, home


def submit(args, source, name, value, home, *more):
    """submit with the setting given by `source`: the flag, its variable or a config key."""
    env = {"SLURM_CONF": "/nonexistent/slurm.conf", "HOME": str(home)}
    if name != "work_dir":
        env["NVRX_WORK_DIR"] = "/shared/alice/run"
    setting = next(f for f in spec_fields() if f.name == name)
    argv = ["submit", *args, *more]
    if source == "flag":
        argv += [flag(name), value]
    elif source == "env":
        env[setting.metadata["env"]] = value
    else:
        Path("run.toml").write_text(f"{flag(name)[2:]} = {json.dumps(value)}\n")
        argv += ["--config", "run.toml"]
    return CliRunner().invoke(cli, argv, env=env)


@pytest.mark.parametrize("source", ["flag", "env", "config"])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("case", CASES)
def test_a_path_is_made_absolute_at_submit_or_refused_naming_the_option_and_value(
    case, form, source, places
):
    cwd, home = places
    args, outcome, value = CASES[case]
    name = case.split("@")[0]
    text = given(form, value)
    if outcome == "absolute":
        result = submit(args, source, name, text, home, "--print-config", "--json")
        assert result.exit_code == 0, result.output
        shown = json.loads(result.stdout)["settings"][name]
        assert shown["value"] == expected(form, value, cwd, home)
        assert f"{text} made absolute" in shown["from"]
        return
    result = submit(args, source, name, text, home, "--dry-run")
    assert result.exit_code == 2, result.output
    assert any(flag(name) in line and text in line for line in result.output.splitlines()), (
        result.output
    )
    assert "#!/bin/bash" not in result.stdout and not Path("/shared/alice/run").exists()


def test_a_relative_bare_python_reaches_the_batch_script_absolute(places):
    # The case: `--python venvlink/bin/python` passed submit, and the script then
    # ran venvlink/bin/nvrx-entrypoint from the work dir, where there is no venvlink.
    cwd, home = places
    venv = Path(sys.executable).parent.parent
    (cwd / "venvlink").symlink_to(venv)
    result = submit(BARE, "flag", "python", "venvlink/bin/python", home, "--dry-run")
    script = result.stdout
    entrypoint = f"{cwd}/venvlink/bin/nvrx-entrypoint"
    assert entrypoint in script and f"HOST_PYTHON={cwd}/venvlink/bin/python" in script, (
        result.output
    )
    assert " venvlink/" not in script and "=venvlink/" not in script
    assert os.access(f"{cwd}/venvlink/bin/nvrx-entrypoint", os.X_OK)


def test_the_python_api_makes_the_same_paths_absolute(places):
    cwd, home = places
    spec = api.chain_spec(
        environ={"HOME": str(home)}, workload="cpu", runtime="bare", work_dir="~/run",
        python="venv/bin/python",
    )  # fmt: skip
    assert (spec.work_dir, spec.python) == (str(home / "run"), str(cwd / "venv/bin/python"))


def test_a_spec_built_by_hand_with_a_relative_path_is_refused_before_anything_is_queued():
    with pytest.raises(api.SettingsError) as refused:
        api.prepare(api.ChainSpec(workload="cpu", runtime="bare", work_dir="/shared/alice/run",
                                  python="venv/bin/python"), dry_run=True)  # fmt: skip
    assert any("--python" in p and "'venv/bin/python'" in p for p in refused.value.problems)


ARGUMENTS = {
    "script_args": ["--runtime", "bare", "--workload", "script", "--script", "/opt/train.py"],
    "megatron_args": ["--runtime", "bare", "--workload", "megatron"],
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("source", ["flag", "env", "config"])
@pytest.mark.parametrize("name", ARGUMENTS)
def test_an_arguments_file_is_read_where_submit_runs_relative_under_home_or_through_a_link(
    name, form, source, places
):
    cwd, home = places
    for directory in (cwd, home, cwd / "link"):
        (directory / "args.txt").write_text("--log-interval 7\n")
    result = submit(ARGUMENTS[name], source, name, given(form, "args.txt"), home,
                    "--print-config", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["settings"][name]["value"] == ["--log-interval", "7"]
