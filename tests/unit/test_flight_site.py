"""The flight-recorder watch each rank's workload runs (rank/flight_site/sitecustomize.py),
run for real: a Python with the guard's PYTHONPATH, and two gloo ranks.

It chains to the sitecustomize it shadows, does nothing in a workload without
torch.distributed, writes a dump once a collective stands still, and takes it back when
the collective completes after all."""

from __future__ import annotations

import contextlib
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


def test_the_judgement_reads_this_cycles_summaries_where_the_publishers_carry_them(tmp_path):
    cycle_dir = tmp_path / "cycle1"
    where = flight.flight_dir(cycle_dir)
    where.mkdir(parents=True)
    mine = {"generation": "c/7/1", "cycle": 1, "rank": 0, "trace": {"entries": []}}
    (where / "n1.rank0.json").write_text(json.dumps(mine))  # a guard without a publisher
    (where / "n1.rank1.json").write_text(json.dumps({**mine, "cycle": 0}))  # another cycle's
    (where / ".n1.rank2.json.99").write_text(json.dumps(mine))  # half written
    (where / "n2.rank3.json").write_text("{torn")
    carried = {**mine, "rank": 5}
    (cycle_dir / "n3.json").write_text(json.dumps({"node": "n3", "samples": [],
                                                   "flight": [carried, {**carried, "cycle": 0}]}))  # fmt: skip
    (cycle_dir / "n3.rank5.json").write_text(json.dumps({"rank": 5}))  # a sample, not a node file
    assert flight.read_dumps(cycle_dir, "c/7/1", 1) == [mine, carried]


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
    assert (written["generation"], written["rank"], written["history"][0][1:]) == (
        "7",
        3,
        [1, 1, 0],
    )


# Issue 53.


def test_a_sites_buffer_under_either_of_torchs_names_wins(tmp_path):
    # torch 2.13 reads TORCH_FR_BUFFER_SIZE before TORCH_NCCL_TRACE_BUFFER_SIZE
    # (FlightRecorder.hpp): the 2,000 the guard injected overrode a site's older name.
    from nvrx_appliance import manifest as run_manifest
    from tests.unit.test_cpu_trainer import cpu_manifest

    m = cpu_manifest(tmp_path, iterations=10, stack_sampling=5)
    environ = {"NVRX_RUN_MANIFEST": str(run_manifest.save(m)),
               "TORCH_NCCL_TRACE_BUFFER_SIZE": "5000"}  # fmt: skip
    child = flight.child_env(environ, "c/4242/1") or {}
    assert flight.BUFFER_ENV not in child and child["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "5000"


def test_under_a_publisher_the_summaries_are_node_local(tmp_path):
    # Issue 53, finding 3: every waiting rank wrote its dump under the shared
    # stacks/cycle0/flight/ during a healthy run's long save.
    from nvrx_appliance import manifest as run_manifest
    from tests.unit.test_cpu_trainer import cpu_manifest

    m = cpu_manifest(tmp_path / "w", iterations=10, stack_sampling=5)
    environ = {"NVRX_RUN_MANIFEST": str(run_manifest.save(m)), "TORCHELASTIC_RESTART_COUNT": "0",
               flight.LOCAL_STACKS_ENV: str(tmp_path / "local")}  # fmt: skip
    child = flight.child_env(environ, "c/4242/1") or {}
    assert child[site.DIR_ENV] == str(tmp_path / "local" / "cycle0" / "flight")


SAVE = r"""
import json, os, sys, time
from pathlib import Path
import torch, torch.distributed as dist
from nvrx_appliance.node.stack_publisher import Publisher
rank, port, local, shared = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
t = torch.ones(2)
dist.all_reduce(t)
if rank == 0:  # rank 0 saves alone; rank 1 waits in the barrier after it
    summary = local / "cycle0" / "flight" / "nodeB.rank1.json"
    for _ in range(600):
        if summary.exists():
            break
        time.sleep(0.1)
    Publisher(local, shared, "nodeB", 1.0, print).publish()  # the node's one publisher
dist.barrier()
dist.destroy_process_group()
"""


def test_a_long_save_on_rank_0_writes_nothing_per_rank_to_shared_storage(tmp_path):
    script = tmp_path / "save.py"
    script.write_text(SAVE)
    port = str(free_port())
    local, shared = tmp_path / "local", tmp_path / "shared"
    environ = {**env(tmp_path), "SLURMD_NODENAME": "nodeB",
               site.DIR_ENV: str(local / "cycle0" / "flight")}  # fmt: skip
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), port, str(local), str(shared)], env=environ
        )
        for r in (0, 1)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    written = sorted(str(p.relative_to(shared)) for p in shared.rglob("*") if p.is_file())
    assert written == ["cycle0/nodeB.json"]  # one file for the node, none per rank
    [summary] = json.loads((shared / "cycle0" / "nodeB.json").read_text())["flight"]
    assert (summary["rank"], summary["version"], summary["stalled"]["seq"]) == (1, 2, 2)
    assert set(summary["trace"]) == {"pg_status", "pg_config", "entries"}
    assert summary["trace"]["entries"][-1]["profiling_name"] == "gloo:barrier"


def test_the_status_is_parsed_without_the_rank_lists_before_it():
    # At 16,384 ranks torch's status carries every group's rank list (pg_config) ahead of
    # pg_status: the watch finds pg_status and parses it alone.
    ranks = "[" + ", ".join(str(r) for r in range(16384)) + "]"
    raw = json.dumps({"comm_lib_version": "", "pg_config": {"0": {"desc": "default_pg",
                      "name": "0", "ranks": ranks}}, "pg_status": {"0": {
                      "last_completed_collective": "6", "last_enqueued_collective": "7",
                      "last_started_collective": "-1"}}, "version": "2.10"}).encode()  # fmt: skip
    assert site.status(raw) == json.loads(raw)["pg_status"]
    assert site._pending(site.status(raw)) == {"0": 7} and site._completed(site.status(raw)) == 6
    assert site.compact_ranks(ranks) == {"start": 0, "stop": 16384, "step": 1}
    assert site.compact_ranks("[3, 9]") == [3, 9]


GROUPS = r"""
import threading, torch, torch.distributed as dist
from nvrx_appliance.rank.flight_site import sitecustomize as site
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
g = site._Groups()
seen = [g.settled(dist), g.settled(dist)]  # the first look has nothing to compare with
pair = dist.new_group([0])
seen += [g.settled(dist), g.settled(dist)]  # a group came: not settled until it stays
dist.all_reduce(torch.ones(1), group=pair)
seen += [g.settled(dist), g.settled(dist)]  # its first collective wrote the recorder's map
forming = {}
exec(compile("def new_group(go, done):\n    go.set()\n    done.wait()\n",
             "/x/torch/distributed/distributed_c10d.py", "exec"), forming)
go, done = threading.Event(), threading.Event()
t = threading.Thread(target=forming["new_group"], args=(go, done))
t.start(); go.wait()
seen.append(g.settled(dist))  # a thread forms a group: never read then
done.set(); t.join()
print(seen)
dist.destroy_process_group()
"""


def test_the_recorder_is_read_only_while_the_process_groups_stand_settled(tmp_path):
    # torch 2.13 reads the recorder's maps without its lock (FlightRecorderDetail.hpp,
    # getPgConfigJson / getPgStatusJson) while new_group and a group's first collective
    # write them.
    script = tmp_path / "groups.py"
    script.write_text(GROUPS)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, check=True)  # fmt: skip
    assert done.stdout.strip() == "[False, True, False, True, False, True, False]", done.stderr


def test_the_watch_goes_on_after_a_failed_look(monkeypatch, capsys):
    # Issue 53, finding 9: the watch thread stopped for good at its first exception.
    class Stop(BaseException):
        pass

    class Dist:
        @staticmethod
        def is_initialized() -> bool:
            return True

    ticks: list[int] = []

    def tick(_dist, n, _gap):
        ticks.append(n)
        if n == 1:
            raise RuntimeError("a group was destroyed under the look")

    def sleep(_s: float) -> None:
        if len(ticks) >= 3:
            raise Stop

    monkeypatch.setitem(sys.modules, "torch.distributed", Dist())
    monkeypatch.setattr(site.time, "sleep", sleep)
    watch = site._Watch("/nonexistent", 1.0, {})
    monkeypatch.setattr(watch, "tick", tick)
    with contextlib.suppress(Stop):
        watch.run()
    assert ticks == [1, 2, 3]
    assert capsys.readouterr().err.count("failed a look") == 1
