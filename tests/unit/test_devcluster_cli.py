"""`nvrx-appliance cluster` refuses, with exit 2 and nothing changed, where it cannot run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvrx_appliance.devcluster.plan import DEFAULT_ROOT, debian_like

CLI = str(Path(sys.executable).parent / "nvrx-appliance")


def as_another_user() -> list[str]:
    # Run as root (CI, the dev machine), a fresh user namespace makes the command run as
    # nobody (uid 65534) while it can still read the root-owned venv; run as a user, the
    # command is already not root.
    return ["unshare", "--user"] if os.geteuid() == 0 else []


def machine_snapshot() -> tuple:
    return (Path("/etc/hosts").read_text(), DEFAULT_ROOT.exists(), sorted(os.listdir("/run")))


@pytest.mark.parametrize(
    "args", [["up"], ["down"], ["kill-node", "node1"], ["revive-node", "node1"]]
)
def test_without_root_every_changing_command_refuses_and_changes_nothing(args):
    before = machine_snapshot()
    done = subprocess.run(
        [*as_another_user(), CLI, "cluster", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert done.returncode == 2, done.stderr
    assert "needs root" in done.stderr and "sudo" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert machine_snapshot() == before


DEBIAN_12 = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n'
DEBIAN_13 = 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nID=debian\nVERSION_ID="13"\n'
UBUNTU = 'NAME="Ubuntu"\nID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\n'
MINT = 'NAME="Linux Mint"\nID=linuxmint\nID_LIKE="ubuntu debian"\n'
FEDORA = 'NAME="Fedora Linux"\nID=fedora\nVERSION_ID=40\n'
ROCKY = 'NAME="Rocky Linux"\nID="rocky"\nID_LIKE="rhel centos fedora"\n'


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        (DEBIAN_12, True),
        (DEBIAN_13, True),
        (UBUNTU, True),
        (MINT, True),
        (FEDORA, False),
        (ROCKY, False),
        ("", False),
        ("# ID=debian\n", False),
    ],
)
def test_only_debian_and_its_derivatives_are_accepted(text, ok):
    assert debian_like(text) is ok
