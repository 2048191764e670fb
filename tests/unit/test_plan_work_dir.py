"""`plan --work-dir` reads the chain from its own files and never asks Slurm, however
slow or down Slurm is; bad options are refused before any chain is read (issue 54,
item 8)."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from nvrx_appliance.cli.main import cli
from nvrx_appliance.goodput import gather
from nvrx_appliance.goodput.account import Inputs
from nvrx_appliance.observe.times import parse_time
from nvrx_appliance.observe.types import Cycle
from tests.unit.test_goodput_inputs import _chain


@pytest.fixture
def slurm_that_hangs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """sacct, squeue and scontrol on PATH that write down each call and then hang: any
    call at all would show, and cost the 30 s a slow controller costs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for tool in ("sacct", "squeue", "scontrol", "sinfo"):
        path = bin_dir / tool
        path.write_text(f'#!/bin/sh\necho "{tool} $@" >> {calls}\nsleep 30\nexit 1\n')
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    return calls


def test_a_work_dir_is_planned_from_its_files_without_a_slurm_call(tmp_path, slurm_that_hangs):
    work = _chain(tmp_path / "run")
    started = time.monotonic()
    result = CliRunner().invoke(
        cli, ["plan", "--work-dir", str(work), "--nodes", "2", "--days", "1", "--seeds", "2",
              "--json"]
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started < 10
    assert not slurm_that_hangs.exists(), slurm_that_hangs.read_text()
    doc = json.loads(result.output)
    assert "chain chain's history" in doc["rates_source"]
    assert doc["rates_per_1000_node_days"]["rank_crash"] > 0  # its in-job restart, counted


def test_a_bad_option_is_refused_before_the_chain_is_read(tmp_path, slurm_that_hangs):
    result = CliRunner().invoke(cli, ["plan", "--nodes", "0", "--from-chain", "somechain"])
    assert result.exit_code == 2
    assert "--nodes 0: the nodes that train" in result.output
    assert not slurm_that_hangs.exists()


def test_an_unreadable_run_manifest_never_gets_its_path_offered_as_a_chain_name(tmp_path):
    work = _chain(tmp_path / "run")
    (work / "run.json").write_text("{ not json")
    result = CliRunner().invoke(cli, ["plan", "--work-dir", str(work)])
    assert result.exit_code == 2
    assert f"cancel {work}" not in result.output
    assert "`nvrx-appliance cancel NAME` (its job name in squeue) still ends the chain" in (
        result.output
    )


def test_without_slurm_each_generation_holds_its_cycles_nodes_from_its_ledger_times():
    work = Path("/nowhere")
    cycles = {
        "10": [Cycle("10", 0, 0, 100.0, 150.0, "node[1-2]", "node3"),
               Cycle("10", 0, 1, 160.0, 190.0, "node[1,3]")],
        "11": [Cycle("11", 0, 0, 230.0, None, "node[2-3]")],
    }  # fmt: skip
    ledger = [{"array_job_id": "10", "task0_node": "node1", "start": "2026-12-06T00:01:30Z",
               "end": "2026-12-06T00:03:20Z"}]  # fmt: skip
    inputs = Inputs("chain", str(work), 500.0, None, cycles=cycles, ledger=ledger)
    held = gather.held_from_files(inputs)
    first = [a for a in held if a.generation == "10"]
    assert [a.nodes[0] for a in first] == ["node1", "node2", "node3"]  # task 0's first
    assert [a.task for a in first] == [0, 1, 2]
    began, ended = parse_time("2026-12-06T00:01:30Z"), parse_time("2026-12-06T00:03:20Z")
    assert {(a.start, a.end) for a in first} == {(began, ended)}
    # No ledger line yet: its cycles' times.
    assert {(a.nodes[0], a.start, a.end) for a in held if a.generation == "11"} == {
        ("node2", 230.0, 230.0),
        ("node3", 230.0, 230.0),
    }
