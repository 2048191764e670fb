"""Read an image's manifest (/etc/nvrx-appliance/image.json) out of a .sqsh or .sif.

read_image_manifest() is what submit calls; `image inspect` prints what it returns.
The image is never mounted or started: unsquashfs reads the one file, at the offset
where the squashfs starts (0 for a .sqsh, after the SIF header for a .sif).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from nvrx_appliance.image import sif
from nvrx_appliance.image.image_manifest import SCHEMA
from nvrx_appliance.image.pins import IMAGE_MANIFEST_PATH

SQUASHFS_MAGIC = b"hsqs"
UNSQUASHFS_TIMEOUT_S = 60  # one small file; a stuck read means a broken image or disk


class ImageError(Exception):
    """The image is missing, of the wrong format, or carries no readable manifest."""


def image_format(head: bytes) -> str | None:
    if head.startswith(SQUASHFS_MAGIC):
        return "squashfs"
    if sif.is_sif(head):
        return "sif"
    return None


def _squashfs_offset(path: Path, head: bytes) -> int:
    if image_format(head) == "squashfs":
        return 0
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            descroff, total = sif.descriptor_table(head, size)
            fh.seek(descroff)
            return sif.rootfs_offset(fh.read(total * sif.DESCRIPTOR_SIZE), size)
    except sif.SIFError as exc:
        raise ImageError(f"{path}: {exc}") from None
    except OSError as exc:
        raise ImageError(f"{path}: cannot read it ({exc.strerror})") from None


def _read_file(path: Path, offset: int, inner: str) -> str:
    unsquashfs = shutil.which("unsquashfs")
    if unsquashfs is None:
        raise ImageError("unsquashfs not found; install squashfs-tools to read image manifests")
    try:
        result = subprocess.run(
            [unsquashfs, "-o", str(offset), "-cat", str(path), inner.lstrip("/")],
            capture_output=True,
            text=True,
            timeout=UNSQUASHFS_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ImageError(f"{path}: reading the image timed out; is the file complete?") from None
    if result.returncode != 0:
        if "no matches" in result.stderr:
            raise ImageError(
                f"{path} has no appliance manifest ({inner}); "
                "it was not built by `nvrx-appliance image build`"
            )
        reason = result.stderr.strip().splitlines()[-1:] or ["unsquashfs failed"]
        raise ImageError(f"{path}: cannot read the image ({reason[0]})")
    return result.stdout


def read_image_manifest(path: str | Path) -> dict[str, Any]:
    """The image's manifest. Raises ImageError with one readable line."""
    path = Path(path)
    if not path.exists():
        raise ImageError(f"{path}: no such image file; build one with `nvrx-appliance image build`")
    if not path.is_file():
        raise ImageError(f"{path} is not a file; pass an image file (.sqsh or .sif)")
    try:
        with path.open("rb") as fh:
            head = fh.read(sif.HEADER_SIZE)
    except OSError as exc:
        raise ImageError(f"{path}: cannot read it ({exc.strerror})") from None
    if image_format(head) is None:
        raise ImageError(f"{path} is neither a squashfs image (.sqsh) nor a SIF image (.sif)")
    text = _read_file(path, _squashfs_offset(path, head), IMAGE_MANIFEST_PATH)
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError:
        raise ImageError(f"{path}: its manifest {IMAGE_MANIFEST_PATH} is not valid JSON") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        raise ImageError(f"{path}: {IMAGE_MANIFEST_PATH} is not an nvrx-appliance image manifest")
    return manifest


def image_manifest_rows(image_manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """The image manifest as (field, value) rows for a table: pins first, then probed versions."""
    rows = [
        (name, str(image_manifest.get(key, "")))
        for name, key in (
            ("appliance", "appliance_version"),
            ("entrypoint protocol", "entrypoint_protocol"),
            ("flavour", "flavor"),
            ("base", "base"),
            ("NVRx (pinned)", "nvrx_version"),
            ("Megatron-LM (pinned)", "megatron_commit"),
            ("built", "built"),
            ("builder", "builder"),
        )
    ]
    probed = image_manifest.get("probed", {})
    for name, key in (
        ("Python", "python"),
        ("PyTorch", "pytorch"),
        ("CUDA", "cuda"),
        ("NCCL", "nccl"),
        ("Transformer Engine", "transformer_engine"),
        ("NVRx", "nvrx"),
        ("Megatron-LM commit", "megatron_commit"),
        ("numactl", "numactl"),
    ):
        rows.append((f"{name} (probed)", str(probed.get(key, "none"))))
    return rows
