"""The rootfs front end, for machines with neither enroot nor Apptainer.

Debian 12 laid down by debootstrap, the same install script run inside it under
bubblewrap, packed with mksquashfs into the format enroot uses. Pure: it plans the
commands and derives what the build borrows from the host (its Debian mirror and its
pip settings) from text that build.py reads.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nvrx_appliance.image.pins import Pins
from nvrx_appliance.image.steps import Step, step

# enroot's own default (ENROOT_SQUASH_OPTIONS), so the image is one enroot would make.
SQUASH_OPTIONS = ("-comp", "lzo", "-noD")
# Inside the build sandbox, under a tmpfs: mount points made here never reach the image.
BUILD_ROOT = "/run/nvrx-build"
CONTEXT = f"{BUILD_ROOT}/context"
PIP_CACHE = f"{BUILD_ROOT}/pip-cache"
APT_ARCHIVES = "/var/cache/apt/archives"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# pip settings that may name files or directories on the host.
_PATH_SETTINGS = {
    "find-links",
    "constraint",
    "requirement",
    "index-url",
    "extra-index-url",
    "cert",
    "client-cert",
}
_INDEX_SETTINGS = {"index-url", "extra-index-url"}
_PIP_SECTIONS = {"global", "install", ":env:"}
# The host's proxy settings reach apt and pip inside the sandbox unchanged.
PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")


def debian_mirror(sources: list[str], suite: str) -> str | None:
    """The host's Debian mirror for suite, from its apt sources (deb822 or one-line)."""
    for text in sources:
        lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
        for stanza in "\n".join(lines).split("\n\n"):
            fields = dict(
                (key.strip().lower(), value.split())
                for key, _, value in (line.partition(":") for line in stanza.splitlines())
                if value
            )
            types, suites, uris = (fields.get(k, []) for k in ("types", "suites", "uris"))
            if "deb" in types and suite in suites and uris:
                return uris[0]
        for line in lines:
            words = re.sub(r"\[[^\]]*\]", " ", line).split()
            if len(words) >= 3 and words[0] == "deb" and words[2] == suite:
                return words[1]
    return None


def parse_pip_config(listing: str) -> dict[str, str]:
    """`pip config list` output -> setting -> value; later scopes win, as in pip."""
    settings: dict[str, str] = {}
    for line in listing.splitlines():
        match = re.match(r"^(?P<section>[^.]+)\.(?P<key>[A-Za-z0-9_-]+)='(?P<value>.*)'$", line)
        if match and match["section"] in _PIP_SECTIONS:
            settings[match["key"]] = match["value"]
    return settings


@dataclass(frozen=True)
class Borrowed:
    """What the sandbox borrows from the host: environment and read-only binds."""

    env: dict[str, str]
    binds: tuple[tuple[str, str], ...]  # (host path, path inside the sandbox)


def borrow_pip(settings: dict[str, str], exists: Callable[[str], bool]) -> Borrowed:
    """Hand the host's pip settings to the pip inside the sandbox.

    Local files and directories they name (a find-links directory, a constraints file,
    file:// indexes) are bound read-only under BUILD_ROOT and the settings rewritten to
    point there; without them pip inside would resolve an unpinned torch to the
    multi-GB CUDA build. A local index is bound with its parent directory, since index
    pages commonly link their files relatively (../../files/...).
    """
    env: dict[str, str] = {}
    binds: list[tuple[str, str]] = []
    for key, value in settings.items():
        words = []
        for word in value.split():
            scheme = "file://" if word.startswith("file://") else ""
            path = word[len(scheme) :].rstrip("/") or "/"
            if key in _PATH_SETTINGS and path.startswith("/") and path != "/" and exists(path):
                host = Path(path)
                index = key in _INDEX_SETTINGS and host.parent != host.parent.parent
                bound = host.parent if index else host
                inside = f"{BUILD_ROOT}/host/{len(binds)}-{bound.name}"
                binds.append((str(bound), inside))
                word = scheme + (f"{inside}/{host.name}" if index else inside)
            words.append(word)
        env["PIP_" + key.upper().replace("-", "_")] = " ".join(words)
    return Borrowed(env, tuple(binds))


def tarball_key(pins: Pins, mirror: str | None, arch: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9.]+", "-", mirror or "default").strip("-")
    return f"debootstrap-{pins.cpu_suite}-minbase-{arch}-{safe}.tar.gz"


def debootstrap_steps(
    pins: Pins, *, root: Path, tarball: Path, tarball_cached: bool, mirror: str | None
) -> list[Step]:
    """Debian minbase from the cached package tarball, fetching it first when absent."""
    tail = (pins.cpu_suite, str(root), *([mirror] if mirror else []))
    steps: list[Step] = []
    if not tarball_cached:
        partial = tarball.with_name(tarball.name + ".partial")
        steps.append(
            step(
                f"download Debian {pins.cpu_debian} ({pins.cpu_suite}) packages",
                "debootstrap",
                "--variant=minbase",
                f"--make-tarball={partial}",
                *tail,
            )
        )
        steps.append(
            step("keep the package tarball for later builds", "mv", str(partial), str(tarball))
        )
    steps.append(
        step(
            f"debootstrap Debian {pins.cpu_debian} ({pins.cpu_suite})",
            "debootstrap",
            "--variant=minbase",
            f"--unpack-tarball={tarball}",
            *tail,
        )
    )
    return steps


def install_step(
    *,
    root: Path,
    context: Path,
    pip_cache: Path,
    apt_archives: Path,
    borrowed: Borrowed,
    host_env: dict[str, str],
) -> Step:
    """The install script, run as root inside the new root under bubblewrap."""
    argv = [
        "bwrap",
        "--bind", str(root), "/",
        "--proc", "/proc",
        "--dev", "/dev",
        # apt drops to its own user to write temporary files: /tmp must be world-writable.
        "--perms", "1777", "--tmpfs", "/tmp",
        "--tmpfs", "/run",
        "--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf",
        "--ro-bind", str(context), CONTEXT,
        "--bind", str(pip_cache), PIP_CACHE,
        "--bind", str(apt_archives), APT_ARCHIVES,
    ]  # fmt: skip
    for host_path, inside in borrowed.binds:
        argv += ["--ro-bind", host_path, inside]
    argv += ["--die-with-parent", "--", "/bin/bash", f"{CONTEXT}/install.sh"]
    env = {
        "PATH": DEFAULT_PATH,
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "PIP_CACHE_DIR": PIP_CACHE,
        **{name: host_env[name] for name in PROXY_VARIABLES if name in host_env},
        **borrowed.env,
    }
    return Step("run the install script", tuple(argv), env)


def squash_step(root: Path, partial: Path, processors: int) -> Step:
    return step(
        "pack the image (mksquashfs)",
        "mksquashfs",
        str(root),
        str(partial),
        *SQUASH_OPTIONS,
        "-noappend",
        "-no-progress",
        "-processors",
        str(processors),
    )
