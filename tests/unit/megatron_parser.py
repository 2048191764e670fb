"""Runs the pinned Megatron's own argument parser and validate_args on argvs (a helper
that tests/unit/test_megatron_parser.py starts in a subprocess; no tests here).

    python tests/unit/megatron_parser.py < request.json

The request names the unpacked megatron-core wheel and the cases; the answer on stdout
is JSON. Megatron 0.19 wants Python 3.12; to import its parser on this machine's 3.11
two small shims are installed, both for imports the parser never uses: typing.override
(new in 3.12, used as a no-op decorator) and the one MoE kernel module that imports
triton at load time, which stands in as an empty module. validate_args asks the GPU's
architecture (get_device_arch_version when tensor parallelism is on, and
torch.cuda.get_device_capability for MoE's grouped GEMM); both are stand-ins answering
what each case states (9: Hopper), since this machine has no GPU. Each case also
states the environment the entrypoint gives the workload (CUDA_DEVICE_MAX_CONNECTIONS
and so on).

The answer also lists the options that look like paths (path_like): every option that
takes a value that is not a number or a choice, and whose name or help speaks of a
path, a directory, a file, a checkpoint or a configuration, so that the test can hold
the appliance's classification of path options to the pinned parser.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import io
import json
import os
import re
import sys
import types
import typing

# Modules replaced by empty ones: they import GPU-only packages when loaded.
EMPTY_MODULES = ("megatron.core.transformer.moe.ops.paged_stash",)


class _Anything:
    """What an empty module's attributes are: callable, subscriptable, a decorator."""

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return _Anything()

    def __getattr__(self, name):
        return _Anything()

    def __getitem__(self, key):
        return _Anything()


class _EmptyModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


class _EmptyModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name in EMPTY_MODULES:
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec):
        return _EmptyModule(spec.name)

    def exec_module(self, module):
        pass


def install_shims() -> None:
    if not hasattr(typing, "override"):
        typing.override = lambda function: function
    sys.meta_path.insert(0, _EmptyModules())


def run_case(arguments, case: dict) -> dict:
    import torch

    os.environ.update(case.get("env", {}))
    os.environ["WORLD_SIZE"] = str(case["world_size"])
    os.environ["RANK"] = "0"
    arguments.get_device_arch_version = lambda: case["gpu_arch"]
    torch.cuda.get_device_capability = lambda device=None: (case["gpu_arch"], 0)
    sys.argv = ["pretrain_gpt.py", *case["argv"]]
    noise = io.StringIO()
    try:
        with contextlib.redirect_stdout(noise), contextlib.redirect_stderr(noise):
            args = arguments.parse_args()
            # pretrain_gpt.py's own defaults for parse_and_validate_args.
            arguments.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
            microbatches = count_microbatches(args)
    except SystemExit:
        return {"ok": False, "error": noise.getvalue().strip().splitlines()[-1:]}
    except Exception as exc:  # what validate_args asserts or raises is the answer
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    values = {name: getattr(args, name, None) for name in case.get("report", [])}
    return {"ok": True, "values": {**values, "num_microbatches": microbatches}}


def count_microbatches(args) -> int:
    """What Megatron's initialization makes of the batch (megatron/training/global_vars.py
    at the pin): the calculator asserts that the global batch divides into microbatches."""
    from megatron.core import num_microbatches_calculator as calculator

    calculator.init_num_microbatches_calculator(
        rank=0,
        global_batch_size=args.global_batch_size,
        micro_batch_size=args.micro_batch_size,
        data_parallel_size=args.data_parallel_size * args.gtp_weight_remat_size,
        decrease_batch_size_if_needed=args.decrease_batch_size_if_needed,
        step_batch_size_schedule=args.step_batch_size_schedule,
        seq_length=args.seq_length,
    )
    try:
        return calculator.get_num_microbatches()
    finally:
        calculator.destroy_num_microbatches_calculator()


def option_table(arguments) -> dict[str, list[str]]:
    """dest -> option strings, of every Megatron option."""
    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    table: dict[str, list[str]] = {}
    for action in parser._actions:
        table.setdefault(action.dest, []).extend(action.option_strings)
    return table


# What makes an option look like a path: words in its name, or in its help.
PATH_NAME = re.compile(
    r"path|dir|file|load|save|ckpt|checkpoint|cfg|config|model|vocab|merge|metadata|yaml|"
    r"json|trace|dump|cache|output|prefix"
)
PATH_HELP = re.compile(r"\b(path|paths|directory|dir|file|files|folder)\b", re.IGNORECASE)


def path_like(arguments) -> list[str]:
    """Every option that takes a free-form value and looks like a path."""
    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    found = []
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0 or action.choices:
            continue
        if action.type in (int, float):
            continue
        names = " ".join(action.option_strings)
        if PATH_NAME.search(names) or PATH_HELP.search(action.help or ""):
            found.extend(action.option_strings)
    return found


def main() -> int:
    request = json.load(sys.stdin)
    sys.path.insert(0, request["megatron"])
    install_shims()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from megatron.training import arguments
    answer = {
        "options": option_table(arguments),
        "path_like": path_like(arguments),
        "cases": [run_case(arguments, case) for case in request["cases"]],
    }
    print(json.dumps(answer, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
