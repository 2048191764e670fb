"""A submit is all or nothing: an sbatch that fails, times out or is interrupted midway
leaves nothing queued and says so, and two submits of one chain name never both queue.

Slurm's commands are a stand-in here (slurm_standin.py: a queue in a file), since a real
cluster cannot be made to fail or hang an sbatch on demand; real submission is covered
by tests/integration/test_chain_* and test_cli_cluster.py.
"""

from __future__ import annotations

import json
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nvrx_appliance import manifest
from nvrx_appliance.chain import job_control, render, submit
from nvrx_appliance.devcluster.poll import wait_until
from nvrx_appliance.settings.chain import ChainSpec

from .slurm_standin import STANDIN_USER, SlurmStandin

CLI = str(Path(sys.executable).parent / "nvrx-appliance")
USER = STANDIN_USER


def make_plan(
    work_dir: Path, depth: int = 3, force: bool = False, job_name: str = "nvrx-chain"
) -> submit.Plan:
    spec = ChainSpec(work_dir=str(work_dir), workload="cpu", runtime="bare", job_name=job_name,
                     python="/opt/venv/bin/python", depth=depth)  # fmt: skip
    m = manifest.build(spec, created="c", user=USER)
    return submit.Plan(
        manifest=m, script="#!/bin/bash\n", script_path=m.layout.sbatch(spec.job_name),
        sbatch_args=render.sbatch_args(m), warnings=(), force=force,
    )  # fmt: skip


def test_a_failure_after_two_generations_cancels_both_and_says_so(slurm, tmp_path):
    slurm.steer(fail_from=3)
    p = make_plan(tmp_path / "run")
    with pytest.raises(submit.SubmitFailed) as caught:
        submit.submit(p)
    message = str(caught.value)
    assert "after queueing 2 of 3 generations" in message
    assert "QOSMaxSubmitJobPerUserLimit" in message
    assert "cancelled 101, 102, so nothing is queued" in message
    assert slurm.calls("scancel")[-1] == "scancel 101 102"
    assert slurm.live() == []
    # The marker says "a chain is expected to live": it must not survive the failure.
    assert not p.manifest.layout.chain_marker.exists()
    assert not p.manifest.layout.submitted.exists()


def test_a_chain_let_into_a_completed_work_dir_is_not_ended_by_the_old_marker(slurm, tmp_path):
    # submit refuses such a chain unless it trains longer or --force (test_submit_validation);
    # once let through, the earlier chain's training-done marker must not end it at once.
    p = make_plan(tmp_path / "run")
    done = p.manifest.layout.training_done
    done.parent.mkdir(parents=True)
    done.write_text("200\n")
    submit.submit(p)
    assert not done.exists()


def test_a_failure_on_the_first_sbatch_cancels_nothing(slurm, tmp_path):
    slurm.steer(fail_from=1)
    with pytest.raises(submit.SubmitFailed, match="nothing was queued"):
        submit.submit(make_plan(tmp_path / "run"))
    assert slurm.calls("scancel") == []


def test_a_full_submission_records_every_job_id(slurm, tmp_path):
    p = make_plan(tmp_path / "run")
    done = submit.submit(p)
    assert done.job_ids == ["101", "102", "103"] == slurm.live()
    assert json.loads(p.manifest.layout.submitted.read_text())["job_ids"] == done.job_ids
    assert p.manifest.layout.chain_marker.exists()
    assert p.manifest.layout.run_json.exists() and p.script_path.exists()


def test_the_work_dir_and_what_submit_writes_there_are_owner_only(slurm, tmp_path):
    p = make_plan(tmp_path / "run")
    submit.write(p)
    layout = p.manifest.layout
    modes = {
        path.name: stat.S_IMODE(path.stat().st_mode)
        for path in (layout.work_dir, layout.run_json, p.script_path, layout.chain_marker)
    }
    assert all(mode & 0o077 == 0 for mode in modes.values()), modes


def test_an_sbatch_that_timed_out_after_queueing_has_its_job_found_and_cancelled(
    slurm, tmp_path, monkeypatch
):
    # The job reached the controller; its id never came back to submit.
    slurm.steer(hang_at=2, hang_after_queueing="")
    monkeypatch.setattr(job_control, "SBATCH_TIMEOUT_S", 1.0)
    p = make_plan(tmp_path / "run")
    with pytest.raises(submit.SubmitFailed) as caught:
        submit.submit(p)
    message = str(caught.value)
    assert "did not answer within 1s" in message
    assert "cancelled 101 (and 102, which the unanswered sbatch queued), so nothing" in message
    assert slurm.live() == []
    assert not p.manifest.layout.chain_marker.exists()


def test_a_job_of_the_same_name_that_was_live_before_a_forced_submit_is_never_cancelled(
    slurm, tmp_path, monkeypatch
):
    older = submit.submit(make_plan(tmp_path / "other", depth=1))  # job 101, same name
    slurm.steer(hang_at=3, hang_after_queueing="")
    monkeypatch.setattr(job_control, "SBATCH_TIMEOUT_S", 1.0)
    with pytest.raises(submit.SubmitFailed):
        submit.submit(make_plan(tmp_path / "other", depth=3, force=True))
    assert slurm.live() == older.job_ids


# ---- as a person runs it: the CLI, interrupted, and two submits at once ----


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    # Not under /tmp: submit refuses node-local work dirs.
    folder = Path(tempfile.mkdtemp(prefix="nvrx-submit-test-", dir=Path.home()))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Running:
    """`nvrx-appliance submit` as a person types it; its stderr goes to a file, so a test
    can read it while the submit runs."""

    proc: subprocess.Popen
    stderr: Path

    def err(self) -> str:
        return self.stderr.read_text()

    def finish(self) -> tuple[int, str]:
        self.proc.communicate(timeout=60)
        return self.proc.returncode, self.err()


def start_submit(slurm: SlurmStandin, work: Path, name: str) -> Running:
    argv = [CLI, "submit", "--work-dir", str(work), "--job-name", name, "--workload", "cpu",
            "--runtime", "bare", "--python", sys.executable, "--depth", "3"]  # fmt: skip
    stderr = slurm.root / f"stderr-{work.name}"
    with stderr.open("w") as err:
        proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=_as_a_foreground_job
        )
        return Running(proc, stderr)


def _as_a_foreground_job() -> None:
    """Ctrl-C's signal at its default, as a person's shell leaves it: a suite started in
    the background (`&` without job control, `nohup`) inherits SIGINT ignored, and so
    would the submit, which Python then never interrupts (the SIGINT case failed so)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(
    ("signum", "exit_code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]
)
def test_a_submit_interrupted_during_an_sbatch_leaves_nothing_queued(
    slurm, shared_dir, signum, exit_code
):
    slurm.steer(hang_at=2, hang_after_queueing="")
    work = shared_dir / "run"
    proc = start_submit(slurm, work, "interrupted")
    wait_until(lambda: (slurm.root / "hanging").exists(), 60, "the second sbatch to hang", 0.05)
    proc.proc.send_signal(signum)
    code, err = proc.finish()
    assert code == exit_code, err
    assert "Traceback" not in err
    assert f"{signal.Signals(signum).name} after queueing 1 of 3 generations" in err
    assert "cancelled 101 (and 102, which the unanswered sbatch queued)" in err
    assert slurm.live() == []
    assert not (work / "chain.active").exists() and not (work / "submitted.json").exists()


def test_two_submits_of_one_name_into_different_work_dirs_queue_one_chain(slurm, shared_dir):
    # The first submit's first sbatch waits until released: the second submit must wait
    # for it rather than check the name meanwhile.
    slurm.steer(hang_at=1)
    first = start_submit(slurm, shared_dir / "a", "shared-name")
    wait_until(lambda: (slurm.root / "hanging").exists(), 60, "the first submit's sbatch", 0.05)
    second = start_submit(slurm, shared_dir / "b", "shared-name")
    wait_until(lambda: "waiting for another submit" in second.err(), 60, "the wait", 0.05)
    slurm.steer(release="")
    code1, err1 = first.finish()
    code2, err2 = second.finish()
    assert code1 == 0, err1
    assert code2 == 2, err2
    assert "waiting for another submit of chain 'shared-name'" in err2
    assert "'shared-name' is used by your queued or running job(s) 101" in err2
    assert [j["work_dir"] for j in slurm.jobs()] == [str(shared_dir / "a")] * 3
    assert not (shared_dir / "b" / "chain.active").exists()
