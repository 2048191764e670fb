"""The environment ft_launcher and the workload run in. Pure.

srun hands every node the submit host's environment, so variables that switch NVRx
behaviour on by mere presence (NVRX_GPUS_PER_NUMA, NVRX_INJECT_GPU_FAILURE) are removed
unless the manifest asks for them: the manifest is the one source of truth.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nvrx_appliance.manifest import Manifest
from nvrx_appliance.node.identity import Node
from nvrx_appliance.settings import generation_end

# Transformer Engine leaves SMs free for communication kernels (the reference deployment's value).
TE_SM_MARGIN = "16"
# torch elastic turns only these into a clean shutdown of the workers: it sends the same
# signal to every worker's process group and waits --term-timeout for them; any other
# signal kills ft_launcher outright and orphans its workers, which run in their own
# sessions. USR1/USR2 are added so the signals we forward end the workers through
# ft_launcher. Not the save signal (settings/generation_end.py): the supervisor sends it to the
# workers, and ft_launcher, left to its default for it, ignores a stray one rather than
# shut down past its exit barrier (time_limit.py).
LAUNCHER_SIGNALS = ",".join(["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"])


# PyTorch's NCCL flight recorder (torch_nccl_environment_variables; the names PyTorch
# 2.13's libtorch reads, and their older spellings NGC's 2.10 reads): entries kept per
# rank, a dump when the watchdog times out, and where (each rank appends its own rank).
FLIGHT_RECORDER_ENTRIES = "2000"
FLIGHT_RECORDER_PREFIX = "nccl_trace_rank_"


def flight_recorder(dump_prefix: str, inherited: Mapping[str, str]) -> dict[str, str]:
    """Ours, where the site set none of a setting's names: torch 2.13 reads the first of a
    setting's names that is set (FlightRecorder.hpp: `TORCH_FR_BUFFER_SIZE` before
    `TORCH_NCCL_TRACE_BUFFER_SIZE`), so ours under one name would override the site's
    under the other."""
    settings = (
        (("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"), FLIGHT_RECORDER_ENTRIES),
        (("TORCH_NCCL_DUMP_ON_TIMEOUT",), "1"),
        (("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"), dump_prefix),
    )
    return {
        name: value
        for names, value in settings
        if not any(inherited.get(n) for n in names)
        for name in names
    }


def contract(manifest: Manifest) -> dict[str, str]:
    """What every workload is told about where it runs (docs/workload-contract.md)."""
    spec, layout = manifest.spec, manifest.layout
    return {
        "NVRX_APPLIANCE_WORK_DIR": str(layout.work_dir),
        "NVRX_APPLIANCE_CHECKPOINT_DIR": str(layout.checkpoints),
        "NVRX_APPLIANCE_TRACKER": str(layout.tracker),
        "NVRX_APPLIANCE_TRAINING_DONE": str(layout.training_done),
        "NVRX_APPLIANCE_SAVE_SIGNAL": generation_end.SAVE_SIGNAL.name,
        "NVRX_APPLIANCE_SAVE_INTERVAL": str(spec.save_interval),
        "NVRX_APPLIANCE_PROGRESS_LOG": str(layout.progress_log),
        "NVRX_APPLIANCE_MODE": spec.mode,
    }


@dataclass(frozen=True)
class EnvPlan:
    set: dict[str, str]
    unset: tuple[str, ...]

    def apply(self, inherited: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in inherited.items() if k not in self.unset}
        env.update(self.set)
        return env


def plan(manifest: Manifest, node: Node, inherited: Mapping[str, str]) -> EnvPlan:
    spec = manifest.spec
    values = {
        # One MNNVL clique per array task: tasks are separate allocations and must not
        # be fused into one NVLink domain. Enabling MNNVL stays the site's choice.
        "NCCL_MNNVL_ENABLE": inherited.get("NCCL_MNNVL_ENABLE", "0"),
        "NCCL_MNNVL_CLIQUE_ID": str(node.task_id),
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "NVTE_FWD_LAYERNORM_SM_MARGIN": TE_SM_MARGIN,
        "NVTE_BWD_LAYERNORM_SM_MARGIN": TE_SM_MARGIN,
        "NVRX_LOG_DEBUG": "1" if spec.log_debug else "0",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": LAUNCHER_SIGNALS,
        "NVRX_RUN_MANIFEST": str(manifest.layout.run_json),
        **contract(manifest),
    }
    unset: list[str] = []
    if spec.gpus_per_numa:
        values["NVRX_GPUS_PER_NUMA"] = str(spec.gpus_per_numa)
    else:
        unset.append("NVRX_GPUS_PER_NUMA")
    if manifest.wandb_run_id:
        # W&B's own variables (wandb/env.py): Megatron's wandb.init passes neither an id
        # nor a resume mode, so these make every generation and in-job restart log to
        # the chain's one run; "allow" creates it the first time and resumes it after.
        values["WANDB_RUN_ID"] = manifest.wandb_run_id
        values["WANDB_RESUME"] = "allow"
    if spec.workload == "megatron" and spec.stack_sampling > 0:
        # A GPU hang leaves every rank in the same Python call (NCCL is asynchronous), so
        # the stacks name nobody there; PyTorch's NCCL flight recorder keeps each rank's
        # last collectives and dumps them when NCCL's watchdog times out (docs/hangs.md).
        # The site's own values win.
        dumps = manifest.layout.stacks(node.array_job_id) / FLIGHT_RECORDER_PREFIX
        values.update(flight_recorder(str(dumps), inherited))
    if manifest.policy.gpu_failure:
        values["NVRX_INJECT_GPU_FAILURE"] = manifest.policy.gpu_failure
    else:
        unset.append("NVRX_INJECT_GPU_FAILURE")
    return EnvPlan(set=values, unset=tuple(unset))
