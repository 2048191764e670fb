"""What every workload reads the same way from the run manifest: length, interpreter.

Pure: no I/O. The argv builders use these so the cpu trainer and Megatron agree.
"""

from __future__ import annotations

import sys

from nvrx_appliance.settings.chain import ChainSpec

# The seeds' --train-samples: far more than one generation can train, so a generation
# ends by its time limit, the exit duration or a fault, never by running out of samples.
DEFAULT_TRAIN_SAMPLES = 10_485_760


def train_samples(spec: ChainSpec) -> int:
    return spec.train_samples or DEFAULT_TRAIN_SAMPLES


def interpreter(python: str | None) -> list[str]:
    # The workload runs under the interpreter that runs the entrypoint (the image's, or
    # the spec's python on bare metal), unbuffered so its log lines reach the per-cycle
    # log as they happen. ft_launcher then needs --no-python.
    return [python or sys.executable, "-u"]
