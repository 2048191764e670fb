"""The enroot front end (the pyxis path): import the base, create, install, export.

Pure: it lists the build steps; build.py runs them. Not run on the machine this was
written on (no enroot there); the unit tests pin the exact commands instead.
"""

from __future__ import annotations

from pathlib import Path

from nvrx_appliance.image.pins import Pins
from nvrx_appliance.image.steps import Step, step

# Where the build context appears inside the container. /mnt exists in every base we
# use, so enroot need not create a mount point that would then be exported with it.
CONTEXT_MOUNT = "/mnt"


def import_uri(pins: Pins, flavor: str) -> str:
    """enroot's spelling of the base: docker://[REGISTRY#]IMAGE:TAG."""
    if flavor == "gpu":
        return f"docker://{pins.registry()}#{pins.gpu_image}:{pins.gpu_tag}"
    return f"docker://{pins.cpu_base}"


def build_steps(
    pins: Pins,
    flavor: str,
    *,
    context: Path,
    base_image: Path,
    base_cached: bool,
    container: str,
    partial: Path,
) -> tuple[list[Step], list[Step]]:
    """The build's steps, and the clean-up steps that run whether or not they succeed.

    base_image is the imported base (.sqsh) kept in the download cache, so a second
    build on the same machine does not pull the multi-GB base again.
    """
    steps: list[Step] = []
    if not base_cached:
        steps.append(
            step(
                f"import {pins.base(flavor)}",
                "enroot",
                "import",
                "--output",
                str(base_image),
                import_uri(pins, flavor),
            )
        )
    steps += [
        step(
            "create the build container", "enroot", "create", "--name", container, str(base_image)
        ),
        step(
            "run the install script",
            "enroot",
            "start",
            "--root",
            "--rw",
            "--mount",
            f"{context}:{CONTEXT_MOUNT}",
            container,
            "bash",
            f"{CONTEXT_MOUNT}/install.sh",
        ),
        step("export the image", "enroot", "export", "--output", str(partial), container),
    ]
    cleanup = [step("remove the build container", "enroot", "remove", "--force", container)]
    return steps, cleanup
