"""Facts about the machine and the stack a result was measured on."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nvrx_appliance import __version__


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _memory_gib() -> float | None:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1024 / 1024, 1)
    return None


def _cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _command(argv: list[str], env: dict[str, str] | None = None) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip()


# What a fresh process of each kind imports before it can do anything: the floor under
# every process a recovery starts (the entrypoint, ft_launcher, each worker).
IMPORTS = {
    "python": "sys",
    "entrypoint": "nvrx_appliance.cli.entrypoint",
    "ft_launcher": "nvidia_resiliency_ext.fault_tolerance.launcher",
    "worker (torch)": "torch, torch.distributed",
}


def command_seconds(argv: list[str], runs: int = 5) -> list[float]:
    """Wall time of a fresh process running `argv`, once per run; none if it fails."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True)
        if done.returncode != 0:
            return []
        times.append(time.perf_counter() - started)
    return times


def import_seconds(module: str, runs: int = 5) -> list[float]:
    """Wall time of a fresh Python importing `module`, once per run."""
    return command_seconds([sys.executable, "-c", f"import {module}"], runs)


def help_seconds(runs: int = 5) -> list[float]:
    """`nvrx-appliance --help` as a user on a login node runs it (the venv's script)."""
    return command_seconds([str(Path(sys.executable).with_name("nvrx-appliance")), "--help"], runs)


def facts(cluster_status: dict[str, Any] | None = None) -> dict[str, Any]:
    env = {**os.environ, **(cluster_status or {}).get("env", {})}
    repo = Path(__file__).resolve().parent.parent
    facts = {
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory_gib": _memory_gib(),
        "kernel": platform.release(),
        "debian": _read("/etc/debian_version"),
        "python": platform.python_version(),
        "slurm": _command(["sinfo", "--version"], env),
        "nvrx": _version("nvidia-resiliency-ext"),
        "torch": _version("torch"),
        "nvrx_appliance": __version__,
        "commit": _command(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"]),
    }
    facts["import_s"] = {name: import_seconds(module) for name, module in IMPORTS.items()}
    facts["help_s"] = help_seconds()
    if cluster_status:
        facts["cluster"] = {
            k: cluster_status.get("params", {}).get(k)
            for k in ("nodes", "cpus_per_node", "gpus_per_node")
        }
    return facts


def describe(machine: dict[str, Any]) -> str:
    """One line for the results document: what ran it."""
    cluster = machine.get("cluster") or {}
    return (
        f"{machine['cores']} cores ({machine['cpu']}), {machine['memory_gib']} GiB, "
        f"Debian {machine['debian']}, kernel {machine['kernel']}, {machine['slurm']}, "
        f"NVRx {machine['nvrx']}, torch {machine['torch']}, Python {machine['python']}"
        + (f"; local cluster of {cluster.get('nodes')} nodes" if cluster else "")
    )
