"""Nothing half-done: an sbatch that fails midway leaves nothing queued and says so.

Slurm's sbatch and scancel are replaced by stand-ins on PATH (shell scripts that
record their argv): the rollback is what is under test; real submission is covered by
tests/integration/test_chain_*.
"""

import json
import stat

import pytest

from nvrx_appliance import manifest
from nvrx_appliance.settings.chain import ChainSpec
from nvrx_appliance.slurm import render, submit

SBATCH = """#!/bin/sh
# stand-in for sbatch: the first {ok} calls print a job id, later ones fail like Slurm
echo "sbatch $*" >> "{log}"
n=$(grep -c '^sbatch' "{log}")
if [ "$n" -le {ok} ]; then echo "$((100 + n))"; exit 0; fi
echo "sbatch: error: QOSMaxSubmitJobPerUserLimit" >&2
exit 1
"""
SCANCEL = """#!/bin/sh
# stand-in for scancel: records its argv
echo "scancel $*" >> "{log}"
"""


@pytest.fixture
def plan(tmp_path, monkeypatch):
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.delenv("SLURM_CONF", raising=False)

    def make(ok: int) -> submit.Plan:
        for name, text in (("sbatch", SBATCH), ("scancel", SCANCEL)):
            (bin_dir / name).write_text(text.format(ok=ok, log=log))
            (bin_dir / name).chmod(0o755)
        spec = ChainSpec(work_dir=str(tmp_path / "run"), workload="cpu", runtime="bare",
                         python="/opt/venv/bin/python", depth=3)  # fmt: skip
        m = manifest.build(spec, created="c", user="alice")
        return submit.Plan(
            manifest=m, script="#!/bin/bash\n", script_path=m.layout.sbatch(spec.job_name),
            sbatch_args=render.sbatch_args(m), warnings=(),
        )  # fmt: skip

    return make, log


def test_a_failure_after_two_generations_cancels_both_and_says_so(plan):
    make, log = plan
    p = make(ok=2)
    with pytest.raises(submit.SubmitFailed) as caught:
        submit.submit(p)
    message = str(caught.value)
    assert "after queueing 2 of 3 generations" in message
    assert "QOSMaxSubmitJobPerUserLimit" in message
    assert "cancelled 101, 102, so nothing is queued" in message
    assert log.read_text().splitlines()[-1] == "scancel 101 102"
    # The marker says "a chain is expected to live": it must not survive the failure.
    assert not p.manifest.layout.chain_marker.exists()
    assert not p.manifest.layout.submitted.exists()


def test_a_failure_on_the_first_sbatch_cancels_nothing(plan):
    make, log = plan
    with pytest.raises(submit.SubmitFailed, match="nothing was queued"):
        submit.submit(make(ok=0))
    assert "scancel" not in log.read_text()


def test_a_full_submission_records_every_job_id(plan):
    make, _ = plan
    p = make(ok=3)
    done = submit.submit(p)
    assert done.job_ids == ["101", "102", "103"]
    assert json.loads(p.manifest.layout.submitted.read_text())["job_ids"] == done.job_ids
    assert p.manifest.layout.chain_marker.exists()
    assert p.manifest.layout.run_json.exists() and p.script_path.exists()


def test_the_work_dir_and_what_submit_writes_there_are_owner_only(plan, tmp_path):
    make, _log = plan
    p = make(ok=3)
    submit.write(p)
    layout = p.manifest.layout
    modes = {
        path.name: stat.S_IMODE(path.stat().st_mode)
        for path in (layout.work_dir, layout.run_json, p.script_path, layout.chain_marker)
    }
    assert all(mode & 0o077 == 0 for mode in modes.values()), modes
