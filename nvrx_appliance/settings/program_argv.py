"""The program argv each workload is given (what follows the interpreter), computed once
at submit, when manifest.build makes the run manifest, and written to run.json; the
entrypoint runs it verbatim on every node.

Megatron-LM's pretrain_gpt.py gets settings/megatron/argv.py's; the user's script its own path
and --script-args; the built-in cpu trainer (workloads/cpu.py) the argv
below. Pure: no I/O.
"""

from __future__ import annotations

from nvrx_appliance.layout import Layout
from nvrx_appliance.settings.chain import ChainSpec, Shape, train_samples
from nvrx_appliance.settings.megatron import argv as megatron_argv
from nvrx_appliance.settings.policy import Policy

CPU_MODULE = "nvrx_appliance.workloads.cpu"
# The spec's faults hit only the first cycle of a generation, so the cycle after the
# in-job restart trains on and reaches the next checkpoint.
CPU_FAULT_CYCLES = 1
# A step event and log line every 10 iterations (a fraction of a second on two CPU
# cores) shows progress without growing the progress log by megabytes an hour.
CPU_LOG_INTERVAL = 10


def cpu_program_argv(spec: ChainSpec, shape: Shape, policy: Policy, layout: Layout) -> list[str]:
    argv = [
        "-m", CPU_MODULE,
        "--save", str(layout.checkpoints),
        "--load", str(layout.checkpoints),
        "--save-interval", str(spec.save_interval),
        "--save-retention", str(spec.save_retention),
        "--micro-batch-size", str(shape.micro_batch),
        "--global-batch-size", str(shape.global_batch),
        "--train-samples", str(train_samples(spec)),
        "--progress-log", str(layout.progress_log),
        "--log-interval", str(CPU_LOG_INTERVAL),
    ]  # fmt: skip
    if spec.cpu_step_pause:
        argv += ["--step-pause", str(spec.cpu_step_pause)]
    if policy.faults_active:
        argv += [
            "--fault-injector-ranks", spec.fault_ranks,
            "--fault-injector-fault-types", spec.fault_types,
            "--fault-injector-fault-delay", str(spec.fault_delay),
            "--fault-injector-cycles", str(CPU_FAULT_CYCLES),
        ]  # fmt: skip
    return argv


def program_argv(spec: ChainSpec, shape: Shape, policy: Policy, layout: Layout) -> list[str]:
    """The argv after the interpreter, for the spec's workload."""
    if spec.workload == "script":
        return [spec.script, *spec.script_args]
    if spec.workload == "cpu":
        return cpu_program_argv(spec, shape, policy, layout)
    return megatron_argv.program_argv(spec, shape, policy, layout)
