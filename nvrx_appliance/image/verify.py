"""`image verify`: does the image start its entrypoint with the runtime at hand?

Two commands run inside the image: `nvrx-entrypoint --version` (must name the
appliance version the manifest records) and `ft_launcher --help` (must offer the
NVRx 0.7.0 flags the entrypoint passes). On a machine with neither enroot nor
Apptainer, the runtime at hand is the bwrap stand-in (a test stand-in, see standin.py).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

RUNTIMES = ("enroot", "apptainer", "bwrap-standin")
CHECK_TIMEOUT_S = 600  # the first stand-in run unpacks the image, which can take minutes
# Flags of ft_launcher that NVRx 0.4.x lacks and the entrypoint relies on.
NVRX_FLAGS = ("--ft-segment", "--ft-cycle-info-dir", "--ft-checkpoint-iteration-file")


@dataclass(frozen=True)
class Check:
    name: str
    command: tuple[str, ...]
    returncode: int
    output: str
    problem: str | None  # None: passed


def choose_runtime(image: Path, requested: str | None, have: dict[str, bool]) -> str:
    """The runtime to start the image with; ValueError names the option and the fix."""
    sif = image.suffix == ".sif"
    if requested:
        if requested not in RUNTIMES:
            raise ValueError(f"--runtime: unknown runtime {requested!r}; use {', '.join(RUNTIMES)}")
        if sif and requested != "apptainer":
            raise ValueError(f"--runtime {requested}: a .sif image runs under apptainer only")
        if not have.get(requested):
            raise ValueError(f"--runtime {requested}: not available on this machine")
        return requested
    order = ("apptainer",) if sif else ("enroot", "bwrap-standin")
    for runtime in order:
        if have.get(runtime):
            return runtime
    raise ValueError(
        "no runtime to start the image with: install apptainer (.sif), or enroot or "
        "bubblewrap + squashfs-tools (.sqsh)"
    )


def runtime_argv(runtime: str, image: Path, command: list[str]) -> list[str]:
    if runtime == "enroot":
        return ["enroot", "start", str(image), *command]
    if runtime == "apptainer":
        return ["apptainer", "exec", str(image), *command]
    return [
        sys.executable,
        "-m",
        "nvrx_appliance.image.standin",
        "run",
        "--image",
        str(image),
        "--",
        *command,
    ]


def judge_version(output: str, returncode: int, appliance_version: str) -> str | None:
    if returncode != 0:
        return f"exited {returncode}"
    if appliance_version not in output:
        return f"printed {output.strip()[:80]!r}, not the manifest's version {appliance_version}"
    return None


def judge_launcher(output: str, returncode: int) -> str | None:
    if returncode != 0:
        return f"exited {returncode}"
    missing = [flag for flag in NVRX_FLAGS if flag not in output]
    if missing:
        return f"lacks {', '.join(missing)} (not NVRx 0.7.0?)"
    return None


def runtimes_here() -> dict[str, bool]:
    return {
        "enroot": shutil.which("enroot") is not None,
        "apptainer": shutil.which("apptainer") is not None,
        "bwrap-standin": all(shutil.which(t) for t in ("bwrap", "unsquashfs")),
    }


def _run(name: str, argv: list[str]) -> tuple[int, str]:
    try:
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return 124, f"{name} did not finish in {CHECK_TIMEOUT_S} s"
    return result.returncode, result.stdout + result.stderr


def verify(image: Path, runtime: str, image_manifest: dict) -> list[Check]:
    checks = []
    for name, command, judge in (
        (
            "nvrx-entrypoint --version",
            ["nvrx-entrypoint", "--version"],
            lambda out, rc: judge_version(
                out, rc, str(image_manifest.get("appliance_version", ""))
            ),
        ),
        ("ft_launcher --help", ["ft_launcher", "--help"], judge_launcher),
    ):
        argv = runtime_argv(runtime, image, command)
        rc, output = _run(name, argv)
        checks.append(Check(name, tuple(argv), rc, output, judge(output, rc)))
    return checks
