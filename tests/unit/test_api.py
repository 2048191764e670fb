"""The Python API builds a ChainSpec exactly as the CLI resolves and checks its flags."""

import json
from pathlib import Path

import pytest

from nvrx_appliance import api, manifest
from nvrx_appliance.cli.main import cli
from nvrx_appliance.settings.chain import ChainSpec

SHARED = "/shared/alice/run"


def test_keywords_beat_the_environment_which_beats_the_config_file(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('time = "02:00:00"\ndepth = 5\nhot-spares = 3\n')
    spec = api.chain_spec(config, environ={"NVRX_CHAIN_DEPTH": "4"}, work_dir=SHARED, hot_spares=2)
    assert (spec.time_limit, spec.depth, spec.hot_spares) == ("02:00:00", 4, 2)


def test_a_relative_work_dir_is_made_absolute_against_cwd():
    spec = api.chain_spec(environ={}, cwd="/shared/alice", work_dir="run", workload="cpu")
    assert spec.work_dir == SHARED


def test_the_api_refuses_what_the_cli_refuses_with_the_same_lines(tmp_path):
    from click.testing import CliRunner

    with pytest.raises(api.SettingsError) as refused:
        api.chain_spec(environ={}, work_dir=SHARED, train_tasks=0, hot_spares=-1)
    cli_says = (
        CliRunner()
        .invoke(
            cli,
            [
                "submit",
                "--dry-run",
                "--work-dir",
                SHARED,
                "--train-tasks",
                "0",
                "--hot-spares",
                "-1",
            ],
            env={"SLURM_CONF": str(tmp_path / "none")},
        )
        .stderr
    )
    assert refused.value.problems
    for problem in refused.value.problems:
        assert problem.startswith("--") and problem in cli_says


def test_an_unknown_setting_and_a_bad_config_are_settings_errors(tmp_path):
    with pytest.raises(api.SettingsError, match="trian_tasks: no such setting"):
        api.chain_spec(environ={}, trian_tasks=2)
    with pytest.raises(api.SettingsError, match="cannot"):
        api.chain_spec(tmp_path / "missing.toml", environ={})


def test_extra_sbatch_arguments_are_checked_before_anything_is_written(tmp_path):
    spec = api.chain_spec(environ={}, work_dir=str(tmp_path / "w"), workload="cpu")
    with pytest.raises(api.SettingsError, match=r"sbatch_args: .*--array"):
        api.submit(spec, sbatch_args=["--array=0-3"])
    assert not Path(spec.work_dir).exists()


def test_the_package_declares_its_types():
    assert (Path(api.__file__).parent / "py.typed").is_file()


def test_a_users_megatron_arguments_go_in_as_a_list_or_as_their_file(tmp_path):
    args = ["--num-layers", "4", "--data-path", "/lustre/corpus_text_document"]
    as_list = api.chain_spec(environ={}, work_dir="/shared/run", megatron_args=args,
                             train_samples=1000)  # fmt: skip
    path = tmp_path / "args.txt"
    path.write_text("--num-layers 4\n--data-path /lustre/corpus_text_document  # the corpus\n")
    from_file = api.chain_spec(environ={}, work_dir="/shared/run", megatron_args=str(path),
                               train_samples=1000)  # fmt: skip
    assert as_list.megatron_args == from_file.megatron_args == args
    assert as_list.profile == "none"
    with pytest.raises(api.SettingsError, match="--save is the appliance's"):
        api.chain_spec(environ={}, work_dir="/shared/run", megatron_args=["--save", "/x"],
                       train_samples=1000)  # fmt: skip


def test_the_cli_and_the_api_find_a_chain_by_its_work_dir_without_slurm(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm"))  # no squeue, scontrol or sacct here
    monkeypatch.chdir(tmp_path)
    assert api.locate("4343", work_dir="run") == (tmp_path / "run", "4343")
    assert api.locate("llm", work_dir=tmp_path / "run") == (tmp_path / "run", None)
    chain = api.Chain("llm", tmp_path / "elsewhere", ("1",))
    assert api.locate(chain, work_dir="run") == (tmp_path / "elsewhere", None)
    with pytest.raises(api.workdir.NotFound):  # the same refusal `status --work-dir` prints
        api.status("llm", work_dir=tmp_path / "run")


def test_a_prepared_plan_shows_the_script_and_sbatch_lines_and_writes_nothing(
    tmp_path, monkeypatch
):
    # Reviewed as `submit --dry-run` reviews it: with Slurm out of reach, the cluster's
    # checks are skipped with a warning rather than refused.
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none"))
    spec = api.chain_spec(environ={}, work_dir="/shared/api/run", workload="cpu", depth=3)
    plan = api.prepare(spec, sbatch_args=["--account=ml"], dry_run=True)
    assert len(plan.command_lines) == 3
    assert all("--account=ml" in line for line in plan.command_lines)
    assert plan.script.startswith("#!") and str(plan.script_path.parent) == "/shared/api/run"
    assert any("Slurm unreachable" in w for w in plan.warnings)
    assert not Path("/shared/api").exists()


def test_submit_dry_run_prints_the_plan_the_api_prepares(tmp_path, monkeypatch):
    import json

    from click.testing import CliRunner

    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none"))
    args = ["--work-dir", "/shared/api/run", "--workload", "cpu", "--depth", "2"]
    shown = CliRunner().invoke(cli, ["submit", "--dry-run", "--json", *args, "--", "--qos=x"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout)
    spec = api.chain_spec(environ={}, work_dir="/shared/api/run", workload="cpu", depth=2)
    plan = api.prepare(spec, sbatch_args=["--qos=x"], dry_run=True)
    assert doc["commands"] == plan.command_lines

    def unstamped(script: str) -> list[str]:  # the chain id is the submit time
        return [line for line in script.splitlines() if not line.startswith("CHAIN_ID=")]

    assert unstamped(doc["script"]) == unstamped(plan.script)


def test_report_says_each_generations_node_deaths_and_hang_verdicts_from_the_work_dir(tmp_path):
    # What `report` prints under "node death:" and the hang lines, read without Slurm.
    spec = ChainSpec(work_dir=str(tmp_path), workload="cpu", runtime="bare", job_name="llm",
                     python="/opt/venv/bin/python", exclude_for=7200)  # fmt: skip
    layout = api.Layout(tmp_path)
    layout.run_json.write_text(json.dumps(manifest.build(spec, created="c", user="u").to_json()))
    layout.deaths("41").mkdir(parents=True)
    layout.hangs("42").mkdir(parents=True)
    death = {"node": "node2", "generation": "llm/41/", "kind": "silent", "cycle": 0,
             "time": "2026-12-06T18:33:41+00:00", "hand_off": False,
             "words": "node2 stopped answering at 18:33:41 UTC; no reset, no exit"}  # fmt: skip
    (layout.deaths("41") / "dead.node2").write_text(json.dumps(death))
    hang = {"cycle": 2, "nodes": ["node3"], "words": "node3 hung in cycle 2"}
    (layout.hangs("42") / "cycle2.json").write_text(json.dumps(hang))

    [said_death] = api.node_deaths(None, work_dir=tmp_path)
    [said_hang] = api.hang_verdicts(None, work_dir=tmp_path)

    assert said_death.startswith("generation 41: node2 stopped answering at 18:33:41 UTC")
    assert said_hang.startswith("generation 42: node3 hung in cycle 2")
    assert "2 h" in said_death and "2 h" in said_hang, (said_death, said_hang)
