"""submit with a user's own workload: the mode it defaults to, the Megatron arguments file,
what it refuses in it, the paths it checks, and the script workload. Each runs the real
`nvrx-appliance submit` (a dry run, or a refusal: nothing may be written either way)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from nvrx_appliance.cli.main import cli

WORK = "/shared/alice/run"  # never created: a dry run writes nothing
IMAGE = "registry.example#nvidia/pytorch:25.12-py3"  # a registry image: nothing to read


def submit(tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    """`submit --dry-run --json` with Slurm unreachable (SLURM_CONF names no file)."""
    environment = {"SLURM_CONF": str(tmp_path / "none.conf"), **(env or {})}
    return CliRunner().invoke(cli, ["submit", "--work-dir", WORK, *args], env=environment)


def plan(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    result = submit(tmp_path, *args, "--dry-run", "--json", env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def refusal(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> list[str]:
    result = submit(tmp_path, *args, env=env)
    assert result.exit_code == 2, result.output
    assert not Path(WORK).exists()
    lines = result.stderr.splitlines()
    assert lines[-1] == "nvrx-appliance submit: nothing was written or submitted"
    return [line for line in lines if not line.startswith("warning") and "slurm:" not in line]


def args_file(tmp_path: Path, text: str, name: str = "args.txt") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


CPU = ("--workload", "cpu", "--runtime", "bare", "--python", sys.executable)


# --- the mode ---------------------------------------------------------------------------


def test_with_no_mode_a_chain_trains_and_nothing_injects_a_fault(tmp_path):
    doc = plan(tmp_path, *CPU)
    assert doc["mode"] == "train"
    assert not [a for a in doc["workload"] if a.startswith("--fault-injector")]


def test_a_fault_setting_given_for_a_training_chain_is_named_as_ignored(tmp_path):
    doc = plan(tmp_path, *CPU, "--gpu-failure", "1:0", env={"NVRX_FAULT_DELAY": "5"})
    assert doc["mode"] == "train"
    ignored = [w for w in doc["warnings"] if "applies to the demo modes only" in w]
    assert [w.split(" ")[0] for w in ignored] == ["--fault-delay", "--gpu-failure"]
    assert "(env NVRX_FAULT_DELAY)" in ignored[0]


def test_the_dry_run_says_the_mode_and_the_final_workload_argv(tmp_path):
    result = submit(tmp_path, *CPU, "--dry-run")
    assert "# mode: train (no injected faults)" in result.stdout
    assert "-m nvrx_appliance.workloads.cpu --save " in result.stdout


@pytest.mark.parametrize(("value", "mode"), [("1", "no-restart"), ("0", "handoff")])
def test_the_seeds_demo_switch_still_selects_a_demo_that_injects(tmp_path, value, mode):
    doc = plan(tmp_path, *CPU, env={"NVRX_NO_RESTART_DEMO": value})
    assert doc["mode"] == mode
    assert "--fault-injector-ranks" in doc["workload"]


# --- Megatron: the user's arguments -----------------------------------------------------

MEGATRON = ("--image", IMAGE, "--train-samples", "1000000")
USER = """\
# my model
--num-layers 24   # deep enough
--hidden-size 2048
--tokenizer-type HuggingFaceTokenizer
--run-name 'first run'
--lr=3e-4
"""


def test_a_users_arguments_come_last_after_the_appliances_with_no_preset(tmp_path):
    doc = plan(tmp_path, *MEGATRON, "--megatron-args", args_file(tmp_path, USER))
    argv = doc["workload"]
    assert argv[0] == "/workspace/megatron-lm/pretrain_gpt.py"
    assert argv[-9:] == [
        "--num-layers", "24", "--hidden-size", "2048", "--tokenizer-type",
        "HuggingFaceTokenizer", "--run-name", "first run", "--lr=3e-4",
    ]  # fmt: skip
    assert "--save" in argv and "--enable-ft-package" in argv
    assert "--mock-data" not in argv  # mock data belongs to the demo presets only


def test_print_config_shows_the_profile_none_and_where_the_arguments_came_from(tmp_path):
    path = args_file(tmp_path, USER)
    result = submit(tmp_path, *MEGATRON, "--megatron-args", path, "--print-config", "--json")
    settings = json.loads(result.stdout)["settings"]
    assert settings["profile"]["value"] == "none"
    assert settings["megatron_args"]["from"] == f"flag --megatron-args {path}"
    assert settings["megatron_args"]["value"][:2] == ["--num-layers", "24"]


def test_print_config_derives_the_shape_from_the_users_file_as_megatron_would(tmp_path):
    path = args_file(tmp_path, "--tensor-model-parallel-size 4\n--context-parallel-size 4\n"
                               "--global-batch-size 4\n")  # fmt: skip
    args = (*MEGATRON, "--train-tasks", "4", "--gpus-per-node", "8", "--megatron-args", path)
    result = submit(tmp_path, *args, "--print-config")
    assert result.exit_code == 0, result.output
    derived = next(line for line in result.stdout.splitlines() if line.startswith("derived: "))
    for part in ("world_size=32", "tensor_parallel=4", "context_parallel=4", "data_parallel=2",
                 "global_batch=4", "microbatches=2"):  # fmt: skip
        assert part in derived.split(", ") or f"derived: {part}" in derived, (part, derived)
    shape = json.loads(submit(tmp_path, *args, "--print-config", "--json").stdout)["shape"]
    assert (shape["data_parallel"], shape["microbatches"]) == (2, 2)


def test_a_preset_keeps_its_mock_data_and_the_users_arguments_override_it(tmp_path):
    path = args_file(tmp_path, "--num-layers 2\n")
    argv = plan(tmp_path, *MEGATRON, "--profile", "small", "--megatron-args", path)["workload"]
    assert "--mock-data" in argv
    assert argv[-2:] == ["--num-layers", "2"]  # after the preset's 8: argparse keeps it


def test_the_config_file_takes_the_arguments_as_a_list(tmp_path):
    config = tmp_path / "chain.toml"
    config.write_text('megatron_args = ["--num-layers", "4", "--seq-length", "2048"]\n')
    argv = plan(tmp_path, *MEGATRON, "--config", str(config))["workload"]
    assert argv[-4:] == ["--num-layers", "4", "--seq-length", "2048"]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "--persistent-save-interval=100",
            "--megatron-args: --persistent-save-interval is a chain setting; remove it and "
            "set --save-interval",
        ),
        ("--save /elsewhere", "--megatron-args: --save is the appliance's"),
        ("--fault-injector-ranks 3", "--megatron-args: --fault-injector-ranks is the demo"),
        (
            "--load /lustre/base",
            "--megatron-args: --load is the appliance's (every generation resumes from "
            "<work dir>/checkpoints); to start from another checkpoint, use "
            "--pretrained-checkpoint DIR",
        ),
    ],
)
def test_an_argument_the_appliance_owns_is_refused_naming_both(tmp_path, line, expected):
    lines = refusal(tmp_path, *MEGATRON, "--megatron-args", args_file(tmp_path, line + "\n"))
    assert any(message.startswith(f"nvrx-appliance submit: {expected}") for message in lines)


def test_an_unreadable_or_badly_quoted_arguments_file_is_one_line(tmp_path):
    result = submit(tmp_path, *MEGATRON, "--megatron-args", str(tmp_path / "missing.txt"))
    assert result.exit_code == 2
    assert "--megatron-args" in result.stderr and "cannot read it" in result.stderr
    bad = args_file(tmp_path, "--lr 1e-4\n--run-name 'open\n")
    result = submit(tmp_path, *MEGATRON, "--megatron-args", bad)
    assert result.exit_code == 2
    assert f"{bad}, line 2: No closing quotation; fix the quoting" in result.stderr


def test_a_control_character_in_an_argument_is_refused(tmp_path):
    config = tmp_path / "chain.toml"
    config.write_text('megatron_args = ["--run-name", "a\\u001b[2Jb"]\n')
    lines = refusal(tmp_path, *MEGATRON, "--config", str(config))
    assert any("--megatron-args: contains the control character '\\x1b'" in m for m in lines)


def test_profile_none_needs_arguments_and_a_length(tmp_path):
    lines = refusal(tmp_path, "--image", IMAGE, "--profile", "none")
    assert any("--profile: none passes only your arguments" in m for m in lines)
    lines = refusal(tmp_path, "--image", IMAGE, "--megatron-args", args_file(tmp_path, USER))
    assert any("--train-samples: your run needs a length" in m for m in lines)


# --- Megatron: the paths in the arguments -----------------------------------------------


def data_args(tmp_path: Path) -> str:
    return args_file(tmp_path, "--data-path 0.5 /data/web_text_document 0.5 /data/code\n")


def test_data_outside_every_container_mount_is_refused_naming_the_mount_to_add(tmp_path):
    lines = refusal(tmp_path, *MEGATRON, "--megatron-args", data_args(tmp_path))
    assert any(
        "--data-path /data/web_text_document is not under any container mount" in m
        and f"--mounts {WORK}:{WORK},/data:/data" in m
        for m in lines
    )


def test_missing_dataset_files_are_named_through_the_mount(tmp_path):
    host = tmp_path / "corpora"
    host.mkdir()
    for name in ("web_text_document.bin", "web_text_document.idx", "code.bin"):
        (host / name).write_text("")
    mounts = ("--mounts", f"{WORK}:{WORK},{host}:/data")
    lines = refusal(tmp_path, *MEGATRON, *mounts, "--megatron-args", data_args(tmp_path))
    assert lines == [
        f"nvrx-appliance submit: --megatron-args: --data-path /data/code: {host}/code.idx does "
        f"not exist (on this host: {host}/code); fix the path (every node must see it at the "
        "same path)",
        "nvrx-appliance submit: nothing was written or submitted",
    ]
    (host / "code.idx").write_text("")
    assert plan(tmp_path, *MEGATRON, *mounts, "--megatron-args", data_args(tmp_path))


def test_a_relative_data_path_is_refused(tmp_path):
    path = args_file(tmp_path, "--data-path corpus_text_document\n")
    lines = refusal(tmp_path, *MEGATRON, "--megatron-args", path)
    assert any("--data-path corpus_text_document: use an absolute path" in m for m in lines)


@pytest.mark.parametrize(
    "option",
    ["--wandb-save-dir", "--non-persistent-global-ckpt-dir", "--non-persistent-local-ckpt-dir",
     "--config-logger-dir", "--flight-recorder-dump-path"],
)  # fmt: skip
def test_an_output_path_outside_every_mount_is_refused_naming_the_mount_to_add(tmp_path, option):
    path = args_file(tmp_path, f"{option} /scratch/run1/out\n")
    lines = refusal(tmp_path, *MEGATRON, "--megatron-args", path)
    assert lines[:-1] == [
        f"nvrx-appliance submit: --megatron-args: {option} /scratch/run1/out is not under any "
        f"container mount, so the job cannot see it; add its directory: --mounts "
        f"{WORK}:{WORK},/scratch/run1:/scratch/run1",
    ]


@pytest.mark.parametrize(
    "option", ["--heterogeneous-layers-config-path", "--te-precision-config-file"]
)
def test_an_input_file_must_exist_through_its_mount(tmp_path, option):
    host = tmp_path / "configs"
    host.mkdir()
    mounts = ("--mounts", f"{WORK}:{WORK},{host}:/configs")
    path = args_file(tmp_path, f"{option} /configs/model.json\n")
    lines = refusal(tmp_path, *MEGATRON, *mounts, "--megatron-args", path)
    assert any(
        f"{option} /configs/model.json: {host}/model.json does not exist" in m for m in lines
    )
    (host / "model.json").write_text("{}")
    assert plan(tmp_path, *MEGATRON, *mounts, "--megatron-args", path)


def test_a_pretrained_checkpoint_must_hold_megatrons_tracker(tmp_path):
    host = tmp_path / "base"
    (host / "iter_0001000").mkdir(parents=True)
    mounts = ("--mounts", f"{WORK}:{WORK},{host}:/ckpt/base")
    path = args_file(tmp_path, "--pretrained-checkpoint /ckpt/base\n")
    lines = refusal(tmp_path, *MEGATRON, *mounts, "--megatron-args", path)
    assert any(f"{host}/latest_checkpointed_iteration.txt does not exist" in m for m in lines), (
        lines
    )
    (host / "latest_checkpointed_iteration.txt").write_text("1000")
    assert plan(tmp_path, *MEGATRON, *mounts, "--megatron-args", path)


def test_a_huggingface_hub_id_is_a_tokenizer_not_a_relative_path(tmp_path):
    hub = "--tokenizer-type HuggingFaceTokenizer\n--tokenizer-model meta-llama/Meta-Llama-3-8B\n"
    result = submit(tmp_path, *MEGATRON, "--megatron-args", args_file(tmp_path, hub),
                    "--dry-run", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if "hub id" in line]
    assert notes == [
        "warning: --tokenizer-model meta-llama/Meta-Llama-3-8B is a HuggingFace hub id: compute "
        "nodes without internet access need it in a HuggingFace cache under a container mount "
        "(HF_HOME, HF_HUB_OFFLINE=1)"
    ]
    # A sentencepiece model has no hub: the same words are a relative path there.
    spm = "--tokenizer-type GPTSentencePieceTokenizer\n--tokenizer-model tokenizers/spm.model\n"
    lines = refusal(tmp_path, *MEGATRON, "--megatron-args", args_file(tmp_path, spm))
    assert any("--tokenizer-model tokenizers/spm.model: use an absolute path" in m for m in lines)


# --- any PyTorch script -----------------------------------------------------------------


SCRIPT_CHAIN = ("--workload", "script", "--runtime", "bare", "--python", sys.executable)


def test_a_script_workload_runs_the_script_with_its_arguments(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    doc = plan(
        tmp_path, *SCRIPT_CHAIN, "--script", str(script),
        "--script-args", args_file(tmp_path, "--iterations 100  # short\n--lr 0.1\n"),
    )  # fmt: skip
    assert doc["workload"] == [str(script), "--iterations", "100", "--lr", "0.1"]


def test_a_script_workload_is_refused_without_its_script_or_when_it_is_missing(tmp_path):
    lines = refusal(tmp_path, *SCRIPT_CHAIN)
    assert any("--script: --workload script needs your script" in m for m in lines)
    lines = refusal(tmp_path, *SCRIPT_CHAIN, "--script", str(tmp_path / "nope.py"))
    assert any(f"--script: your script: {tmp_path}/nope.py does not exist" in m for m in lines)


def test_a_script_cannot_be_given_a_demo_fault_it_cannot_inject(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    lines = refusal(tmp_path, *SCRIPT_CHAIN, "--script", str(script), "--mode", "handoff")
    assert any("pass --no-fault-inject" in m for m in lines)
    doc = plan(tmp_path, *SCRIPT_CHAIN, "--script", str(script), "--mode", "handoff",
               "--no-fault-inject")  # fmt: skip
    assert doc["mode"] == "handoff"


def test_arguments_of_another_workload_are_refused(tmp_path):
    lines = refusal(tmp_path, *CPU, "--megatron-args", args_file(tmp_path, "--lr 1\n"))
    assert any("--megatron-args: applies to --workload megatron, not cpu" in m for m in lines)


def test_a_step_pause_is_for_the_built_in_trainer_only_and_within_bounds(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    lines = refusal(tmp_path, *SCRIPT_CHAIN, "--script", str(script), "--cpu-step-pause", "0.2")
    assert any("--cpu-step-pause: applies to --workload cpu, not script" in m for m in lines)
    lines = refusal(tmp_path, *CPU, "--cpu-step-pause", "30")
    assert any("--cpu-step-pause: must be between 0 and 10 seconds" in m for m in lines)
    assert "--step-pause" in plan(tmp_path, *CPU, "--cpu-step-pause", "0.2")["workload"]
