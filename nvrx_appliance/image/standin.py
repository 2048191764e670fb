"""A TEST STAND-IN for pyxis + enroot: run a command inside an appliance .sqsh.

pyxis and enroot cannot exist on a machine without GPUs (and are not packaged for
it), so the local cluster's tests run images the way enroot does instead: unpack the
squashfs once per image, then start the command in it with bubblewrap, the job's
mounts bound, on the node's own network and hostname, with the job's environment.
It is the runtime called "bwrap-standin" in chain.py; no production path uses it.

    python -m nvrx_appliance.image.standin run --image X.sqsh --mounts SRC:DST[,..] -- CMD...

Exit status: CMD's, unchanged (93 included); 128+N when CMD died of signal N. Signals
sent to this process (TERM, INT, HUP, QUIT, USR1, USR2) go to CMD.

Differences from enroot, on purpose: the image's root is read-only and shared by every
task that uses it (enroot gives each container a private writable copy); /tmp, /var/tmp,
/run and the home directory are private tmpfs instead.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from nvrx_appliance import exitcodes
from nvrx_appliance.clock import log_stamp
from nvrx_appliance.settings import chain

CACHE_ENV = "NVRX_STANDIN_CACHE"
# enroot mounts these from the host into every container; node names resolve through them.
HOST_FILES = ("/etc/hosts", "/etc/resolv.conf")
# Host settings that would point the image's programs at the host's files.
DROPPED_ENV = (
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "VIRTUAL_ENV",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FORWARDED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
UNPACK_TIMEOUT_S = 1800  # a multi-GB image on a slow disk; beyond this the disk is the problem


class StandinError(Exception):
    """Bad arguments (exit USAGE) or a container that could not be started (LAUNCH_FAILED)."""

    def __init__(self, message: str, code: int = exitcodes.LAUNCH_FAILED) -> None:
        super().__init__(message)
        self.code = code


# ----------------------------------------------------------------- pure: planning --


def parse_mounts(text: str) -> list[tuple[str, str, bool]]:
    """pyxis's --container-mounts syntax (chain.parse_mounts), as a usage error."""
    try:
        return chain.parse_mounts(text)
    except ValueError as exc:
        raise StandinError(f"--mounts: {exc}", exitcodes.USAGE) from None


def cache_key(realpath: str, size: int, mtime_ns: int, inode: int) -> str:
    """One unpacked copy per image version: a rebuilt image (new mtime/inode) gets a new one."""
    digest = hashlib.sha256(f"{realpath}\0{size}\0{mtime_ns}\0{inode}".encode()).hexdigest()
    return digest[:16]


def inside_cwd(cwd: str, mounts: list[tuple[str, str, bool]]) -> str:
    """The job's working directory as seen inside, when a mount carries it; else /."""
    for src, dst, _ in mounts:
        if cwd == src or cwd.startswith(src.rstrip("/") + "/"):
            return dst + cwd[len(src.rstrip("/")) :]
    return "/"


def private_dirs(home: str) -> dict[str, str]:
    """Directories each task gets as its own tmpfs over the shared read-only root,
    with their modes (/tmp world-writable as usual: jobs and apt drop privileges)."""
    dirs = {"/tmp": "1777", "/var/tmp": "1777", "/run": "0755"}
    if home.startswith("/") and home.rstrip("/") and not under(home, list(dirs)):
        dirs[home] = "0700"
    return dirs


def under(path: str, dirs: list[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def bwrap_argv(
    root: str,
    mounts: list[tuple[str, str, bool]],
    *,
    cwd: str,
    home: str,
    host_files: list[str],
    info_fd: int,
    command: list[str],
) -> list[str]:
    argv = ["bwrap", "--ro-bind", root, "/", "--proc", "/proc", "--dev", "/dev"]
    for directory, mode in private_dirs(home).items():
        argv += ["--perms", mode, "--tmpfs", directory]
    for path in host_files:
        argv += ["--ro-bind", path, path]
    for src, dst, read_only in mounts:
        argv += ["--ro-bind" if read_only else "--bind", src, dst]
    # No --unshare-net/-uts/-pid: the task keeps its node's network namespace, hostname
    # and process view, as pyxis containers do by default.
    argv += ["--chdir", cwd, "--die-with-parent", "--info-fd", str(info_fd), "--", *command]
    return argv


def image_path_variable(environment_file: str) -> str:
    """PATH from the image's /etc/environment (enroot's image environment), else the default."""
    for line in environment_file.splitlines():
        key, _, value = line.strip().partition("=")
        if key == "PATH" and value:
            return value.strip().strip('"')
    return DEFAULT_PATH


def container_env(host_env: dict[str, str], path: str) -> dict[str, str]:
    env = {k: v for k, v in host_env.items() if k not in DROPPED_ENV}
    env["PATH"] = path
    return env


def exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


# ------------------------------------------------------------- shell: unpacking --


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or f"/var/tmp/nvrx-appliance-standin-{os.getuid()}")


def _owner_only_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path):
        raise StandinError(f"stand-in cache {path} is not a directory")
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise StandinError(
            f"stand-in cache {path} must belong to uid {os.getuid()} with mode 0700; "
            f"fix it or point {CACHE_ENV} elsewhere"
        )


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[bool]:
    """Hold a flock on path; yields False when a non-blocking request was refused."""
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, mode)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _prune(cache_dir: Path, image_name: str, keep: str) -> None:
    """Drop earlier unpacked versions of this image that no task is running, and
    partial unpacks whose process is gone; each unpacked image is gigabytes."""
    for entry in cache_dir.glob(f"{image_name}.*"):
        key = entry.name[len(image_name) + 1 :]
        if key == keep or not entry.is_dir():
            continue
        with _flock(cache_dir / f".{key}.use", fcntl.LOCK_EX | fcntl.LOCK_NB) as free:
            if free:
                shutil.rmtree(entry, ignore_errors=True)
                for suffix in ("unpack", "use"):
                    (cache_dir / f".{key}.{suffix}").unlink(missing_ok=True)
    for partial in cache_dir.glob(".*.partial-*"):
        pid = partial.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(partial, ignore_errors=True)


def _unpack(image: Path, cache_dir: Path, key: str, final: Path) -> None:
    partial = cache_dir / f".{key}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    result = subprocess.run(
        ["unsquashfs", "-n", "-d", str(partial), str(image)],
        capture_output=True,
        text=True,
        timeout=UNPACK_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        detail = (result.stderr.strip().splitlines() or ["unsquashfs failed"])[-1]
        raise StandinError(f"--image {image}: cannot unpack it ({detail})")
    os.rename(partial, final)


@contextlib.contextmanager
def unpacked_root(image: Path, cache_dir: Path) -> Iterator[Path]:
    """The image unpacked once, shared by every task that runs it, held while in use.

    Unpacked under a private name and renamed into place, so a root that exists is
    complete; the unpack lock keeps tasks starting together on several nodes from each
    unpacking the same image, and the shared use lock keeps a root from being pruned
    while a task runs in it.
    """
    if not image.is_file():
        raise StandinError(f"--image {image}: no such image file", exitcodes.USAGE)
    _owner_only_dir(cache_dir)
    info = image.stat()
    key = cache_key(str(image.resolve()), info.st_size, info.st_mtime_ns, info.st_ino)
    final = cache_dir / f"{image.name}.{key}"
    if not final.is_dir():
        with _flock(cache_dir / f".{key}.unpack", fcntl.LOCK_EX):
            if not final.is_dir():
                _unpack(image, cache_dir, key, final)
                _prune(cache_dir, image.name, keep=key)
    with _flock(cache_dir / f".{key}.use", fcntl.LOCK_SH):
        if not final.is_dir():
            raise StandinError(f"--image {image}: its unpacked copy vanished; run again")
        yield final


# --------------------------------------------------------------- shell: running --


def _child_pid(info_fd: int) -> int | None:
    """bwrap's --info-fd report: JSON with the sandboxed command's pid."""
    data = b""
    while True:
        chunk = os.read(info_fd, 4096)
        if not chunk:
            return None
        data += chunk
        with contextlib.suppress(ValueError):
            return int(json.loads(data)["child-pid"])


def run(image: Path, mounts: list[tuple[str, str, bool]], command: list[str]) -> int:
    with unpacked_root(image, default_cache_dir()) as root:
        return _run_in(root, mounts, command)


def _mount_point(root: Path, dst: str, *, is_file: bool) -> None:
    """Create a missing mount point in the unpacked image, as enroot's x-create does.

    bwrap cannot create it in a read-only root. Each step is made inside root by hand,
    and a symlink on the way is refused: following one would create it on the host.
    """
    current = root
    parts = [part for part in dst.split("/") if part]
    for index, part in enumerate(parts):
        current = current / part
        if current.is_symlink():
            raise StandinError(
                f"--mounts: {dst} passes through a symlink in the image ({current.relative_to(root)}); "
                "mount it at another path",
                exitcodes.USAGE,
            )
        if current.exists():
            continue
        last = index == len(parts) - 1
        with contextlib.suppress(FileExistsError):
            if last and is_file:
                current.touch(exist_ok=True)
            else:
                current.mkdir()


def _run_in(root: Path, mounts: list[tuple[str, str, bool]], command: list[str]) -> int:
    environment = root / "etc" / "environment"
    path = image_path_variable(environment.read_text() if environment.is_file() else "")
    env = container_env(dict(os.environ), path)
    home = os.environ.get("HOME", "")
    host_files = [p for p in HOST_FILES if os.path.isfile(p)]
    for src, _, _ in mounts:
        if not os.path.exists(src):
            raise StandinError(f"--mounts: source {src} does not exist on {os.uname().nodename}")
    targets = [(dst, os.path.isfile(src)) for src, dst, _ in mounts] + [
        (p, True) for p in host_files
    ]
    for dst, is_file in targets:
        if not under(dst, list(private_dirs(home))):
            _mount_point(root, dst, is_file=is_file)

    target: dict[str, int | None] = {"pid": None}
    pending: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if target["pid"] is None:
            pending.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(target["pid"], signum)

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)

    read_fd, write_fd = os.pipe()
    argv = bwrap_argv(
        str(root),
        mounts,
        cwd=inside_cwd(os.getcwd(), mounts),
        home=home,
        host_files=host_files,
        info_fd=write_fd,
        command=command,
    )
    try:
        proc = subprocess.Popen(argv, pass_fds=(write_fd,), env=env)
    except FileNotFoundError:
        raise StandinError("bwrap not found; install bubblewrap to use the stand-in") from None
    finally:
        os.close(write_fd)
    # Until bwrap reports the command's pid, a signal can only go to bwrap itself.
    target["pid"] = _child_pid(read_fd) or proc.pid
    os.close(read_fd)
    for held in pending:
        forward(held, None)
    return exit_status(proc.wait())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nvrx_appliance.image.standin",
        description="TEST STAND-IN for pyxis+enroot: run CMD inside an appliance .sqsh.",
    )
    sub = parser.add_subparsers(dest="verb", required=True)
    run_parser = sub.add_parser("run", help="run CMD inside the image")
    run_parser.add_argument("--image", required=True, type=Path)
    run_parser.add_argument("--mounts", default="", help="SRC[:DST[:ro]][,..] (pyxis syntax)")
    run_parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        if not command:
            raise StandinError("no command given; put it after --", exitcodes.USAGE)
        return run(args.image, parse_mounts(args.mounts), command)
    except StandinError as exc:
        # Into the job's output, beside the entrypoint's lines: stamped as they are.
        print(f"{log_stamp()} nvrx-standin: {exc}", file=sys.stderr)
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
