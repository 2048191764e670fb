"""The one atomic-write helper: nothing planted in the directory is opened or chmod-ed."""

import json
import os
import stat

import pytest

from nvrx_appliance.files import read_text, write_atomic
from nvrx_appliance.watch import sinks


def _victim(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    victim.chmod(0o600)
    return victim


def test_a_symlink_planted_at_the_metrics_temp_name_is_neither_written_nor_chmod_ed(tmp_path):
    metrics_dir = tmp_path / "textfiles"
    metrics_dir.mkdir()
    victim = _victim(tmp_path)
    # The name the old writer used (.<name>.<pid>), for this process and its neighbours.
    for pid in range(os.getpid() - 2, os.getpid() + 3):
        (metrics_dir / f".nvrx.prom.{pid}").symlink_to(victim)

    sinks.write_metrics(str(metrics_dir / "nvrx.prom"), "nvrx_watch_up 1\n")

    assert victim.read_text() == "precious\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    written = metrics_dir / "nvrx.prom"
    assert written.read_text() == "nvrx_watch_up 1\n"
    assert stat.S_IMODE(written.lstat().st_mode) == 0o644


def test_a_symlink_at_the_target_is_replaced_not_followed(tmp_path):
    victim = _victim(tmp_path)
    target = tmp_path / "state.json"
    target.symlink_to(victim)

    write_atomic(target, "{}\n", 0o600, durable=False)

    assert victim.read_text() == "precious\n"
    assert not target.is_symlink() and target.read_text() == "{}\n"


def test_a_failed_write_leaves_no_temp_file_and_the_old_file_intact(tmp_path):
    target = tmp_path / "run.json"
    write_atomic(target, json.dumps({"a": 1}))

    with pytest.raises(TypeError):
        write_atomic(target, 123)  # not text: fails mid-write
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_reading_a_fifo_is_refused_at_once_and_bad_bytes_spoil_only_themselves(tmp_path):
    fifo = tmp_path / "chain.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        read_text(fifo, 1024)  # without O_NONBLOCK this waits for a writer for ever
    text = tmp_path / "tracker"
    text.write_bytes(b"\xff12\n")
    assert read_text(text, 1024) == "\ufffd12\n"
    assert read_text(tmp_path / "missing", 1024) is None
