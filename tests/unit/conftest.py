"""Fixtures shared by unit test modules."""

from __future__ import annotations

from pathlib import Path

import pytest

from .slurm_standin import STANDIN_USER, SlurmStandin


@pytest.fixture(autouse=True)
def _no_inherited_terminal_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands a test runs print as through a pipe, whoever runs the suite:
    pytest-xdist's workers (make test) inherit COLUMNS=80 and LINES=24 from execnet, which
    would fold status's tables at 80 columns. A test that wants a width sets its own."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SlurmStandin:
    """Slurm's commands as the file-backed stand-in (slurm_standin.py), first on PATH,
    with no real cluster reachable, for STANDIN_USER."""
    standin = SlurmStandin(tmp_path / "slurm", STANDIN_USER)
    monkeypatch.setenv("PATH", f"{standin.bin}:/usr/bin:/bin")
    monkeypatch.setenv("USER", STANDIN_USER)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    return standin
