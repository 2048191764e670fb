"""The image manifest: written inside the image at build time, read by inspect and submit.

The install script runs `python -m nvrx_appliance.image.image_manifest` with the image's own
Python as its last step. The versions it records are probed there (what is installed),
not copied from the pins; a probed version that disagrees with its pin fails the build,
so an image never carries a manifest that lies about its contents.

compose() and problems() are pure; the probes below them import what they probe.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import importlib.util
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from nvrx_appliance.settings.program_argv import CPU_MODULE

SCHEMA = "nvrx-appliance/image"
VERSION = 1
NONE = "none"  # the recorded value of anything the image does not have


def compose(settings: dict[str, str], probed: dict[str, str], *, protocol: int, built: str) -> dict:
    """The manifest from the build settings (the pins) and what was probed in the image."""
    gpu = settings["IMAGE_FLAVOR"] == "gpu"
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "appliance_version": settings["APPLIANCE_VERSION"],
        "entrypoint_protocol": protocol,
        "nvrx_version": settings["NVRX_VERSION"],
        "megatron_commit": settings["MEGATRON_COMMIT"] if gpu else NONE,
        "megatron_core_version": settings.get("MEGATRON_CORE_VERSION", "") or NONE,
        "flavor": settings["IMAGE_FLAVOR"],
        "base": settings["IMAGE_BASE"],
        "builder": settings["IMAGE_BUILDER"],
        "built": built,
        "pins": {
            "nvrx": settings["NVRX_VERSION"],
            "megatron_core": settings.get("MEGATRON_CORE_VERSION", "") or NONE,
            "megatron_tag": settings.get("MEGATRON_TAG", "") or NONE,
            "megatron_repository": settings["MEGATRON_REPOSITORY"] or NONE,
            "megatron_commit": settings["MEGATRON_COMMIT"] or NONE,
            "megatron_path": settings["MEGATRON_PATH"] or NONE,
            "torch": settings["TORCH_VERSION"] or NONE,
        },
        "probed": dict(probed),
    }


def problems(manifest: dict) -> list[str]:
    """Where the image's contents disagree with its pins; empty when they agree."""
    probed = manifest["probed"]
    pins = manifest["pins"]
    found: list[str] = []

    def expect(what: str, got: str, want: str) -> None:
        if got != want:
            found.append(f"{what}: pinned {want}, found {got} in the image")

    expect("NVRx", probed.get("nvrx", NONE), manifest["nvrx_version"])
    expect("nvrx-appliance", probed.get("appliance", NONE), manifest["appliance_version"])
    expect("Megatron-LM commit", probed.get("megatron_commit", NONE), manifest["megatron_commit"])
    expect(
        "megatron-core",
        probed.get("megatron_core", NONE),
        manifest.get("megatron_core_version", NONE),
    )
    if pins["torch"] != NONE:
        # A local build tag (2.13.0+cpu) is the pinned release built for CPU.
        expect("PyTorch", probed.get("pytorch", NONE).split("+")[0], pins["torch"])
    if probed.get("trainer_module", NONE) == NONE:
        found.append(f"the built-in trainer: {CPU_MODULE} cannot be imported in the image")
    if probed.get("numactl", NONE) == NONE:
        found.append("numactl: not found in the image (ft_launcher needs it for NUMA binding)")
    return found


def _version(*distributions: str) -> str:
    for name in distributions:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return NONE


def _torch_versions() -> dict[str, str]:
    try:
        import torch
    except ImportError:
        return {"pytorch": NONE, "cuda": NONE, "nccl": NONE}
    nccl = NONE
    if torch.version.cuda:
        try:
            nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
        except (AttributeError, RuntimeError):
            nccl = NONE
    return {
        "pytorch": torch.__version__,
        "cuda": torch.version.cuda or NONE,
        "nccl": nccl,
    }


def _git_head(path: str) -> str:
    if not path or not Path(path, ".git").exists():
        return NONE
    result = subprocess.run(
        ["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else NONE


def probe(settings: dict[str, str]) -> dict[str, str]:
    return {
        "python": platform.python_version(),
        **_torch_versions(),
        "transformer_engine": _version("transformer_engine", "transformer-engine"),
        "nvrx": _version("nvidia-resiliency-ext"),
        "megatron_commit": _git_head(settings.get("MEGATRON_PATH", "")),
        "megatron_core": _version("megatron-core", "megatron_core"),
        "appliance": _version("nvrx-appliance"),
        # What `--workload cpu` runs with -m, found in this image; submit compares it
        # with the module run.json names (settings/validate.py).
        "trainer_module": CPU_MODULE if importlib.util.find_spec(CPU_MODULE) else NONE,
        "numactl": shutil.which("numactl") or NONE,
    }


def main(argv: list[str] | None = None) -> int:
    from nvrx_appliance import ENTRYPOINT_PROTOCOL
    from nvrx_appliance.clock import now_iso
    from nvrx_appliance.files import write_atomic
    from nvrx_appliance.image.pins import parse_settings

    parser = argparse.ArgumentParser(prog="python -m nvrx_appliance.image.image_manifest")
    parser.add_argument("--settings", required=True, type=Path, help="the build.env file")
    parser.add_argument("--out", required=True, type=Path, help="where to write image.json")
    args = parser.parse_args(argv)

    settings = parse_settings(args.settings.read_text())
    built = now_iso()
    manifest = compose(settings, probe(settings), protocol=ENTRYPOINT_PROTOCOL, built=built)
    found = problems(manifest)
    for line in found:
        print(f"probe: {line}", file=sys.stderr)
    if found:
        return 1
    write_atomic(args.out, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    print(json.dumps(manifest["probed"], sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
