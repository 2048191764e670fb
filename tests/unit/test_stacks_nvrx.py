"""The guard's stack sampling and hang judgement under the real ft_launcher 0.7.0 and the
real py-spy, without Slurm: two launchers on this host play two nodes (NVRx's own
simulation case), one rank each, each rank under its guard. The rank of "node2" is
frozen (SIGSTOP) once it trains; NVRx's step timeout kills both workloads, and the first
guard to see its SIGKILL writes the cycle's hang record naming node2.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.rank import guard, sampler
from nvrx_appliance.workloads import workload_argv

from .test_cpu_trainer import FT_LAUNCHER, cpu_manifest, free_port, kill_tree, read_events

GENERATION = "chain-1/4242/"
STEP_TIMEOUT_S = 8


def _launcher(m: run_manifest.Manifest, endpoint: str) -> list[str]:
    layout = m.layout
    workload = workload_argv(list(m.workload), sys.executable)
    guarded = guard.argv(layout.control("4242"), layout.exit_records("4242"), GENERATION, workload)
    return [
        str(FT_LAUNCHER), "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", endpoint, "--rdzv-id", "hang", "--max-restarts", "1",
        "--monitor-interval", "0.2", "--ft-cycle-info-dir", str(layout.cycle_infos("4242")),
        "--ft-rank-section-timeouts", f"setup:120,step:{STEP_TIMEOUT_S},checkpointing:120",
        "--ft-rank-out-of-section-timeout", "120", "--ft-workload-check-interval", "1",
        "--no-python", *guarded,
    ]  # fmt: skip


def _worker_on(m: run_manifest.Manifest, node: str) -> int | None:
    """This test's trainer on `node`: its run manifest, not any other cpu trainer on the
    machine (a cluster test's or a benchmark's node of the same name)."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            trainer = "nvrx_appliance.workloads.cpu" in (proc.info["cmdline"] or [])[:4]
            env = proc.environ() if trainer else {}
            mine = env.get("NVRX_RUN_MANIFEST") == str(m.layout.run_json)
            if mine and env.get("SLURMD_NODENAME") == node:
                return proc.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


@pytest.mark.skipif(sampler.pyspy() is None, reason="py-spy is installed by make python-deps")
def test_a_frozen_rank_is_named_from_the_stacks_when_nvrx_kills_the_hung_cycle(tmp_path):
    m = cpu_manifest(tmp_path / "w", iterations=100_000, save_interval=100_000, stack_sampling=1)
    m.layout.work_dir.mkdir(parents=True)
    run_manifest.save(m)
    for directory in (m.layout.control("4242"), m.layout.exit_records("4242")):
        directory.mkdir(parents=True)
    endpoint = f"127.0.0.1:{free_port()}"
    logs, launchers = [tmp_path / "node1.log", tmp_path / "node2.log"], []
    for i, log in enumerate(logs, start=1):
        env = {**os.environ, "NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE": "1",
               "NVRX_RUN_MANIFEST": str(m.layout.run_json), "SLURMD_NODENAME": f"node{i}",
               # As the entrypoint says it (node/env.py): the guards read the run's waits.
               "NVRX_APPLIANCE_PROGRESS_LOG": str(m.layout.progress_log)}  # fmt: skip
        with log.open("w") as out:
            launchers.append(subprocess.Popen(
                _launcher(m, endpoint), cwd=m.layout.work_dir, env=env, stdout=out,
                stderr=subprocess.STDOUT,
            ))  # fmt: skip
    record_path = m.layout.hangs("4242") / "cycle0.json"
    try:
        deadline = time.monotonic() + 240  # a busy 2-core machine
        while not [e for e in read_events(m) if e["event"] == "step" and e["iteration"] >= 5]:
            assert time.monotonic() < deadline, "training never got going"
            time.sleep(0.2)
        frozen = _worker_on(m, "node2")
        assert frozen is not None
        os.kill(frozen, signal.SIGSTOP)
        while not record_path.exists():
            assert time.monotonic() < deadline, [log.read_text()[-3000:] for log in logs]
            time.sleep(0.2)
    finally:
        for launcher in launchers:
            kill_tree(psutil.Process(launcher.pid))
    record = json.loads(record_path.read_text())
    output = "".join(log.read_text() for log in logs)
    assert "Rank monitor sent SIGCONT then SIGKILL" in output or "Section 'step'" in output
    assert record["verdict"] == "hung" and record["nodes"] == ["node2"], record["words"]
    # Its rank stopped in the trainer's own code; the other waited in DDP's gradient
    # all-reduce, which only its native frames show (py-spy --native of a blocked rank).
    words = record["words"]
    assert words.startswith("node2 hung in cycle 0: its 1 rank stopped in `"), words
    # The workload's own thread of ours (rank/flight_site) dumped the waiting rank's flight
    # recorder; it says whom that rank waited for. The collective's name from the stacks
    # needs the native dump, which a loaded machine may not fit in before NVRx's kill
    # (seen once under two xdist workers): then the words say "a collective", still true.
    assert re.search(
        r" while the 1 other waited in (`all_reduce`|a collective) \(flight recorder: rank\(s\) "
        r"\d waited in "
        r"`gloo:all_reduce` #\d+ of process group 0 for rank\(s\) \d\)$",
        words,
    ), words
    assert record["hand_off"]  # no hot spare in this world
    assert {s["node"] for s in record["stacks"]} == {"node1", "node2"}
    marker = json.loads((m.layout.hangs("4242") / "hung.node2").read_text())
    assert marker["generation"] == GENERATION and marker["words"] == record["words"]
    samples = m.layout.stacks("4242") / "cycle0"
    # One dump, the waiting rank's: a stopped rank writes none.
    (dump,) = (samples / "flight").iterdir()
    assert dump.name.startswith("node1.rank"), dump.name
    assert sorted(p.name for p in samples.iterdir() if p.is_file()) == [
        "node1.rank0.json",
        "node2.rank1.json",
    ] or (
        sorted(p.name for p in samples.iterdir() if p.is_file())
        == ["node1.rank1.json", "node2.rank0.json"]
    )
    assert oct(samples.stat().st_mode & 0o777) == "0o700"
