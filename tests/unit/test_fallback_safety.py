"""The fall-back never costs a good checkpoint (issue 40): it goes back only to a
checkpoint the tracker once named, leaves a loadable state at every step, does nothing
(and says so) when the file system refuses, and excludes across nodes with a lock made
by exclusive create in the checkpoint directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nvrx_appliance.checkpoints import fallback, lockfile, tracked_record
from nvrx_appliance.checkpoints.checkpoint_dir import iteration_dir, tracker_text
from nvrx_appliance.devcluster.poll import wait_until
from nvrx_appliance.layout import Layout
from tests.unit.test_workload_verdicts import _checkpoints, _guard

ARGS = {"chain": "c1", "limit": 2, "floor": None, "who": {"node": "node1"}, "reason": "torn"}


def tracker(ckpt: Path) -> str:
    return (ckpt / "latest_checkpointed_iteration.txt").read_text()


def test_a_torn_directory_the_tracker_never_named_is_no_fall_back_target(tmp_path):
    # Reproduced: 100 good, 137 torn (never tracked), the tracker at 200; the fall-back
    # from 200 chose 137, which then could not be loaded either.
    ckpt = _checkpoints(tmp_path, (100, 200), 200, torn=(137,))
    done = fallback.set_aside(ckpt, ckpt / "fallbacks.jsonl", 200, **ARGS)
    assert done.fell_back_to == 100 and tracker(ckpt) == "100\n"
    assert (ckpt / iteration_dir(137)).is_dir()  # left alone, never the target


def test_with_only_torn_directories_before_it_the_chain_stops_saying_so(tmp_path):
    ckpt = _checkpoints(tmp_path, (200,), 200, torn=(137,))
    done = fallback.set_aside(ckpt, ckpt / "fallbacks.jsonl", 200, **ARGS)
    assert done.stop and done.fell_back_to is None
    assert "no checkpoint before it that was ever complete (tracked)" in done.message
    assert tracker(ckpt) == "200\n"


def test_when_retention_removed_the_target_the_stop_names_save_retention(tmp_path):
    # Seen with --save-retention 1: 30 tracked and complete, retention removed 20 and 25.
    ckpt = _checkpoints(tmp_path, (20, 25, 30), 30)
    for gone in (20, 25):
        (ckpt / iteration_dir(gone) / "shard").unlink()
        (ckpt / iteration_dir(gone)).rmdir()
        tracked_record.append(ckpt / tracked_record.FILE, tracked_record.REMOVED, gone)
    done = fallback.set_aside(ckpt, ckpt / "fallbacks.jsonl", 30, **ARGS)
    assert done.stop and tracker(ckpt) == "30\n"
    assert "retention had removed the complete one(s) before it (20, 25)" in done.message
    assert "--save-retention" in done.message


def test_the_tracker_moves_before_the_bad_checkpoint_is_renamed(tmp_path, monkeypatch):
    # The rename fails (its new name is taken by a non-empty directory): the tracker
    # names the earlier checkpoint already, a state every restart can load.
    ckpt = _checkpoints(tmp_path, (30, 35), 35)
    monkeypatch.setattr(fallback, "now_iso", lambda: "2026-12-04T10:00:00Z")
    taken = ckpt / f"{iteration_dir(35)}.unloadable-2026-12-04T100000Z"
    taken.mkdir()
    (taken / "x").write_text("x")
    done = fallback.set_aside(ckpt, ckpt / "fallbacks.jsonl", 35, **ARGS)
    assert done.fell_back_to == 30 and tracker(ckpt) == "30\n"
    assert "left in place" in done.message
    assert 35 not in tracked_record.read(ckpt / tracked_record.FILE)


def test_a_file_system_that_refuses_changes_nothing_and_says_so(tmp_path):
    ckpt = _checkpoints(tmp_path, (30, 35), 35)
    (ckpt / "latest_checkpointed_iteration.txt").unlink()
    (ckpt / "latest_checkpointed_iteration.txt").mkdir()  # unreadable as a tracker
    done = fallback.set_aside(ckpt, ckpt / "fallbacks.jsonl", 35, **ARGS)
    assert done.fell_back_to is None and not done.stop
    assert "nothing was set aside" in done.message and "tracker is left as it was" in done.message
    assert (ckpt / iteration_dir(35)).is_dir()
    assert not (ckpt / lockfile.LOCK_FILE).exists()  # the lock is given back


def test_the_guard_exits_with_the_workloads_code_when_the_fall_back_cannot_be_done(tmp_path):
    ckpt = _checkpoints(tmp_path, (10, 15), 15)
    tracker_file = ckpt / "latest_checkpointed_iteration.txt"
    tracker_file.unlink()
    tracker_file.mkdir()  # the file system answers every read of it with an error
    proc = _guard(tmp_path, """
        import sys
        print("NVRX_APPLIANCE_LOAD_FAILED iteration=15", file=sys.stderr, flush=True)
        sys.exit(3)
        """)  # fmt: skip
    assert proc.wait(timeout=90) == 3
    assert tracker_file.is_dir() and (ckpt / iteration_dir(15)).is_dir()
    assert not Layout(tmp_path).control_files(42).verdict.exists()  # no verdict: restart
    assert "nothing was set aside" in proc.communicate()[1]


def test_a_lock_another_node_holds_is_waited_for_and_a_stale_one_is_broken(tmp_path, monkeypatch):
    ckpt = _checkpoints(tmp_path, (30, 35), 35)
    lock = ckpt / lockfile.LOCK_FILE
    lock.write_text(json.dumps({"host": "node2", "pid": 1, "token": "t2"}))
    monkeypatch.setattr(lockfile, "LOCK_WAIT_S", 0.3)
    held = fallback.set_aside(ckpt, ckpt / "fallbacks.jsonl", 35, **ARGS)
    assert held.fell_back_to is None and not held.stop and "held by another guard" in held.message
    assert tracker(ckpt) == "35\n"
    # Its holder died holding it: seen unchanged for the staleness, by the waiter's clock.
    monkeypatch.setattr(lockfile, "LOCK_STALE_S", 0.2)
    monkeypatch.setattr(lockfile, "LOCK_WAIT_S", 30)
    done = fallback.set_aside(ckpt, ckpt / "fallbacks.jsonl", 35, **ARGS)
    assert done.fell_back_to == 30 and not lock.exists()


def test_a_lock_whose_mtime_the_server_set_an_hour_back_is_not_taken_for_stale(
    tmp_path, monkeypatch
):
    """NFS sets the mtime from the server's clock: a lock made a moment ago can look an
    hour old to a node. Staleness is what the waiter itself saw, never the mtime."""
    ckpt = _checkpoints(tmp_path, (30, 35), 35)
    lock = ckpt / lockfile.LOCK_FILE
    lock.write_text(json.dumps({"host": "node2", "pid": 1, "token": "t2"}))
    hour_ago = time.time() - 3600
    os.utime(lock, (hour_ago, hour_ago))
    monkeypatch.setattr(lockfile, "LOCK_WAIT_S", 0.5)
    held = fallback.set_aside(ckpt, ckpt / "fallbacks.jsonl", 35, **ARGS)
    assert "held by another guard" in held.message and lock.exists()
    assert tracker(ckpt) == "35\n"


def test_a_lock_stolen_from_a_slow_holder_counts_one_fall_back_once(tmp_path, monkeypatch):
    """Reproduced (issue 44): the holder's tracker write outlasted the staleness, a second
    guard took the lock and repeated the fall-back: two entries in fallbacks.jsonl (the
    chain's whole budget for one event), and the holder's exit removed the thief's lock.
    The tracker write is held up here as a slow NFS server would hold it."""
    ckpt = _checkpoints(tmp_path, (25, 30, 35), 35)
    record = ckpt / "fallbacks.jsonl"
    monkeypatch.setattr(lockfile, "LOCK_STALE_S", 0.2)
    writing, release = threading.Event(), threading.Event()
    real_write = fallback.files.write_atomic

    def slow_first_write(path, text, *args, **kwargs):
        if not writing.is_set():
            writing.set()
            release.wait(60)
        return real_write(path, text, *args, **kwargs)

    monkeypatch.setattr(fallback.files, "write_atomic", slow_first_write)
    outcomes = {}
    holder = threading.Thread(
        target=lambda: outcomes.update(holder=fallback.set_aside(ckpt, record, 35, **ARGS))
    )
    holder.start()
    assert writing.wait(30)
    thief = fallback.set_aside(ckpt, record, 35, **{**ARGS, "who": {"node": "node2"}})
    assert thief.fell_back_to == 30 and "1 of 2 fall-backs" in thief.message
    # A third guard holds the lock when the slow holder finally finishes.
    other = ckpt / lockfile.LOCK_FILE
    other.write_text(json.dumps({"host": "node3", "pid": 3, "token": "t3"}))
    release.set()
    holder.join(60)
    assert "another guard took the fall-back lock" in outcomes["holder"].message
    assert other.exists()  # the holder never removes a lock it no longer holds
    [entry] = [json.loads(line) for line in record.read_text().splitlines()]
    assert (entry["from"], entry["to"], entry["node"]) == (35, 30, "node2")
    assert tracker(ckpt) == "30\n"


def lock_taken_while_read(monkeypatch, path: Path, taker: str, read_of: str) -> None:
    """The one race a look at a lock and its removal leave: the moment after the lock
    whose text holds `read_of` is read, another guard's lock takes the name `path`
    (by rename, as a waiter that broke it and won the create would leave it)."""
    real = lockfile.files.read_text
    taken = threading.Event()

    def read_then_taken(file, limit):
        text = real(file, limit)
        if not taken.is_set() and text and read_of in text:
            taken.set()
            made = path.with_name("taker.tmp")
            made.write_text(json.dumps({"host": "node2", "pid": 2, "token": taker}))
            os.replace(made, path)
        return text

    monkeypatch.setattr(lockfile.files, "read_text", read_then_taken)


def test_a_lock_taken_between_the_holders_last_look_and_its_removal_is_not_removed(
    tmp_path, monkeypatch
):
    path = tmp_path / lockfile.LOCK_FILE
    with lockfile.exclusive(path):
        mine = json.loads(path.read_text())["token"]
        lock_taken_while_read(monkeypatch, path, "t2", read_of=mine)
    assert json.loads(path.read_text())["token"] == "t2"


def test_a_stale_lock_replaced_while_a_waiter_breaks_it_is_not_removed(tmp_path, monkeypatch):
    path = tmp_path / lockfile.LOCK_FILE
    path.write_text(json.dumps({"host": "node9", "pid": 9, "token": "dead"}))
    stale = lockfile._seen(path)
    lock_taken_while_read(monkeypatch, path, "t2", read_of="dead")
    lockfile._break(path, stale)
    assert json.loads(path.read_text())["token"] == "t2"
    lockfile._break(path, stale)  # a waiter that judged the dead one stale breaks no other
    assert json.loads(path.read_text())["token"] == "t2"
    assert [p.name for p in tmp_path.iterdir()] == [lockfile.LOCK_FILE]


def test_a_repeated_fall_back_from_the_same_checkpoint_is_neither_done_nor_counted_twice(
    tmp_path,
):
    ckpt = _checkpoints(tmp_path, (25, 30, 35), 35)
    record = ckpt / "fallbacks.jsonl"
    first = fallback.set_aside(ckpt, record, 35, **ARGS)
    assert first.fell_back_to == 30
    # A guard that read the tracker before the first fall-back's write reached it.
    (ckpt / "latest_checkpointed_iteration.txt").write_text("35\n")
    again = fallback.set_aside(ckpt, record, 35, **ARGS)
    assert "was set aside already" in again.message and again.fell_back_to == 30
    assert len(record.read_text().splitlines()) == 1
    # 35 saved again later and torn again: a fall-back of its own, counted.
    (ckpt / iteration_dir(35)).mkdir()
    tracked_record.append(ckpt / tracked_record.FILE, tracked_record.TRACKED, 35)
    second = fallback.set_aside(ckpt, record, 35, **ARGS)
    assert second.fell_back_to == 30 and "2 of 2 fall-backs" in second.message


def test_a_release_tracker_is_said_in_words_not_as_iteration_none(tmp_path):
    ckpt = _checkpoints(tmp_path, (30, 35), 35)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("release")
    done = fallback.set_aside(ckpt, ckpt / "fallbacks.jsonl", 35, **ARGS)
    assert "None" not in done.message
    assert done.message == (
        "the tracker names no iteration (it reads 'release'): nothing to fall back from"
    )


def test_set_aside_and_removed_iterations_are_no_longer_complete():
    text = "\n".join(json.dumps(e) for e in (
        {"tracked": 10}, {"tracked": 20}, {"set_aside": 20}, {"tracked": 30}, {"removed": 10},
        {"tracked": True}, "torn", {"tracked": 20},
    )) + '\n{"tracked": 4'  # fmt: skip
    assert tracked_record.complete(text) == {20, 30}
    assert tracker_text(20) == "20\n"


def test_an_append_to_the_tracked_record_waits_for_the_writer_on_another_node(
    tmp_path, monkeypatch
):
    """Several nodes write the tracked record (the keeper, the trainer's rank 0, the
    guards); O_APPEND from different NFS clients is no exclusion, the record lock is."""
    record = tmp_path / tracked_record.FILE
    lock = tmp_path / lockfile.RECORD_LOCK_FILE
    lock.write_text(json.dumps({"host": "node2", "pid": 7, "token": "t7"}))
    monkeypatch.setattr(lockfile, "LOCK_WAIT_S", 0.3)
    with pytest.raises(lockfile.LockUnavailable):
        tracked_record.append(record, tracked_record.TRACKED, 40)
    assert not record.exists()
    lock.unlink()  # node2 wrote its line and let go
    tracked_record.append(record, tracked_record.TRACKED, 40)
    assert tracked_record.read(record) == {40} and not lock.exists()


def test_writers_in_several_processes_each_get_their_line_in_whole(tmp_path):
    record = tmp_path / tracked_record.FILE
    code = (
        "import sys; from pathlib import Path; from nvrx_appliance.checkpoints import tracked_record as t\n"
        "for i in range(int(sys.argv[1]), int(sys.argv[1]) + 50): t.append(Path(sys.argv[2]), t.TRACKED, i)"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(start), str(record)])
             for start in (0, 1000, 2000)]  # fmt: skip
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    expected = {i for start in (0, 1000, 2000) for i in range(start, start + 50)}
    assert tracked_record.read(record) == expected


def test_a_guard_stopped_while_it_drains_the_output_still_judges_the_exit_it_saw(tmp_path):
    """torch elastic's TERM reaches the guard after its worker failed, while a child of
    the worker still holds the output open: the failed load the worker reported before
    is judged, not dropped."""
    ckpt = _checkpoints(tmp_path, (30, 35), 35)
    go, exited = tmp_path / "go", tmp_path / "exited"
    proc = _guard(tmp_path, f"""
        import os, subprocess, sys
        print("NVRX_APPLIANCE_LOAD_FAILED iteration=35", file=sys.stderr, flush=True)
        # A child that keeps the worker's output open, as a data loader's may.
        subprocess.Popen([sys.executable, "-c",
                          "import os, time\\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"])
        open({str(exited)!r}, "w").write(str(os.getpid()))
        sys.exit(1)
        """)  # fmt: skip
    wait_until(lambda: exited.exists() and exited.read_text(), 60, "the worker to exit")
    worker = int(exited.read_text())
    wait_until(lambda: not os.path.exists(f"/proc/{worker}"), 60, "the guard to reap it")
    os.kill(proc.pid, signal.SIGTERM)  # the guard is draining the output now
    go.touch()
    assert proc.wait(timeout=60) == 1
    assert tracker(ckpt) == "30\n", proc.communicate()[1]
    assert "resuming from checkpoint 30" in proc.communicate()[1]


def test_a_work_dir_from_before_the_tracked_record_stops_naming_what_is_there_and_the_fix(
    tmp_path,
):
    ckpt = _checkpoints(tmp_path, (), 50, torn=(30, 40, 50))  # iter_ directories, no record
    done = fallback.set_aside(ckpt, ckpt / "fallbacks.jsonl", 50, **ARGS)
    assert done.stop and tracker(ckpt) == "50\n"
    assert done.message == (
        "checkpoint 50 cannot be loaded and no checkpoint before it that was ever complete "
        "(tracked) is on disk; iter_0000030, iter_0000040 lie there, but "
        "checkpoints/tracked.jsonl never recorded them complete (a work dir from before the "
        "record, or saves cut short, look alike). If you know one is complete, add a line "
        '{"tracked": 40} to checkpoints/tracked.jsonl, write 40 into '
        "checkpoints/latest_checkpointed_iteration.txt, and resubmit"
    )
