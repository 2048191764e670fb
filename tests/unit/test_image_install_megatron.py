"""install-megatron.sh, run for real: pip installs a megatron-core wheel, git fetches a
commit from a repository, and the two must be one release.

The repository is a local bare clone and the wheel a local file (no code host is
reachable from CI); both are built here with the layout the real ones have.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "nvrx_appliance" / "image" / "install-megatron.sh"


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def package_info(version: str) -> str:
    major, minor, patch = version.split(".")
    return f"MAJOR = {major}\nMINOR = {minor}\nPATCH = {patch}\nPRE_RELEASE = ''\n"


def megatron_lm(tmp_path: Path, version: str, *, injector: bool = True) -> tuple[str, str]:
    """A bare repository with one Megatron-LM-shaped commit; (its URL, the commit)."""
    work = tmp_path / f"src-{version}-{injector}"
    (work / "megatron" / "core").mkdir(parents=True)
    (work / "pretrain_gpt.py").write_text("print('pretrain')\n")
    (work / "megatron" / "core" / "package_info.py").write_text(package_info(version))
    if injector:
        (work / "megatron" / "core" / "fault_injector.py").write_text("# injector\n")
    git("init", "-q", cwd=work)
    git("add", "-A", cwd=work)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "release", cwd=work)
    commit = git("rev-parse", "HEAD", cwd=work)
    bare = tmp_path / f"mlm-{version}-{injector}.git"
    git("clone", "-q", "--bare", str(work), str(bare), cwd=tmp_path)
    # GitHub serves any reachable commit by id; a local bare repository must be told to.
    git("config", "uploadpack.allowAnySHA1InWant", "true", cwd=bare)
    return f"file://{bare}", commit


def wheel(directory: Path, version: str) -> Path:
    """A minimal megatron-core wheel whose package says `version`."""
    directory.mkdir(exist_ok=True)
    dist = f"megatron_core-{version}.dist-info"
    files = {
        "megatron/core/package_info.py": package_info(version),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: megatron-core\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def record_line(name: str, text: str) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        return f"{name},sha256={digest.decode()},{len(text.encode())}"

    record = "\n".join(record_line(n, t) for n, t in files.items()) + f"\n{dist}/RECORD,,\n"
    path = directory / f"megatron_core-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in {**files, f"{dist}/RECORD": record}.items():
            archive.writestr(name, text)
    return path


@pytest.fixture(scope="module")
def python(tmp_path_factory) -> str:
    """A fresh environment to install into (the script installs with pip)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    return str(venv / "bin" / "python")


def install(tmp_path: Path, python: str, version: str, repository: str, commit: str):
    wheels = tmp_path / "wheels"
    wheel(wheels, "0.19.0")
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("")
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    env.pop("PIP_CONSTRAINT", None)
    checkout = tmp_path / "megatron-lm"
    done = subprocess.run(
        ["bash", str(SCRIPT), python, version, repository, commit, str(checkout), str(constraints)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    return done, checkout


def test_one_release_installs_the_package_and_checks_out_the_source(tmp_path, python):
    repository, commit = megatron_lm(tmp_path, "0.19.0")
    done, checkout = install(tmp_path, python, "0.19.0", repository, commit)
    assert done.returncode == 0, done.stderr
    assert git("rev-parse", "HEAD", cwd=checkout) == commit
    assert (checkout / "pretrain_gpt.py").is_file()
    version = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('megatron-core'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert version == "0.19.0"


def test_source_of_another_release_fails_the_build_naming_both(tmp_path, python):
    # The shape of the real trap: the tag core_v0.19.0 points at the 0.19.1 version bump.
    repository, commit = megatron_lm(tmp_path, "0.19.1")
    done, _ = install(tmp_path, python, "0.19.0", repository, commit)
    assert done.returncode == 1
    assert "is release 0.19.1, but megatron-core is pinned at 0.19.0" in done.stderr


def test_a_commit_the_repository_does_not_have_fails_the_build(tmp_path, python):
    repository, _ = megatron_lm(tmp_path, "0.19.0")
    done, _ = install(
        tmp_path, python, "0.19.0", repository, "36731acc3f0dac859ee7369bdc3a6af58bac546c"
    )
    assert done.returncode == 1
    assert "cannot fetch Megatron-LM commit 36731acc" in done.stderr


def test_a_source_without_the_fault_injector_fails_the_build(tmp_path, python):
    repository, commit = megatron_lm(tmp_path, "0.19.0", injector=False)
    done, _ = install(tmp_path, python, "0.19.0", repository, commit)
    assert done.returncode == 1
    assert "lacks the fault injector" in done.stderr


def test_a_package_version_nobody_publishes_fails_the_build(tmp_path, python):
    repository, commit = megatron_lm(tmp_path, "0.19.0")
    done, _ = install(tmp_path, python, "0.99.0", repository, commit)
    assert done.returncode != 0
    assert "megatron-core==0.99.0" in done.stderr
