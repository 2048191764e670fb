"""The image manifest writer: pins plus versions probed inside the image."""

from __future__ import annotations

import json

from nvrx_appliance.image import image_manifest
from nvrx_appliance.image.pins import build_settings, load, render_settings


def _probed(**overrides: str) -> dict[str, str]:
    pins = load()
    probed = {
        "python": "3.12.3",
        "pytorch": "2.10.0a0+b4e4ee81d3",
        "cuda": "13.1",
        "nccl": "2.28.9",
        "transformer_engine": "2.10.0",
        "nvrx": pins.nvrx_version,
        "megatron_commit": pins.megatron_commit,
        "megatron_core": pins.megatron_core_version,
        "appliance": pins.appliance_version,
        "numactl": "/usr/bin/numactl",
        "trainer_module": "nvrx_appliance.workloads.cpu",
    }
    probed.update(overrides)
    return probed


def _gpu_manifest(**probed: str) -> dict:
    settings = build_settings(load(), "gpu", "enroot")
    return image_manifest.compose(
        settings, _probed(**probed), protocol=1, built="2026-01-01T00:00:00+00:00"
    )


def test_the_manifest_carries_what_submit_reads():
    manifest = _gpu_manifest()
    for key in (
        "appliance_version",
        "entrypoint_protocol",
        "nvrx_version",
        "megatron_commit",
        "megatron_core_version",
        "flavor",
        "base",
        "probed",
        "built",
        "builder",
    ):
        assert key in manifest
    assert manifest["schema"] == image_manifest.SCHEMA
    assert manifest["flavor"] == "gpu"
    assert manifest["builder"] == "enroot"
    assert manifest["probed"]["transformer_engine"] == "2.10.0"
    json.dumps(manifest)  # it is what gets written


def test_an_image_whose_contents_match_its_pins_has_no_problems():
    assert image_manifest.problems(_gpu_manifest()) == []


def test_a_fallback_nvrx_in_the_image_is_a_problem():
    found = image_manifest.problems(_gpu_manifest(nvrx="0.4.1"))
    assert found == ["NVRx: pinned 0.7.0, found 0.4.1 in the image"]


def test_a_megatron_checkout_at_another_commit_is_a_problem():
    found = image_manifest.problems(_gpu_manifest(megatron_commit="0" * 40))
    assert len(found) == 1 and found[0].startswith("Megatron-LM commit")


def test_another_megatron_core_package_in_the_image_is_a_problem():
    found = image_manifest.problems(_gpu_manifest(megatron_core="0.16.1"))
    assert found == ["megatron-core: pinned 0.19.0, found 0.16.1 in the image"]


def test_an_image_without_numactl_is_a_problem():
    found = image_manifest.problems(_gpu_manifest(numactl=image_manifest.NONE))
    assert any("numactl" in line for line in found)


def test_the_cpu_flavour_records_none_for_megatron_and_checks_its_torch_pin():
    pins = load()
    settings = build_settings(pins, "cpu", "rootfs")
    probed = _probed(
        megatron_commit=image_manifest.NONE,
        megatron_core=image_manifest.NONE,
        pytorch=f"{pins.cpu_torch}+cpu",
        cuda="none",
    )
    manifest = image_manifest.compose(settings, probed, protocol=1, built="x")
    assert manifest["megatron_commit"] == image_manifest.NONE
    assert image_manifest.problems(manifest) == []
    other = image_manifest.compose(settings, {**probed, "pytorch": "2.4.0"}, protocol=1, built="x")
    assert image_manifest.problems(other) == [
        f"PyTorch: pinned {pins.cpu_torch}, found 2.4.0 in the image"
    ]


def test_the_probe_writes_a_manifest_of_this_python(tmp_path):
    pins = load()
    settings = build_settings(pins, "cpu", "rootfs")
    settings["TORCH_VERSION"] = __import__("torch").__version__.split("+")[0]
    (tmp_path / "build.env").write_text(render_settings(settings))
    out = tmp_path / "etc" / "image.json"
    rc = image_manifest.main(["--settings", str(tmp_path / "build.env"), "--out", str(out)])
    # This venv has NVRx 0.7.0, torch and numactl (the system package): it passes.
    assert rc == 0, "the dev venv should satisfy the cpu pins"
    written = json.loads(out.read_text())
    import platform

    assert written["probed"]["python"] == platform.python_version()
    assert written["probed"]["nvrx"] == "0.7.0"


def test_the_probe_refuses_to_write_a_manifest_that_contradicts_the_pins(tmp_path, capsys):
    settings = build_settings(load(), "cpu", "rootfs")
    settings["NVRX_VERSION"] = "9.9.9"
    (tmp_path / "build.env").write_text(render_settings(settings))
    out = tmp_path / "image.json"
    assert image_manifest.main(["--settings", str(tmp_path / "build.env"), "--out", str(out)]) == 1
    assert not out.exists()
    assert "NVRx: pinned 9.9.9" in capsys.readouterr().err


def test_an_image_without_the_built_in_trainer_is_not_built():
    missing = _gpu_manifest(trainer_module=image_manifest.NONE)
    assert image_manifest.problems(missing) == [
        "the built-in trainer: nvrx_appliance.workloads.cpu cannot be imported in the image"
    ]


def test_the_probe_finds_the_trainer_that_run_json_names():
    assert image_manifest.probe({})["trainer_module"] == "nvrx_appliance.workloads.cpu"
