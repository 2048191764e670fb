"""`nvrx-appliance demo`, which is also b) by the GPU-failure injector and g): a workload
fault restarts the first generation in place, the injector then fails task 0's node
before cycle 1, and the next generation resumes from the last completed checkpoint
although the first one's closed flag and rendezvous record are still there."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET

import pytest

from nvrx_appliance.workflows import demo

from .chain_support import ledger, logs_on_failure, progress, squeue_ids, state, tasks
from .conftest import Cluster

pytestmark = pytest.mark.cluster


def test_the_demo_hands_off_and_reports_the_resume_point(cluster: Cluster, tmp_path):
    said: list[str] = []
    outcome = demo.run(say=said.append)
    work, (first, second) = outcome.work_dir, outcome.job_ids
    text = "\n".join(said)

    assert outcome.report.resumed_ok, text + logs_on_failure(work)
    entries = {e["array_job_id"]: e for e in ledger(work)}
    left = entries[first]["checkpoint_iteration"]
    assert f"resumed at iteration {left} = last completed checkpoint" in text
    # Slurm: both generations ran, one after the other, and nothing is left queued.
    assert state(tasks(cluster, first)[0]) in ("FAILED", "COMPLETED")
    assert tasks(cluster, second)[0]["Start"] >= tasks(cluster, first)[0]["End"]
    assert squeue_ids(cluster, outcome.job_name) == []
    # Disk: the fault came first, in cycle 0 of the first generation; the successor's
    # first iteration is the tracker value the first generation left (> 0).
    faults = [e for e in progress(work) if e["event"] == "fault"]
    assert faults and faults[0]["cycle"] == 0
    [start] = [
        e for e in progress(work)
        if e["event"] == "start" and e["slurm_array_job_id"] == second
    ]  # fmt: skip
    assert start["iteration"] == left > 0 and start["cycle"] == 0
    assert entries[first]["action"] == "released_spares"
    control = work / "nvrx" / first / "control"
    assert (control / "closed").exists() and (control / "rdzv.json").exists()
    # The report ends with the goodput lines, and the picture opens.
    assert f"Goodput of chain {outcome.job_name}: " in text
    assert f"picture: {work / 'goodput.svg'}" in text
    ET.parse(work / "goodput.svg")
    # Kept with pytest's temporary files (the work dir goes with the cluster): the
    # docs/operating.md's picture is one of these.
    shutil.copy(work / "goodput.svg", tmp_path / f"{outcome.job_name}.svg")
