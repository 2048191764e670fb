"""The pins an image is built from (pins.toml), and what derives from them.

Derived here and nowhere else: the image's file name, its base image reference, and
the build settings file the install script reads inside the image. Pure apart from
reading the packaged pins.toml.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from importlib import resources
from typing import Any

from nvrx_appliance import __version__

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 hosts
    import tomli as tomllib

FLAVORS = ("gpu", "cpu")
BUILDERS = ("enroot", "apptainer", "rootfs")
# Where the image's manifest lives; submit and inspect read it from there.
IMAGE_MANIFEST_PATH = "/etc/nvrx-appliance/image.json"
# The settings file the install script sources, next to it in the build context.
SETTINGS_FILE = "build.env"


class PinsError(Exception):
    """pins.toml is missing a value or holds one of the wrong kind."""


@dataclass(frozen=True)
class Pins:
    appliance_version: str
    nvrx_version: str
    py_spy_version: str
    megatron_core_version: str
    megatron_tag: str
    megatron_repository: str
    megatron_commit: str
    megatron_path: str
    gpu_registry: str
    gpu_image: str
    gpu_tag: str
    gpu_python: str
    cpu_suite: str
    cpu_debian: str
    cpu_python: str
    cpu_torch: str

    @property
    def gpu_base(self) -> str:
        """The base as records show it; qualified by the registry host when a site set one."""
        name = f"{self.gpu_image}:{self.gpu_tag}"
        return f"{self.gpu_registry}/{name}" if self.gpu_registry else name

    def gpu_pull_ref(self) -> str:
        """The base as a front end pulls it: the registry host is required here."""
        return f"{self.registry()}/{self.gpu_image}:{self.gpu_tag}"

    def registry(self) -> str:
        if not self.gpu_registry:
            raise PinsError(
                f"the GPU flavour's base {self.gpu_image}:{self.gpu_tag} needs its registry "
                f"host: set {REGISTRY_ENV} (e.g. your site's NGC registry host or mirror)"
            )
        return self.gpu_registry

    @property
    def cpu_base(self) -> str:
        return f"debian:{self.cpu_suite}"

    def base(self, flavor: str) -> str:
        return self.gpu_base if flavor == "gpu" else self.cpu_base


REGISTRY_ENV = "NVRX_BASE_REGISTRY"


def parse(data: dict[str, Any], appliance_version: str = __version__, registry: str = "") -> Pins:
    def get(section: str, key: str) -> Any:
        try:
            value = data[section][key]
        except KeyError:
            raise PinsError(f"pins.toml: [{section}] {key} is missing") from None
        if isinstance(value, str) and not value:
            raise PinsError(f"pins.toml: [{section}] {key} is empty")
        return value

    commit = str(get("megatron", "commit"))
    if len(commit) != 40 or any(c not in "0123456789abcdef" for c in commit):
        raise PinsError(f"pins.toml: [megatron] commit {commit!r} is not a full 40-hex commit")
    return Pins(
        appliance_version=appliance_version,
        nvrx_version=str(get("nvrx", "version")),
        py_spy_version=str(get("stacks", "py_spy")),
        megatron_core_version=str(get("megatron", "core_version")),
        megatron_tag=str(get("megatron", "tag")),
        megatron_repository=str(get("megatron", "repository")),
        megatron_commit=commit,
        megatron_path=str(get("megatron", "path")),
        gpu_registry=registry,
        gpu_image=str(get("gpu", "image")),
        gpu_tag=str(get("gpu", "tag")),
        gpu_python=str(get("gpu", "python")),
        cpu_suite=str(get("cpu", "suite")),
        cpu_debian=str(get("cpu", "debian")),
        cpu_python=str(get("cpu", "python")),
        cpu_torch=str(get("cpu", "torch")),
    )


def load() -> Pins:
    text = resources.files("nvrx_appliance.image").joinpath("pins.toml").read_text()
    return parse(tomllib.loads(text), registry=os.environ.get(REGISTRY_ENV, ""))


def image_filename(pins: Pins, flavor: str, suffix: str) -> str:
    """The versions an image carries, readable from its name alone.

    nvrx-appliance-0.1.0_nvrx-0.7.0_mcore-0.19.0-5d4cf1d_pytorch-25.12-py3.sqsh (gpu);
    the cpu flavour has no Megatron-LM, so it says cpu and its torch instead.
    """
    head = f"nvrx-appliance-{pins.appliance_version}_nvrx-{pins.nvrx_version}"
    if flavor == "gpu":
        base = f"{pins.gpu_image.rsplit('/', 1)[-1]}-{pins.gpu_tag}"
        megatron = f"mcore-{pins.megatron_core_version}-{pins.megatron_commit[:7]}"
        return f"{head}_{megatron}_{base}{suffix}"
    return f"{head}_cpu-torch-{pins.cpu_torch}_debian-{pins.cpu_debian}{suffix}"


def build_settings(pins: Pins, flavor: str, builder: str) -> dict[str, str]:
    """What the install script needs to know, as shell variables (empty: not this flavour)."""
    gpu = flavor == "gpu"
    return {
        "APPLIANCE_VERSION": pins.appliance_version,
        "IMAGE_FLAVOR": flavor,
        "IMAGE_BASE": pins.base(flavor),
        "IMAGE_BUILDER": builder,
        "NVRX_VERSION": pins.nvrx_version,
        "PY_SPY_VERSION": pins.py_spy_version,
        "MEGATRON_CORE_VERSION": pins.megatron_core_version if gpu else "",
        "MEGATRON_TAG": pins.megatron_tag if gpu else "",
        "MEGATRON_REPOSITORY": pins.megatron_repository if gpu else "",
        "MEGATRON_COMMIT": pins.megatron_commit if gpu else "",
        "MEGATRON_PATH": pins.megatron_path if gpu else "",
        "TORCH_VERSION": "" if gpu else pins.cpu_torch,
        "IMAGE_MANIFEST": IMAGE_MANIFEST_PATH,
    }


def render_settings(settings: dict[str, str]) -> str:
    return "".join(f"{key}={shlex.quote(value)}\n" for key, value in settings.items())


def parse_settings(text: str) -> dict[str, str]:
    settings: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.isidentifier():
            raise PinsError(f"build settings: cannot read line {line!r}")
        words = shlex.split(value)
        settings[key] = words[0] if words else ""
    return settings
