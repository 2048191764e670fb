"""Every Megatron argv the appliance builds passes the pinned Megatron's own parser and its
validate_args, for the world size the chain trains; and the flags the appliance owns or
checks are Megatron's real ones, aliases included.

The parser is the pinned megatron-core wheel's, unpacked beside the venv by
scripts/install-python-deps.sh, run in a subprocess (tests/unit/megatron_parser.py).
Real teams' argument files (tests/unit/fixtures/megatron/: a Llama-3-style 8B, a
fine-tune, a logging-heavy run, a mixture of experts with sequence, context and expert
parallelism) are either accepted, and then parsed and validated by Megatron for their
world with the data-parallel size the appliance derived, or refused with one line
saying what to do instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from nvrx_appliance.image.pins import load
from nvrx_appliance.manifest import Manifest, build
from nvrx_appliance.node import env
from nvrx_appliance.node.identity import Node
from nvrx_appliance.settings import workload_args
from nvrx_appliance.settings.chain import ChainSpec, check
from nvrx_appliance.settings.generation_end import SAVE_SIGNAL
from nvrx_appliance.settings.megatron import argv as megatron_argv
from nvrx_appliance.settings.megatron import parallel
from nvrx_appliance.settings.megatron import paths as megatron_paths
from nvrx_appliance.settings.megatron import rules as megatron_rules

HOPPER = 9  # the GPU architecture validate_args is told it runs on
MEGATRON = Path(sys.prefix) / f"megatron-core-{load().megatron_core_version}"
HELPER = Path(__file__).with_name("megatron_parser.py")
FIXTURES = Path(__file__).parent / "fixtures" / "megatron"

# A user's own run on real data, as a team would write it (profile none).
USER_ARGS = """\
# model: a 1.5B dense GPT
--num-layers 24
--hidden-size 2048
--ffn-hidden-size 5632
--num-attention-heads 16
--group-query-attention
--num-query-groups 4
--seq-length 4096
--max-position-embeddings 4096
--position-embedding-type rope
--normalization RMSNorm
--swiglu
--untie-embeddings-and-output-weights
--disable-bias-linear
--attention-dropout 0.0
--hidden-dropout 0.0
# data: a weighted blend of two preprocessed corpora
--data-path 0.7 /lustre/corpora/web_text_document 0.3 /lustre/corpora/code_text_document
--split 990,8,2
--data-cache-path /lustre/cache/index
--tokenizer-type HuggingFaceTokenizer
--tokenizer-model /lustre/tokenizers/llama3
# optimizer and schedule
--lr 3e-4
--min-lr 3e-5
--lr-decay-style cosine
--lr-warmup-samples 2048000
--lr-decay-samples 480000000
--weight-decay 0.1
--clip-grad 1.0
--adam-beta1 0.9
--adam-beta2 0.95
--bf16
--use-distributed-optimizer
--overlap-grad-reduce
# checkpoints and logging
--ckpt-format torch_dist
--async-save
--log-interval 10
--eval-interval 1000
--eval-iters 10
--tensorboard-dir /lustre/tensorboard/run1
"""

# The parser decides; a chain of 4 tasks x 8 GPUs is the world these are validated for.
SHAPE = {"train_tasks": 4, "hot_spares": 1, "gpus_per_node": 8}


def megatron_manifest(*, checked: bool = True, **settings) -> Manifest:
    """The manifest submit would write; checked=False builds one submit refuses, to show
    what Megatron would make of it."""
    spec = ChainSpec(work_dir="/lustre/runs/run1", workload="megatron", **{**SHAPE, **settings})
    if checked:
        assert check(spec) == [], check(spec)
    return build(spec, created="2026-12-01T00:00:00Z", user="alice")


def team_args(name: str, *extra: str, drop: tuple[str, ...] = ()) -> list[str]:
    """A fixture's arguments, less the lines starting with `drop`, plus `extra`."""
    text = (FIXTURES / f"{name}.args").read_text()
    kept = "\n".join(line for line in text.splitlines() if not line.startswith(drop or "\0"))
    return [*workload_args.parse_args_file(kept, f"{name}.args"), *extra]


def parse(cases: list[dict]) -> dict:
    if not (MEGATRON / "megatron" / "training" / "arguments.py").is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{MEGATRON} is missing: scripts/install-python-deps.sh unpacks it")
        pytest.skip(f"{MEGATRON} is missing: run scripts/install-python-deps.sh")
    request = json.dumps({"megatron": str(MEGATRON), "cases": cases})
    done = subprocess.run(
        [sys.executable, str(HELPER)], input=request, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def case(manifest: Manifest) -> dict:
    # The program argv is pretrain_gpt.py and its arguments; the parser takes the latter.
    node = Node(array_job_id="7", task_id=0, node_id=0, job_id="7", hostname="node1")
    return {
        "argv": list(manifest.workload[1:]),
        "world_size": manifest.shape.world_size,
        "env": env.plan(manifest, node, {}).set,
        "gpu_arch": HOPPER,
        "report": ["save", "load", "data_parallel_size", "global_batch_size", "train_samples",
                   "train_iters", "enable_ft_package", "fault_injector_ranks", "data_path",
                   "tensor_model_parallel_size", "context_parallel_size",
                   "expert_model_parallel_size", "expert_tensor_parallel_size",
                   "virtual_pipeline_model_parallel_size", "micro_batch_size", "async_save",
                   "async_strategy", "use_persistent_ckpt_worker", "ckpt_format",
                   "pretrained_checkpoint", "tokenizer_model", "wandb_project",
                   "lr_decay_samples", "lr_decay_iters", "lr_warmup_samples",
                   "exit_signal_handler", "exit_signal", "exit_duration_in_mins"],
    }  # fmt: skip


PRESETS = [
    ({"profile": "small", "mode": mode}, mode) for mode in ("train", "no-restart", "handoff")
] + [({"profile": "8b", "mode": mode, "tensor_parallel": 4}, mode) for mode in ("train", "handoff")]


@dataclass(frozen=True)
class Refusal:
    settings: dict  # the chain, as megatron_manifest takes it
    line: str  # the start of submit's one line
    # What Megatron's validate_args (or its microbatch calculator) says of the same argv:
    # None: not asked; "": it accepts it, and the run would fail later, or silently.
    megatron_says: str | None = None


REFUSED: dict[str, Refusal] = {
    # 1. The shape, as Megatron computes it.
    "tp8-cp2-on-24-gpus": Refusal(
        dict(profile="small", train_tasks=3, tensor_parallel=8, context_parallel=2),
        "--train-tasks: a world of 24 ranks is not divisible by TP 8 x PP 1 x CP 2 = 16",
        "world size (24) is not divisible by total_model_size"),
    "ep16-on-8-gpus": Refusal(
        dict(megatron_args=team_args("moe", "--num-experts", "16", drop=("--expert-model",)),
             train_tasks=1, expert_parallel=16, train_samples=1000),
        "--expert-parallel: ETP 2 x EP 16 x PP 2 = 64 does not divide the world of 8 ranks",
        ""),  # validate_args lets it through: initialize_model_parallel stops every rank
    "batch-not-divisible": Refusal(
        dict(megatron_args=team_args("llama3-8b"), train_tasks=3, train_samples=1000),
        "--global-batch: 128 is not divisible by micro batch x data-parallel size = 1 x 6",
        "eval_global_batch_size (128) must be divisible by eval_micro_batch_size (1) * "
        "data_parallel_size (6)"),
    "eval-batch-not-divisible": Refusal(
        dict(megatron_args=team_args("llama3-8b", "--eval-global-batch-size", "36"),
             train_samples=1000),
        "--megatron-args: --eval-global-batch-size 36 is not divisible by "
        "--eval-micro-batch-size x data-parallel size = 1 x 8",
        "eval_global_batch_size (36) must be divisible by eval_micro_batch_size (1) * "
        "data_parallel_size (8)"),
    "tp-twice": Refusal(
        dict(megatron_args=team_args("llama3-8b"), tensor_parallel=2, train_samples=1000),
        "--tensor-parallel: 2 conflicts with --tensor-model-parallel-size 4 in your "
        "--megatron-args; state it in one place"),
    # 2. Flags that break resuming.
    **{
        f"finetune{extra[0]}": Refusal(
            dict(megatron_args=team_args("finetune", *extra)),
            f"--megatron-args: {extra[0]} {why}", "" if extra[0] == "--finetune" else None)
        for extra, why in [
            (("--finetune",), "restarts training at iteration 0 on every resume"),
            (("--no-load-optim",), "drops the optimizer state on every resume"),
            (("--no-load-rng",), "drops the RNG state on every resume"),
            (("--no-save-optim",), "saves checkpoints no generation can resume from"),
            (("--ckpt-step", "2000"), "pins every resume to one iteration"),
            (("--yaml-cfg", "/lustre/cfg/llama3-8b.yaml"), "makes Megatron ignore the command line"),
            (("--load", "/lustre/checkpoints/llama3-8b-base"),
             "is the appliance's (every generation resumes from <work dir>/checkpoints); to "
             "start from another checkpoint, use --pretrained-checkpoint DIR"),
        ]
    },
    "virtual-stages-without-a-pipeline": Refusal(
        dict(profile="small", virtual_pipeline=2),
        "--virtual-pipeline: 2 virtual stages need pipeline parallelism (PP 2 or more",
        "pipeline-model-parallel size should be greater than 1"),
    "exit-on-missing-without-pretrained": Refusal(
        dict(megatron_args=team_args("llama3-8b", "--exit-on-missing-checkpoint"),
             train_samples=1000),
        "--megatron-args: --exit-on-missing-checkpoint stops the first generation, which "
        "starts with no checkpoint"),
    "override-iteration": Refusal(
        dict(megatron_args=team_args("finetune", "--override-ckpt-iteration", "0")),
        "--megatron-args: --override-ckpt-iteration rewrites the iteration on every resume"),
    # 3. A length and a schedule in one unit.
    "preset-samples-with-iteration-decay": Refusal(
        dict(profile="small", megatron_args=["--lr-decay-iters", "2000"]),
        "--megatron-args: --lr-decay-iters does not match a run measured in samples",
        "expected sample-based learning rate decay"),
    "iterations-with-sample-warmup": Refusal(
        dict(megatron_args=team_args("finetune", "--lr-warmup-samples", "1000")),
        "--megatron-args: --lr-warmup-samples does not match a run measured in iterations",
        "expected iteration-based learning rate warmup"),
    # 4. Asynchronous checkpoints need the format that has them.
    "async-with-torch-format": Refusal(
        dict(megatron_args=team_args("llama3-8b", "--ckpt-format", "torch"), train_samples=10),
        "--megatron-args: --ckpt-format torch cannot save asynchronously through NVRx"),
    # 5. Retention: Megatron's own thinning and the appliance's keep-N both delete.
    "retain-interval-and-retention": Refusal(
        dict(megatron_args=team_args("llama3-8b", "--save-retain-interval", "5000"),
             train_samples=10),
        "--megatron-args: --save-retain-interval (Megatron's own thinning) and "
        "--save-retention 3 would both remove checkpoints"),
    # 6. Paths.
    "relative-data-path": Refusal(
        dict(megatron_args=team_args("llama3-8b", "--data-path", "corpora/web_text_document"),
             train_samples=10),
        "--megatron-args: --data-path corpora/web_text_document: use an absolute path"),
    "relative-sentencepiece-model": Refusal(
        dict(megatron_args=team_args("logging", "--tokenizer-model", "tokenizers/spm.model"),
             train_samples=10, global_batch=64),
        "--megatron-args: --tokenizer-model tokenizers/spm.model: use an absolute path"),
    # 7. W&B needs an experiment name on Megatron's logging rank.
    "wandb-without-name": Refusal(
        dict(megatron_args=team_args("logging", drop=("--wandb-exp-name",)),
             train_samples=10, global_batch=64),
        "--megatron-args: --wandb-project needs --wandb-exp-name too"),
}  # fmt: skip


# Real teams' files, each in the chain it runs in. The shape comes from the file (the
# settings stay 0) unless a case gives it as settings instead.
TEAM_RUNS: dict[str, dict] = {
    "llama3-8b": dict(megatron_args=team_args("llama3-8b"), train_tasks=4,
                      train_samples=250_000_000, save_interval=500),
    "finetune": dict(megatron_args=team_args("finetune"), train_tasks=2, save_interval=100),
    # The global batch as a setting: the file leaves it out.
    "logging": dict(megatron_args=team_args("logging"), train_tasks=2, global_batch=64,
                    train_samples=100_000_000, save_interval=250),
    "moe": dict(megatron_args=team_args("moe"), train_tasks=8, train_samples=400_000_000,
                save_interval=500),
    # The same MoE run with its parallel sizes as chain settings instead of lines.
    "moe-settings": dict(
        megatron_args=team_args("moe", drop=("--tensor-model", "--pipeline-model",
                                             "--num-layers-per-virtual", "--context-parallel",
                                             "--expert-model")),
        train_tasks=8, tensor_parallel=2, pipeline_parallel=2, virtual_pipeline=4,
        context_parallel=2, expert_parallel=8, train_samples=400_000_000, save_interval=500),
    # The issue's own: a preset measured in iterations (its sample-based schedule gives
    # way), and CP 4 x TP 4 on 32 GPUs with a global batch of 4 (DP 2).
    "small-iters": dict(profile="small",
                        megatron_args=["--train-iters", "2000", "--lr-decay-iters", "2000"]),
    "small-cp4-tp4": dict(profile="small", train_tasks=4, tensor_parallel=4, context_parallel=4,
                          global_batch=4),
    "small-cp4-tp4-default-batch": dict(profile="small", train_tasks=4, tensor_parallel=4,
                                        context_parallel=4),
    "llama3-8b-sync": dict(megatron_args=team_args("llama3-8b"), train_tasks=4,
                           train_samples=250_000_000, async_save=False),
}  # fmt: skip


@pytest.fixture(scope="module")
def answers() -> dict:
    manifests = {
        **{f"{s['profile']}-{mode}": megatron_manifest(**s) for s, mode in PRESETS},
        "user-train": megatron_manifest(
            megatron_args=workload_args.parse_args_file(USER_ARGS, "args.txt"),
            train_samples=480_000_000, save_interval=500, tensor_parallel=2,
        ),
        "user-iters": megatron_manifest(
            megatron_args=[
                *workload_args.parse_args_file(USER_ARGS.replace("samples", "iters"), "args.txt"),
                "--train-iters", "100000",
            ],
            exit_duration_min=110,
        ),
        **{name: megatron_manifest(**settings) for name, settings in TEAM_RUNS.items()},
        **{f"refused-{n}": megatron_manifest(checked=False, **r.settings)
           for n, r in REFUSED.items() if r.megatron_says is not None},
    }  # fmt: skip
    names = list(manifests)
    answer = parse([case(manifests[n]) for n in names])
    return {
        "options": answer["options"],
        "path_like": answer["path_like"],
        "cases": dict(zip(names, answer["cases"], strict=True)),
        "manifests": manifests,
    }


@pytest.mark.parametrize("name", [f"{s['profile']}-{mode}" for s, mode in PRESETS])
def test_every_preset_in_every_mode_passes_megatrons_validation(answers, name):
    result = answers["cases"][name]
    assert result["ok"], result["error"]
    values, m = result["values"], answers["manifests"][name]
    assert values["save"] == values["load"] == str(m.layout.checkpoints)
    assert values["enable_ft_package"] is True
    assert values["data_parallel_size"] == m.shape.data_parallel
    assert (values["fault_injector_ranks"] is not None) == (m.spec.mode != "train")


@pytest.mark.parametrize("name", ["user-train", "user-iters"])
def test_a_users_own_arguments_on_real_data_pass_megatrons_validation(answers, name):
    result = answers["cases"][name]
    assert result["ok"], result["error"]
    values, m = result["values"], answers["manifests"][name]
    assert values["data_path"] == [
        "0.7", "/lustre/corpora/web_text_document", "0.3", "/lustre/corpora/code_text_document",
    ]  # fmt: skip
    assert values["save"] == str(m.layout.checkpoints)
    assert values["fault_injector_ranks"] is None  # train mode never injects
    assert values["tensor_model_parallel_size"] == m.shape.tensor_parallel
    if name == "user-iters":
        assert (values["train_iters"], values["train_samples"]) == (100000, None)
    else:
        assert values["train_samples"] == 480_000_000


def test_every_argv_saves_and_exits_on_the_save_signal_and_never_times_itself(answers):
    # The time-limit save: the save signal the entrypoint sends at the notice. Megatron's
    # own exit duration would count from each worker's start, so it is never passed.
    built = {n: r for n, r in answers["cases"].items() if not n.startswith("refused-")}
    assert len(built) > 5
    for name, result in built.items():
        assert result["ok"], (name, result["error"])
        values = result["values"]
        assert values["exit_signal_handler"] is True, name
        assert values["exit_signal"] == int(SAVE_SIGNAL), name
        assert values["exit_duration_in_mins"] is None, name


def test_the_parser_rejects_what_megatron_rejects(answers):
    """The check can fail: a TP that does not divide the world is Megatron's error too."""
    m = megatron_manifest(profile="small")
    bad = {
        **case(m),
        "world_size": 6,
        "argv": [*case(m)["argv"], "--tensor-model-parallel-size", "4"],
    }
    (result,) = parse([bad])["cases"]
    assert not result["ok"]
    assert "not divisible" in str(result["error"])


OWNED_DESTS = (
    "save", "load", "save_interval", "enable_ft_package", "train_samples",
    "exit_duration_in_mins", "exit_signal_handler", "exit_signal",
)  # fmt: skip
RESUME_BREAKING_DESTS = (
    "finetune", "no_load_optim", "no_load_rng", "no_save_optim", "ckpt_step",
    "override_ckpt_iteration", "yaml_cfg",
)  # fmt: skip
# The shape sizes a user's arguments may state, by the dest Megatron stores them in.
SIZE_DESTS = {
    "tensor_parallel": "tensor_model_parallel_size",
    "pipeline_parallel": "pipeline_model_parallel_size",
    "context_parallel": "context_parallel_size",
    "expert_parallel": "expert_model_parallel_size",
    "expert_tensor_parallel": "expert_tensor_parallel_size",
    "micro_batch": "micro_batch_size",
    "global_batch": "global_batch_size",
}


def test_every_spelling_of_an_owned_or_resume_breaking_flag_is_refused(answers):
    options = answers["options"]
    for dest in (*OWNED_DESTS, *RESUME_BREAKING_DESTS):
        for spelling in options[dest]:
            assert workload_args.refusal(spelling), f"{spelling} ({dest}) is not refused"
    injector = [
        o for dest, opts in options.items() if dest.startswith("fault_injector") for o in opts
    ]
    assert injector and all(workload_args.refusal(o) for o in injector)


def test_a_shape_size_has_one_spelling_and_it_is_the_one_the_appliance_reads(answers):
    for setting, dest in SIZE_DESTS.items():
        assert answers["options"][dest] == [parallel.SIZE_FLAGS[setting]], dest


# --- real teams' files ---------------------------------------------------------------


@pytest.mark.parametrize("name", list(TEAM_RUNS))
def test_a_teams_file_is_accepted_and_megatron_validates_it_with_the_same_shape(answers, name):
    result = answers["cases"][name]
    assert result["ok"], result["error"]
    values, m = result["values"], answers["manifests"][name]
    shape = m.shape
    assert values["data_parallel_size"] == shape.data_parallel
    assert values["global_batch_size"] == shape.global_batch
    assert values["num_microbatches"] == shape.microbatches
    assert values["micro_batch_size"] == shape.micro_batch
    assert (values["tensor_model_parallel_size"], values["context_parallel_size"],
            values["expert_model_parallel_size"], values["expert_tensor_parallel_size"]) == (
        shape.tensor_parallel, shape.context_parallel, shape.expert_parallel,
        shape.expert_tensor_parallel)  # fmt: skip
    assert (values["virtual_pipeline_model_parallel_size"] or 0) == shape.virtual_pipeline
    assert values["save"] == values["load"] == str(m.layout.checkpoints)
    # NVRx-backed asynchronous checkpoints, unless the chain turned them off.
    if m.spec.async_save:
        assert (
            values["async_save"],
            values["async_strategy"],
            values["ckpt_format"],
            values["use_persistent_ckpt_worker"],
        ) == (True, "nvrx", "torch_dist", True)
    else:
        assert (values["async_save"], values["async_strategy"]) == (False, "mcore")


def test_the_issues_shapes_come_out_as_megatron_computes_them(answers):
    cases, manifests = answers["cases"], answers["manifests"]
    # CP 4 x TP 4 on 32 GPUs: DP 2, so a global batch of 4 is 2 microbatches of 1.
    assert cases["small-cp4-tp4"]["values"]["data_parallel_size"] == 2
    assert manifests["small-cp4-tp4"].shape.microbatches == 2
    # Without --global-batch the default is micro batch x DP = 2: one microbatch a step.
    assert cases["small-cp4-tp4-default-batch"]["values"]["global_batch_size"] == 2
    assert cases["small-cp4-tp4-default-batch"]["values"]["num_microbatches"] == 1
    # The MoE file: 64 ranks = TP 2 x PP 2 x CP 2 x DP 8, 4 virtual stages, EP 8 x ETP 2.
    moe = cases["moe"]["values"]
    assert (moe["data_parallel_size"], moe["virtual_pipeline_model_parallel_size"]) == (8, 4)
    assert manifests["moe-settings"].shape == manifests["moe"].shape


def test_a_preset_measured_in_iterations_keeps_megatrons_one_unit(answers):
    values = answers["cases"]["small-iters"]["values"]
    assert (values["train_iters"], values["lr_decay_iters"]) == (2000, 2000)
    assert (values["train_samples"], values["lr_decay_samples"]) == (None, None)
    assert values["lr_warmup_samples"] == 0


def test_a_fine_tune_starts_from_the_pretrained_checkpoint_and_resumes_its_own(answers):
    values = answers["cases"]["finetune"]["values"]
    assert values["pretrained_checkpoint"] == "/lustre/checkpoints/llama3-8b-base"
    assert values["load"] == str(answers["manifests"]["finetune"].layout.checkpoints)


def test_a_hub_tokenizer_reaches_megatron_as_given(answers):
    assert (
        answers["cases"]["llama3-8b"]["values"]["tokenizer_model"] == "meta-llama/Meta-Llama-3-8B"
    )


@pytest.mark.parametrize("name", list(REFUSED))
def test_what_would_break_a_chain_is_refused_in_one_line_that_says_what_to_do(name):
    refusal = REFUSED[name]
    spec = ChainSpec(work_dir="/lustre/runs/run1", workload="megatron",
                     **{**SHAPE, **refusal.settings})  # fmt: skip
    lines = [str(p) for p in check(spec)]
    assert len(lines) == 1, lines
    assert lines[0].startswith(refusal.line), lines[0]
    assert "\n" not in lines[0]


@pytest.mark.parametrize("name", [n for n, r in REFUSED.items() if r.megatron_says is not None])
def test_megatron_agrees_with_each_refusal_it_can_judge(answers, name):
    result, says = answers["cases"][f"refused-{name}"], REFUSED[name].megatron_says
    if says:
        assert not result["ok"] and says in str(result["error"]), result
    else:  # validate_args accepts it: the run would fail later, or train wrongly
        assert result["ok"], result["error"]


# --- path options ----------------------------------------------------------------------


def test_every_option_of_megatron_that_looks_like_a_path_is_classified(answers):
    classified = (
        set(megatron_paths.MEGATRON_PATH_FLAGS) | set(megatron_paths.NOT_PATHS)
        | set(workload_args.OWNED_MEGATRON_FLAGS) | set(workload_args.RESUME_BREAKING_FLAGS)
    )  # fmt: skip
    unclassified = sorted(set(answers["path_like"]) - classified)
    assert not unclassified, (
        f"classify these in settings/megatron/paths.py (a kind, or NOT_PATHS): {unclassified}"
    )


def test_the_walk_finds_the_output_paths_that_were_never_checked(answers):
    for option in ("--wandb-save-dir", "--non-persistent-global-ckpt-dir",
                   "--non-persistent-local-ckpt-dir", "--heterogeneous-layers-config-path",
                   "--te-precision-config-file", "--tokenizer-model", "--data-cache-path"):  # fmt: skip
        assert option in answers["path_like"]
        assert option in megatron_paths.MEGATRON_PATH_FLAGS


def test_every_flag_the_appliance_names_is_megatrons_own(answers):
    real = {option for spellings in answers["options"].values() for option in spellings}
    named = (
        set(workload_args.OWNED_MEGATRON_FLAGS) | set(workload_args.RESUME_BREAKING_FLAGS)
        | set(megatron_paths.MEGATRON_PATH_FLAGS) | set(megatron_paths.NOT_PATHS)
        | set(parallel.SIZE_FLAGS.values()) | set(parallel.VIRTUAL_FLAGS)
        | {parallel.TENSOR_SHARDS, parallel.EXPERT_TENSOR_SHARDS, parallel.MICROBATCH_GROUP,
           parallel.EVAL_GLOBAL_BATCH, parallel.EVAL_MICRO_BATCH, *parallel.BATCH_RAMPS}
        | {f for group in megatron_rules.SCHEDULE_GROUPS for f in group}
        | set(megatron_rules.ITERATION_FLAGS) | set(megatron_rules.SAMPLE_FLAGS)
        | {"--wandb-project", "--wandb-exp-name", "--ckpt-format", "--save-retain-interval",
           "--exit-on-missing-checkpoint", "--tokenizer-type", "--train-iters",
           "--pretrained-checkpoint", "--num-layers", "--account-for-embedding-in-pipeline-split",
           "--account-for-loss-in-pipeline-split"}
        | {word for word in megatron_argv.ASYNC_SAVE if word.startswith("--")}
    )  # fmt: skip
    assert named <= real, sorted(named - real)
