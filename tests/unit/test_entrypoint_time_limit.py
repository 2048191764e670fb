"""The time-limit notice in the control directory, and which of ft_launcher's workers
the save signal can reach: those with a handler installed (real processes)."""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from nvrx_appliance.layout import ControlFiles
from nvrx_appliance.node import time_limit

GENERATION = "chain-1/500/2026-01-01T00:00:00"


def test_the_notice_names_its_generation_and_another_runs_is_ignored(tmp_path):
    assert time_limit.noticed(tmp_path, GENERATION) is None
    time_limit.write_notice(tmp_path, GENERATION, "exit duration of 1 min reached")
    assert time_limit.noticed(tmp_path, GENERATION) == "exit duration of 1 min reached"
    assert ControlFiles(tmp_path).time_limit.stat().st_mode & 0o777 == 0o600
    assert time_limit.noticed(tmp_path, "chain-1/501/") is None  # a reused array job id


def test_the_notice_the_batch_shell_writes_is_read(tmp_path):
    # The shell's printf, as generation.sbatch.tmpl writes it (submit time unknown there
    # when scontrol did not answer: still the same generation).
    ControlFiles(tmp_path).time_limit.write_text(
        "generation=chain-1/500/\nreason=Slurm: task 3 is near its time limit\n"
        "time=2026-01-01T00:59:00Z\n"
    )
    assert time_limit.noticed(tmp_path, GENERATION) == "Slurm: task 3 is near its time limit"


# A stand-in for ft_launcher: it catches the signal (as torch elastic would if told to
# handle it) and runs one worker, and a forked child like its rank monitors, whose
# command line is the launcher's own and so ends with the workload's.
LAUNCHER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGURG, lambda *_: None)
    if os.fork() == 0:
        signal.signal(signal.SIGURG, signal.SIG_DFL)
        time.sleep(60)
        os._exit(0)
    subprocess.Popen([sys.executable, "-c", WORKER, "train.py", "--iters", "9"])
    while True:
        time.sleep(0.1)
    """
)
WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    time.sleep(float(os.environ["HANDLER_AFTER"]))  # importing, building the model
    signal.signal(signal.SIGURG, lambda *_: None)
    time.sleep(60)
    """
)


def _end(launcher: subprocess.Popen) -> None:
    """The stand-in launcher and everything it started."""
    for child in psutil.Process(launcher.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()
    launcher.kill()
    launcher.wait()


def test_the_save_signal_reaches_a_worker_once_it_catches_it_and_never_the_launcher(tmp_path):
    code = LAUNCHER.replace("WORKER, ", repr(WORKER) + ", ")
    launcher = subprocess.Popen(
        [sys.executable, "-c", code, "-c", WORKER, "train.py", "--iters", "9"],
        env={**os.environ, "HANDLER_AFTER": "2"},
    )
    workload = [sys.executable, "-c", WORKER, "train.py", "--iters", "9"]
    try:
        deadline = time.monotonic() + 20
        while len(psutil.Process(launcher.pid).children()) < 2:
            assert time.monotonic() < deadline, "the launcher's children never started"
            time.sleep(0.05)
        # The forked child's command line ends with the workload's; only the worker counts.
        [(worker, workload_pid)] = time_limit.workers(launcher.pid, workload)
        assert workload_pid == worker  # no guard in between here
        # Still importing: the signal would be lost, so nothing is reachable yet...
        assert time_limit.reachable(launcher.pid, workload, signal.SIGURG) == ()
        while not time_limit.reachable(launcher.pid, workload, signal.SIGURG):
            assert time.monotonic() < deadline, "never reachable"
            time.sleep(0.05)
        # ...then the worker alone, though the launcher catches the signal too.
        assert time_limit.reachable(launcher.pid, workload, signal.SIGURG) == (worker,)
        assert time_limit.catches(launcher.pid, signal.SIGURG)
        assert not time_limit.catches(worker, signal.SIGUSR2)
    finally:
        _end(launcher)


def test_through_the_workload_guard_the_signal_waits_for_the_workload_and_goes_to_its_group(
    tmp_path,
):
    # ft_launcher -> guard -> workload: the guard catches no SIGURG (its default is to be
    # ignored), so the workload decides when the signal can land, and it is sent to the
    # guard's process group, which the workload is in.
    code = (
        LAUNCHER.replace(
            '[sys.executable, "-c", WORKER,',
            '[sys.executable, "-m", "nvrx_appliance.rank.guard", "--control", '
            f'{str(tmp_path)!r}, "--exits", {str(tmp_path / "exits")!r}, "--generation", "g", '
            '"--", sys.executable, "-c", WORKER,',
        )
        .replace("WORKER, ", repr(WORKER) + ", ")
        .replace("WORKER,", repr(WORKER) + ",")
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", code], env={**os.environ, "HANDLER_AFTER": "2"},
    )  # fmt: skip
    workload = [sys.executable, "-c", WORKER, "train.py", "--iters", "9"]
    try:
        deadline = time.monotonic() + 30
        while not time_limit.workers(launcher.pid, workload):
            assert time.monotonic() < deadline, "the guard never started the workload"
            time.sleep(0.05)
        [(guard, worker)] = time_limit.workers(launcher.pid, workload)
        assert guard != worker and psutil.Process(worker).ppid() == guard
        assert os.getpgid(worker) == os.getpgid(guard)
        while not time_limit.reachable(launcher.pid, workload, signal.SIGURG):
            assert time.monotonic() < deadline, "never reachable"
            time.sleep(0.05)
        assert time_limit.reachable(launcher.pid, workload, signal.SIGURG) == (guard,)
        assert not time_limit.catches(guard, signal.SIGURG)
    finally:
        _end(launcher)


def test_the_save_signal_goes_to_a_workers_whole_process_group(tmp_path):
    # A worker leads a session of its own (torch elastic starts it so); what it started,
    # a data loader say, gets the signal too, as from torch elastic's own forwarding.
    got = tmp_path / "got"
    worker = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import os, signal, sys, time
            def noted(*_):
                with open({str(got)!r}, "a") as fh:
                    fh.write(f"{{os.getpid()}}\\n")
            signal.signal(signal.SIGURG, noted)
            if os.fork() == 0:
                signal.signal(signal.SIGURG, noted)
            open({str(got)!r} + "." + str(os.getpid()), "w").close()
            time.sleep(60)
        """)],
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while len(list(tmp_path.glob("got.*"))) < 2:
            assert time.monotonic() < deadline, "the worker and its child never got ready"
            time.sleep(0.05)
        time_limit.send(worker.pid, signal.SIGURG)
        while not got.exists() or len(got.read_text().split()) < 2:
            assert time.monotonic() < deadline, "the signal did not reach both"
            time.sleep(0.05)
        assert str(worker.pid) in got.read_text().split()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


def test_a_notice_that_is_not_json_still_counts(tmp_path):
    # Only the reason is lost: the generation must still save.
    Path(ControlFiles(tmp_path).time_limit).write_text("garbage\n")
    assert time_limit.noticed(tmp_path, GENERATION) == "the time-limit notice is present"
