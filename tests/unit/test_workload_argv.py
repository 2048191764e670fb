"""The workload argv the entrypoint appends after ft_launcher's flags, per mode and profile."""

from __future__ import annotations

import pytest

from nvrx_appliance.entrypoints.workloads import cpu, workload_argv
from nvrx_appliance.manifest import Manifest, build
from nvrx_appliance.settings import megatron_argv
from nvrx_appliance.settings.chain import DEFAULT_TRAIN_SAMPLES, ChainSpec
from nvrx_appliance.settings.program_argv import cpu_program_argv

PY = "/opt/venv/bin/python"


def manifest(**settings) -> Manifest:
    spec = ChainSpec(work_dir="/shared/run", **settings)
    return build(spec, created="2026-01-01T00:00:00Z", user="alice")


def run_argv(m: Manifest, python: str | None = PY) -> list[str]:
    """What ft_launcher starts on each rank for this manifest."""
    return workload_argv(list(m.workload), python)


def flags(argv: list[str]) -> dict[str, str | None]:
    """--flag value pairs (None for a bare switch); a repeated flag would be a bug."""
    out: dict[str, str | None] = {}
    for i, word in enumerate(argv):
        if word.startswith("--"):
            assert word not in out, f"{word} given twice"
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[word] = None if nxt is None or nxt.startswith("--") else nxt
    return out


# --- Megatron ---------------------------------------------------------------------------


def test_megatron_runs_pretrain_gpt_from_the_spec_checkout_under_the_given_python():
    argv = run_argv(manifest(megatron_path="/workspace/megatron-lm/"))
    assert argv[:3] == [PY, "-u", "/workspace/megatron-lm/pretrain_gpt.py"]


def test_megatron_trains_on_mock_data_with_the_null_tokenizer_and_the_ft_package():
    f = flags(run_argv(manifest()))
    assert "--mock-data" in f
    assert f["--tokenizer-type"] == "NullTokenizer"
    assert "--enable-ft-package" in f


@pytest.mark.parametrize(
    ("profile", "layers", "hidden", "seq"),
    [("small", "8", "1024", "1024"), ("8b", "32", "4096", "8192")],
)
def test_megatron_profiles_are_the_seeds(profile, layers, hidden, seq):
    f = flags(run_argv(manifest(profile=profile)))
    assert (f["--num-layers"], f["--hidden-size"], f["--seq-length"]) == (layers, hidden, seq)
    assert ("--group-query-attention" in f) == (profile == "8b")


def test_megatron_batch_and_parallelism_come_from_the_manifest_shape():
    m = manifest(train_tasks=4, gpus_per_node=4, tensor_parallel=2, pipeline_parallel=2,
                 micro_batch=2, global_batch=32)  # fmt: skip
    f = flags(run_argv(m))
    assert f["--tensor-model-parallel-size"] == "2"
    assert f["--pipeline-model-parallel-size"] == "2"
    assert f["--micro-batch-size"] == "2"
    assert f["--global-batch-size"] == "32"


def test_megatron_global_batch_defaults_to_micro_batch_times_data_parallel():
    m = manifest(train_tasks=2, gpus_per_node=4, tensor_parallel=2, micro_batch=3)
    assert flags(run_argv(m))["--global-batch-size"] == str(3 * 4)


def test_megatron_checkpoints_are_async_torch_dist_in_the_work_dir():
    m = manifest(save_interval=50)
    f = flags(run_argv(m))
    assert f["--save"] == f["--load"] == str(m.layout.checkpoints)
    assert f["--ckpt-format"] == "torch_dist"
    assert "--async-save" in f
    assert f["--save-interval"] == "50"


@pytest.mark.parametrize(("interval", "retain"), [(20, "10000"), (30, "10020"), (7, "10003")])
def test_megatron_keeps_the_newest_checkpoint_plus_a_multiple_of_the_save_interval(
    interval, retain
):
    f = flags(run_argv(manifest(save_interval=interval, save_retention=2)))
    assert f["--save-retain-interval"] == retain
    assert int(retain) % interval == 0


def test_megatron_retention_zero_keeps_every_checkpoint():
    assert "--save-retain-interval" not in flags(run_argv(manifest(save_retention=0)))


def test_megatron_train_samples_default_to_the_seeds_and_follow_the_spec():
    assert flags(run_argv(manifest()))["--train-samples"] == str(DEFAULT_TRAIN_SAMPLES)
    assert flags(run_argv(manifest(train_samples=4096)))["--train-samples"] == "4096"


def test_megatron_exit_duration_only_when_set():
    assert "--exit-duration-in-mins" not in flags(run_argv(manifest()))
    f = flags(run_argv(manifest(exit_duration_min=50)))
    assert f["--exit-duration-in-mins"] == "50"


@pytest.mark.parametrize("mode", ["no-restart", "handoff"])
def test_megatron_fault_modes_inject_the_spec_fault_with_megatron_names(mode):
    m = manifest(mode=mode, fault_ranks="2,3", fault_delay=90.0, fault_types="exception,hang")
    f = flags(run_argv(m))
    assert f["--fault-injector-ranks"] == "2,3"
    assert f["--fault-injector-fault-delay"] == "90.0"
    assert f["--fault-injector-fault-types"] == "async_exc,lock_gil"


def test_megatron_exit_fault_is_a_sigkill_of_the_rank():
    f = flags(run_argv(manifest(mode="handoff", fault_types="exit")))
    assert f["--fault-injector-fault-types"] == "sigkill"


@pytest.mark.parametrize(
    "settings", [{"mode": "train"}, {"mode": "handoff", "fault_inject": False}]
)
def test_megatron_no_fault_in_train_mode_or_with_injection_off(settings):
    f = flags(run_argv(manifest(**settings)))
    assert not [k for k in f if k.startswith("--fault-injector")]


# --- cpu trainer ----------------------------------------------------------------------


def test_cpu_runs_the_trainer_module_under_the_given_python():
    argv = run_argv(manifest(workload="cpu"))
    assert argv[:4] == [PY, "-u", "-m", "nvrx_appliance.entrypoints.workloads.cpu"]


def test_cpu_paths_are_the_work_dir_layout():
    m = manifest(workload="cpu")
    f = flags(run_argv(m))
    assert f["--save"] == f["--load"] == str(m.layout.checkpoints)
    assert f["--progress-log"] == str(m.layout.progress_log)


def test_cpu_logs_progress_every_few_iterations_not_every_one():
    assert flags(run_argv(manifest(workload="cpu")))["--log-interval"] == "10"


def test_cpu_batch_interval_retention_and_length_come_from_the_manifest():
    m = manifest(workload="cpu", train_tasks=2, hot_spares=0, gpus_per_node=2,
                 micro_batch=4, save_interval=7, save_retention=3, train_samples=800)  # fmt: skip
    f = flags(run_argv(m))
    assert f["--micro-batch-size"] == "4"
    assert f["--global-batch-size"] == str(4 * 4)
    assert f["--save-interval"] == "7"
    assert f["--save-retention"] == "3"
    assert f["--train-samples"] == "800"


@pytest.mark.parametrize("mode", ["no-restart", "handoff"])
def test_cpu_fault_modes_inject_in_the_first_cycle_only(mode):
    m = manifest(workload="cpu", mode=mode, fault_ranks="1", fault_types="hang",
                 fault_delay=5.0)  # fmt: skip
    f = flags(run_argv(m))
    assert f["--fault-injector-ranks"] == "1"
    assert f["--fault-injector-fault-types"] == "hang"
    assert f["--fault-injector-fault-delay"] == "5.0"
    assert f["--fault-injector-cycles"] == "1"


@pytest.mark.parametrize(
    "settings", [{"mode": "train"}, {"mode": "no-restart", "fault_inject": False}]
)
def test_cpu_no_fault_in_train_mode_or_with_injection_off(settings):
    f = flags(run_argv(manifest(workload="cpu", **settings)))
    assert not [k for k in f if k.startswith("--fault-injector")]


@pytest.mark.parametrize("mode", ["train", "no-restart", "handoff"])
def test_cpu_argv_is_accepted_by_the_trainer_for_the_manifest_world(mode):
    m = manifest(workload="cpu", mode=mode, train_tasks=2, hot_spares=1, gpus_per_node=2,
                 exit_duration_min=30)  # fmt: skip
    args = cpu.build_parser().parse_args(run_argv(m)[4:])
    assert cpu.resolve(args, m.shape.world_size) is None
    assert args.exit_duration_in_mins == 30


# --- dispatch ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workload", "builder"), [("cpu", cpu_program_argv), ("megatron", megatron_argv.program_argv)]
)
def test_dispatcher_picks_the_spec_workload(workload, builder):
    m = manifest(workload=workload)
    assert list(m.workload) == builder(m.spec, m.shape, m.policy, m.layout)


def test_default_interpreter_is_the_one_running_the_entrypoint():
    import sys

    assert workload_argv(list(manifest(workload="cpu").workload))[0] == sys.executable
