"""The pins file and what derives from it: the image's name and the install script's settings."""

from __future__ import annotations

import copy
import sys

import pytest

from nvrx_appliance import __version__
from nvrx_appliance.image import pins as pins_mod
from nvrx_appliance.image.pins import (
    REGISTRY_ENV,
    PinsError,
    build_settings,
    image_filename,
    load,
    parse,
    parse_settings,
    render_settings,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from importlib import resources


@pytest.fixture(autouse=True)
def _site_registry(monkeypatch):
    # The project names no registry host; a site sets it (pins.toml says why).
    monkeypatch.setenv(REGISTRY_ENV, "registry.example")


def _raw() -> dict:
    text = resources.files("nvrx_appliance.image").joinpath("pins.toml").read_text()
    return tomllib.loads(text)


def test_the_packaged_pins_name_nvrx_070_a_full_megatron_commit_and_a_py312_ngc_base():
    pins = load()
    assert pins.nvrx_version == "0.7.0"
    assert len(pins.megatron_commit) == 40
    # One release in both halves: the package and the tag it was cut from.
    assert pins.megatron_core_version == "0.19.0"
    assert pins.megatron_tag == f"core_v{pins.megatron_core_version}"
    assert pins.gpu_python == "3.12"
    assert pins.gpu_base.startswith(pins.gpu_registry + "/")
    assert pins.appliance_version == __version__


def test_the_gpu_image_name_carries_appliance_nvrx_megatron_and_base_versions():
    pins = load()
    name = image_filename(pins, "gpu", ".sqsh")
    assert name == (
        f"nvrx-appliance-{__version__}_nvrx-0.7.0_mcore-0.19.0-{pins.megatron_commit[:7]}"
        f"_pytorch-{pins.gpu_tag}.sqsh"
    )


def test_the_cpu_image_name_says_cpu_and_its_torch_instead_of_megatron():
    pins = load()
    name = image_filename(pins, "cpu", ".sqsh")
    assert "mcore-" not in name
    assert f"_cpu-torch-{pins.cpu_torch}_debian-{pins.cpu_debian}.sqsh" in name


def test_a_shortened_megatron_commit_is_refused_with_the_section_named():
    raw = copy.deepcopy(_raw())
    raw["megatron"]["commit"] = "36731ac"
    with pytest.raises(PinsError, match=r"\[megatron\] commit"):
        parse(raw)


def test_a_missing_pin_is_named():
    raw = copy.deepcopy(_raw())
    del raw["nvrx"]["version"]
    with pytest.raises(PinsError, match=r"\[nvrx\] version is missing"):
        parse(raw)


def test_build_settings_round_trip_through_the_shell_file_the_install_script_sources():
    settings = build_settings(load(), "gpu", "enroot")
    assert parse_settings(render_settings(settings)) == settings


def test_cpu_settings_leave_megatron_empty_and_pin_torch():
    settings = build_settings(load(), "cpu", "rootfs")
    assert settings["MEGATRON_COMMIT"] == ""
    assert settings["TORCH_VERSION"] == load().cpu_torch
    assert settings["IMAGE_MANIFEST"] == pins_mod.IMAGE_MANIFEST_PATH


def test_settings_with_shell_metacharacters_stay_literal():
    settings = {"IMAGE_BASE": "a b; rm -rf / $(x)"}
    assert parse_settings(render_settings(settings)) == settings


def test_the_gpu_base_without_a_site_registry_is_refused_with_the_variable_named(monkeypatch):
    monkeypatch.delenv(REGISTRY_ENV)
    with pytest.raises(PinsError, match=REGISTRY_ENV):
        load().gpu_pull_ref()
    assert load().gpu_base == "nvidia/pytorch:25.12-py3"  # records still name the base
