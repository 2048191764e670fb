"""Workloads run under ft_launcher: Megatron-LM's pretrain_gpt.py, the user's own script
(docs/workload-contract.md), and the built-in CPU trainer, which follows the same contract.

submit records each workload's program argv (settings/program_argv.py) in run.json; the
entrypoint runs `python -u` and that argv on every node, so ft_launcher gets --no-python.
"""

from __future__ import annotations

from collections.abc import Sequence

from nvrx_appliance.workloads.common import interpreter


def workload_argv(program: Sequence[str], python: str | None = None) -> list[str]:
    """What ft_launcher starts on each rank: the interpreter, then the program argv."""
    return [*interpreter(python), *program]
