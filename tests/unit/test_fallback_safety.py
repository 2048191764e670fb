"""The fall-back never costs a good checkpoint (issue 40): it goes back only to a
checkpoint the tracker once named, leaves a loadable state at every step, does nothing
(and says so) when the file system refuses, and excludes across nodes with a lock made
by exclusive create in the checkpoint directory."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from nvrx_appliance.checkpoints import fallback, tracked_record
from nvrx_appliance.checkpoints.checkpoint_dir import iteration_dir, tracker_text
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
    assert not (ckpt / fallback.LOCK_FILE).exists()  # the lock is given back


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
    lock = ckpt / fallback.LOCK_FILE
    lock.write_text(json.dumps({"host": "node2", "pid": 1}))
    monkeypatch.setattr(fallback, "LOCK_WAIT_S", 0.3)
    held = fallback.set_aside(ckpt, ckpt / "fallbacks.jsonl", 35, **ARGS)
    assert held.fell_back_to is None and not held.stop and "held by another guard" in held.message
    assert tracker(ckpt) == "35\n"
    old = time.time() - fallback.LOCK_STALE_S - 5
    os.utime(lock, (old, old))  # its holder died holding it
    done = fallback.set_aside(ckpt, ckpt / "fallbacks.jsonl", 35, **ARGS)
    assert done.fell_back_to == 30 and not lock.exists()


def test_set_aside_and_removed_iterations_are_no_longer_complete():
    text = "\n".join(json.dumps(e) for e in (
        {"tracked": 10}, {"tracked": 20}, {"set_aside": 20}, {"tracked": 30}, {"removed": 10},
        {"tracked": True}, "torn", {"tracked": 20},
    )) + '\n{"tracked": 4'  # fmt: skip
    assert tracked_record.complete(text) == {20, 30}
    assert tracker_text(20) == "20\n"
