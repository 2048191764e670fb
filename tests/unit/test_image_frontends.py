"""The enroot and Apptainer front ends produce exactly these commands and definition.

Neither tool exists on the machines this project is developed and tested on, so these
tests pin what the front ends would run; docs/images.md says they were not run here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nvrx_appliance import __version__
from nvrx_appliance.image import apptainer, enroot
from nvrx_appliance.image.pins import REGISTRY_ENV, load


@pytest.fixture(autouse=True)
def _site_registry(monkeypatch):
    # The project names no registry host; a site sets it (pins.toml says why).
    monkeypatch.setenv(REGISTRY_ENV, "registry.example")


CONTEXT = Path("/scratch/build/context")
PARTIAL = Path("/images/.x.sqsh.partial-7")
BASE = Path("/cache/enroot/base.sqsh")


def _enroot(base_cached: bool):
    return enroot.build_steps(
        load(),
        "gpu",
        context=CONTEXT,
        base_image=BASE,
        base_cached=base_cached,
        container="nvrx-appliance-build-7",
        partial=PARTIAL,
    )


def test_enroot_imports_the_ngc_base_creates_installs_as_root_and_exports():
    pins = load()
    steps, cleanup = _enroot(base_cached=False)
    assert [s.argv for s in steps] == [
        (
            "enroot",
            "import",
            "--output",
            str(BASE),
            f"docker://{pins.gpu_registry}#{pins.gpu_image}:{pins.gpu_tag}",
        ),
        ("enroot", "create", "--name", "nvrx-appliance-build-7", str(BASE)),
        (
            "enroot",
            "start",
            "--root",
            "--rw",
            "--mount",
            f"{CONTEXT}:/mnt",
            "nvrx-appliance-build-7",
            "bash",
            "/mnt/install.sh",
        ),
        ("enroot", "export", "--output", str(PARTIAL), "nvrx-appliance-build-7"),
    ]
    assert [s.argv for s in cleanup] == [("enroot", "remove", "--force", "nvrx-appliance-build-7")]


def test_enroot_reuses_a_base_imported_by_an_earlier_build():
    steps, _ = _enroot(base_cached=True)
    assert [s.argv[1] for s in steps] == ["create", "start", "export"]


def test_enroot_cpu_flavour_starts_from_debians_own_image():
    assert enroot.import_uri(load(), "cpu") == f"docker://debian:{load().cpu_suite}"


def test_the_apptainer_definition_is_exactly_this():
    pins = load()
    expected = f"""Bootstrap: docker
From: {pins.gpu_registry}/{pins.gpu_image}:{pins.gpu_tag}
Stage: appliance

%files
{CONTEXT} /opt/nvrx-appliance-build
%labels
org.nvrx-appliance.version {__version__}
org.nvrx-appliance.flavor gpu
org.nvrx-appliance.nvrx {pins.nvrx_version}
org.nvrx-appliance.megatron-core {pins.megatron_core_version}
org.nvrx-appliance.megatron-commit {pins.megatron_commit}
%post
bash /opt/nvrx-appliance-build/install.sh
rm -rf /opt/nvrx-appliance-build
%runscript
exec nvrx-entrypoint "$@"
%startscript
exec nvrx-entrypoint "$@"
"""
    assert apptainer.definition(pins, "gpu", CONTEXT) == expected


def test_apptainer_builds_the_definition_to_a_partial_sif_with_fakeroot_unless_root():
    definition = Path("/scratch/build/appliance.def")
    partial = Path("/images/.x.sif.partial-7")
    (as_user,) = apptainer.build_steps(definition, partial, as_root=False)
    assert as_user.argv == ("apptainer", "build", "--fakeroot", str(partial), str(definition))
    (as_root,) = apptainer.build_steps(definition, partial, as_root=True)
    assert as_root.argv == ("apptainer", "build", str(partial), str(definition))


def test_both_gpu_front_ends_install_megatron_core_and_the_megatron_lm_commit_together():
    """enroot and Apptainer both run install.sh over the same build context, whose
    build.env carries both Megatron pins and whose install-megatron.sh checks them."""
    from nvrx_appliance.image.pins import build_settings, render_settings

    pins = load()
    settings = render_settings(build_settings(pins, "gpu", "apptainer"))
    assert f"MEGATRON_CORE_VERSION={pins.megatron_core_version}\n" in settings
    assert f"MEGATRON_COMMIT={pins.megatron_commit}\n" in settings
    steps, _ = _enroot(base_cached=True)
    assert steps[1].argv[-2:] == ("bash", "/mnt/install.sh")
    assert "bash /opt/nvrx-appliance-build/install.sh" in apptainer.definition(pins, "gpu", CONTEXT)
    install = (Path(apptainer.__file__).parent / "install.sh").read_text()
    assert 'install-megatron.sh" "$py" "$MEGATRON_CORE_VERSION"' in install
