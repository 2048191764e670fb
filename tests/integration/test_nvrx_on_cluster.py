"""Real NVRx ft_launcher 0.7.0 across two nodes of the local cluster (issue 2): the
rendezvous is hosted on the first node's hostname, a rank that fails once is answered
by an in-job restart, and the cycle-info files carry the Slurm job id."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from .conftest import Cluster

pytestmark = pytest.mark.cluster

WORKLOAD = Path(__file__).with_name("gloo_workload.py")
# The venv's launcher, beside the interpreter running these tests: the nodes share
# this machine's file system, so the same path works on every node (bare metal). It
# starts the workload with its own interpreter, the same venv's.
FT_LAUNCHER = Path(sys.executable).parent / "ft_launcher"

SBATCH = """#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --no-requeue
# ft_launcher on each node; the node listed first hosts the rendezvous store, found by
# its hostname, which is what every process in that node's namespace calls itself.
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun {ft_launcher} --nnodes=2 --nproc-per-node=1 \\
  --rdzv-backend=c10d --rdzv-endpoint="$first:29500" --rdzv-id="$SLURM_JOB_ID" \\
  --max-restarts=3 --monitor-interval=1 --ft-cycle-info-dir={cycle_infos} \\
  {workload} {records} 1
"""


def hostnames(cluster: Cluster, hostlist: str) -> set[str]:
    return set(cluster.slurm("scontrol", "show", "hostnames", hostlist).stdout.split())


def test_ft_launcher_restarts_a_failed_rank_in_job_and_writes_cycle_infos(cluster: Cluster):
    work = cluster.workdir("nvrx")
    records, cycle_infos = work / "records", work / "cycle_infos"
    records.mkdir()
    cycle_infos.mkdir()
    script = work / "ft.sbatch"
    script.write_text(
        SBATCH.format(
            ft_launcher=FT_LAUNCHER,
            cycle_infos=cycle_infos,
            workload=WORKLOAD,
            records=records,
        )
    )
    job = cluster.sbatch("--job-name", "nvrx-two-nodes", "-o", f"{work}/job.out", str(script))
    [record] = cluster.wait_finished(job, 1, timeout=240)
    log = (work / "job.out").read_text(errors="replace")
    assert (record["State"], record["ExitCode"]) == ("COMPLETED", "0:0"), log[-3000:]
    nodes = hostnames(cluster, record["NodeList"])
    assert len(nodes) == 2

    # rank 1 failed in cycle 0; ft_launcher restarted the workers in the same job and
    # both ranks completed in cycle 1, one on each node, each seeing its node's name
    fault = json.loads((records / "fault.0.json").read_text())
    assert fault["rank"] == 1 and fault["slurm_job_id"] == job
    done = [json.loads(p.read_text()) for p in sorted(records.glob("done.*.json"))]
    assert {(d["cycle"], d["rank"]) for d in done} == {(1, 0), (1, 1)}
    assert {d["host"] for d in done} == nodes
    assert all(d["world"] == 2 and d["total"] == 2.0 * 3 for d in done)

    # the rendezvous host wrote one cycle-info file per cycle, named by the Slurm job id
    names = sorted(p.name for p in cycle_infos.iterdir())
    assert f"cycle_info.{job}.0.0" in names and f"cycle_info.{job}.0.1" in names, names
    assert f"cycle_info.{job}.current" in names
    cycles = [json.loads((cycle_infos / f"cycle_info.{job}.0.{n}").read_text()) for n in (0, 1)]
    assert [c["job_id"] for c in cycles] == [job, job]
    assert [c["cycle_number"] for c in cycles] == [0, 1]
    assert hostnames(cluster, cycles[1]["active_nodes"]) == nodes  # hostlist, e.g. node[1-2]
