"""The Apptainer front end: a definition file written through spython, built to a .sif.

Pure: it writes the definition text and lists the build step; build.py runs it.
Not run on the machine this was written on (no Apptainer there); the unit tests pin
the exact definition and command instead.

spython is an optional extra (`nvrx-appliance[apptainer]`): a login node that only
submits and watches never needs it, so it is imported only when a definition is written.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from nvrx_appliance.image.pins import Pins
from nvrx_appliance.image.steps import Step, step

# Where %files puts the build context inside the image; %post removes it again.
CONTEXT_DIR = "/opt/nvrx-appliance-build"


# What an Apptainer build needs beyond the apptainer command, and how to get it.
SPYTHON_NEEDED = "the spython package (pip install 'nvrx-appliance[apptainer]')"


def spython_installed() -> bool:
    return importlib.util.find_spec("spython") is not None


def definition(pins: Pins, flavor: str, context: Path) -> str:
    try:
        from spython.main.parse.recipe import Recipe
        from spython.main.parse.writers import SingularityWriter
    except ImportError:
        raise RuntimeError(f"an Apptainer definition is written through {SPYTHON_NEEDED}") from None
    recipe = Recipe()
    recipe.fromHeader = pins.gpu_pull_ref() if flavor == "gpu" else pins.cpu_base
    recipe.files = [[str(context), CONTEXT_DIR]]
    recipe.labels = [
        ["org.nvrx-appliance.version", pins.appliance_version],
        ["org.nvrx-appliance.flavor", flavor],
        ["org.nvrx-appliance.nvrx", pins.nvrx_version],
        [
            "org.nvrx-appliance.megatron-core",
            pins.megatron_core_version if flavor == "gpu" else "none",
        ],
        ["org.nvrx-appliance.megatron-commit", pins.megatron_commit if flavor == "gpu" else "none"],
    ]
    recipe.install = [f"bash {CONTEXT_DIR}/install.sh", f"rm -rf {CONTEXT_DIR}"]
    recipe.entrypoint = ["nvrx-entrypoint"]
    # The writer takes stages by name; one stage is all an appliance image needs.
    return SingularityWriter({"appliance": recipe}).convert() + "\n"


def build_steps(definition_file: Path, partial: Path, *, as_root: bool) -> list[Step]:
    # Building from a definition needs root, or a site that allows --fakeroot.
    fakeroot = () if as_root else ("--fakeroot",)
    return [
        step(
            "build the image (Apptainer)",
            "apptainer",
            "build",
            *fakeroot,
            str(partial),
            str(definition_file),
        )
    ]
