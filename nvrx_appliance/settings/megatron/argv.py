"""argv for Megatron-LM's pretrain_gpt.py: the appliance's own arguments, a preset, and
the user's. Pure.

The appliance always sets what the chain depends on (workload_args.OWNED_MEGATRON_FLAGS):
NVRx's section API (--enable-ft-package), checkpoints saved to and resumed from the work
directory's checkpoints/ (whose tracker NVRx and the chain read), asynchronously through
NVRx unless --no-async-save, the parallel and batch shape the chain was validated for
(parallel.py), and the demo modes' fault injector. A preset (the reference
deployment's `small` and `8b` profiles, on mock data with NullTokenizer) comes first, then the
user's --megatron-args, last, so they override the preset. Profile `none` passes only
the user's. Retention is not Megatron's: task 0's entrypoint keeps the newest
--save-retention checkpoints (checkpoints/retention.py). Megatron needs GPUs; here its
own parser checks these argvs (tests/unit/test_megatron_parser.py)."""

from __future__ import annotations

from nvrx_appliance.layout import Layout
from nvrx_appliance.settings import generation_end, workload_args
from nvrx_appliance.settings.chain import ChainSpec, Shape, effective_profile, train_samples
from nvrx_appliance.settings.megatron import parallel
from nvrx_appliance.settings.megatron import rules as megatron_rules
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
    "--untie-embeddings-and-output-weights",
    "--disable-bias-linear",
    "--position-embedding-type", "rope",
    "--rotary-percent", "1.0",
    "--normalization", "RMSNorm",
    "--attention-dropout", "0.0",
    "--hidden-dropout", "0.0",
]  # fmt: skip

# Flag and value pairs; the schedule's two sample-based lengths may give way.
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
]  # fmt: skip

_OPTIMIZER_SWITCHES = [
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

# The presets' checkpoint loading: parallel across data-parallel ranks, and a save plan
# reused from one checkpoint to the next (the model's structure never changes in a run).
_CHECKPOINT_SPEED = [
    "--ckpt-fully-parallel-load",
    "--ckpt-assume-constant-structure",
]  # fmt: skip

# Every Megatron run's checkpoints, unless --no-async-save: torch_dist saved in the
# background by a persistent worker, through NVRx (the strategy Megatron takes for
# --async-save at the pin), so a step does not wait for the file system. The tracker
# NVRx's progress tracker and the chain read moves only once a save is complete.
# (Megatron's --ckpt-fully-parallel-save and --use-mcore-models are deprecated no-ops
# at the pin, so they are not passed.)
ASYNC_SAVE = [
    "--ckpt-format", "torch_dist",
    "--async-save",
    "--use-persistent-ckpt-worker",
]  # fmt: skip


def async_save_args(spec: ChainSpec) -> list[str]:
    return list(ASYNC_SAVE) if spec.async_save else []


def fault_args(spec: ChainSpec, policy: Policy) -> list[str]:
    if not policy.faults_active:
        return []
    kinds = [k for k in spec.fault_types.split(",") if k]
    return [
        "--fault-injector-ranks", spec.fault_ranks,
        "--fault-injector-fault-delay", str(spec.fault_delay),
        "--fault-injector-fault-types", ",".join(workload_args.MEGATRON_FAULT_TYPES[k] for k in kinds),
    ]  # fmt: skip


def preset_args(profile: str, user_args: list[str]) -> list[str]:
    """A demo preset: the reference deployment's model on mock data (none: nothing). Its
    learning-rate schedule is in samples; it gives way where the user's arguments state
    their own or measure the run in iterations, since Megatron refuses a mix of the two
    units."""
    if profile == "none":
        return []
    dropped = megatron_rules.preset_schedule_gives_way(user_args)
    optimizer = [
        word
        for flag, value in zip(_OPTIMIZER[::2], _OPTIMIZER[1::2], strict=True)
        if flag not in dropped
        for word in (flag, value)
    ]
    return [*_DATA, *PROFILES[profile], *_ARCHITECTURE, *optimizer, *_OPTIMIZER_SWITCHES,
            *_LOGGING, *_CHECKPOINT_SPEED]  # fmt: skip


def shape_args(spec: ChainSpec, shape: Shape) -> list[str]:
    """The parallel and batch sizes the chain was validated for (parallel.py):
    TP, PP and the batch always; CP, EP, ETP and virtual stages when they are settings
    (a user's arguments that state them keep their own line, which agrees)."""
    optional = [
        ("--context-parallel-size", spec.context_parallel),
        ("--expert-model-parallel-size", spec.expert_parallel),
        ("--expert-tensor-parallel-size", spec.expert_tensor_parallel),
        ("--num-virtual-stages-per-pipeline-rank", spec.virtual_pipeline),
    ]
    # Megatron takes a batch schedule or a global batch, never both.
    scheduled = parallel.BATCH_SCHEDULE in workload_args.flags_in(spec.megatron_args)
    global_batch = [] if scheduled else ["--global-batch-size", str(shape.global_batch)]
    return [
        "--tensor-model-parallel-size", str(shape.tensor_parallel),
        "--pipeline-model-parallel-size", str(shape.pipeline_parallel),
        *(word for flag, size in optional if size for word in (flag, str(size))),
        "--micro-batch-size", str(shape.micro_batch),
        *global_batch,
    ]  # fmt: skip


def length_args(spec: ChainSpec) -> list[str]:
    """--train-samples, unless the user measures the run in iterations themselves."""
    if megatron_rules.in_iterations(spec.megatron_args):
        return []
    return ["--train-samples", str(train_samples(spec))]


def program_argv(spec: ChainSpec, shape: Shape, policy: Policy, layout: Layout) -> list[str]:
    checkpoints = str(layout.checkpoints)
    return [
        f"{spec.megatron_path.rstrip('/')}/{SCRIPT}",
        # Makes Megatron open and close NVRx's setup/step/checkpointing sections, so
        # ft_launcher's section timeouts bound them.
        "--enable-ft-package",
        *preset_args(effective_profile(spec), spec.megatron_args),
        *shape_args(spec, shape),
        *length_args(spec),
        # Save and exit 0 on the save signal, which the entrypoint sends each worker at the
        # time-limit notice (settings/generation_end.py); the exit duration arrives the same way.
        "--exit-signal-handler", "--exit-signal", generation_end.SAVE_SIGNAL.name,
        "--load", checkpoints,
        "--save", checkpoints,
        "--save-interval", str(spec.save_interval),
        *async_save_args(spec),
        *fault_args(spec, policy),
        *spec.megatron_args,
    ]  # fmt: skip
