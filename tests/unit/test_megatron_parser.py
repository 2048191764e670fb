"""Every Megatron argv the appliance builds passes the pinned Megatron's own parser and its
validate_args, for the world size the chain trains; and the flags the appliance owns or
checks are Megatron's real ones, aliases included.

The parser is the pinned megatron-core wheel's, unpacked beside the venv by
scripts/install-python-deps.sh, run in a subprocess (tests/unit/megatron_parser.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvrx_appliance.entrypoints import env
from nvrx_appliance.entrypoints.node import Node
from nvrx_appliance.image.pins import load
from nvrx_appliance.manifest import Manifest, build
from nvrx_appliance.settings import workload_args
from nvrx_appliance.settings.chain import ChainSpec, check

HOPPER = 9  # the GPU architecture validate_args is told it runs on
MEGATRON = Path(sys.prefix) / f"megatron-core-{load().megatron_core_version}"
HELPER = Path(__file__).with_name("megatron_parser.py")

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


def megatron_manifest(**settings) -> Manifest:
    spec = ChainSpec(work_dir="/lustre/runs/run1", workload="megatron", **{**SHAPE, **settings})
    assert check(spec) == [], check(spec)
    return build(spec, created="2026-12-01T00:00:00Z", user="alice")


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
                   "tensor_model_parallel_size"],
    }  # fmt: skip


PRESETS = [
    ({"profile": "small", "mode": mode}, mode) for mode in ("train", "no-restart", "handoff")
] + [({"profile": "8b", "mode": mode, "tensor_parallel": 4}, mode) for mode in ("train", "handoff")]


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
        ),
    }  # fmt: skip
    names = list(manifests)
    answer = parse([case(manifests[n]) for n in names])
    return {
        "options": answer["options"],
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
    assert values["tensor_model_parallel_size"] == m.spec.tensor_parallel
    if name == "user-iters":
        assert (values["train_iters"], values["train_samples"]) == (100000, None)
    else:
        assert values["train_samples"] == 480_000_000


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
    "save", "load", "save_interval", "save_retain_interval", "enable_ft_package",
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size",
    "global_batch_size", "train_samples", "exit_duration_in_mins",
)  # fmt: skip


def test_every_spelling_of_an_owned_setting_is_refused_in_user_arguments(answers):
    options = answers["options"]
    for dest in OWNED_DESTS:
        for spelling in options[dest]:
            assert workload_args.owner_of(spelling), f"{spelling} ({dest}) is not owned"
    injector = [
        o for dest, opts in options.items() if dest.startswith("fault_injector") for o in opts
    ]
    assert injector and all(workload_args.owner_of(o) for o in injector)


def test_the_owned_and_path_flags_are_megatrons_own(answers):
    real = {option for spellings in answers["options"].values() for option in spellings}
    named = set(workload_args.OWNED_MEGATRON_FLAGS) | set(workload_args.MEGATRON_PATH_FLAGS)
    assert named <= real, sorted(named - real)
