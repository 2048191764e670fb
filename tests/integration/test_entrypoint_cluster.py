"""nvrx-entrypoint on the local Slurm cluster, under a minimal sbatch of its own.

The production sbatch (nvrx_appliance/chain/generation.sbatch.tmpl) adds task 0's
teardown trap; these tests leave it out on purpose, so the closed flag and task 0's death are in the test's hands:
what is judged is the entrypoint alone, with real srun, ft_launcher 0.7.0 and the cpu
trainer.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from nvrx_appliance import exitcodes, manifest
from nvrx_appliance.layout import Layout
from nvrx_appliance.node import control, controldir
from nvrx_appliance.settings.chain import ChainSpec

from .conftest import Cluster

pytestmark = pytest.mark.cluster

ENTRYPOINT = Path(sys.executable).parent / "nvrx-entrypoint"
LEASE_STALE_S = 15
CHAIN = "2026-01-01T00:00:00Z"  # the chain id of every run.json written here
# How long after the flag (or after task 0's lease went stale) every other task must be gone.
DRAIN_BOUND_S = 10

SBATCH = """#!/bin/bash
#SBATCH --no-requeue --exclusive --nodes=1 --ntasks-per-node=1 --time=00:10:00
# No trap here: the tests decide when the generation is closed, or kill task 0 outright.
srun --label --ntasks=1 --ntasks-per-node=1 {entrypoint} --manifest {run_json}
rc=$?
echo "$rc" > {work}/srun-exit.$SLURM_ARRAY_TASK_ID
exit $rc
"""


def generation(cluster: Cluster, name: str, **settings) -> tuple[Path, Path]:
    """A work dir with run.json and the minimal sbatch; returns (work, sbatch)."""
    work = cluster.workdir(name)
    spec = ChainSpec(
        work_dir=str(work),
        job_name=name,
        workload="cpu",
        runtime="bare",
        python=sys.executable,
        gpus_per_node=2,
        segment="off",
        save_interval=5,
        setup_timeout=120,
        step_timeout=30,
        checkpointing_timeout=60,
        out_of_section_timeout=60,
        join_timeout=90,
        store_connect_wait=300,  # the reference design's drain bound, left as it is
        rdzv_host_wait=60,
        lease_stale_after=LEASE_STALE_S,
        **settings,
    )
    built = manifest.build(spec, created=CHAIN, user="root")
    run_json = manifest.save(built)
    script = work / "generation.sbatch"
    script.write_text(SBATCH.format(entrypoint=ENTRYPOINT, run_json=run_json, work=work))
    return work, script


def submit(cluster: Cluster, work: Path, script: Path, name: str, *flags: str) -> str:
    return cluster.sbatch(
        "--job-name", name, "--output", f"{work}/slurm-%A_%a.out", *flags, str(script)
    )


def unique(name: str) -> str:
    return f"ep-{name}-{uuid.uuid4().hex[:6]}"


def output(work: Path, array_job_id: str, task: int) -> str:
    path = work / f"slurm-{array_job_id}_{task}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def outputs(work: Path) -> str:
    return "\n".join(
        f"==== {p.name}\n{p.read_text(errors='replace')[-2500:]}"
        for p in sorted(work.glob("slurm-*.out"))
    )


def by_task(cluster: Cluster, array_job_id: str) -> dict[int, dict[str, str]]:
    return {
        int(r["JobID"].partition("_")[2]): r
        for r in cluster.sacct(array_job_id)
        if r["JobID"].partition("_")[2].isdigit()
    }


def progress(work: Path) -> list[dict]:
    path = work / "logs" / "progress.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def dialing(array_job_id: str) -> bool:
    """Is an ft_launcher of this generation running? (Nodes share this PID namespace.)

    Matched by its --rdzv-id, not by the id appearing anywhere: a fresh cluster's job ids
    are small numbers that any other ft_launcher's argv may hold (`--nnodes 1`)."""
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        pairs = itertools.pairwise(cmdline)
        if any("ft_launcher" in part for part in cmdline) and ("--rdzv-id", array_job_id) in pairs:
            return True
    return False


def test_exit_93_from_ft_launcher_comes_out_of_srun_as_93(cluster: Cluster):
    name = unique("93")
    work, script = generation(
        cluster, name, mode="no-restart", train_tasks=1, hot_spares=0, fault_delay=3
    )
    job = submit(cluster, work, script, name, "--array=0-0")
    [record] = cluster.wait_finished(job, 1, timeout=240)
    assert (work / "srun-exit.0").read_text().strip() == "93", outputs(work)
    assert record["ExitCode"] == "93:0"
    assert Layout(work).control_files(job).no_restart.exists()
    assert any(e["event"] == "fault" for e in progress(work))


def test_a_late_peer_dialing_a_dead_host_leaves_within_seconds_of_the_closed_flag(
    cluster: Cluster,
):
    # The race the reference design only bounds (store_connect_wait, 300 s): a cold
    # spare passes the gate just before task 0's trap writes the flag, then dials a
    # store that is gone. Here task 0 is played by the test: its record names a real
    # node where nothing listens, and its lease stays fresh.
    name = unique("race")
    dead_host = cluster.nodes[-1]
    work, script = generation(cluster, name, train_tasks=1, hot_spares=1)
    job = submit(cluster, work, script, name, "--array=1-1", "--hold", f"--exclude={dead_host}")
    control_dir = work / "nvrx" / job / "control"
    controldir.prepare(control_dir, os.geteuid())
    lease = controldir.LeaseKeeper(control_dir, 2, holder={"host": dead_host}, warn=print)
    lease.start()
    controldir.publish(
        control_dir,
        control.Record(
            host=dead_host,
            port=29500,
            segment=None,
            cluster_uuid=None,
            started="2026-01-01T00:00:00+00:00",
            array_job_id=job,
            task_id=0,
            job_id=job,
            generation=control.generation(CHAIN, job),
        ),
    )
    cluster.slurm("scontrol", "release", job)
    try:
        cluster.wait_until(lambda: dialing(job), 120, "the peer's ft_launcher to dial")
        time.sleep(2)  # deep in its store wait, as a spare that passed the gate long ago
        # As task 0's trap writes it: by rename, naming its generation (a flag that
        # names none is not obeyed).
        controldir.close(
            control_dir,
            {"generation": control.generation(CHAIN, job), "exit_code": 1, "reason": "test"},
        )
        flagged = time.monotonic()
        cluster.wait_until(
            lambda: (work / "srun-exit.1").exists(), DRAIN_BOUND_S + 5, "the peer to exit"
        )
        drained = time.monotonic() - flagged
        code = (work / "srun-exit.1").read_text().strip()
        assert code == str(exitcodes.STOPPED_BY_CLOSED_FLAG), output(work, job, 1)
        assert drained <= DRAIN_BOUND_S, f"drained in {drained:.1f} s"
        assert not dialing(job)
    finally:
        lease.stop()
        cluster.slurm("scancel", job, check=False)


def test_when_task_0_dies_hard_every_other_task_leaves_and_none_hosts_the_rendezvous(
    cluster: Cluster,
):
    # 2 training tasks + 1 hot spare on three nodes, 1 cold spare that can only be
    # placed on a node one of them leaves behind; task 0's is where the reference
    # design's spare hosted the store itself and trained on without task 0.
    name = unique("task0")
    spare_node = cluster.nodes[-1]
    work, script = generation(
        cluster, name, mode="train", train_tasks=2, hot_spares=1, cold_spares=1
    )
    job = submit(cluster, work, script, name, "--array=0-3%3", f"--exclude={spare_node}")
    try:
        cluster.wait_until(
            lambda: any(e["event"] == "checkpoint" for e in progress(work)),
            240,
            "the generation to train and checkpoint",
        )
        task0_node = by_task(cluster, job)[0]["NodeList"]
        cluster.slurm("scancel", "--signal=KILL", "--full", f"{job}_0")  # no trap, no flag
        killed_wall, killed = time.time(), time.monotonic()

        def all_done():
            tasks = by_task(cluster, job)
            finished = [
                t for t in tasks.values() if t["State"].split()[0] not in ("PENDING", "RUNNING")
            ]
            return tasks if len(tasks) == 4 and len(finished) == 4 else None

        tasks = cluster.wait_until(
            all_done, LEASE_STALE_S + DRAIN_BOUND_S + 30, "every task of the generation to end"
        )
        elapsed = time.monotonic() - killed
        assert elapsed <= LEASE_STALE_S + DRAIN_BOUND_S, (elapsed, outputs(work))
        # Every other task left, none of them with success or with NVRx's verdict.
        for task in (1, 2, 3):
            code = (work / f"srun-exit.{task}").read_text().strip()
            assert code not in ("0", str(exitcodes.NVRX_NO_RESTART)), (task, outputs(work))
        # The cold spare hosted nothing, wherever Slurm placed it. On task 0's old node
        # (where the reference design's spare hosted the store itself) it refuses to host;
        # on a node a peer left (which peers now free as fast as task 0's), it may even
        # dial the dead host while the lease is fresh, then leaves on the stale lease or
        # the closed flag.
        spare_log = output(work, job, 3)
        assert any(
            why in spare_log for why in ("refusing to host the rendezvous", "lease", "closed flag")
        ), spare_log
        if tasks[3]["NodeList"] == task0_node:
            assert "joins rendezvous" not in spare_log
        # Nothing trained after task 0 was gone: no new rendezvous round, no restart.
        assert not [e for e in progress(work) if e["event"] == "start" and e["time"] > killed_wall]
        cycle_infos = work / "nvrx" / job / "cycle_infos"
        assert all(p.stat().st_mtime <= killed_wall + 1 for p in cycle_infos.glob("cycle_info.*"))
    finally:
        cluster.slurm("scancel", job, check=False)


def task0_processes(array_job_id: str) -> list[psutil.Process]:
    """Every process of array task 0 but Slurm's own (nodes share this PID namespace)."""
    found = []
    for proc in psutil.process_iter(["name"]):
        try:
            environ = proc.environ()
        except psutil.Error:
            continue
        if (
            environ.get("SLURM_ARRAY_JOB_ID") == array_job_id
            and environ.get("SLURM_ARRAY_TASK_ID") == "0"
            and proc.info["name"] != "slurmstepd"
        ):
            found.append(proc)
    return found


def test_when_task_0_hangs_its_stale_lease_sends_every_peer_home(cluster: Cluster):
    # A hung node: every process of task 0 frozen, its kernel still accepting TCP, so
    # the store neither answers nor refuses. Without the lease, the peers would wait on
    # NVRx's own timeouts (here a 30 s step section, then 300 s of store dialing).
    name = unique("hang")
    work, script = generation(cluster, name, mode="train", train_tasks=2, hot_spares=1)
    job = submit(cluster, work, script, name, "--array=0-2%3")
    frozen: list[psutil.Process] = []
    try:
        cluster.wait_until(
            lambda: any(e["event"] == "checkpoint" for e in progress(work)),
            240,
            "the generation to train and checkpoint",
        )
        frozen = task0_processes(job)
        assert any("ft_launcher" in " ".join(p.cmdline()) for p in frozen)
        for proc in frozen:
            proc.suspend()
        stopped = time.monotonic()

        def peers_done():
            codes = [work / f"srun-exit.{t}" for t in (1, 2)]
            return all(p.exists() for p in codes)

        cluster.wait_until(peers_done, LEASE_STALE_S + DRAIN_BOUND_S + 30, "both peers to exit")
        elapsed = time.monotonic() - stopped
        assert elapsed <= LEASE_STALE_S + DRAIN_BOUND_S, (elapsed, outputs(work))
        # The first peer to see the stale lease fences task 0 (71); the other leaves on
        # that fence's closed flag (76) unless it saw the lease go stale first.
        codes = {(work / f"srun-exit.{task}").read_text().strip() for task in (1, 2)}
        gone = {str(exitcodes.TASK0_GONE), str(exitcodes.STOPPED_BY_CLOSED_FLAG)}
        assert codes <= gone, (codes, outputs(work))
        assert any("fenced task 0" in output(work, job, task) for task in (1, 2)), outputs(work)
    finally:
        for proc in frozen:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        cluster.slurm("scancel", job, check=False)
