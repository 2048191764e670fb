"""Which of Megatron's options name paths, and what each must be before a run starts. Pure.

Every option of the pinned Megatron's parser that takes a value and looks like a path
(its name or help speaks of a path, directory, file, checkpoint, ...) is classified
here, either with what submit checks for it or as not a path at all: the list is
derived from the parser by tests/unit/test_megatron_parser.py, which fails on an
option no table names, so a path option added to Megatron cannot slip past.

Kinds: "prefixes" a blend of optional weights and dataset prefixes (PREFIX.bin and
PREFIX.idx must exist); "file" and "dir" must exist; "checkpoint" a directory holding
a Megatron checkpoint (its tracker file); "tokenizer" a file or directory, or a
HuggingFace hub id; "output" is written by the job, so only its mount is checked.
The appliance's own (--save, --load) and refused ones (--yaml-cfg) are
workload_args.OWNED_MEGATRON_FLAGS and REFUSED_MEGATRON_FLAGS.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nvrx_appliance.layout import TRACKER_FILE
from nvrx_appliance.settings.workload_args import values_of

MEGATRON_PATH_FLAGS: dict[str, str] = {
    # data
    "--data-path": "prefixes",
    "--train-data-path": "prefixes",
    "--valid-data-path": "prefixes",
    "--test-data-path": "prefixes",
    "--data-args-path": "file",
    "--per-split-data-args-path": "file",
    "--per-dataset-sequences-path": "file",
    "--titles-data-path": "mounted",
    "--evidence-data-path": "mounted",
    "--data-cache-path": "output",
    "--object-storage-cache-path": "output",
    "--block-data-path": "mounted",
    "--embedding-path": "mounted",
    # tokenizer
    "--tokenizer-model": "tokenizer",
    "--tokenizer-metadata": "file",
    "--vocab-file": "file",
    "--merge-file": "file",
    # model and precision configuration files
    "--heterogeneous-layers-config-path": "file",
    "--te-precision-config-file": "file",
    "--tp-comm-overlap-cfg": "file",
    "--nccl-communicator-config-path": "file",
    "--dump-param-to-param-group-map": "file",
    "--langrl-env-config": "file",
    # checkpoints beside the chain's own
    "--pretrained-checkpoint": "checkpoint",
    "--ict-load": "dir",
    "--bert-load": "dir",
    "--logits-load-dir": "dir",
    "--non-persistent-global-ckpt-dir": "output",
    "--non-persistent-local-ckpt-dir": "output",
    "--ckpt-convert-save": "output",
    "--logits-save-dir": "output",
    # logs, traces and profiles
    "--tensorboard-dir": "output",
    "--wandb-save-dir": "output",
    "--config-logger-dir": "output",
    "--memory-snapshot-path": "output",
    "--flight-recorder-dump-path": "output",
    "--moe-routing-trace-path": "output",
    "--rl-profile-dir": "output",
    "--result-rejected-tracker-filename": "output",
}

# Options that look like paths to the parser walk but are not, and what they are.
NOT_PATHS: dict[str, str] = {
    "--fp8-quantizer-factory": "a Python import path",
    "--fp4-quantizer-factory": "a Python import path",
    "--offload-modules": "module names",
    "--dist-ckpt-format": "a deprecated format name",
    "--pipeline-model-parallel-layout": "a layer layout",
    "--fim-no-prefix": "a text prefix",
    "--fim-prefix-token": "a token",
    "--heterogeneous-layers-config-encoded-json": "inline JSON",
}

# Tokenizers that take a HuggingFace hub id for --tokenizer-model (AutoTokenizer's
# pretrained_model_name_or_path in megatron/core/tokenizers at the pin).
HUB_TOKENIZERS = ("HuggingFaceTokenizer",)
# org/name as the hub spells repository ids; a bare name (gpt2) is a hub id too.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


@dataclass(frozen=True)
class PathArg:
    flag: str
    path: str  # as the workload sees it (inside the container)
    kind: str  # "file", "dir", "checkpoint", "tokenizer", "prefix", "output" or "mounted"


def _is_weight(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def path_args(args: list[str]) -> list[PathArg]:
    """The paths in a user's Megatron arguments, with what must exist for each."""
    found: list[PathArg] = []
    for megatron_flag, kind in MEGATRON_PATH_FLAGS.items():
        for value in values_of(args, megatron_flag):
            if kind == "prefixes":
                if not _is_weight(value):
                    found.append(PathArg(megatron_flag, value, "prefix"))
            else:
                found.append(PathArg(megatron_flag, value, kind))
    return found


def hub_id(arg: PathArg, args: list[str]) -> bool:
    """A --tokenizer-model that names a HuggingFace hub repository, not a path: only for
    a tokenizer type that loads from the hub, and only in the hub's own spelling
    (org/name), which no relative path of more than two parts or with a dot start has."""
    types = values_of(args, "--tokenizer-type")
    return (
        arg.kind == "tokenizer"
        and bool(types)
        and types[-1] in HUB_TOKENIZERS
        and not arg.path.startswith(".")
        and bool(_HUB_ID.fullmatch(arg.path))
    )


def required_files(arg: PathArg) -> list[str]:
    """What must exist for a path argument to be usable (nothing for an output)."""
    if arg.kind == "prefix":
        return [arg.path + ".bin", arg.path + ".idx"]
    if arg.kind == "checkpoint":
        # Megatron reads a checkpoint directory through its tracker file.
        return [f"{arg.path.rstrip('/')}/{TRACKER_FILE}"]
    if arg.kind in ("file", "dir", "tokenizer"):
        return [arg.path]
    return []
