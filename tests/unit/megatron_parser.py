"""Runs the pinned Megatron's own argument parser and validate_args on argvs (a helper
that tests/unit/test_megatron_parser.py starts in a subprocess; no tests here).

    python tests/unit/megatron_parser.py < request.json

The request names the unpacked megatron-core wheel and the cases; the answer on stdout
is JSON. Megatron 0.19 wants Python 3.12; to import its parser on this machine's 3.11
two small shims are installed, both for imports the parser never uses: typing.override
(new in 3.12, used as a no-op decorator) and the one MoE kernel module that imports
triton at load time, which stands in as an empty module. validate_args asks the GPU's
architecture when tensor parallelism is on; each case states it (9: Hopper), and the
environment the entrypoint gives the workload (CUDA_DEVICE_MAX_CONNECTIONS and so on).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import io
import json
import os
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
    os.environ.update(case.get("env", {}))
    os.environ["WORLD_SIZE"] = str(case["world_size"])
    os.environ["RANK"] = "0"
    arguments.get_device_arch_version = lambda: case["gpu_arch"]
    sys.argv = ["pretrain_gpt.py", *case["argv"]]
    noise = io.StringIO()
    try:
        with contextlib.redirect_stdout(noise), contextlib.redirect_stderr(noise):
            args = arguments.parse_args()
            # pretrain_gpt.py's own defaults for parse_and_validate_args.
            arguments.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
    except SystemExit:
        return {"ok": False, "error": noise.getvalue().strip().splitlines()[-1:]}
    except Exception as exc:  # what validate_args asserts or raises is the answer
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {
        "ok": True,
        "values": {name: getattr(args, name, None) for name in case.get("report", [])},
    }


def option_table(arguments) -> dict[str, list[str]]:
    """dest -> option strings, of every Megatron option."""
    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    table: dict[str, list[str]] = {}
    for action in parser._actions:
        table.setdefault(action.dest, []).extend(action.option_strings)
    return table


def main() -> int:
    request = json.load(sys.stdin)
    sys.path.insert(0, request["megatron"])
    install_shims()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from megatron.training import arguments
    answer = {
        "options": option_table(arguments),
        "cases": [run_case(arguments, case) for case in request["cases"]],
    }
    print(json.dumps(answer, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
