"""Workloads run under ft_launcher: Megatron-LM pretrain_gpt.py, and a built-in CPU trainer.

`workload_argv(manifest)` is what the entrypoint appends after ft_launcher's own flags:
interpreter first, so ft_launcher must be given --no-python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nvrx_appliance.manifest import Manifest


def workload_argv(manifest: Manifest, python: str | None = None) -> list[str]:
    """The argv of the manifest's workload (spec.workload: megatron or cpu)."""
    # Imported here, not at the top: `python -m ...workloads.cpu` imports this package
    # first, and a submodule imported by its package before it runs as __main__ makes
    # runpy warn and load it twice.
    if manifest.spec.workload == "cpu":
        from nvrx_appliance.entrypoints.workloads import cpu

        return cpu.workload_argv(manifest, python)
    from nvrx_appliance.entrypoints.workloads import megatron

    return megatron.workload_argv(manifest, python)
