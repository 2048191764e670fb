"""Choosing the builder and flavour, and what `image verify` accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvrx_appliance.image import verify
from nvrx_appliance.image.build import BuildError, choose_builder, default_flavor, refusal

ALL = {"enroot": True, "apptainer": True, "rootfs": True}


def test_the_builder_that_exists_is_picked_enroot_first():
    assert choose_builder(None, ALL) == "enroot"
    assert choose_builder(None, {"apptainer": True, "rootfs": True}) == "apptainer"
    assert choose_builder(None, {"rootfs": True}) == "rootfs"


def test_a_named_builder_that_is_missing_says_what_it_needs():
    with pytest.raises(BuildError, match="--builder enroot: not available here"):
        choose_builder("enroot", {"rootfs": True})


def test_no_builder_at_all_says_what_to_install():
    with pytest.raises(BuildError, match="no image builder found"):
        choose_builder(None, {})


def test_the_rootfs_builder_makes_the_cpu_flavour_and_refuses_the_gpu_one():
    assert default_flavor("rootfs") == "cpu"
    assert default_flavor("enroot") == "gpu"
    assert "--flavor gpu" in refusal("rootfs", "gpu", is_root=True)
    assert refusal("rootfs", "cpu", is_root=True) is None
    assert "needs root" in refusal("rootfs", "cpu", is_root=False)


def test_verify_picks_the_runtime_at_hand_and_only_apptainer_for_sif():
    have = {"enroot": False, "apptainer": False, "bwrap-standin": True}
    assert verify.choose_runtime(Path("x.sqsh"), None, have) == "bwrap-standin"
    with pytest.raises(ValueError, match="runs under apptainer only"):
        verify.choose_runtime(Path("x.sif"), "bwrap-standin", have)
    with pytest.raises(ValueError, match="no runtime"):
        verify.choose_runtime(Path("x.sif"), None, have)


def test_verify_wants_the_manifests_version_and_nvrx_070_launcher_flags():
    assert verify.judge_version("nvrx-entrypoint 0.1.0\n", 0, "0.1.0") is None
    assert "not the manifest's version" in verify.judge_version("0.0.9", 0, "0.1.0")
    assert verify.judge_version("", 75, "0.1.0") == "exited 75"
    full = " ".join(verify.NVRX_FLAGS)
    assert verify.judge_launcher(full, 0) is None
    assert "--ft-segment" in verify.judge_launcher("--ft-cycle-info-dir", 0)
