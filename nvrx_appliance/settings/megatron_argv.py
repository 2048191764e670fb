"""argv for Megatron-LM's pretrain_gpt.py: the appliance's own arguments, a preset, and
the user's. Pure.

The appliance always sets what the chain depends on (workload_args.OWNED_MEGATRON_FLAGS):
NVRx's section API (--enable-ft-package), checkpoints saved to and resumed from the work
directory's checkpoints/ (whose tracker NVRx and the chain read), the parallel and batch
shape the chain was validated for, and the demo modes' fault injector. A preset (the
reference deployment's `small` and `8b` profiles, on mock data with NullTokenizer) follows,
then the user's --megatron-args, last, so they override the preset. Profile `none` passes
only the user's. Megatron needs GPUs; here its own parser checks these argvs
(tests/unit/test_megatron_parser.py).
"""

from __future__ import annotations

from nvrx_appliance.layout import Layout
from nvrx_appliance.settings import workload_args
from nvrx_appliance.settings.chain import ChainSpec, Shape, effective_profile, train_samples
from nvrx_appliance.settings.policy import Policy

SCRIPT = "pretrain_gpt.py"

# The reference deployment's profiles. `small` reaches a step and a checkpoint on a couple of GPUs,
# which is all a restart demo needs; `8b` is an 8B dense model (about 2 GB200 nodes).
PROFILES: dict[str, list[str]] = {
    "small": [
        "--num-layers", "8",
        "--hidden-size", "1024",
        "--ffn-hidden-size", "4096",
        "--num-attention-heads", "16",
        "--swiglu",
        "--init-method-std", "0.02",
        "--seq-length", "1024",
        "--max-position-embeddings", "1024",
    ],
    "8b": [
        "--num-layers", "32",
        "--hidden-size", "4096",
        "--ffn-hidden-size", "21504",
        "--num-attention-heads", "32",
        "--group-query-attention",
        "--num-query-groups", "8",
        "--kv-channels", "128",
        "--squared-relu",
        "--init-method-std", "0.014",
        "--rotary-base", "1000000",
        "--seq-length", "8192",
        "--max-position-embeddings", "8192",
        "--recompute-granularity", "selective",
    ],
}  # fmt: skip

_DATA = [
    "--mock-data",
    "--tokenizer-type", "NullTokenizer",
    "--vocab-size", "131072",
    "--no-create-attention-mask-in-dataloader",
    "--num-workers", "1",
]  # fmt: skip

_ARCHITECTURE = [
    "--use-mcore-models",
    "--untie-embeddings-and-output-weights",
    "--disable-bias-linear",
    "--position-embedding-type", "rope",
    "--rotary-percent", "1.0",
    "--normalization", "RMSNorm",
    "--attention-dropout", "0.0",
    "--hidden-dropout", "0.0",
]  # fmt: skip

_OPTIMIZER = [
    "--lr-decay-samples", "1038336",
    "--lr-warmup-samples", "10240",
    "--lr", "6e-4",
    "--min-lr", "6e-6",
    "--lr-decay-style", "cosine",
    "--weight-decay", "0.1",
    "--clip-grad", "1.0",
    "--adam-beta1", "0.9",
    "--adam-beta2", "0.95",
    "--bf16",
    "--use-distributed-optimizer",
    "--overlap-grad-reduce",
    "--overlap-param-gather",
    "--manual-gc",
]  # fmt: skip

_LOGGING = [
    "--distributed-timeout-minutes", "10",
    "--eval-iters", "14",
    "--eval-interval", "2000",
    "--log-interval", "20",
    "--log-progress",
    "--log-throughput",
    "--timing-log-option", "minmax",
]  # fmt: skip

# Asynchronous, fully parallel torch_dist checkpoints: the save that NVRx's progress
# tracker watches through latest_checkpointed_iteration.txt.
_CHECKPOINT_FORMAT = [
    "--ckpt-format", "torch_dist",
    "--ckpt-fully-parallel-save",
    "--ckpt-fully-parallel-load",
    "--ckpt-assume-constant-structure",
    "--async-save",
    "--use-persistent-ckpt-worker",
]  # fmt: skip


# The reference deployment's --save-retain-interval. Megatron deletes every checkpoint but the newest
# unless its iteration is a multiple of this, and asserts it is a multiple of the save
# interval; it has no "keep the newest N", so any retention > 0 means: the newest, plus
# one about every 10000 iterations. Retention 0 keeps everything.
RETAIN_EVERY = 10_000


def retention_args(save_interval: int, retention: int) -> list[str]:
    if not retention:
        return []
    every = -(-RETAIN_EVERY // save_interval) * save_interval
    return ["--save-retain-interval", str(every)]


def fault_args(spec: ChainSpec, policy: Policy) -> list[str]:
    if not policy.faults_active:
        return []
    kinds = [k for k in spec.fault_types.split(",") if k]
    return [
        "--fault-injector-ranks", spec.fault_ranks,
        "--fault-injector-fault-delay", str(spec.fault_delay),
        "--fault-injector-fault-types", ",".join(workload_args.MEGATRON_FAULT_TYPES[k] for k in kinds),
    ]  # fmt: skip


def preset_args(profile: str) -> list[str]:
    """A demo preset: the reference deployment's model on mock data (none: nothing)."""
    if profile == "none":
        return []
    return [
        *_DATA, *PROFILES[profile], *_ARCHITECTURE, *_OPTIMIZER, *_LOGGING, *_CHECKPOINT_FORMAT,
    ]  # fmt: skip


def length_args(spec: ChainSpec) -> list[str]:
    """--train-samples, unless the user measures the run in iterations themselves."""
    if "--train-iters" in workload_args.flags_in(spec.megatron_args):
        return []
    return ["--train-samples", str(train_samples(spec))]


def program_argv(spec: ChainSpec, shape: Shape, policy: Policy, layout: Layout) -> list[str]:
    checkpoints = str(layout.checkpoints)
    exit_duration = (
        ["--exit-duration-in-mins", str(spec.exit_duration_min)] if spec.exit_duration_min else []
    )
    return [
        f"{spec.megatron_path.rstrip('/')}/{SCRIPT}",
        # Makes Megatron open and close NVRx's setup/step/checkpointing sections, so
        # ft_launcher's section timeouts bound them.
        "--enable-ft-package",
        *preset_args(effective_profile(spec)),
        "--tensor-model-parallel-size", str(spec.tensor_parallel),
        "--pipeline-model-parallel-size", str(spec.pipeline_parallel),
        "--micro-batch-size", str(spec.micro_batch),
        "--global-batch-size", str(shape.global_batch),
        *length_args(spec),
        *exit_duration,
        "--load", checkpoints,
        "--save", checkpoints,
        "--save-interval", str(spec.save_interval),
        *retention_args(spec.save_interval, spec.save_retention),
        *fault_args(spec, policy),
        *spec.megatron_args,
    ]  # fmt: skip
