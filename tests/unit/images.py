"""Appliance images for unit tests: a manifest as the build composes it, and real
squashfs files (made with mksquashfs) that hold it where the image reader looks."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from nvrx_appliance import ENTRYPOINT_PROTOCOL
from nvrx_appliance.image.image_manifest import compose
from nvrx_appliance.image.pins import IMAGE_MANIFEST_PATH, build_settings, load
from nvrx_appliance.settings.program_argv import CPU_MODULE

needs_squashfs = pytest.mark.skipif(
    not (shutil.which("mksquashfs") and shutil.which("unsquashfs")),
    reason="squashfs-tools not installed (scripts/install-system-deps.sh installs it)",
)


def cpu_manifest(built: str = "2026-01-01", **probed: str) -> dict:
    """The manifest of a CPU image from the real pins; `probed` overrides versions."""
    base = {
        "python": "3.11.2",
        "pytorch": "2.13.0+cpu",
        "nvrx": "0.7.0",
        "trainer_module": CPU_MODULE,
    }
    settings = build_settings(load(), "cpu", "rootfs")
    return compose(settings, {**base, **probed}, protocol=ENTRYPOINT_PROTOCOL, built=built)


def squash(tmp_path: Path, files: dict[str, str], name: str = "img.sqsh") -> Path:
    """A squashfs file of `files` (relative path -> text), packed the way enroot packs."""
    tree = tmp_path / f"{name}.tree"
    tree.mkdir()
    for rel, text in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    out = tmp_path / name
    argv = ["mksquashfs", str(tree), str(out), "-comp", "lzo", "-noD", "-noappend"]
    subprocess.run([*argv, "-quiet", "-no-progress"], check=True, capture_output=True)
    return out


def squash_image(tmp_path: Path, manifest: dict, name: str = "img.sqsh") -> Path:
    """An image file holding `manifest` at the path the image reader reads."""
    return squash(tmp_path, {IMAGE_MANIFEST_PATH.lstrip("/"): json.dumps(manifest)}, name)
