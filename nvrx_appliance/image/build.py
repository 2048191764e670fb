"""`image build`: choose a front end, prepare the build context, run its steps.

The image appears under its final name only after every step succeeded and its
manifest reads back; until then it is a hidden partial file next to it, removed on
failure. Downloads that are safe to reuse (the imported enroot base, debootstrap's
package tarball, pip's and apt's caches) are kept in a cache directory between builds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nvrx_appliance.image import apptainer, enroot, rootfs
from nvrx_appliance.image.inspect import ImageError, read_image_manifest
from nvrx_appliance.image.pins import (
    BUILDERS,
    SETTINGS_FILE,
    Pins,
    build_settings,
    image_filename,
    render_settings,
)
from nvrx_appliance.image.steps import Step

CACHE_ENV = "NVRX_IMAGE_CACHE"
# Debian publishes security fixes within days; a package set older than this is
# downloaded afresh rather than baked into another image.
TARBALL_MAX_AGE_S = 7 * 24 * 3600
# The order `image build` tries front ends in when none is named (issue: enroot, then
# Apptainer, then the rootfs builder).
PREFERENCE = ("enroot", "apptainer", "rootfs")
ROOTFS_TOOLS = ("debootstrap", "mksquashfs", "unsquashfs", "bwrap")
LOG_TAIL_LINES = 15

Echo = Callable[[str], None]


class BuildError(Exception):
    """A build that cannot start or did not finish; the message says what to do."""


# --------------------------------------------------------------------- pure part --


def choose_builder(requested: str | None, available: dict[str, bool]) -> str:
    if requested:
        if requested not in BUILDERS:
            raise BuildError(f"--builder: unknown builder {requested!r}; use {', '.join(BUILDERS)}")
        if not available.get(requested):
            need = {
                "enroot": "the enroot command",
                "apptainer": f"the apptainer command and {apptainer.SPYTHON_NEEDED}",
                "rootfs": ", ".join(ROOTFS_TOOLS)
                + " (Debian: debootstrap squashfs-tools bubblewrap)",
            }[requested]
            raise BuildError(f"--builder {requested}: not available here; it needs {need}")
        return requested
    for builder in PREFERENCE:
        if available.get(builder):
            return builder
    raise BuildError(
        "no image builder found: install enroot or Apptainer, or debootstrap, "
        "squashfs-tools and bubblewrap for the rootfs builder"
    )


def default_flavor(builder: str) -> str:
    # The rootfs builder has no way to start from an NGC image.
    return "cpu" if builder == "rootfs" else "gpu"


def refusal(builder: str, flavor: str, *, is_root: bool) -> str | None:
    if flavor not in ("gpu", "cpu"):
        return f"--flavor: unknown flavour {flavor!r}; use gpu or cpu"
    if builder == "rootfs" and flavor == "gpu":
        return (
            "--flavor gpu: the rootfs builder cannot start from the NGC PyTorch base; "
            "use --builder enroot or apptainer, or --flavor cpu"
        )
    if builder == "rootfs" and not is_root:
        return "--builder rootfs: needs root (debootstrap and the build sandbox run as root)"
    return None


@dataclass(frozen=True)
class Outcome:
    image: Path
    builder: str
    flavor: str
    seconds: float
    image_manifest: dict


# ---------------------------------------------------------------- shell: context --


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nvrx-appliance"


def available_builders() -> dict[str, bool]:
    return {
        "enroot": shutil.which("enroot") is not None,
        "apptainer": shutil.which("apptainer") is not None and apptainer.spython_installed(),
        "rootfs": all(shutil.which(tool) for tool in ROOTFS_TOOLS),
    }


def source_tree() -> Path:
    """The nvrx-appliance checkout this tool runs from; the image's wheel is built from it."""
    import nvrx_appliance

    root = Path(nvrx_appliance.__file__).resolve().parent.parent
    if not (root / "pyproject.toml").is_file():
        raise BuildError(
            f"image build needs the nvrx-appliance source tree, and {root} has no "
            "pyproject.toml; run it from a checkout (pip install -e .)"
        )
    return root


def make_context(context: Path, pins: Pins, flavor: str, builder: str, echo: Echo) -> None:
    """install.sh (+ install-nvrx.sh, install-megatron.sh), build.env and this appliance's wheel: all it reads."""
    context.mkdir(parents=True)
    here = Path(__file__).resolve().parent
    for script in ("install.sh", "install-nvrx.sh", "install-megatron.sh"):
        shutil.copy2(here / script, context / script)
    (context / SETTINGS_FILE).write_text(render_settings(build_settings(pins, flavor, builder)))
    # Build from a copy holding only what the wheel needs, so nothing is written into
    # the checkout (build/, *.egg-info) while others may be working in it.
    tree = source_tree()
    source = context.parent / "source"
    shutil.copytree(
        tree / "nvrx_appliance",
        source / "nvrx_appliance",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    for name in ("pyproject.toml", "README.md"):
        if (tree / name).exists():
            shutil.copy2(tree / name, source / name)
    echo(f"      wheel of nvrx-appliance {pins.appliance_version} from {tree}")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--quiet", "--wheel-dir", str(context / "wheels"), str(source)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise BuildError(
            f"building the nvrx-appliance wheel failed: {result.stderr.strip()[-300:]}"
        )


# ------------------------------------------------------------------ shell: steps --


def run_steps(
    steps: list[Step], log: Path, echo: Echo, *, verbose: bool, first: int, total: int
) -> None:
    with log.open("a") as sink:
        for number, item in enumerate(steps, start=first):
            echo(f"[{number}/{total}] {item.title}")
            sink.write(f"\n$ {item.command_line()}\n")
            sink.flush()
            started = time.monotonic()
            try:
                proc = subprocess.Popen(
                    item.argv,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    text=True,
                    errors="replace",
                    env=item.env,
                )
            except FileNotFoundError:
                raise BuildError(f"{item.argv[0]} not found (step: {item.title})") from None
            assert proc.stdout is not None
            for line in proc.stdout:
                sink.write(line)
                if line.startswith("==> "):
                    echo(f"      {line[4:].rstrip()}")
                elif verbose:
                    echo(f"      | {line.rstrip()}")
            rc = proc.wait()
            sink.flush()
            if rc != 0:
                tail = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
                for line in tail:
                    echo(f"      | {line}")
                raise BuildError(f"step '{item.title}' failed (exit {rc}); full log: {log}")
            echo(f"      ok ({time.monotonic() - started:.0f} s)")


def _rootfs_steps(pins: Pins, work: Path, context: Path, partial: Path, cache: Path) -> list[Step]:
    sources = [
        p.read_text(errors="replace")
        for p in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
        if p.is_file() and p.suffix in ("", ".list", ".sources")
    ]
    mirror = rootfs.debian_mirror(sources, pins.cpu_suite)
    arch = subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=False
    )
    tarball = cache / rootfs.tarball_key(pins, mirror, arch.stdout.strip() or "host")
    fresh = tarball.is_file() and time.time() - tarball.stat().st_mtime < TARBALL_MAX_AGE_S
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    borrowed = rootfs.borrow_pip(rootfs.parse_pip_config(listing), os.path.exists)
    for name in ("pip", "apt-archives"):
        (cache / name).mkdir(parents=True, exist_ok=True)
    root = work / "rootfs"
    return [
        *rootfs.debootstrap_steps(
            pins, root=root, tarball=tarball, tarball_cached=fresh, mirror=mirror
        ),
        rootfs.install_step(
            root=root,
            context=context,
            pip_cache=cache / "pip",
            apt_archives=cache / "apt-archives",
            borrowed=borrowed,
            host_env=dict(os.environ),
        ),
        rootfs.squash_step(root, partial, os.cpu_count() or 1),
    ]


def _build_steps(pins: Pins, builder: str, flavor: str, work: Path, partial: Path, cache: Path):
    """(steps, clean-up steps) of the chosen front end; the context is made afterwards."""
    context = work / "context"
    if builder == "rootfs":
        return _rootfs_steps(pins, work, context, partial, cache), []
    if builder == "enroot":
        base = cache / "enroot" / f"{pins.base(flavor).replace('/', '+').replace(':', '+')}.sqsh"
        base.parent.mkdir(parents=True, exist_ok=True)
        return enroot.build_steps(
            pins,
            flavor,
            context=context,
            base_image=base,
            base_cached=base.is_file(),
            container=f"nvrx-appliance-build-{os.getpid()}",
            partial=partial,
        )
    definition = work / "appliance.def"
    definition.write_text(apptainer.definition(pins, flavor, context))
    return apptainer.build_steps(definition, partial, as_root=os.geteuid() == 0), []


def _mounts_under(path: Path) -> list[str]:
    """Mount points below path, deepest first (a failed debootstrap can leave /proc mounted)."""
    prefix = str(path.resolve()) + "/"
    with open("/proc/self/mounts") as fh:
        points = [line.split()[1].replace("\\040", " ") for line in fh]
    return sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True)


def _remove_work(work: Path, echo: Echo) -> None:
    for point in _mounts_under(work):
        subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)
    if _mounts_under(work):
        # Never recurse into a mounted file system (a bound /dev would be the host's).
        echo(f"warning: {work} still has mounts; left in place, remove it by hand")
        return
    shutil.rmtree(work, ignore_errors=True)


def build(
    pins: Pins,
    *,
    builder: str,
    flavor: str,
    output_dir: Path,
    cache: Path,
    echo: Echo,
    verbose: bool = False,
) -> Outcome:
    started = time.monotonic()
    suffix = ".sif" if builder == "apptainer" else ".sqsh"
    final = output_dir / image_filename(pins, flavor, suffix)
    output_dir.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    partial = output_dir / f".{final.name}.partial-{os.getpid()}"
    log = output_dir / f"{final.name}.build.log"
    log.write_text(f"nvrx-appliance image build: {builder}, {flavor} flavour -> {final}\n")
    # The work directory sits beside the output: a root file system is gigabytes.
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=output_dir))
    cleanup: list[Step] = []
    echo(f"Building {final.name} with {builder} ({flavor} flavour); log: {log}")
    try:
        steps, cleanup = _build_steps(pins, builder, flavor, work, partial, cache)
        total = len(steps) + 2
        echo(f"[1/{total}] build context (install script, pins, appliance wheel)")
        make_context(work / "context", pins, flavor, builder, echo)
        run_steps(steps, log, echo, verbose=verbose, first=2, total=total)
        echo(f"[{total}/{total}] read the image manifest back and move the image into place")
        try:
            image_manifest = read_image_manifest(partial)
        except ImageError as exc:
            raise BuildError(f"the built image is unusable: {exc}") from None
        os.replace(partial, final)
    finally:
        if cleanup:
            try:
                run_steps(
                    cleanup, log, lambda _line: None, verbose=False, first=1, total=len(cleanup)
                )
            except BuildError as exc:
                echo(f"warning: clean-up failed: {exc}")
        partial.unlink(missing_ok=True)
        _remove_work(work, echo)
    return Outcome(final, builder, flavor, time.monotonic() - started, image_manifest)


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"
