"""What every workload reads the same way from the run manifest: mode semantics, length.

Pure: no I/O. Both argv builders use these so the cpu trainer and Megatron agree on
what a mode means.
"""

from __future__ import annotations

import sys

from nvrx_appliance.chain import ChainSpec

# The seeds' --train-samples: far more than one generation can train, so a generation
# ends by its time limit, the exit duration or a fault, never by running out of samples.
DEFAULT_TRAIN_SAMPLES = 10_485_760


def fault_active(spec: ChainSpec) -> bool:
    """`train` never injects; `no-restart` and `handoff` inject when the spec asks."""
    return spec.mode != "train" and spec.fault_inject


def train_samples(spec: ChainSpec) -> int:
    return spec.train_samples or DEFAULT_TRAIN_SAMPLES


def interpreter(python: str | None) -> list[str]:
    # The workload runs under the interpreter that runs the entrypoint (the image's, or
    # the spec's python on bare metal), unbuffered so its log lines reach the per-cycle
    # log as they happen. ft_launcher then needs --no-python.
    return [python or sys.executable, "-u"]
