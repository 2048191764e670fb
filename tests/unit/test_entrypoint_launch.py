"""The ft_launcher command line, checked against NVRx 0.7.0's own argument parser."""

import pytest
from nvidia_resiliency_ext.fault_tolerance import launcher

from nvrx_appliance import workloads
from nvrx_appliance.node import launch
from tests.unit import entrypoint_support as support


def run_manifest(tmp_path, **settings):
    return support.run_manifest(tmp_path / "work", **settings)


def parsed(m, rec=None, *, hosts=True, workload=("python3", "-m", "train", "--lr", "1")):
    argv = launch.command(
        m, rec or support.record(), list(workload), hosts_rendezvous=hosts, launcher=["ft_launcher"]
    )
    assert argv[0] == "ft_launcher"
    return launcher.get_args_parser().parse_args(argv[1:])


def test_the_shape_comes_from_the_manifest(tmp_path):
    m = run_manifest(
        tmp_path, train_tasks=4, hot_spares=1, cold_spares=8, nodes_per_task=2, gpus_per_node=4
    )
    args = parsed(m)
    assert args.nnodes == "8:10"
    assert args.nproc_per_node == "4"
    assert (args.rdzv_backend, args.rdzv_id, args.rdzv_endpoint) == ("c10d", "4242", "node1:29500")


def test_timeouts_and_restarts_come_from_the_manifest(tmp_path):
    m = run_manifest(
        tmp_path,
        setup_timeout=900,
        step_timeout=60,
        checkpointing_timeout=300,
        out_of_section_timeout=90,
        join_timeout=1200,
        store_connect_wait=45,
        max_restarts=5,
    )
    args = parsed(m)
    assert args.ft_rank_section_timeouts == "setup:900,step:60,checkpointing:300"
    assert args.ft_rank_out_of_section_timeout == "90"
    assert args.max_restarts == 5
    assert "join_timeout=1200" in args.rdzv_conf
    assert "store_connect_wait_seconds=45" in args.rdzv_conf


def test_only_task_0_hosts_the_store_and_says_so(tmp_path):
    m = run_manifest(tmp_path)
    assert "is_host=true" in parsed(m, hosts=True).rdzv_conf
    assert "is_host=false" in parsed(m, hosts=False).rdzv_conf


def test_per_generation_paths_live_under_the_work_dir(tmp_path):
    m = run_manifest(tmp_path, job_name="llm")
    args = parsed(m)
    work = tmp_path / "work"
    assert args.ft_cycle_info_dir == str(work / "nvrx" / "4242" / "cycle_infos")
    assert args.ft_per_cycle_applog_prefix == str(work / "logs" / "llm_4242.log")
    assert args.ft_nvrx_logfile == str(work / "nvrx" / "4242" / "logs" / "ft_launcher.log")


def test_the_log_server_does_not_hold_the_hand_off_for_a_minute(tmp_path):
    args = parsed(run_manifest(tmp_path))
    assert args.ft_log_server_graceful_shutdown_timeout == launch.LOG_SERVER_DRAIN_S < 60


@pytest.mark.parametrize(
    ("mode", "tracker", "cycles"),
    [
        ("no-restart", "static_iteration.txt", 1),
        ("handoff", "checkpoints/latest_checkpointed_iteration.txt", 3),
        ("train", "checkpoints/latest_checkpointed_iteration.txt", 3),
    ],
)
def test_each_mode_tracks_progress_on_its_own_file(tmp_path, mode, tracker, cycles):
    args = parsed(run_manifest(tmp_path, mode=mode, max_no_progress_cycles=3))
    assert args.ft_checkpoint_iteration_file == str(tmp_path / "work" / tracker)
    assert args.ft_max_no_progress_cycles == cycles


def test_segment_is_passed_only_when_task_0_decided_it(tmp_path):
    m = run_manifest(tmp_path)
    assert parsed(m, support.record(segment=None)).ft_segment is None
    assert parsed(m, support.record(segment=2)).ft_segment == 2


def test_the_health_check_endpoint_is_passed_when_set(tmp_path):
    assert parsed(run_manifest(tmp_path)).ft_node_health_check_endpoint is None
    m = run_manifest(tmp_path, health_check_endpoint="unix:///var/run/nvhcd.sock")
    assert parsed(m).ft_node_health_check_endpoint == "unix:///var/run/nvhcd.sock"


@pytest.mark.parametrize(
    ("workload", "profile"), [("cpu", "small"), ("megatron", "small"), ("megatron", "8b")]
)
def test_the_workload_follows_ft_launchers_flags_with_its_own_interpreter(
    tmp_path, workload, profile
):
    m = run_manifest(tmp_path, workload=workload, profile=profile, gpus_per_node=4)
    workload_argv = workloads.workload_argv(m.workload)
    args = parsed(m, workload=workload_argv)
    assert args.no_python
    assert [args.training_script, *args.training_script_args] == workload_argv


def test_max_nodes_follows_the_array_throttle_the_controller_enforces(tmp_path):
    m = run_manifest(tmp_path, train_tasks=4, hot_spares=1, cold_spares=8, nodes_per_task=2)
    assert launch.nnodes(m) == "8:10"
    assert launch.nnodes(m, active_tasks=7) == "8:14"  # raised with scontrol after submit
    assert parsed(m).nnodes == "8:10"


def test_a_throttle_below_the_training_tasks_is_refused_with_the_fix(tmp_path):
    m = run_manifest(tmp_path, train_tasks=4, hot_spares=1)
    with pytest.raises(launch.ShapeError, match="ArrayTaskThrottle=5"):
        launch.nnodes(m, active_tasks=3)
