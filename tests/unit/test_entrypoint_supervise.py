"""Supervision with real child processes: exit codes, signals, the closed flag, orphans.

The supervisor runs in a driver process of its own (as nvrx-entrypoint does under
srun), so the tests can signal it and kill it like Slurm would.
"""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from nvrx_appliance import exitcodes

DRIVER = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from nvrx_appliance.entrypoints import gate
    from nvrx_appliance.entrypoints.supervise import Supervisor

    flag, grace, argv = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]

    def check():
        return gate.while_running(
            closed=flag.exists(), lease_age=None, watch_lease=False, stale_after=60
        )

    outcome = Supervisor(
        argv, dict(os.environ), check=check, grace=grace, poll=0.2,
        log=lambda line: print(line, file=sys.stderr, flush=True),
    ).run()
    sys.exit(outcome.exit_code)
    """
)


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_leftovers():
    """A test that fails midway must not leave its driver and child running: each driver
    leads a process group of its own, which is killed whole after the test."""
    yield
    while STARTED:
        proc = STARTED.pop()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def supervise(tmp_path: Path, child: str, grace: float = 1.0) -> subprocess.Popen:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(child))
    proc = subprocess.Popen(
        [
            sys.executable,
            str(driver),
            str(tmp_path / "closed"),
            str(grace),
            sys.executable,
            str(script),
        ],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    STARTED.append(proc)
    return proc


def test_exit_93_passes_through_untouched(tmp_path):
    proc = supervise(tmp_path, "import sys; sys.exit(93)")
    assert proc.wait(timeout=30) == exitcodes.NVRX_NO_RESTART


def test_an_ordinary_failure_passes_through_as_is(tmp_path):
    proc = supervise(tmp_path, "import sys; sys.exit(3)")
    assert proc.wait(timeout=30) == 3


def test_a_child_killed_by_a_signal_reports_128_plus_the_signal(tmp_path):
    proc = supervise(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert proc.wait(timeout=30) == 128 + signal.SIGKILL


def test_slurms_signals_reach_ft_launcher(tmp_path):
    seen = tmp_path / "seen"
    proc = supervise(
        tmp_path,
        f"""
        import signal, sys, time
        from pathlib import Path
        seen = Path({str(seen)!r})
        def note(signum, _):
            with seen.open("a") as fh:
                fh.write(signal.Signals(signum).name + "\\n")
            if signum == signal.SIGTERM:
                sys.exit(42)
        for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGTERM):
            signal.signal(s, note)
        seen.write_text("ready\\n")
        while True:
            time.sleep(0.1)
        """,
    )
    wait_for(lambda: seen.exists(), 30, "the child to start")
    received = []
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGTERM):
        proc.send_signal(sig)
        received.append(sig.name)
        wait_for(lambda: seen.read_text().split()[1:] == received, 10, f"{sig.name} to arrive")
    assert proc.wait(timeout=10) == 42


def test_the_closed_flag_stops_even_a_child_that_ignores_term(tmp_path):
    grandchild = tmp_path / "grandchild.pid"
    proc = supervise(
        tmp_path,
        f"""
        import signal, subprocess, time
        from pathlib import Path
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        # Like a training worker: in a session of its own, out of reach of group signals.
        worker = subprocess.Popen(["sleep", "300"], start_new_session=True)
        Path({str(grandchild)!r}).write_text(str(worker.pid))
        while True:
            time.sleep(0.1)
        """,
        grace=1.0,
    )
    worker_pid = int(
        wait_for(lambda: grandchild.exists() and grandchild.read_text(), 30, "the worker")
    )
    try:
        (tmp_path / "closed").write_text('{"exit_code": 1}\n')
        flagged = time.monotonic()
        assert proc.wait(timeout=30) == exitcodes.STOPPED_BY_CLOSED_FLAG
        assert time.monotonic() - flagged <= 1.0 + 2
        assert gone(worker_pid)
        assert "closed flag appeared" in proc.stderr.read()
    finally:
        if not gone(worker_pid):
            os.kill(worker_pid, signal.SIGKILL)


def test_ft_launcher_does_not_outlive_a_killed_entrypoint(tmp_path):
    pid_file = tmp_path / "child.pid"
    proc = supervise(
        tmp_path,
        f"""
        import os, time
        from pathlib import Path
        Path({str(pid_file)!r}).write_text(str(os.getpid()))
        while True:
            time.sleep(0.1)
        """,
    )
    child_pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30, "the child"))
    try:
        proc.send_signal(signal.SIGKILL)  # no handler runs: only the kernel can tell the child
        proc.wait(timeout=10)
        wait_for(lambda: gone(child_pid), 10, "the orphaned child to go")
    finally:
        if not gone(child_pid):
            os.kill(child_pid, signal.SIGKILL)


def test_task_0_fences_itself_while_a_control_dir_read_hangs(tmp_path):
    # A hung shared file system blocks the control-dir check inside a system call; the
    # self-fence deadline, judged from memory, must still stop ft_launcher and its tree.
    import threading

    from nvrx_appliance.entrypoints import gate
    from nvrx_appliance.entrypoints.supervise import Supervisor

    entered, release, returned = threading.Event(), threading.Event(), threading.Event()

    def hung_check():
        entered.set()
        release.wait(timeout=120)  # as a read of a stalled mount would block
        returned.set()
        return None

    pid_file = tmp_path / "child.pid"

    def past_deadline():
        if not (entered.is_set() and pid_file.exists() and pid_file.read_text()):
            return None
        return gate.self_fence(unrefreshed_for=99.0, deadline=10.0)

    child = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(300)"
    )
    lines: list[str] = []
    try:
        outcome = Supervisor(
            [sys.executable, "-c", child], dict(os.environ), check=hung_check,
            urgent=past_deadline, grace=1.0, poll=0.2, log=lines.append,
        ).run()  # fmt: skip
        stuck_when_stopped = not returned.is_set()
    finally:
        release.set()
    assert stuck_when_stopped
    assert outcome.exit_code == exitcodes.SELF_FENCED
    assert gone(int(pid_file.read_text()))
    assert any("has not refreshed its liveness lease" in line for line in lines)


def test_what_ft_launcher_leaves_running_when_it_exits_is_stopped(tmp_path):
    # NVRx's log server runs in a session of its own: left behind, it would hold its port
    # into the next generation on this node, whose workers would then stream to it.
    leftover = tmp_path / "leftover.pid"
    proc = supervise(
        tmp_path,
        f"""
        import subprocess, time
        from pathlib import Path
        server = subprocess.Popen(["sleep", "300"], start_new_session=True)
        Path({str(leftover)!r}).write_text(str(server.pid))
        time.sleep(1.0)  # a poll or more of the supervisor sees it running
        """,
    )
    assert proc.wait(timeout=60) == 0  # ft_launcher's own exit code, untouched
    pid = int(leftover.read_text())
    try:
        wait_for(lambda: gone(pid), 10, "the leftover to be killed")
        assert "left 1 process(es) running" in proc.stderr.read()
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_an_exit_93_during_the_control_dir_check_stands_although_the_check_says_closed(tmp_path):
    # ft_launcher exits 93 while the check reads the control dir, and the check then finds
    # the closed flag (task 0's flag follows its own 93): stopping the child anyway and
    # returning 76 lost the 93, and with it the no-restart witness.
    from nvrx_appliance.entrypoints import gate
    from nvrx_appliance.entrypoints.supervise import Supervisor

    go = tmp_path / "go"
    child = (
        "import os, sys, time\n"
        f"while not os.path.exists({str(go)!r}):\n"
        "    time.sleep(0.01)\n"
        "sys.exit(93)\n"
    )
    supervisor: Supervisor

    def check():
        go.touch()  # the child exits 93 now, while this check is still "reading"
        assert supervisor.child is not None
        os.waitid(os.P_PID, supervisor.child.pid, os.WEXITED | os.WNOWAIT)  # not reaped
        return gate.while_running(closed=True, lease_age=None, watch_lease=False, stale_after=60)

    supervisor = Supervisor(
        [sys.executable, "-c", child], dict(os.environ), check=check, grace=1.0, poll=1.0,
        log=lambda line: None,
    )  # fmt: skip
    outcome = supervisor.run()
    assert (outcome.exit_code, outcome.stopped) == (exitcodes.NVRX_NO_RESTART, None)
