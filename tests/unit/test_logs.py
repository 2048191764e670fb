"""`nvrx-appliance logs`: a generation's output found where sbatch and NVRx write it."""

import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from nvidia_resiliency_ext.fault_tolerance.per_cycle_logs import PipeBasedLogsSpecs

from nvrx_appliance import manifest
from nvrx_appliance.chain import render
from nvrx_appliance.cli.main import cli
from nvrx_appliance.node import launch
from nvrx_appliance.settings.chain import ChainSpec

APPLIANCE = str(Path(sys.executable).with_name("nvrx-appliance"))


def _chain(work: Path, generations=("4242", "4250")):
    spec = ChainSpec(work_dir=str(work), job_name="llm", train_tasks=2, hot_spares=1, cold_spares=1)
    m = manifest.build(spec, created="2026-11-30T00:00:00Z", user="alice")
    manifest.save(m)
    record = {"job_ids": list(generations)}
    manifest.write_atomic(m.layout.submitted, json.dumps(record))
    return m


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _logs(*args):
    return CliRunner().invoke(cli, ["logs", *args])


def test_the_files_logs_reads_are_the_ones_sbatch_and_nvrx_are_told_to_write(tmp_path):
    m = _chain(tmp_path)
    batch = render.log_pattern(m).replace("%x", "llm").replace("%A", "4250").replace("%a", "2")
    assert Path(batch) == m.layout.batch_log("llm", "4250", 2)
    # NVRx's own rule for a cycle's file name, applied to the prefix ft_launcher is given.
    prefix = SimpleNamespace(_base_log_file=str(launch.applog_prefix(m, "4250")))
    assert PipeBasedLogsSpecs.get_cycle_log_file(prefix, 3) == str(m.layout.app_log("llm", 4250, 3))
    assert launch.nvrx_logfile(m, "4250") == m.layout.launcher_log("4250")


def test_a_chain_name_shows_the_newest_generations_task_0_log_and_names_its_path(tmp_path):
    m = _chain(tmp_path)
    _write(m.layout.batch_log("llm", "4242", 0), "old generation\n")
    newest = _write(m.layout.batch_log("llm", "4250", 0), "0: step 10\n")
    _write(m.layout.batch_log("llm", "4250", 1), "1: step 10\n")
    _write(m.layout.app_log("llm", "4250", 0), "cycle zero\n")
    _write(m.layout.launcher_log("4250"), "launcher\n")
    result = _logs("llm", "--work-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert result.stdout == "0: step 10\n"
    assert f"==> {newest} <==" in result.stderr
    assert "other logs of generation 4250: --task 0, --task 1, --cycle 0, --launcher" in (
        result.stderr
    )


def test_a_job_id_task_cycle_and_launcher_pick_that_generations_files(tmp_path):
    m = _chain(tmp_path)
    _write(m.layout.batch_log("llm", "4242", 2), "spare of 4242\n")
    _write(m.layout.app_log("llm", "4242", 1), "workload, cycle 1\n")
    _write(m.layout.launcher_log("4242"), "ft_launcher of 4242\n")
    _write(m.layout.batch_log("llm", "4250", 2), "spare of 4250\n")
    work = ["--work-dir", str(tmp_path)]
    assert _logs("4242", "--task", "2", *work).stdout == "spare of 4242\n"
    assert _logs("4242", "--cycle", "1", *work).stdout == "workload, cycle 1\n"
    assert _logs("4242", "--launcher", *work).stdout == "ft_launcher of 4242\n"


def test_a_log_not_written_yet_is_one_line_and_a_failure(tmp_path):
    _chain(tmp_path)
    result = _logs("4250", "--cycle", "7", "--work-dir", str(tmp_path))
    assert result.exit_code == 1
    assert "application log of NVRx cycle 7 of generation 4250" in result.stderr
    assert "does not exist yet" in result.stderr


def test_two_logs_at_once_are_refused(tmp_path):
    _chain(tmp_path)
    result = _logs("llm", "--cycle", "1", "--launcher", "--work-dir", str(tmp_path))
    assert result.exit_code == 2
    assert "give one of them" in result.stderr


def _read_until(proc, text, timeout_s=20.0):
    """stdout+stderr of a running command until `text` shows (the deadline only bounds a
    failing test)."""
    seen = ""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while text not in seen:
            left = deadline - time.monotonic()
            assert left > 0 and sel.select(left), f"never printed {text!r}; got {seen!r}"
            chunk = os.read(proc.stdout.fileno(), 65536).decode()
            assert chunk, f"exited before printing {text!r}; got {seen!r}"
            seen += chunk
    return seen


def test_follow_prints_what_is_appended_and_moves_on_to_the_next_generation(tmp_path):
    m = _chain(tmp_path, generations=("4242",))
    first = _write(m.layout.batch_log("llm", "4242", 0), "start\n")
    proc = subprocess.Popen(
        [APPLIANCE, "logs", "llm", "--follow", "--work-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        _read_until(proc, "start\n")
        with first.open("a") as fh:
            fh.write("step 1\n")
        _read_until(proc, "step 1\n")
        _chain(tmp_path, generations=("4242", "4250"))
        second = _write(m.layout.batch_log("llm", "4250", 0), "resumed at 40\n")
        seen = _read_until(proc, "resumed at 40\n")
        assert f"==> {second} <==" in seen
    finally:
        proc.terminate()
        proc.wait()


def test_the_api_gives_the_same_log_its_other_logs_and_a_typed_miss(tmp_path):
    from nvrx_appliance import api

    m = _chain(tmp_path)
    newest = _write(m.layout.batch_log("llm", "4250", 0), "0: step 10\n")
    _write(m.layout.launcher_log("4250"), "launcher\n")
    log = api.logs("llm", work_dir=tmp_path)
    assert (log.generation, log.path, log.text) == ("4250", newest, "0: step 10\n")
    assert log.others == ("--task 0", "--launcher")
    with pytest.raises(api.LogMissing) as missing:
        api.logs("4242", cycle=3, work_dir=tmp_path)
    assert missing.value.generation == "4242"
    assert missing.value.path == m.layout.app_log("llm", "4242", 3)
    with pytest.raises(ValueError, match="give one of them"):
        api.logs("llm", cycle=1, launcher=True, work_dir=tmp_path)
