"""The parallel shape of a run, computed as the pinned Megatron computes it. Pure.

Megatron splits the world of ranks into model-parallel groups of TP x PP x CP (x the
tensor weight shards, 1 unless --tensor-parallel-num-weight-shards says otherwise) and
replicates them data-parallel: DP = world / (TP x PP x CP). Its experts are laid out
over the same world as ETP x EP x PP (ETP is TP unless set), which must divide it too.
A step is global batch / (micro batch x DP) microbatches; with virtual pipeline stages
the interleaved schedule takes them in groups of PP (or
--microbatch-group-size-per-virtual-pipeline-stage), so their count must allow it.
(megatron/training/arguments.py validate_args, megatron/core/parallel_state.py
initialize_model_parallel, megatron/core/num_microbatches_calculator.py and the
interleaved schedule at the pin; tests/unit/test_megatron_parser.py holds every derived
data-parallel size to Megatron's own.)

Each size can be a chain setting (0: unset) or stated in the user's --megatron-args, as
teams' argument files do; both at once must agree. The appliance passes TP, PP and the
batch sizes on every command line; CP, EP, ETP and the virtual pipeline only when they
are settings (what a user's file says stays in the file, once).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nvrx_appliance.settings.workload_args import flags_in, values_of

# A chain setting and the Megatron flag that states the same size in a user's arguments.
SIZE_FLAGS: dict[str, str] = {
    "tensor_parallel": "--tensor-model-parallel-size",
    "pipeline_parallel": "--pipeline-model-parallel-size",
    "context_parallel": "--context-parallel-size",
    "expert_parallel": "--expert-model-parallel-size",
    "expert_tensor_parallel": "--expert-tensor-parallel-size",
    "micro_batch": "--micro-batch-size",
    "global_batch": "--global-batch-size",
}
# Sizes with no setting: rare enough to live in the user's arguments only.
TENSOR_SHARDS = "--tensor-parallel-num-weight-shards"
EXPERT_TENSOR_SHARDS = "--expert-tensor-parallel-num-weight-shards"
MICROBATCH_GROUP = "--microbatch-group-size-per-virtual-pipeline-stage"
# Evaluation's batch (default: training's), which validate_args divides by DP too.
EVAL_GLOBAL_BATCH = "--eval-global-batch-size"
EVAL_MICRO_BATCH = "--eval-micro-batch-size"
# The three ways a user's arguments give virtual pipeline stages (Megatron takes one).
VIRTUAL_STAGES = "--num-virtual-stages-per-pipeline-rank"
LAYERS_PER_VIRTUAL_STAGE = "--num-layers-per-virtual-pipeline-stage"
LAYOUT = "--pipeline-model-parallel-layout"
VIRTUAL_FLAGS = (VIRTUAL_STAGES, LAYERS_PER_VIRTUAL_STAGE, LAYOUT)
# With these Megatron sets or rounds the global batch itself (a schedule cannot be given
# with --global-batch-size, so the appliance then passes none).
BATCH_SCHEDULE = "--step-batch-size-schedule"
BATCH_RAMPS = (BATCH_SCHEDULE, "--decrease-batch-size-if-needed")


@dataclass(frozen=True)
class Parallel:
    """The sizes one run trains with (0 for global_batch: micro batch x DP)."""

    tensor: int = 1
    pipeline: int = 1
    context: int = 1
    expert: int = 1
    expert_tensor: int = 0  # 0: the tensor-parallel size, as in Megatron
    virtual_pipeline: int = 0  # stages per pipeline rank; 0: no interleaving
    tensor_shards: int = 0  # --tensor-parallel-num-weight-shards; 0: TP
    expert_tensor_shards: int = 0  # --expert-tensor-parallel-num-weight-shards; 0: ETP
    micro_batch: int = 1
    global_batch: int = 0
    microbatch_group: int = 0  # 0: PP
    batch_ramp: bool = False  # Megatron adjusts the global batch itself
    eval_global_batch: int = 0  # 0: the global batch
    eval_micro_batch: int = 0  # 0: the micro batch

    @property
    def expert_tensor_size(self) -> int:
        return self.expert_tensor or self.tensor

    @property
    def model_size(self) -> int:
        """Ranks of one model replica (Megatron's total_model_size)."""
        remat = (self.tensor_shards or self.tensor) // self.tensor
        return self.tensor * self.pipeline * self.context * max(remat, 1)

    @property
    def expert_model_size(self) -> int:
        """Ranks of one expert replica (ETP x EP x PP, x the expert weight shards)."""
        etp = self.expert_tensor_size
        remat = (self.expert_tensor_shards or etp) // etp
        return etp * self.expert * self.pipeline * max(remat, 1)

    def data_parallel(self, world: int) -> int:
        """Megatron's data_parallel_size: the replicas of the model."""
        return world // self.model_size

    def batch_parallel(self, world: int) -> int:
        """What a step's batch is split over: the replicas times the weight shards beyond
        TP (Megatron's microbatch calculator is given data_parallel_size x those)."""
        return world // (self.tensor * self.pipeline * self.context)

    def global_batch_for(self, world: int) -> int:
        """The global batch: as stated, else Megatron's default, micro batch x DP."""
        return self.global_batch or self.micro_batch * max(self.data_parallel(world), 1)


@dataclass(frozen=True)
class Conflict:
    """A size stated twice, differently, or stated as something that is not a count."""

    setting: str  # the ChainSpec field to name (megatron_args for a bad value there)
    message: str


def _last_count(args: Sequence[str], flag: str) -> tuple[int | None, str | None]:
    """The last value the user's arguments give a flag (argparse keeps the last), as a
    count; (None, None) when absent, (None, text) when it is not a positive integer."""
    values = values_of(list(args), flag)
    if not values:
        return None, None
    text = values[-1]
    return (int(text), None) if text.isdigit() and int(text) > 0 else (None, text)


def layout_stages(layout: str) -> int:
    """Stages in a --pipeline-model-parallel-layout string (PP x virtual stages), with
    Megatron's own unrolling of "(...)*n" and "x*n"."""
    text = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text)
    return text.count("|") + 1


def _virtual_from_args(args: Sequence[str], pipeline: int) -> int:
    """Virtual stages per pipeline rank as the user's arguments give them (0: none, or
    not computable here, which Megatron's own validation then judges)."""
    stages, _ = _last_count(args, VIRTUAL_STAGES)
    if stages:
        return stages
    layout = values_of(list(args), LAYOUT)
    if layout:
        return layout_stages(layout[-1]) // pipeline
    per_stage, _ = _last_count(args, LAYERS_PER_VIRTUAL_STAGE)
    layers, _ = _last_count(args, "--num-layers")
    if not (per_stage and layers):
        return 0
    present = set(flags_in(list(args)))
    layers += ("--account-for-embedding-in-pipeline-split" in present) + (
        "--account-for-loss-in-pipeline-split" in present
    )
    if layers % pipeline or (layers // pipeline) % per_stage:
        return 0  # Megatron's validate_args refuses it, in its own words
    return layers // pipeline // per_stage


def stated(
    settings: Mapping[str, int], args: Sequence[str], virtual_setting: int = 0
) -> tuple[Parallel, list[Conflict]]:
    """The sizes from the chain's settings (0: unset) and the user's arguments, and every
    conflict between the two. A conflicting size takes the setting's value."""
    conflicts: list[Conflict] = []
    sizes: dict[str, int] = {}
    for setting, flag in SIZE_FLAGS.items():
        mine = settings.get(setting, 0)
        theirs, bad = _last_count(args, flag)
        if bad is not None:
            conflicts.append(
                Conflict("megatron_args", f"{flag} {bad} is not a count; use a whole number")
            )
        elif mine and theirs and mine != theirs:
            conflicts.append(
                Conflict(
                    setting,
                    f"{mine} conflicts with {flag} {theirs} in your --megatron-args; state it "
                    "in one place (drop the setting or the line)",
                )
            )
        sizes[setting] = mine or theirs or 0
    pipeline = sizes["pipeline_parallel"] or 1
    theirs_virtual = _virtual_from_args(args, pipeline)
    present = [f for f in VIRTUAL_FLAGS if f in flags_in(list(args))]
    if virtual_setting and present and theirs_virtual != virtual_setting:
        conflicts.append(
            Conflict(
                "virtual_pipeline",
                f"{virtual_setting} conflicts with {present[0]} in your --megatron-args; "
                "state the virtual pipeline in one place",
            )
        )
    parallel = Parallel(
        tensor=sizes["tensor_parallel"] or 1,
        pipeline=pipeline,
        context=sizes["context_parallel"] or 1,
        expert=sizes["expert_parallel"] or 1,
        expert_tensor=sizes["expert_tensor_parallel"],
        virtual_pipeline=_interleaved(virtual_setting or theirs_virtual),
        tensor_shards=_last_count(args, TENSOR_SHARDS)[0] or 0,
        expert_tensor_shards=_last_count(args, EXPERT_TENSOR_SHARDS)[0] or 0,
        micro_batch=sizes["micro_batch"] or 1,
        global_batch=sizes["global_batch"],
        microbatch_group=_last_count(args, MICROBATCH_GROUP)[0] or 0,
        batch_ramp=any(f in flags_in(list(args)) for f in BATCH_RAMPS),
        eval_global_batch=_last_count(args, EVAL_GLOBAL_BATCH)[0] or 0,
        eval_micro_batch=_last_count(args, EVAL_MICRO_BATCH)[0] or 0,
    )
    return parallel, conflicts


def _interleaved(stages: int) -> int:
    # Megatron treats one virtual stage per rank as no interleaving at all.
    return stages if stages > 1 else 0


def _sizes(p: Parallel) -> str:
    parts = [f"TP {p.tensor}", f"PP {p.pipeline}", f"CP {p.context}"]
    if p.model_size != p.tensor * p.pipeline * p.context:
        parts.append(f"weight shards {p.model_size // (p.tensor * p.pipeline * p.context)}")
    return " x ".join(parts)


def problems(p: Parallel, world: int) -> list[tuple[str, str]]:
    """(setting, message) for every way this shape cannot train on `world` ranks, in the
    order Megatron would find them."""
    found: list[tuple[str, str]] = []
    if world % p.model_size:
        found.append(
            (
                "train_tasks",
                f"a world of {world} ranks is not divisible by {_sizes(p)} = {p.model_size} "
                "(Megatron stops every rank at start); train on a multiple of "
                f"{p.model_size} ranks, or change the parallel sizes",
            )
        )
        return found  # the rest divides by the data-parallel size
    if world % p.expert_model_size:
        found.append(
            (
                "expert_parallel",
                f"ETP {p.expert_tensor_size} x EP {p.expert} x PP {p.pipeline} = "
                f"{p.expert_model_size} does not divide the world of {world} ranks "
                "(Megatron's initialize_model_parallel refuses it); pick sizes whose product "
                "divides it",
            )
        )
    dp = p.batch_parallel(world)
    step = p.micro_batch * dp
    if p.batch_ramp:
        return found
    gbs = p.global_batch_for(world)
    if gbs % step:
        found.append(
            (
                "global_batch",
                f"{gbs} is not divisible by micro batch x data-parallel size = "
                f"{p.micro_batch} x {dp} (DP = {world} ranks / {_sizes(p)}); use a multiple "
                f"of {step}",
            )
        )
        return found
    found += _interleaving(p, gbs // step, step)
    return found + _evaluation(p, world, gbs)


def _evaluation(p: Parallel, world: int, gbs: int) -> list[tuple[str, str]]:
    """validate_args divides evaluation's batch by the replicas too."""
    eval_gbs = p.eval_global_batch or gbs
    eval_mbs = p.eval_micro_batch or p.micro_batch
    dp = p.data_parallel(world)
    if not (p.eval_global_batch or p.eval_micro_batch) or not eval_gbs % (eval_mbs * dp):
        return []
    return [
        (
            "megatron_args",
            f"{EVAL_GLOBAL_BATCH} {eval_gbs} is not divisible by {EVAL_MICRO_BATCH} x "
            f"data-parallel size = {eval_mbs} x {dp}; use a multiple of {eval_mbs * dp}",
        )
    ]


def _interleaving(p: Parallel, microbatches: int, step: int) -> list[tuple[str, str]]:
    """Megatron's interleaved schedule takes microbatches in groups of G (PP by
    default): PP <= G <= M, and what is left over must be none or at least PP."""
    if not p.virtual_pipeline:
        return []
    if p.pipeline < 2:
        return [
            (
                "virtual_pipeline",
                f"{p.virtual_pipeline} virtual stages need pipeline parallelism (PP 2 or "
                "more, as Megatron's interleaved schedule does); raise the pipeline-parallel "
                "size or drop the virtual stages",
            )
        ]
    group = p.microbatch_group or p.pipeline
    left = microbatches % group
    if p.pipeline <= group <= microbatches and not 0 < left < p.pipeline:
        return []
    return [
        (
            "global_batch",
            f"{microbatches} microbatches per step do not fit {p.virtual_pipeline} virtual "
            f"pipeline stages in groups of {group} (Megatron's interleaved schedule needs "
            f"a multiple of {group}, at least {group}); use a global batch that is a "
            f"multiple of {step * group}",
        )
    ]
