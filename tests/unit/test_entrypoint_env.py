"""The workload's environment: the manifest decides, not whatever srun inherited."""

import pytest

from nvrx_appliance.node import env
from nvrx_appliance.node.identity import Node
from tests.unit import entrypoint_support as support

run_manifest = support.run_manifest


def node(task_id=3):
    return Node(array_job_id="4242", task_id=task_id, node_id=0, job_id="4245", hostname="n3")


def child_env(m, inherited=None, task_id=3):
    inherited = {"PATH": "/usr/bin"} if inherited is None else inherited
    return env.plan(m, node(task_id), inherited).apply(inherited)


def test_each_array_task_is_its_own_mnnvl_clique(tmp_path):
    m = run_manifest(tmp_path)
    assert child_env(m, task_id=3)["NCCL_MNNVL_CLIQUE_ID"] == "3"
    assert child_env(m, task_id=0)["NCCL_MNNVL_CLIQUE_ID"] == "0"
    assert child_env(m)["NCCL_MNNVL_ENABLE"] == "0"
    assert child_env(m, {"NCCL_MNNVL_ENABLE": "1"})["NCCL_MNNVL_ENABLE"] == "1"


def test_the_seeds_gpu_settings_are_set(tmp_path):
    e = child_env(run_manifest(tmp_path))
    assert e["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert e["NVTE_FWD_LAYERNORM_SM_MARGIN"] == e["NVTE_BWD_LAYERNORM_SM_MARGIN"] == "16"
    assert e["PATH"] == "/usr/bin"


def test_ft_launcher_turns_forwarded_usr_signals_into_a_clean_shutdown(tmp_path):
    handled = child_env(run_manifest(tmp_path))["TORCHELASTIC_SIGNALS_TO_HANDLE"].split(",")
    assert {"SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2"} <= set(handled)


def test_numa_binding_only_when_the_manifest_asks(tmp_path):
    assert child_env(run_manifest(tmp_path, gpus_per_numa=2))["NVRX_GPUS_PER_NUMA"] == "2"
    # Mere presence switches numactl wrapping on in NVRx, so an inherited one must go.
    assert "NVRX_GPUS_PER_NUMA" not in child_env(
        run_manifest(tmp_path), {"NVRX_GPUS_PER_NUMA": "2"}
    )


def test_debug_logging_follows_the_manifest(tmp_path):
    assert child_env(run_manifest(tmp_path, log_debug=True))["NVRX_LOG_DEBUG"] == "1"
    assert child_env(run_manifest(tmp_path), {"NVRX_LOG_DEBUG": "1"})["NVRX_LOG_DEBUG"] == "0"


@pytest.mark.parametrize(
    ("mode", "gpu_failure", "expected"),
    [
        ("handoff", None, "1:0,2:0"),
        ("handoff", "3:0", "3:0"),
        ("handoff", "", None),
        ("train", None, None),
        ("train", "1:0", None),
        ("no-restart", None, None),
    ],
)
def test_gpu_failure_injection_only_in_handoff_mode(tmp_path, mode, gpu_failure, expected):
    m = run_manifest(tmp_path, mode=mode, gpu_failure=gpu_failure)
    inherited = {"NVRX_INJECT_GPU_FAILURE": "9:9"}  # e.g. left in the submit shell
    assert child_env(m, inherited).get("NVRX_INJECT_GPU_FAILURE") == expected


def test_the_workload_can_find_the_run_manifest(tmp_path):
    assert child_env(run_manifest(tmp_path))["NVRX_RUN_MANIFEST"] == str(tmp_path / "run.json")


def test_a_megatron_rank_keeps_its_nccl_flight_recorder_for_a_gpu_hang(tmp_path):
    m = run_manifest(tmp_path)  # megatron, stacks sampled
    e = child_env(m, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "500"})
    assert e["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    # The site's own value wins, under either name: torch 2.13 reads TORCH_FR_BUFFER_SIZE
    # first, so ours there once overrode the site's 500 (issue 53, finding 9).
    assert e["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "500" and "TORCH_FR_BUFFER_SIZE" not in e
    assert child_env(m)["TORCH_FR_BUFFER_SIZE"] == child_env(m)["TORCH_NCCL_TRACE_BUFFER_SIZE"]
    dumps = str(m.layout.stacks("4242") / "nccl_trace_rank_")
    assert e["TORCH_FR_DUMP_TEMP_FILE"] == e["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == dumps
    off = support.run_manifest(tmp_path / "off", stack_sampling=0)
    assert "TORCH_NCCL_DUMP_ON_TIMEOUT" not in child_env(off)
