"""The flight-recorder watch each rank's workload runs (rank/flight_site/sitecustomize.py),
run for real: a Python with the guard's PYTHONPATH, and two gloo ranks.

It chains to the sitecustomize it shadows, does nothing in a workload without
torch.distributed, writes a dump once a collective stands still, and takes it back when
the collective completes after all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from nvrx_appliance.rank import flight
from nvrx_appliance.rank.flight_site import sitecustomize as site
from tests.unit.test_cpu_trainer import free_port


def env(tmp_path: Path, *more: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([flight.SITE_DIR, *more]),
        site.DIR_ENV: str(tmp_path / "flight"),
        site.STALL_ENV: "1",
        site.WHO_ENV: json.dumps({"generation": "c/7/1", "cycle": 0}),
        flight.BUFFER_ENV: "2000",
    }


def test_the_sitecustomize_it_shadows_still_runs_and_a_plain_script_is_untouched(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import sys; sys.stderr.write('theirs ran\\n')\n")
    done = subprocess.run([sys.executable, "-c", "print('trained')"], env=env(tmp_path, str(theirs)),
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert done.stdout == "trained\n"
    assert done.stderr == "theirs ran\n"
    assert not (tmp_path / "flight").exists()


RANKS = r"""
import json, os, sys, time
from pathlib import Path
import torch, torch.distributed as dist
rank, port, flight = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
t = torch.ones(2)
dist.all_reduce(t)
mine = flight / "nodeA.rank0.json"
if rank == 1:  # late: in its own code until rank 0's dump is there
    for _ in range(600):
        if mine.exists():
            break
        time.sleep(0.1)
    print(mine.read_text())
dist.all_reduce(t)
if rank == 0:  # the collective completed: the dump goes
    for _ in range(600):
        if not mine.exists():
            print("taken back")
            break
        time.sleep(0.1)
dist.destroy_process_group()
"""


def test_a_stalled_collective_leaves_a_dump_that_goes_when_it_completes(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    port = str(free_port())  # a port no other test (xdist runs them side by side) holds
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), port, str(tmp_path / "flight")],
            env={**env(tmp_path), "SLURMD_NODENAME": "nodeA"},
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    out = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert out[0].strip() == "taken back"
    dump = json.loads(out[1])
    assert (dump["rank"], dump["node"], dump["generation"], dump["cycle"]) == (
        0,
        "nodeA",
        "c/7/1",
        0,
    )
    assert dump["stalled"]["seq"] == 2 and dump["recorder"] == "_dump_fr_trace_json"
    assert dump["trace"]["entries"][-1]["profiling_name"] == "gloo:all_reduce"
    assert oct((tmp_path / "flight").stat().st_mode & 0o777) == "0o700"


def test_the_guard_switches_the_watch_on_only_where_the_chain_samples_stacks(tmp_path):
    from nvrx_appliance import manifest as run_manifest
    from tests.unit.test_cpu_trainer import cpu_manifest

    sampled = cpu_manifest(tmp_path / "on", iterations=10, stack_sampling=5)
    environ = {
        "NVRX_RUN_MANIFEST": str(run_manifest.save(sampled)),
        "TORCHELASTIC_RESTART_COUNT": "2",
        "PYTHONPATH": "theirs",
    }
    child = flight.child_env(environ, "c/4242/1")
    assert child is not None
    assert child["PYTHONPATH"] == f"{flight.SITE_DIR}{os.pathsep}theirs"
    assert child[site.DIR_ENV] == str(sampled.layout.stacks("4242") / "cycle2" / "flight")
    assert child[site.STALL_ENV] == "10"  # two sampling periods
    assert json.loads(child[site.WHO_ENV]) == {"generation": "c/4242/1", "cycle": 2}
    assert child[flight.BUFFER_ENV] == "2000"
    assert site.WAITS_ENV not in child  # no node-local directory: no figures at all
    local = flight.child_env({**environ, flight.LOCAL_STACKS_ENV: "/tmp/n"}, "c/4242/1") or {}
    assert json.loads(local[site.WAITS_ENV]) == {
        "dir": "/tmp/n/cycle2/waits",
        "period": 5.0,
        "generation": "4242",
    }
    assert (
        flight.child_env({**environ, flight.BUFFER_ENV: "64"}, "c/4242/1")[flight.BUFFER_ENV]
        == "64"
    )
    off = cpu_manifest(tmp_path / "off", iterations=10, stack_sampling=0)
    assert flight.child_env({"NVRX_RUN_MANIFEST": str(run_manifest.save(off))}, "c/4242/1") is None
    assert flight.child_env({}, "c/4242/1") is None


def test_the_judgement_reads_this_cycles_dumps_and_the_generations_earlier_workload_stalls(
    tmp_path,
):
    where = tmp_path / "flight"
    where.mkdir()
    mine = {"generation": "c/7/1", "cycle": 1, "rank": 0, "trace": {"entries": []}}
    (where / "n1.rank0.json").write_text(json.dumps(mine))
    (where / "n1.rank1.json").write_text(json.dumps({**mine, "cycle": 0}))  # another cycle's
    (where / ".n1.rank2.json.99").write_text(json.dumps(mine))  # half written
    (where / "n2.rank3.json").write_text("{torn")
    assert flight.read_dumps(where, "c/7/1", 1) == [mine]
    hangs = tmp_path / "hangs"
    hangs.mkdir()
    stall = {"generation": "c/7/1", "verdict": "workload", "stalled": {"node3": [3]}}
    (hangs / "cycle0.json").write_text(json.dumps(stall))
    (hangs / "cycle1.json").write_text(json.dumps({**stall, "generation": "c/8/1"}))
    (hangs / "cycle2.json").write_text(json.dumps({**stall, "verdict": "hung"}))
    assert flight.earlier_stalls(hangs, "c/7/1") == {"node3": [3]}


LATE = r"""
import sys, time
import torch, torch.distributed as dist
rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
t = torch.ones(2)
for _ in range(60):
    if rank == 1:  # late to every collective, away from its own compute
        time.sleep(0.05)
    dist.all_reduce(t)
time.sleep(0.6)  # one more period: the last figures are written
dist.destroy_process_group()
"""


def test_the_watch_measures_who_waits_inside_collectives_and_the_publisher_carries_it(tmp_path):
    from nvrx_appliance.goodput import wait_record
    from nvrx_appliance.layout import Layout
    from nvrx_appliance.node.stack_publisher import Publisher

    script = tmp_path / "late.py"
    script.write_text(LATE)
    port = str(29100 + os.getpid() % 400)
    local = {r: tmp_path / f"local{r}" for r in (0, 1)}  # each node's own directory

    def figures(rank: int) -> str:
        where = local[rank] / "cycle0" / flight.WAITS_DIR
        return json.dumps({"dir": str(where), "period": 0.5, "generation": "7"})

    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), port],
            env={**env(tmp_path), "SLURMD_NODENAME": f"node{rank}", site.WAITS_ENV: figures(rank)},
        )
        for rank in (0, 1)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    layout = Layout(tmp_path / "work")
    # Each node's one publisher puts its ranks' figures in its one shared file.
    for rank in (0, 1):
        assert Publisher(local[rank], layout.stacks("7"), f"node{rank}", 1.0, print).publish() == 1
    cycle, waits = wait_record.read(layout, "7") or (None, [])
    assert cycle == 0
    shares = {(w.node, w.rank): w.history[-1][2] / w.history[-1][1] for w in waits}
    assert sorted(shares) == [("node0", 0), ("node1", 1)]
    # rank 0 waits for the late rank 1 inside every all-reduce; rank 1 barely waits
    assert shares["node0", 0] > 0.5 > 0.3 > shares["node1", 1], shares
    assert oct((local[0] / "cycle0" / "waits").stat().st_mode & 0o777) == "0o700"


def test_a_poll_after_the_process_was_stopped_is_not_counted(tmp_path, monkeypatch):
    # After a SIGSTOP the first poll sees the state the rank was stopped in, not a share
    # of the time it ran.
    monkeypatch.setenv("SLURMD_NODENAME", "nodeA")
    waits = site._Waits(str(tmp_path / "w"), 0.5, "7", 0)
    waits.count(True, 3, site.TICK_S)
    waits.count(True, 3, 0.4)  # the poll after a 0.4 s stop
    waits.count(False, 3, site.TICK_S)
    assert (waits.polls, waits.waiting) == (2, 1)
    written = json.loads((tmp_path / "w" / "nodeA.rank3.json").read_text())
    assert (written["generation"], written["rank"], written["history"][0][1:]) == ("7", 3, [1, 1])
