"""Workloads run under ft_launcher: Megatron-LM's pretrain_gpt.py, the user's own script
(docs/workload-contract.md), and the built-in CPU trainer, which follows the same contract.

submit records each workload's program argv (what follows the interpreter) in run.json;
the entrypoint runs `python -u` and that argv on every node, so ft_launcher gets
--no-python.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from nvrx_appliance.entrypoints.workloads.common import interpreter

if TYPE_CHECKING:
    from nvrx_appliance.manifest import Manifest


def program_argv(manifest: Manifest) -> list[str]:
    """The argv after the interpreter, for the manifest's workload."""
    spec = manifest.spec
    if spec.workload == "script":
        return [spec.script, *spec.script_args]
    # Imported here, not at the top: `python -m ...workloads.cpu` imports this package
    # first, and a submodule imported by its package before it runs as __main__ makes
    # runpy warn and load it twice.
    if spec.workload == "cpu":
        from nvrx_appliance.entrypoints.workloads import cpu

        return cpu.program_argv(manifest)
    from nvrx_appliance.entrypoints.workloads import megatron

    return megatron.program_argv(manifest)


def workload_argv(program: Sequence[str], python: str | None = None) -> list[str]:
    """What ft_launcher starts on each rank: the interpreter, then the program argv."""
    return [*interpreter(python), *program]


def complete(manifest: Manifest) -> Manifest:
    """The manifest with its workload's program argv filled in, as submit writes it."""
    return dataclasses.replace(manifest, workload=tuple(program_argv(manifest)))
