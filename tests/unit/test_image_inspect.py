"""`image inspect` and read_image_manifest: real squashfs and SIF files, and bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from nvrx_appliance.image import sif
from nvrx_appliance.image.cli import image
from nvrx_appliance.image.inspect import ImageError, manifest_rows, read_image_manifest
from nvrx_appliance.image.pins import MANIFEST_PATH, build_settings, load
from nvrx_appliance.image.probe import compose

needs_squashfs = pytest.mark.skipif(
    not (shutil.which("mksquashfs") and shutil.which("unsquashfs")),
    reason="squashfs-tools not installed (scripts/install-system-deps.sh installs it)",
)


def _manifest() -> dict:
    probed = {"python": "3.11.2", "pytorch": "2.13.0+cpu", "nvrx": "0.7.0"}
    return compose(build_settings(load(), "cpu", "rootfs"), probed, protocol=1, built="2026-01-01")


def _squash(tmp_path: Path, files: dict[str, str], name: str = "img.sqsh") -> Path:
    tree = tmp_path / "tree"
    for rel, text in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    tree.mkdir(exist_ok=True)
    out = tmp_path / name
    subprocess.run(
        [
            "mksquashfs",
            str(tree),
            str(out),
            "-comp",
            "lzo",
            "-noD",
            "-noappend",
            "-quiet",
            "-no-progress",
        ],
        check=True,
        capture_output=True,
    )
    return out


def _inspect(*args: str):
    return CliRunner().invoke(image, ["inspect", *args])


@needs_squashfs
def test_inspect_prints_the_manifest_of_a_squashfs_image_as_json(tmp_path):
    path = _squash(tmp_path, {MANIFEST_PATH.lstrip("/"): json.dumps(_manifest())})
    result = _inspect(str(path), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["probed"]["pytorch"] == "2.13.0+cpu"


@needs_squashfs
def test_inspect_prints_a_table_with_the_probed_versions(tmp_path):
    path = _squash(tmp_path, {MANIFEST_PATH.lstrip("/"): json.dumps(_manifest())})
    result = _inspect(str(path))
    assert result.exit_code == 0, result.output
    assert "PyTorch (probed)" in result.output and "2.13.0+cpu" in result.output


@needs_squashfs
def test_the_manifest_is_read_out_of_a_sif_file_without_apptainer(tmp_path):
    squash = _squash(tmp_path, {MANIFEST_PATH.lstrip("/"): json.dumps(_manifest())}).read_bytes()
    descroff, dataoff = 4096, 8192
    deffile = bytearray(sif.pack_partition(1, 0, 0))
    deffile[0:4] = (0x4001).to_bytes(4, "little")  # a definition-file object comes first
    table = bytes(deffile) + sif.pack_partition(2, dataoff, len(squash))
    blob = sif.pack_header(descroff, 2, dataoff, len(squash)).ljust(descroff, b"\0")
    blob += table.ljust(dataoff - descroff, b"\0") + squash
    path = tmp_path / "img.sif"
    path.write_bytes(blob)
    assert read_image_manifest(path)["flavor"] == "cpu"


def test_a_missing_image_is_one_clear_line_and_exit_2(tmp_path):
    result = _inspect(str(tmp_path / "nope.sqsh"))
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: {tmp_path / 'nope.sqsh'}: no such image file; build one with `nvrx-appliance image build`"
    ]


def test_a_file_that_is_neither_squashfs_nor_sif_is_refused(tmp_path):
    path = tmp_path / "notes.sqsh"
    path.write_text("just text\n")
    result = _inspect(str(path))
    assert result.exit_code == 2
    assert "neither a squashfs image (.sqsh) nor a SIF image (.sif)" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_directory_is_refused(tmp_path):
    result = _inspect(str(tmp_path))
    assert result.exit_code == 2 and "is not a file" in result.output


@needs_squashfs
def test_an_image_without_a_manifest_is_refused(tmp_path):
    path = _squash(tmp_path, {"etc/os-release": "ID=debian\n"})
    result = _inspect(str(path))
    assert result.exit_code == 2
    assert "has no appliance manifest" in result.output
    assert len(result.output.strip().splitlines()) == 1


@needs_squashfs
def test_a_manifest_of_something_else_is_refused(tmp_path):
    path = _squash(tmp_path, {MANIFEST_PATH.lstrip("/"): json.dumps({"name": "other"})})
    with pytest.raises(ImageError, match="not an nvrx-appliance image manifest"):
        read_image_manifest(path)


def test_a_sif_without_a_squashfs_partition_is_refused(tmp_path):
    path = tmp_path / "empty.sif"
    path.write_bytes(sif.pack_header(4096, 1, 8192, 0).ljust(4096 + sif.DESCRIPTOR_SIZE, b"\0"))
    with pytest.raises(ImageError, match="no squashfs root file system"):
        read_image_manifest(path)


def test_the_table_lists_pins_then_probed_versions_with_none_for_absent_ones():
    rows = dict(manifest_rows(_manifest()))
    assert rows["NVRx (pinned)"] == "0.7.0"
    assert rows["Megatron-LM (pinned)"] == "none"
    assert rows["CUDA (probed)"] == "none"
