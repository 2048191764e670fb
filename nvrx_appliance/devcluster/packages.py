"""The Debian packages the cluster runs on, installed when missing (shell: dpkg, apt-get).

The same names appear in scripts/install-system-deps.sh, which installs everything the
project needs; this is the cluster's own share, so `cluster up` works from a plain
`pip install` too.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

PACKAGES = (
    "slurm-wlm",
    "slurmdbd",
    "slurm-client",
    "munge",
    "mariadb-server",
    "iproute2",
    "procps",
    "util-linux",
)

# Debian starts a service as its package is installed unless this says no; the
# cluster starts its own daemons, with its own configuration, in its namespaces.
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")


class InstallError(RuntimeError):
    pass


def missing(packages: tuple[str, ...] = PACKAGES) -> list[str]:
    absent = []
    for name in packages:
        status = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True
        ).stdout
        if "install ok installed" not in status:
            absent.append(name)
    return absent


def install(names: list[str], say: Callable[[str], None]) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    say("apt-get update")
    _apt(["apt-get", "update", "-qq"], env)
    say(f"apt-get install {' '.join(names)} (a minute or two on a fresh machine)")
    ours = not POLICY_RC_D.exists()
    if ours:
        POLICY_RC_D.write_text(
            "#!/bin/sh\n# nvrx-appliance: no service starts on install\nexit 101\n"
        )
        POLICY_RC_D.chmod(0o755)
    try:
        _apt(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *names], env)
    finally:
        if ours:
            POLICY_RC_D.unlink(missing_ok=True)


def _apt(argv: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise InstallError(f"{' '.join(argv[:2])} failed (exit {done.returncode}):\n{tail}")
