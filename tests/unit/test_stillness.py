"""The guard keeps `--out-of-section-timeout` for a script that never connects to NVRx's
rank monitor, and never for one that did: with real processes and a real Unix socket."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

from nvrx_appliance.rank import stillness


def _sample(epoch: float, frames: list, state: str = "S", ticks: int = 0) -> dict:
    return {"epoch": epoch, "frames": frames, "state": state, "cpu_ticks": ticks}


WAIT = [{"name": "all_reduce", "file": "torch/distributed/distributed_c10d.py", "line": 1}]


def test_a_connection_the_rank_monitor_accepted_is_read_from_proc_net_unix(tmp_path):
    path = str(tmp_path / "rmon.socket")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen()
    assert not stillness.connected(path, stillness.UNIX_TABLE.read_text())
    client = socket.socket(socket.AF_UNIX)
    client.connect(path)
    accepted, _ = server.accept()
    try:
        assert stillness.connected(path, stillness.UNIX_TABLE.read_text())
        assert not stillness.connected(path + ".other", stillness.UNIX_TABLE.read_text())
    finally:
        for s in (client, accepted, server):
            s.close()


def test_moving_is_a_changed_stack_or_cpu_while_asleep_or_unread():
    assert stillness.moved(_sample(0, WAIT), _sample(5, []), 5)
    assert not stillness.moved(_sample(0, WAIT), _sample(5, WAIT, ticks=1), 5)
    assert stillness.moved(_sample(0, WAIT), _sample(5, WAIT, ticks=100), 5)
    assert not stillness.moved(_sample(0, WAIT, "R"), _sample(5, WAIT, "R", 400), 5)  # spins
    assert stillness.moved(_sample(0, [], "R"), _sample(5, [], "R", 400), 5)  # unread, busy
    # Stopped at both samples and no CPU: not moved, though py-spy read it differently
    # (one read timed out, the next did not).
    assert not stillness.moved(_sample(0, [], "T"), _sample(5, WAIT, "T"), 5)


def _watch(tmp_path, pid: int, said: list[str]) -> stillness.Stillness:
    return stillness.Stillness(
        pid, 30.0, str(tmp_path / "rmon.socket"), tmp_path / "hangs" / stillness.still_name("node2", 3, 0),
        {"node": "node2", "rank": 3, "cycle": 0}, said.append,
    )  # fmt: skip


def test_a_script_still_past_the_timeout_is_ended_as_nvrx_ends_a_rank_with_its_record(tmp_path):
    workload = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    said: list[str] = []
    watch = _watch(tmp_path, workload.pid, said)
    watch.since = 1000.0
    for epoch in (1000.0, 1010.0, 1020.0):
        watch.see(_sample(epoch, WAIT), 5)
    assert workload.poll() is None  # 20 s still: not yet
    watch.see(_sample(1031.0, WAIT), 5)
    assert workload.wait(30) == -9
    assert said == [
        "rank 3 on node2 stood still for 31 s in `all_reduce` and its workload never "
        "connected to NVRx's rank monitor: the guard ends it as NVRx would past "
        "--out-of-section-timeout (30 s)"
    ]
    record = json.loads((tmp_path / "hangs" / ".still.cycle0.node2.rank3.json").read_text())
    assert record["by"] == "guard" and record["words"] == said[0]  # written before the kill


def test_a_workload_that_connected_to_its_rank_monitor_is_never_ended_by_the_guard(tmp_path):
    workload = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "rmon.socket"))
    server.listen()
    client = socket.socket(socket.AF_UNIX)
    client.connect(str(tmp_path / "rmon.socket"))
    accepted, _ = server.accept()
    try:
        watch = _watch(tmp_path, workload.pid, [])
        watch.since = 1000.0
        watch.see(_sample(1000.0, WAIT), 5)
        client.close()  # it may disconnect later: NVRx watched it, NVRx's timeouts rule
        for epoch in (1031.0, 2000.0):
            watch.see(_sample(epoch, WAIT), 5)
        assert workload.poll() is None and watch.watched
    finally:
        workload.kill()
        workload.wait()
        for s in (accepted, server):
            s.close()


def test_a_loop_paced_by_short_sleeps_moves_though_its_stack_and_cpu_stay_the_same(tmp_path):
    from nvrx_appliance.rank import sampler

    paced = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    blocked = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                               stdin=subprocess.PIPE)  # fmt: skip
    try:
        found = {}
        for name, proc in (("paced", paced), ("blocked", blocked)):
            s = sampler.Sampler(proc.pid, None, 1.0, {}, lambda _: None)
            first = s.take()
            assert first is not None
            deadline = time.monotonic() + 30
            while name == "paced" and sampler.wakeups(proc.pid) <= first["wakeups"] + 5:
                assert time.monotonic() < deadline  # it wakes on
            found[name] = stillness.moved(first, s.take() or {}, 1.0)
    finally:
        for proc in (paced, blocked):
            proc.kill()
            proc.wait()
    assert found == {"paced": True, "blocked": False}
