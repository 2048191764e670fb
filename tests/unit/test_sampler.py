"""The guard's sampler where py-spy cannot read the workload, with a real workload
process: a py-spy stand-in (named so) answers as py-spy does when the kernel refuses it
the workload's memory (Yama's ptrace_scope, no CAP_SYS_PTRACE)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from nvrx_appliance.rank import hang_rule, run_waits, sampler, stacks

REFUSAL = "Error: Operation not permitted (os error 1)"


def _pyspy_standin(tmp_path):
    """A stand-in for py-spy that counts its runs and fails as py-spy does under Yama."""
    path = tmp_path / "py-spy-standin"
    path.write_text(f"#!/bin/sh\necho run >> {tmp_path / 'runs'}\necho '{REFUSAL}' >&2\nexit 1\n")
    path.chmod(0o755)
    return path


def test_a_refused_py_spy_is_said_once_not_retried_and_every_sample_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(sampler, "pyspy", lambda: str(_pyspy_standin(tmp_path)))
    monkeypatch.setattr(sampler, "ptrace_scope", lambda: "2")
    workload = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    said: list[str] = []
    try:
        s = sampler.Sampler(workload.pid, tmp_path / "s" / "node1.rank0.json", 0.1,
                            {"rank": 0, "node": "node1"}, said.append)  # fmt: skip
        samples = [s.take() for _ in range(4)]
    finally:
        workload.kill()
        workload.wait()
    assert (tmp_path / "runs").read_text().count("run") == 1  # no retry loop
    assert len(said) == 1, said
    assert said[0].startswith("no stacks sampled from now on: py-spy cannot read the "
                              f"workload (py-spy said: {REFUSAL}); kernel.yama.ptrace_scope "
                              "is 2 here; set it to 1")  # fmt: skip
    for sample in samples:
        assert sample is not None and sample["frames"] == [] and sample["state"] in "SR"
        assert sample["unreadable"] == sample["no_stacks"] == said[0].split(": ", 1)[1]
    # Read back as the rule reads a sample, and judged: no stacks, said in the record.
    stack = stacks.rank_stack(samples[-1])
    judgement = hang_rule.judge([stack], world_size=2, cycle=0, now=stack.taken, fresh_s=10,
                                still_s=0, segment=False)  # fmt: skip
    record = stacks.record_of(judgement, samples[-1:], generation="c/1/t", cycle=0,
                              judged_by={}, hand_off=False)  # fmt: skip
    assert record["verdict"] == "none" and record["nodes"] == []
    assert record["no_stacks"] == [samples[-1]["no_stacks"]]
    assert record["words"].endswith(f"; no stacks: {samples[-1]['no_stacks']}"), record
    json.dumps(record)


def test_a_passing_failure_is_not_a_refusal_and_without_yama_the_fix_is_the_capability():
    assert not sampler.refused("Error: Failed to find python version from target process")
    assert sampler.refused("Permission Denied: Try running again with elevated permissions")
    words = sampler.no_stacks_words("Operation not permitted (os error 1)", "")
    assert "SYS_PTRACE" in words and "py-spy said: Operation not permitted" in words


def test_a_sample_inherits_its_stillness_only_when_the_rank_used_no_cpu_in_between(tmp_path):
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        s = sampler.Sampler(busy.pid, tmp_path / "r.json", 0.01, {}, lambda _: None)
        s.binary = None  # no py-spy: every sample is /proc's alone, frames alike ([])
        first = s.take()
        s.last = first
        assert first is not None
        first["still_since"] = first["epoch"] - 100
        deadline = time.monotonic() + 30
        while sampler.proc_state(busy.pid)[1] <= first["cpu_ticks"]:  # it runs on
            assert time.monotonic() < deadline
        second = s.take()
    finally:
        busy.kill()
        busy.wait()
    assert second is not None and second["cpu_ticks"] > first["cpu_ticks"]
    assert second["still_since"] == second["epoch"]  # it ran: still since now, not before


STORE_WAIT = [  # rank 0 forming the group at a cycle's start-up, as py-spy read it
    {"name": "_create_c10d_store", "file": "torch/distributed/rendezvous.py", "line": 199},
    {"name": "_env_rendezvous_handler", "file": "torch/distributed/rendezvous.py", "line": 280},
    {"name": "init_process_group", "file": "torch/distributed/distributed_c10d.py", "line": 1700},
]
OWN_LOOP = [{"name": "poll_queue", "file": "train_script.py", "line": 40}]
STEPPING = [  # a straggler's peer: in the step's all_reduce at every sample, a new one
    {"name": "all_reduce", "file": "torch/distributed/distributed_c10d.py", "line": 2950},
    {"name": "_train_step", "file": "nvrx_appliance/workloads/trainer.py", "line": 257},
]


def test_a_group_forming_that_polls_stays_still_and_nothing_else_that_wakes_does():
    # Recorded on the local cluster (a node frozen at start-up): rank 0's TCPStore woke
    # 1,400 times in 5 s waiting for its workers, at 5 ticks; its stillness was reset at
    # every sample, and the rule said "still moving" of a rank that had waited 30 s.
    def samples(frames, woke, ticks):
        last = {"frames": frames, "wakeups": 5479, "cpu_ticks": 182}
        return last, {"frames": frames, "wakeups": 5479 + woke, "cpu_ticks": 182 + ticks}

    assert sampler.quiet(*samples(STORE_WAIT, 1400, 5), 5.0)
    # The same wakeups in the workload's own code are a loop paced by sleeps: moving.
    assert not sampler.quiet(*samples(OWN_LOOP, 1400, 5), 5.0)
    # In a collective too: the rank may be stepping through one all_reduce after another
    # with little CPU while it waits for a slow peer.
    assert not sampler.quiet(*samples(STEPPING, 1400, 5), 5.0)
    # CPU counts while the group forms: a rank that computes is not standing still.
    assert not sampler.quiet(*samples(STORE_WAIT, 0, 5 * 100), 5.0)


def test_a_stopped_rank_stays_still_though_py_spy_read_it_differently(tmp_path):
    # Seen on the local cluster: a frozen rank's non-blocking read timed out (no frames)
    # and the next one succeeded; the frames differed, its stillness was reset, and the
    # rule said "still moving" of a rank stopped for 30 s.
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        os.kill(sleeper.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while sampler.proc_state(sleeper.pid)[0] != "T":
            assert time.monotonic() < deadline
        s = sampler.Sampler(sleeper.pid, tmp_path / "r.json", 5.0, {}, lambda _: None)
        importing = [
            {"name": "_load_unlocked", "file": "<frozen importlib._bootstrap>", "line": 690}
        ]
        reads = iter([None, importing, None])
        s.dump = lambda *_: next(reads)  # type: ignore[method-assign]
        first = s.take()
        assert first is not None and first["frames"] == []
        first["still_since"] = first["epoch"] - 30
        s.last = first
        second = s.take()
        s.last = second
        third = s.take()  # the read fails again: the stack read last stands
    finally:
        sleeper.kill()
        sleeper.wait()
    assert second is not None and second["state"] == "T" and second["frames"] == importing
    assert second["still_since"] == first["still_since"]  # stopped throughout: still
    assert third is not None and third["frames"] == importing and "unreadable" not in third
    assert third["still_since"] == first["still_since"]


def test_a_blocking_dump_waits_out_the_runs_own_waits_and_the_first_cycles_start_up(
    tmp_path, monkeypatch
):
    events = [
        {"event": "start", "slurm_array_job_id": "41", "cycle": 0, "iteration": 0},
        {"event": "checkpoint", "slurm_array_job_id": "41", "cycle": 0, "seconds": 12.5},
        {"event": "checkpoint", "slurm_array_job_id": "40", "cycle": 0, "seconds": 99.0},
        {"event": "step", "slurm_array_job_id": "41", "cycle": 1, "iteration": 3},
    ]
    text = "\n".join(json.dumps(e) for e in events) + "\n{torn"
    assert run_waits.of_text(text, "41", 1) == (True, 12.5)  # another generation's: not ours
    assert run_waits.of_text(text, "41", 2) == (False, 12.5)
    log = tmp_path / "progress.jsonl"
    monkeypatch.setenv(sampler.PROGRESS_ENV, str(log))
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "41")
    s = sampler.Sampler(1, None, 5.0, {"cycle": 0}, lambda _: None)
    still_for = {"epoch": 100.0, "still_since": 80.0}  # 20 s still
    assert not s.past_legit_waits(still_for)  # no log: the first cycle's start-up
    log.write_text(json.dumps(events[0]) + "\n")
    assert not s.past_legit_waits(still_for)  # started, not trained yet
    log.write_text(text)
    assert s.past_legit_waits(still_for)  # trained (a save), still longer than 12.5 s
    assert not s.past_legit_waits({"epoch": 100.0, "still_since": 90.0})  # 10 s: a save's


def test_a_timed_out_non_blocking_dump_leaves_a_rank_stopped_by_something_else_stopped(
    tmp_path, monkeypatch
):
    # On the cluster py-spy --nonblocking sometimes outlasted its timeout on a SIGSTOPped
    # rank; the SIGCONT meant for a killed blocking dump then woke the hung rank, which
    # went on into its collective and read as waiting (the hang test's words were wrong).
    hang = tmp_path / "py-spy-standin"
    hang.write_text("#!/bin/sh\nexec sleep 30\n")  # a stand-in that never answers
    hang.chmod(0o755)
    monkeypatch.setattr(sampler, "pyspy", lambda: str(hang))
    monkeypatch.setattr(sampler, "PYSPY_TIMEOUT_S", 0.2)
    workload = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        workload.send_signal(signal.SIGSTOP)
        s = sampler.Sampler(workload.pid, tmp_path / "s" / "node1.rank0.json", 1.0,
                            {"rank": 0, "node": "node1"}, lambda _: None)  # fmt: skip
        sample = s.take()
        assert sample is not None and sample["unreadable"] == "py-spy took over 0.2 s"
        assert sample["state"] == "T" and sampler.proc_state(workload.pid)[0] == "T"
        # A blocking dump that times out is the one whose own stop must be undone.
        assert s.dump("--native") is None
        assert sampler.proc_state(workload.pid)[0] in "SR"
    finally:
        workload.kill()
        workload.wait()


def test_a_stopped_ranks_sample_is_fresh_though_py_spy_would_not_answer(tmp_path, monkeypatch):
    # In CI a frozen rank had no fresh sample at the judgement (no verdict) while its
    # node's other rank had: a non-blocking read of a stopped rank sometimes outlasts its
    # timeout on the cluster, and every look after it waits for it.
    hang = tmp_path / "py-spy-standin"
    hang.write_text("#!/bin/sh\nexec sleep 60\n")  # a stand-in that never answers
    hang.chmod(0o755)
    workload = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        workload.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while sampler.proc_state(workload.pid)[0] != "T":
            assert time.monotonic() < deadline
        s = sampler.Sampler(workload.pid, tmp_path / "s" / "node1.rank0.json", 5.0,
                            {"rank": 0, "node": "node1"}, lambda _: None)  # fmt: skip
        # Its first look reads the stack (read by py-spy as the rank was stopped) ...
        read = [{"name": "train_step", "file": "train.py", "line": 7}]
        reads = iter([read])
        s.dump = lambda *_: next(reads)  # type: ignore[method-assign]
        s.last = s.take()
        del s.dump  # ... and from now on py-spy (the stand-in) never answers.
        s.binary = str(hang)
        asked = time.time()
        sample = s.take()
        # A stopped rank that used no CPU since runs no code: its stack is the one read.
        assert sample is not None and sample["state"] == "T" and sample["frames"] == read
        assert "unreadable" not in sample
        assert sample["epoch"] - asked < 2.0  # not after a read that timed out (5 s)
        # A rank not read before is read, for a period at most (a second at least).
        fresh = sampler.Sampler(workload.pid, tmp_path / "t" / "node1.rank0.json", 1.0,
                                {"rank": 0, "node": "node1"}, lambda _: None)  # fmt: skip
        fresh.binary = str(hang)
        first = fresh.take()
        assert first is not None and first["unreadable"] == "py-spy took over 1 s"
    finally:
        workload.kill()
        workload.wait()


def test_no_blocking_dump_is_taken_of_a_rank_stopped_or_stuck_in_the_kernel():
    # py-spy --native attaches with ptrace: on the cluster its attach to a rank frozen in
    # state D outlived the timeout and starved the sampler, so the judgement found that
    # node's stacks stale and named nobody.
    s = sampler.Sampler(1, None, 1.0, {}, lambda _: None)
    assert s.blocked({"state": "S", "native": [], "native_at": None})
    assert not s.blocked({"state": "D", "native": [], "native_at": None})
    assert not s.blocked({"state": "T", "native": [], "native_at": None})
    assert not s.blocked({"state": "S", "native": ["c10d::Reducer::finalize_backward"],
                          "native_at": 5.0})  # fmt: skip


def test_a_failed_blocking_dump_is_not_tried_again_while_the_rank_stands_still(
    tmp_path, monkeypatch
):
    # Issue 53: a blocking native dump that failed was tried again every period, each try
    # stopping the rank for up to 10 s. Once per stillness, read or not.
    monkeypatch.delenv(sampler.LOCAL_STACKS_ENV, raising=False)
    workload = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    tries: list[str] = []
    frames = [{"name": "all_reduce", "file": "torch/distributed/distributed_c10d.py", "line": 1}]

    def dump(*how: str):
        tries.append(how[0])
        return None if how[0] == "--native" else frames

    try:
        s = sampler.Sampler(workload.pid, tmp_path / "s" / "node1.rank0.json", 1.0,
                            {"rank": 0, "node": "node1", "cycle": 1}, lambda _: None)  # fmt: skip
        s.dump = dump  # type: ignore[method-assign]
        s.past_legit_waits = lambda _sample: True  # type: ignore[method-assign]
        for _ in range(200):  # its start-up done: asleep
            if sampler.proc_state(workload.pid)[0] == "S":
                break
            time.sleep(0.05)
        for _ in range(4):
            s.last = s.take()
            assert s.last is not None
            s.last["epoch"] -= 1.0  # as if a period apart: asleep, quiet, the same stack
    finally:
        workload.kill()
        workload.wait()
    assert tries.count("--native") == 1, tries
    assert s.last is not None and s.last["native_at"] is not None and s.last["native"] == []


def test_under_the_nodes_publisher_a_still_rank_reads_the_runs_waits_locally(tmp_path, monkeypatch):
    # Issue 53: each still, sleeping rank read 256 kB of the progress log every period
    # (~800 MB/s from one file at 16,384 ranks during a long wait). The node's publisher
    # reads the lines the log gained, once a period, and keeps the answer node-local.
    from nvrx_appliance.node.stack_publisher import Publisher

    log, local = tmp_path / "progress.jsonl", tmp_path / "local"
    events = [{"event": "checkpoint", "slurm_array_job_id": "41", "cycle": 0, "seconds": 12.5}]
    log.write_text("".join(json.dumps(e) + "\n" for e in events))
    publisher = Publisher(local, tmp_path / "stacks", "node1", 5.0, print, progress=log,
                          array_job_id="41")  # fmt: skip
    publisher.prepare()
    publisher.look()
    monkeypatch.setenv(sampler.LOCAL_STACKS_ENV, str(local))
    monkeypatch.setenv(sampler.PROGRESS_ENV, str(tmp_path / "unreadable" / "log"))
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "41")
    s = sampler.Sampler(1, None, 5.0, {"cycle": 0}, lambda _: None)
    assert s.past_legit_waits({"epoch": 100.0, "still_since": 80.0})  # trained; 20 > 12.5
    assert not s.past_legit_waits({"epoch": 100.0, "still_since": 90.0})
    with log.open("a") as more:  # a longer save: only the new line is read
        more.write(json.dumps({**events[0], "seconds": 30.0}) + "\n")
    publisher.look()
    assert publisher._read_to == log.stat().st_size
    assert not s.past_legit_waits({"epoch": 100.0, "still_since": 80.0})  # 20 < 30


def test_a_rank_in_the_kernel_says_where_the_kernel_keeps_it(tmp_path):
    # Issue 53: /proc/<pid>/wchan, readable by the owner, tells a file system's wait
    # (not the node's fault) from a driver's; the sample keeps it in state D.
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for _ in range(100):
            if sampler.proc_state(sleeper.pid)[0] == "S":
                break
            time.sleep(0.05)
        assert sampler.kernel_wait(sleeper.pid)  # asleep: the kernel names its wait
        assert sampler.kernel_wait(2**22 + 7) == ""  # gone: unknown
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_rank_that_died_is_gone_and_its_last_sample_stands(tmp_path):
    # NVRx's rank monitor ends a hung rank with SIGCONT then SIGKILL: a sample taken as it
    # died read state Z beside the frames of the collective it had been stopped on the way
    # into, and the judgement took the stopped rank for a waiting one (no verdict).
    workload = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        s = sampler.Sampler(workload.pid, tmp_path / "s" / "node1.rank0.json", 1.0,
                            {"rank": 0, "node": "node1"}, lambda _: None)  # fmt: skip
        workload.send_signal(signal.SIGSTOP)
        stopped = s.take()
        assert stopped is not None and stopped["state"] == "T"
        workload.kill()
        os.waitid(os.P_PID, workload.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped: Z
        stat = Path(f"/proc/{workload.pid}/stat").read_text()
        assert stat.rsplit(")", 1)[1].split()[0] == "Z"
        assert sampler.proc_state(workload.pid) == ("", 0)
        assert s.take() is None  # gone: the sampler keeps the stopped sample it had
    finally:
        workload.kill()
        workload.wait()
