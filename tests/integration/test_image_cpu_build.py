"""The CPU image, built for real with the rootfs builder, then inspected, verified and run.

Slow (a couple of minutes: debootstrap, pip, mksquashfs) and needs root; no cluster.
Outside CI it skips when it cannot run here; under CI=true it must run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvrx_appliance.image.build import BuildError, build, cache_dir
from nvrx_appliance.image.pins import image_filename, load

TOOLS = ("debootstrap", "mksquashfs", "unsquashfs", "bwrap")
BUILD_DEADLINE_S = 600  # the CI budget for this build
APPLIANCE = [str(Path(sys.executable).with_name("nvrx-appliance"))]
STANDIN = [sys.executable, "-m", "nvrx_appliance.image.standin", "run"]


def _needs_root_and_tools() -> None:
    missing = [tool for tool in TOOLS if not shutil.which(tool)]
    reason = None
    if os.geteuid() != 0:
        reason = "the rootfs builder needs root"
    elif missing:
        reason = f"missing {', '.join(missing)} (scripts/install-system-deps.sh installs them)"
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot build the CPU image under CI: {reason}")
        pytest.skip(reason)


# Other modules import the fixture below; each import is a fixture of its own to pytest,
# so the built image is remembered here to build it once per session all the same.
_BUILT: dict[str, Path] = {}
left_by_build: list[str] = []  # the output directory right after the build


@pytest.fixture(scope="session")
def cpu_image() -> Iterator[Path]:
    """One CPU image per test session, built through the real CLI.

    Not under pytest's tmp_path: other pytest sessions on this machine rotate those
    directories away, and this image must outlive a cluster test of several minutes.
    """
    _needs_root_and_tools()
    if "cpu" in _BUILT:
        yield _BUILT["cpu"]
        return
    out = Path(tempfile.mkdtemp(prefix="nvrx-image-test-", dir="/var/tmp"))
    try:
        started = time.monotonic()
        result = subprocess.run(
            [*APPLIANCE, "image", "build", "--builder", "rootfs", "--output-dir", str(out)],
            capture_output=True,
            text=True,
            timeout=BUILD_DEADLINE_S,
            check=False,
        )
        elapsed = time.monotonic() - started
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        image = out / image_filename(load(), "cpu", ".sqsh")
        assert image.is_file(), result.stdout
        print(f"rootfs CPU image built in {elapsed:.0f} s: {image.stat().st_size >> 20} MiB")
        _BUILT["cpu"] = image
        left_by_build.extend(sorted(p.name for p in out.iterdir()))
        yield image
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _in_image(
    image: Path, *command: str, mounts: str = "", **kwargs
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*STANDIN, "--image", str(image), "--mounts", mounts, "--", *command],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        **kwargs,
    )


def test_the_build_leaves_only_the_image_and_its_log(cpu_image):
    assert left_by_build == [
        cpu_image.name,
        cpu_image.name + ".build.log",
    ]


def test_inspect_shows_the_versions_probed_inside_the_image(cpu_image):
    result = subprocess.run(
        [*APPLIANCE, "image", "inspect", "--json", str(cpu_image)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    manifest = json.loads(result.stdout)
    pins = load()
    probed = manifest["probed"]
    assert manifest["flavor"] == "cpu" and manifest["builder"] == "rootfs"
    assert probed["nvrx"] == "0.7.0"
    assert probed["pytorch"].split("+")[0] == pins.cpu_torch
    assert probed["python"].startswith(pins.cpu_python + ".")
    assert probed["megatron_commit"] == "none" and probed["cuda"] == "none"
    assert probed["numactl"] != "none"
    # The record agrees with what the image's own Python reports when started.
    live = _in_image(
        cpu_image,
        "/opt/nvrx-appliance/venv/bin/python",
        "-c",
        "import platform, torch; print(platform.python_version(), torch.__version__)",
    )
    assert live.returncode == 0, live.stderr
    assert live.stdout.split() == [probed["python"], probed["pytorch"]]


def test_the_table_view_lists_the_probed_versions(cpu_image):
    result = subprocess.run(
        [*APPLIANCE, "image", "inspect", str(cpu_image)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0
    assert "NVRx (probed)" in result.stdout and "0.7.0" in result.stdout


def test_verify_passes_with_the_bwrap_standin(cpu_image):
    result = subprocess.run(
        [*APPLIANCE, "image", "verify", str(cpu_image)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "bwrap-standin" in result.stdout
    assert "ok    nvrx-entrypoint --version" in result.stdout
    assert "ok    ft_launcher --help" in result.stdout


@pytest.mark.parametrize("code", [0, 1, 93])
def test_the_standin_passes_the_commands_exit_code_through(cpu_image, code):
    assert _in_image(cpu_image, "sh", "-c", f"exit {code}").returncode == code


def test_the_standin_binds_the_mounts_on_the_nodes_own_hostname(cpu_image, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    # A destination the image lacks, outside its private tmpfs directories: the
    # stand-in creates the mount point in the unpacked image, as enroot would.
    inside = f"/srv/nvrx-test-{os.getpid()}/work"
    result = _in_image(
        cpu_image,
        "sh",
        "-c",
        f"hostname > {inside}/seen-host && echo from-image > {inside}/written",
        mounts=f"{work}:{inside}",
    )
    assert result.returncode == 0, result.stderr
    assert (work / "written").read_text() == "from-image\n"
    assert (work / "seen-host").read_text().strip() == os.uname().nodename


def test_the_standin_forwards_sigterm_to_the_command(cpu_image):
    proc = subprocess.Popen(
        [*STANDIN, "--image", str(cpu_image), "--", "sh", "-c",
         'trap "echo got-term; exit 42" TERM; echo ready; while :; do sleep 0.1; done'],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"  # the trap is armed
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 42
    assert proc.stdout.read().strip() == "got-term"


def test_a_failed_install_step_leaves_no_image_behind(tmp_path):
    _needs_root_and_tools()
    broken = dataclasses.replace(load(), cpu_torch="0.0.1")  # no such PyTorch release
    lines: list[str] = []
    with pytest.raises(BuildError, match="step 'run the install script' failed"):
        build(
            broken,
            builder="rootfs",
            flavor="cpu",
            output_dir=tmp_path,
            cache=cache_dir(),
            echo=lines.append,
        )
    final = image_filename(broken, "cpu", ".sqsh")
    assert sorted(p.name for p in tmp_path.iterdir()) == [final + ".build.log"]
    assert any("torch==0.0.1" in line for line in lines)
