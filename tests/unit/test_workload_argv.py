"""The workload argv the entrypoint appends after ft_launcher's flags, per mode and profile."""

from __future__ import annotations

import pytest

from nvrx_appliance.manifest import Manifest, build
from nvrx_appliance.settings.chain import DEFAULT_TRAIN_SAMPLES, ChainSpec
from nvrx_appliance.settings.megatron import argv as megatron_argv
from nvrx_appliance.settings.program_argv import cpu_program_argv
from nvrx_appliance.workloads import cpu, workload_argv

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


def test_megatron_checkpoints_are_async_through_nvrx_in_the_work_dir_for_every_profile():
    for profile in ("small", "none"):
        extra = {"megatron_args": ["--num-layers", "4"], "train_samples": 100}
        m = manifest(save_interval=50, profile=profile, **(extra if profile == "none" else {}))
        f = flags(run_argv(m))
        assert f["--save"] == f["--load"] == str(m.layout.checkpoints)
        assert f["--ckpt-format"] == "torch_dist"
        assert "--async-save" in f and "--use-persistent-ckpt-worker" in f
        assert f["--save-interval"] == "50"
        # Deprecated no-ops at the pin: never passed.
        assert "--ckpt-fully-parallel-save" not in f and "--use-mcore-models" not in f


def test_no_async_save_leaves_megatrons_synchronous_default():
    f = flags(run_argv(manifest(async_save=False)))
    assert "--async-save" not in f and "--use-persistent-ckpt-worker" not in f
    assert "--ckpt-format" not in f


def test_megatrons_retention_is_kept_by_task_0_not_by_a_megatron_flag():
    m = manifest(save_interval=20, save_retention=3)
    assert "--save-retain-interval" not in flags(run_argv(m))
    assert m.policy.checkpoints_kept == 3
    # The cpu trainer keeps its own: the entrypoint removes nothing of it.
    cpu_m = manifest(workload="cpu", save_retention=3)
    assert cpu_m.policy.checkpoints_kept == 0


def test_context_expert_and_virtual_sizes_are_passed_when_they_are_settings():
    m = manifest(train_tasks=8, gpus_per_node=8, tensor_parallel=2, pipeline_parallel=4,
                 context_parallel=2, expert_parallel=4, expert_tensor_parallel=1,
                 virtual_pipeline=2, global_batch=64)  # fmt: skip
    f = flags(run_argv(m))
    assert f["--context-parallel-size"] == "2"
    assert f["--expert-model-parallel-size"] == "4"
    assert f["--expert-tensor-parallel-size"] == "1"
    assert f["--num-virtual-stages-per-pipeline-rank"] == "2"
    assert m.shape.data_parallel == 64 // (2 * 4 * 2)
    unset = flags(run_argv(manifest()))
    assert not {"--context-parallel-size", "--expert-model-parallel-size"} & set(unset)


def test_sizes_a_users_arguments_state_stay_in_their_line_and_shape_the_chain():
    args = ["--num-layers", "4", "--tensor-model-parallel-size", "4",
            "--context-parallel-size", "4", "--global-batch-size", "4"]  # fmt: skip
    m = manifest(train_tasks=4, gpus_per_node=8, megatron_args=args, train_samples=100)
    argv = run_argv(m)
    assert m.shape.data_parallel == 2 and m.shape.global_batch == 4
    assert argv.count("--context-parallel-size") == 1  # the user's own line, once
    assert flags(argv[: argv.index("--num-layers")])["--tensor-model-parallel-size"] == "4"


def test_a_presets_sample_based_schedule_gives_way_to_a_run_measured_in_iterations():
    m = manifest(profile="small",
                 megatron_args=["--train-iters", "2000", "--lr-decay-iters", "2000"])  # fmt: skip
    f = flags(run_argv(m))
    assert "--lr-decay-samples" not in f and "--lr-warmup-samples" not in f
    assert "--train-samples" not in f
    assert f["--lr"] == "6e-4"  # the rest of the preset stays


def test_a_presets_warmup_gives_way_to_the_users_own():
    f = flags(run_argv(manifest(profile="small", megatron_args=["--lr-warmup-fraction", "0.01"])))
    assert "--lr-warmup-samples" not in f and f["--lr-decay-samples"] == "1038336"


def test_megatron_train_samples_default_to_the_seeds_and_follow_the_spec():
    assert flags(run_argv(manifest()))["--train-samples"] == str(DEFAULT_TRAIN_SAMPLES)
    assert flags(run_argv(manifest(train_samples=4096)))["--train-samples"] == "4096"


def test_megatron_saves_on_the_save_signal_and_never_times_itself():
    # Megatron's own exit duration counts from each worker's start, which an in-job
    # restart resets; the appliance counts from the generation's start and signals.
    for m in (manifest(), manifest(exit_duration_min=50)):
        f = flags(run_argv(m))
        assert "--exit-duration-in-mins" not in f
        assert "--exit-signal-handler" in f and f["--exit-signal"] == "SIGURG"


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
    assert argv[:4] == [PY, "-u", "-m", "nvrx_appliance.workloads.cpu"]


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


def test_cpu_step_pause_reaches_the_trainer_only_when_asked():
    assert "--step-pause" not in flags(run_argv(manifest(workload="cpu")))
    argv = run_argv(manifest(workload="cpu", cpu_step_pause=0.25))
    assert flags(argv)["--step-pause"] == "0.25"
    assert cpu.build_parser().parse_args(argv[4:]).step_pause == 0.25


@pytest.mark.parametrize("mode", ["train", "no-restart", "handoff"])
def test_cpu_argv_is_accepted_by_the_trainer_for_the_manifest_world(mode):
    m = manifest(workload="cpu", mode=mode, train_tasks=2, hot_spares=1, gpus_per_node=2,
                 exit_duration_min=30)  # fmt: skip
    args = cpu.build_parser().parse_args(run_argv(m)[4:])
    assert cpu.resolve(args, m.shape.world_size) is None


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
