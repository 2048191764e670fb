"""`image inspect` and read_image_manifest: real squashfs and SIF files, and bad input."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from nvrx_appliance.cli.image import image
from nvrx_appliance.image import sif
from nvrx_appliance.image.inspect import ImageError, image_manifest_rows, read_image_manifest
from nvrx_appliance.image.pins import IMAGE_MANIFEST_PATH
from tests.unit.images import cpu_manifest, needs_squashfs, squash, squash_image


def _inspect(*args: str):
    return CliRunner().invoke(image, ["inspect", *args])


@needs_squashfs
def test_inspect_prints_the_manifest_of_a_squashfs_image_as_json(tmp_path):
    path = squash_image(tmp_path, cpu_manifest())
    result = _inspect(str(path), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["probed"]["pytorch"] == "2.13.0+cpu"


@needs_squashfs
def test_inspect_prints_a_table_with_the_probed_versions(tmp_path):
    path = squash_image(tmp_path, cpu_manifest())
    result = _inspect(str(path))
    assert result.exit_code == 0, result.output
    assert "PyTorch (probed)" in result.output and "2.13.0+cpu" in result.output


@needs_squashfs
def test_the_manifest_is_read_out_of_a_sif_file_without_apptainer(tmp_path):
    packed = squash_image(tmp_path, cpu_manifest()).read_bytes()
    descroff, dataoff = 4096, 8192
    deffile = bytearray(sif.pack_partition(1, 0, 0))
    deffile[0:4] = (0x4001).to_bytes(4, "little")  # a definition-file object comes first
    table = bytes(deffile) + sif.pack_partition(2, dataoff, len(packed))
    blob = sif.pack_header(descroff, 2, dataoff, len(packed)).ljust(descroff, b"\0")
    blob += table.ljust(dataoff - descroff, b"\0") + packed
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
    path = squash(tmp_path, {"etc/os-release": "ID=debian\n"})
    result = _inspect(str(path))
    assert result.exit_code == 2
    assert "has no appliance manifest" in result.output
    assert len(result.output.strip().splitlines()) == 1


@needs_squashfs
def test_a_manifest_of_something_else_is_refused(tmp_path):
    path = squash(tmp_path, {IMAGE_MANIFEST_PATH.lstrip("/"): json.dumps({"name": "other"})})
    with pytest.raises(ImageError, match="not an nvrx-appliance image manifest"):
        read_image_manifest(path)


def test_a_sif_without_a_squashfs_partition_is_refused(tmp_path):
    path = tmp_path / "empty.sif"
    path.write_bytes(sif.pack_header(4096, 1, 8192, 0).ljust(4096 + sif.DESCRIPTOR_SIZE, b"\0"))
    with pytest.raises(ImageError, match="no squashfs root file system"):
        read_image_manifest(path)


def test_the_table_lists_pins_then_probed_versions_with_none_for_absent_ones():
    rows = dict(image_manifest_rows(cpu_manifest()))
    assert rows["NVRx (pinned)"] == "0.7.0"
    assert rows["Megatron-LM (pinned)"] == "none"
    assert rows["CUDA (probed)"] == "none"


@pytest.mark.parametrize(
    ("descroff", "total", "fileoff"),
    [
        (4096, 2**40, 8192),  # a descriptor count that would be read into memory whole
        (2**62, 1, 8192),  # a table far past the end (seek overflows)
        (4096, 1, 2**62),  # a partition past the end
        (4096, 1, -5),  # a negative partition offset
    ],
)
def test_a_sif_with_a_damaged_header_is_one_line_and_exit_2(tmp_path, descroff, total, fileoff):
    path = tmp_path / "damaged.sif"
    table = sif.pack_partition(1, fileoff, 4096)
    path.write_bytes(sif.pack_header(descroff, total, 8192, 4096).ljust(4096, b"\0") + table)
    result = CliRunner().invoke(image, ["inspect", str(path)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert len(result.output.strip().splitlines()) == 1 and str(path) in result.output
