"""Coming from the reference deployment: every name it reads is honoured or refused.

The names are tests/unit/reference_names.py's, read from the reference itself: a name
we forget to handle fails here, whatever our own code lists.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from nvidia_resiliency_ext.fault_tolerance import launcher
from nvidia_resiliency_ext.fault_tolerance.config import FaultToleranceConfig

from nvrx_appliance import manifest
from nvrx_appliance.cli import watch as watch_cli
from nvrx_appliance.cli.main import cli
from nvrx_appliance.cli.watch import watch
from nvrx_appliance.node import env as node_env
from nvrx_appliance.node import launch
from nvrx_appliance.node.identity import Node
from nvrx_appliance.settings import reference, resolve
from nvrx_appliance.watch import config as watch_config
from tests.unit import entrypoint_support as support
from tests.unit import reference_names
from tests.unit.test_watch_sinks import killed_run, receiver  # noqa: F401 - a fixture

# Read where they act rather than by submit: on the node, and by submit's command line.
AT_THE_NODE = {"NCCL_MNNVL_ENABLE"}
BY_THE_COMMAND = {"NVRX_DRY_RUN"}
SUBMIT_NAMES = sorted(set(reference_names.SCRIPTS) - AT_THE_NODE - BY_THE_COMMAND)


def _resolve(environ: dict[str, str]) -> resolve.Resolved:
    return resolve.resolve({}, environ, {}, cwd="/shared/alice", python="/opt/venv/bin/python")


@pytest.mark.parametrize("name", SUBMIT_NAMES)
def test_each_name_the_reference_scripts_read_is_honoured_or_refused_in_one_line(name):
    environ = {name: reference_names.SCRIPTS[name]}
    try:
        resolved = _resolve(environ)
    except resolve.SettingError as exc:
        message = str(exc)
        assert message.startswith(name) and "\n" not in message
        assert "--" in message or "unset" in message  # the setting to use, or to drop it
        return
    taken = f"env {name}" in resolved.origins.values()
    noticed = any(name in n for n in resolve.seed_notices(resolved, environ))
    assert taken or noticed, f"{name} is silently ignored"


def test_the_reference_scripts_whole_default_environment_is_taken_but_two_refusals():
    environ = {name: reference_names.SCRIPTS[name] for name in SUBMIT_NAMES}
    with pytest.raises(resolve.SettingError) as refused:
        _resolve(environ)
    assert sorted(reference.REFUSED) == ["LR_DECAY_SAMPLES", "SAVE_RETAIN_INTERVAL"]
    assert all(name in str(refused.value) for name in reference.REFUSED)
    for name in reference.REFUSED:
        del environ[name]
    spec = _resolve(environ).spec
    assert (spec.train_tasks, spec.hot_spares, spec.cold_spares) == (1, 1, 3)
    assert (spec.gpus_per_node, spec.rdzv_port, spec.exit_duration_min) == (4, 29400, 110)
    assert (spec.mode, spec.fault_types, spec.segment) == ("no-restart", "exception", "1")


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        ({"NVRX_ACTIVE_TASKS": "5"}, "NVRX_ACTIVE_TASKS='5' disagrees with --train-tasks"),
        ({"NVRX_NO_RESTART_EXIT_CODE": "42"}, "keeps NVRx's own code 93"),
        ({"LR_DECAY_SAMPLES": "9"}, "put --lr-decay-samples N in your --megatron-args"),
        ({"SAVE_RETAIN_INTERVAL": "9"}, "set --save-retention N (NVRX_SAVE_RETENTION)"),
    ],
)
def test_submit_refuses_a_reference_name_it_cannot_honour_in_one_line(tmp_path, environ, said):
    args = ["submit", "--work-dir", str(tmp_path), "--print-config"]
    result = CliRunner().invoke(cli, args, env=environ)
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    assert said in line and result.stdout == ""


def test_a_reference_name_that_agrees_is_taken_with_a_notice(tmp_path):
    environ = {"NVRX_ACTIVE_TASKS": "3", "NVRX_NO_RESTART_EXIT_CODE": "93"}  # 2 + 1 hot
    args = ["submit", "--work-dir", str(tmp_path), "--print-config"]
    result = CliRunner().invoke(cli, args, env=environ)
    assert result.exit_code == 0, result.output
    assert "notice: NVRX_ACTIVE_TASKS=3 agrees with --train-tasks + --hot-spares" in result.stderr
    assert "notice: NVRX_NO_RESTART_EXIT_CODE=93 is the code" in result.stderr


def test_the_names_read_on_the_node_and_by_the_command_are_read_there(tmp_path):
    m = support.run_manifest(tmp_path)
    node = Node(array_job_id="4242", task_id=0, node_id=0, job_id="4242", hostname="n1")
    inherited = {"NCCL_MNNVL_ENABLE": "1"}
    assert node_env.plan(m, node, inherited).apply(inherited)["NCCL_MNNVL_ENABLE"] == "1"
    args = ["submit", "--work-dir", "/shared/alice/x", "--workload", "cpu"]
    result = CliRunner().invoke(cli, args, env={"NVRX_DRY_RUN": "1", "SLURM_CONF": "/none"})
    assert result.exit_code == 0 and "NVRX_DRY_RUN is set: a dry run" in result.stderr


# --- NVRX_MAX_NO_PROGRESS_CYCLES -------------------------------------------------------


def test_zero_no_progress_cycles_turns_nvrx_progress_tracking_off(tmp_path):
    # NVRx's documented way (0 or -1) to stop judging progress, e.g. under Megatron's
    # rerun state machine, which replays an iteration without advancing the checkpoint.
    args = ["submit", "--work-dir", "/shared/alice/x", "--workload", "cpu", "--dry-run"]
    env = {"NVRX_MAX_NO_PROGRESS_CYCLES": "0", "SLURM_CONF": "/none"}
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output  # was: "must be at least 1"
    m = manifest.load(manifest.save(support.run_manifest(tmp_path, max_no_progress_cycles=0)))
    assert m.policy.max_no_progress_cycles == 0  # run.json keeps it, every node reads it
    argv = launch.command(
        m, support.record(), ["python3", "t.py"], hosts_rendezvous=True, launcher=["ft_launcher"]
    )
    args = launcher.get_args_parser().parse_args(argv[1:])
    assert args.ft_max_no_progress_cycles == 0
    assert not FaultToleranceConfig.from_args(args).is_progress_tracking_enabled


def test_a_negative_no_progress_count_is_refused_naming_zero(tmp_path):
    args = ["submit", "--work-dir", str(tmp_path), "--max-no-progress-cycles", "-1", "--dry-run"]
    result = CliRunner().invoke(cli, args, env={"SLURM_CONF": "/none"})
    assert result.exit_code == 2
    assert (
        "--max-no-progress-cycles: cannot be negative (got -1); 0 turns NVRx's progress"
        in result.stderr
    )


def test_the_no_restart_demo_says_it_drops_the_users_no_progress_count(tmp_path):
    args = ["submit", "--work-dir", "/shared/alice/x", "--workload", "cpu", "--mode", "no-restart"]
    result = CliRunner().invoke(
        cli, [*args, "--dry-run"], env={"NVRX_MAX_NO_PROGRESS_CYCLES": "5", "SLURM_CONF": "/none"}
    )
    assert result.exit_code == 0, result.output
    assert (
        "warning: --max-no-progress-cycles 5 (env NVRX_MAX_NO_PROGRESS_CYCLES) is not used: "
        "the no-restart demo ends the chain (exit 93) at the first cycle without progress; "
        "it will be 1"
    ) in result.stderr


def test_print_config_shows_what_a_train_chain_will_do_not_a_value_nothing_reads(tmp_path):
    args = ["submit", "--work-dir", str(tmp_path), "--print-config"]
    settings = json.loads(CliRunner().invoke(cli, [*args, "--json"]).stdout)["settings"]
    assert settings["fault_inject"] == {
        "value": False,
        "from": "mode train never injects a fault (given true by default)",
    }
    handoff = CliRunner().invoke(cli, [*args, "--mode", "handoff", "--json"]).stdout
    assert json.loads(handoff)["settings"]["gpu_failure"]["value"] == "1:0,2:0"
    table = CliRunner().invoke(cli, args).stdout
    [row] = [line for line in table.splitlines() if line.startswith("fault_inject ")]
    assert row.split()[1] == "false" and "never injects" in row


# --- the reference watcher -------------------------------------------------------------


def test_each_name_the_reference_watcher_reads_is_read_here_or_refused_in_one_line():
    known = watch_cli.variables(watch)
    for name, value in reference_names.WATCHER_ENV.items():
        _, notices, refusals = watch_config.reference_environment({name: value}, known)
        handled = name in known or any(name in line for line in notices + refusals)
        assert handled, f"{name} is silently ignored"
        assert all(line.startswith(name) and "\n" not in line for line in refusals)


def test_every_option_of_the_reference_watcher_is_an_option_here():
    ours = {opt for param in watch.params for opt in (*param.opts, *param.secondary_opts)}
    assert set(reference_names.WATCHER_OPTIONS) - ours == set()


def _watch_once(tmp_path, env, *args):
    work = killed_run(tmp_path)
    base = ["--platform", "none", "--work-dir", str(work), "--stall-seconds", "1"]
    base += ["--state-file", str(tmp_path / "state" / "state.json"), *args]
    return CliRunner().invoke(watch, base, env=env)


def test_the_readmes_routing_key_name_still_pages(tmp_path, receiver):  # noqa: F811
    # The reference README's cron line sets NVRX_WATCH_PD_ROUTING_KEY: ignored, paging
    # just stopped.
    env = {"NVRX_WATCH_PD_ROUTING_KEY": "R0UTING-of-the-readme"}
    url = f"{receiver.url}/v2/enqueue"
    result = _watch_once(tmp_path, env, "--pagerduty-url", url, "--pagerduty-allow-http")
    assert result.exit_code == 2, result.output  # the killed cycle stalls: critical
    [trigger] = receiver.bodies("/v2/enqueue")
    assert trigger["routing_key"] == "R0UTING-of-the-readme"
    assert "notice: NVRX_WATCH_PD_ROUTING_KEY read as NVRX_WATCH_PAGERDUTY_ROUTING_KEY" in (
        result.stderr
    )
    assert "R0UTING-of-the-readme" not in result.output


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"NVRX_WATCH_OBSERVE_ONLY": "0"}, "act with --act"),
        ({"NVRX_WATCH_NO_RESTART_EXIT_CODE": "42"}, "chain_not_cancelled looks for 93"),
        ({"NVRX_WATCH_EXPECT_FILE": "/h/.x"}, "the chain marker here is <work dir>/chain.active"),
        ({"NVRX_WATCH_PD_ROUTING_KEY": "a", "NVRX_WATCH_PAGERDUTY_ROUTING_KEY": "b"}, "disagree"),
        ({"NVRX_WATCH_STALL_SECOND": "60"}, "is not an nvrx-watch setting"),
    ],
)
def test_the_watcher_refuses_a_name_it_cannot_honour_before_any_pass(tmp_path, env, said):
    result = _watch_once(tmp_path, env)
    assert result.exit_code == 2
    assert said in result.output and "pass over" not in result.output
    assert not (tmp_path / "state").exists()


def test_a_reference_config_key_is_refused_naming_what_to_do(tmp_path):
    config = tmp_path / "watch.toml"
    config.write_text("observe_only = false\n")
    result = _watch_once(tmp_path, {}, "--config", str(config))
    assert result.exit_code == 2 and "act with --act" in result.output
