"""Every directory the appliance creates is owner-only, whatever the umask.

Under a group-writable umask (002, common on shared clusters) the work dir's
subdirectories were created 0775: a member of the group could plant a checkpoint that
torch loads with pickle (code run as the job's user), or swap the control directory for
a symlink the batch script follows.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from pathlib import Path

import pytest

from nvrx_appliance import manifest
from nvrx_appliance.chain import render, submit
from nvrx_appliance.node import rendezvous
from nvrx_appliance.node.identity import Node
from nvrx_appliance.settings.chain import ChainSpec
from tests.unit import test_teardown as generation


@contextlib.contextmanager
def umask(mask: int):
    before = os.umask(mask)
    try:
        yield
    finally:
        os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def dirs_under(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): mode(p) for p in [root, *root.rglob("*")] if p.is_dir()}


def test_submit_and_the_entrypoint_create_every_directory_0700_under_umask_002(tmp_path):
    work = tmp_path / "runs" / "gpt"  # runs/ does not exist yet either
    m = manifest.build(
        ChainSpec(work_dir=str(work), workload="cpu", runtime="bare"), created="c", user="a"
    )
    plan = submit.Plan(
        manifest=m,
        script=render.render(m, template=submit.template_text()),
        script_path=m.layout.sbatch("nvrx-chain"),
        sbatch_args=[],
        warnings=(),
    )
    with umask(0o002):
        submit.write(plan)
        rendezvous.make_dirs(m, Node("700", 0, 0, "700", "task0"))
        rendezvous.make_dirs(m, Node("700", 2, 0, "702", "node3"))
    created = dirs_under(tmp_path / "runs")
    wanted = {"gpt/nvrx/700/control", "gpt/nvrx/700/cycle_infos", "gpt/checkpoints", "gpt/logs"}
    assert wanted <= set(created)
    assert created == dict.fromkeys(created, 0o700)


def test_task_0s_teardown_creates_the_control_dir_0700_under_umask_002(tmp_path):
    # Task 0 may die before its entrypoint made the directory: the trap makes it.
    script, work, env = generation._prepare(tmp_path, srun_exit=1)
    done = subprocess.run(
        ["bash", "-c", 'umask 002 && exec bash "$0"', str(script)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert (work / "nvrx/500/control/closed").is_file()
    assert (mode(work / "nvrx"), mode(work / "nvrx/500"), mode(work / "nvrx/500/control")) == (
        0o700,
        0o700,
        0o700,
    )


@pytest.mark.parametrize("role", ["task 0", "peer"])
def test_a_control_dir_swapped_for_a_symlink_is_neither_written_through_nor_read(tmp_path, role):
    script, work, env = generation._prepare(tmp_path, srun_exit=1)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    # A closed flag of this very generation, where the symlink points.
    (elsewhere / "closed").write_text("generation=chain-1/500/\n")
    (work / "nvrx" / "500").mkdir(parents=True, mode=0o700)
    (work / "nvrx" / "500" / "control").symlink_to(elsewhere)
    if role == "peer":
        env = env | {"SLURM_ARRAY_TASK_ID": "2", "SLURM_JOB_ID": "502"}
    done = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    calls = (tmp_path / "calls").read_text().splitlines()
    if role == "task 0":
        assert "not writing the closed flag" in done.stderr and "is a symlink" in done.stderr
        assert (elsewhere / "closed").read_text() == "generation=chain-1/500/\n"
        assert sorted(p.name for p in elsewhere.iterdir()) == ["closed"]
    else:
        # The planted flag did not send it away: the entrypoint judges the directory.
        assert any(call.startswith("srun ") for call in calls), done.stdout
