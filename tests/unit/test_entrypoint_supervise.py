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
    import os, signal, sys
    from pathlib import Path
    from nvrx_appliance.node import gate, time_limit
    from nvrx_appliance.node.supervise import Save, SaveSignal, Supervisor

    flag, grace, argv = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
    # Task 0's options, as node_lifecycle sets them: the time-limit notice, a TERM drain,
    # and what it does when the drain ends (there: write the closed flag).
    notice = Path(os.environ.get("DRIVER_NOTICE", "/nonexistent"))
    drain = float(os.environ["DRIVER_DRAIN"]) if "DRIVER_DRAIN" in os.environ else None
    closed_for_signal = os.environ.get("DRIVER_ON_STOP")
    # The workload's command line, when the child stands in for ft_launcher and its
    # workers: then the supervisor finds the workers as node_lifecycle has it find them.
    # Without it the child is its own one worker.
    workload = os.environ.get("DRIVER_WORKLOAD")

    def check():
        verdict = gate.while_running(
            closed=flag.exists(), lease_age=None, watch_lease=False, stale_after=60
        )
        if verdict is None and notice.exists():
            return Save("the time limit is near")
        return verdict

    def on_stop(signum):
        Path(closed_for_signal).write_text(signal.Signals(signum).name)

    outcome = Supervisor(
        argv, dict(os.environ), check=check, grace=grace, poll=0.2,
        log=lambda line: print(line, file=sys.stderr, flush=True),
        on_stop_signal=on_stop if closed_for_signal else None, drain=drain,
        save=SaveSignal(
            signal.SIGURG,
            (lambda pid: time_limit.reachable(pid, [sys.executable, workload], signal.SIGURG))
            if workload
            else (lambda pid: (pid,) if time_limit.catches(pid, signal.SIGURG) else ()),
        ),
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


def supervise(
    tmp_path: Path, child: str, grace: float = 1.0, **driver_env: str
) -> subprocess.Popen:
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
        env={**os.environ, **driver_env},
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


def test_slurms_signals_reach_ft_launcher_and_a_stop_signal_only_once(tmp_path):
    # torch elastic raises on every stop signal; a second one, raised inside its shutdown,
    # would end its wait for workers that are saving.
    seen = tmp_path / "seen"
    proc = supervise(
        tmp_path,
        f"""
        import signal, sys, time
        from pathlib import Path
        seen = Path({str(seen)!r})
        stopping = []
        def note(signum, _):
            with seen.open("a") as fh:
                fh.write(signal.Signals(signum).name + "\\n")
            if signum in (signal.SIGINT, signal.SIGTERM):
                stopping.append(signum)
        for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGTERM):
            signal.signal(s, note)
        seen.write_text("ready\\n")
        while not stopping:
            time.sleep(0.1)
        time.sleep(1.5)  # long enough for a second stop signal to arrive, if sent
        sys.exit(42)
        """,
    )
    wait_for(lambda: seen.exists(), 30, "the child to start")
    received = []
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT):
        proc.send_signal(sig)
        received.append(sig.name)
        wait_for(lambda: seen.read_text().split()[1:] == received, 10, f"{sig.name} to arrive")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 42
    assert seen.read_text().split()[1:] == received


def test_the_notice_sends_the_save_signal_once_and_only_once_it_can_land(tmp_path):
    # A process without a handler ignores SIGURG: sent while ft_launcher is still in its
    # rendezvous (or its workers still import), it would be lost. So it waits.
    seen, notice = tmp_path / "seen", tmp_path / "time_limit"
    notice.write_text("{}")
    proc = supervise(
        tmp_path,
        f"""
        import signal, sys, time
        from pathlib import Path
        time.sleep(1.5)  # setting up: no handler yet, for several polls of the supervisor
        got = []
        signal.signal(signal.SIGURG, lambda *_: got.append(1))
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # saving: a second signal would be counted here
        Path({str(seen)!r}).write_text(str(len(got)))
        sys.exit(0)
        """,
        DRIVER_NOTICE=str(notice),
    )
    assert proc.wait(timeout=30) == 0
    assert seen.read_text() == "1"
    err = proc.stderr.read()
    assert "the time limit is near: asking the workload to save and end" in err
    assert "sending SIGURG to ft_launcher's 1 worker(s)" in err


# A stand-in for ft_launcher that runs its cycles' workers one at a time and, told to
# handle SIGURG as torch elastic would (`handles`), shuts down on it past its exit
# barrier, which then holds every peer: the supervisor must never send it there. A
# "between" cycle is a restart in progress (no worker for a while); after the last
# worker ends 0, it ends 0 too (the exit barrier, passed).
LAUNCHER = """
    import os, signal, subprocess, sys, time
    from pathlib import Path
    log = Path({log!r})
    def on_signal(*_):
        log.write_text(log.read_text() + "launcher got SIGURG\\n")
        sys.exit(0)
    signal.signal(signal.SIGURG, on_signal)
    for cycle in {cycles!r}:
        if cycle == "between":
            time.sleep(1.0)
            continue
        worker = subprocess.Popen([sys.executable, {worker!r}], env=dict(os.environ, CYCLE=cycle),
                                  start_new_session=True)
        code = worker.wait()
        if code != 0:
            sys.exit(code)
    sys.exit(0)
"""
WORKER = """
    import os, signal, sys, time
    from pathlib import Path
    cycle, log = os.environ["CYCLE"], Path({log!r})
    time.sleep(0.5)  # importing: no handler yet
    got = []
    signal.signal(signal.SIGURG, lambda *_: got.append(1))
    deadline = time.monotonic() + 20
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # saving: a second signal would be counted here
    log.write_text(log.read_text() + f"worker {{cycle}} saved ({{len(got)}})\\n")
    sys.exit(0 if got else 4)
"""


def noticed_launcher(tmp_path: Path, cycles: list[str]):
    """The stand-in under a supervisor that finds the time-limit notice present from the
    start: (the supervisor's process, the signals log)."""
    log = tmp_path / "signals.log"
    log.write_text("")
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent(WORKER.format(log=str(log))))
    code = LAUNCHER.format(log=str(log), cycles=cycles, worker=str(worker))
    notice = tmp_path / "time_limit"
    notice.write_text("{}")
    proc = supervise(tmp_path, code, DRIVER_NOTICE=str(notice), DRIVER_WORKLOAD=str(worker))
    return proc, log


def test_the_save_signal_goes_to_each_worker_once_and_never_to_ft_launcher(tmp_path):
    # The CI run's time-limit failure: a ft_launcher that got the signal itself shut
    # down past its exit barrier, and its peer's waited there until Slurm killed the
    # job (143, not 0). Its workers alone get it, once, and the launcher ends 0 after.
    proc, log = noticed_launcher(tmp_path, ["first"])
    assert proc.wait(timeout=30) == 0
    assert log.read_text() == "worker first saved (1)\n"
    assert "sending SIGURG to ft_launcher's 1 worker(s)" in proc.stderr.read()


def test_workers_started_after_the_save_signal_get_it_too(tmp_path):
    # The notice came during an in-job restart (no workers): the next cycle's workers
    # get it as soon as they catch it; a second cycle's workers too.
    proc, log = noticed_launcher(tmp_path, ["between", "next", "last"])
    assert proc.wait(timeout=30) == 0
    assert log.read_text() == "worker next saved (1)\nworker last saved (1)\n"
    err = proc.stderr.read()
    assert "ft_launcher started new workers after SIGURG; sending it to them too" in err


SAVES_ON_TERM = """
    import signal, sys, time
    from pathlib import Path
    def drain(*_):
        time.sleep(4)  # longer than the closed flag's grace
        Path({saved!r}).write_text("done")
        sys.exit(0)
    signal.signal(signal.SIGTERM, drain)
    Path({saved!r} + ".ready").write_text("")
    while True:
        time.sleep(0.1)
"""


def test_task_0_closes_the_generation_at_once_on_term_yet_lets_its_workload_finish(tmp_path):
    # The run: a child that needs seconds to drain on TERM was killed 3 s in
    # (exit 76) by task 0's own closed flag. The flag still goes out at once (the batch
    # shell may be what died); ft_launcher, told to stop, is let finish within the drain.
    saved, flag = tmp_path / "saved", tmp_path / "closed"
    proc = supervise(
        tmp_path, SAVES_ON_TERM.format(saved=str(saved)), grace=1.0,
        DRIVER_DRAIN="10", DRIVER_ON_STOP=str(flag),
    )  # fmt: skip
    wait_for(lambda: Path(str(saved) + ".ready").exists(), 30, "the child to start")
    proc.send_signal(signal.SIGTERM)
    wait_for(flag.exists, 5, "the closed flag")
    assert not saved.exists()  # the flag went out before the workload had finished
    assert proc.wait(timeout=20) == 0  # ft_launcher's own code: it finished
    assert saved.exists() and flag.read_text() == "SIGTERM"
    assert "told to stop, finishes on its own" in proc.stderr.read()


def test_a_peer_told_to_stop_by_slurm_is_not_cut_short_by_the_closed_flag(tmp_path):
    saved = tmp_path / "saved"
    proc = supervise(tmp_path, SAVES_ON_TERM.format(saved=str(saved)), grace=1.0)
    wait_for(lambda: Path(str(saved) + ".ready").exists(), 30, "the child to start")
    proc.send_signal(signal.SIGTERM)  # Slurm ends this task's job too (scancel, time limit)
    (tmp_path / "closed").write_text("generation=x\n")  # task 0's flag, at once
    assert proc.wait(timeout=20) == 0 and saved.exists()


def test_a_term_drain_that_runs_out_stops_everything_before_slurms_kill(tmp_path):
    flag, pid_file = tmp_path / "closed", tmp_path / "child.pid"
    proc = supervise(
        tmp_path,
        f"""
        import os, signal, time
        from pathlib import Path
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        Path({str(pid_file)!r}).write_text(str(os.getpid()))
        while True:
            time.sleep(0.1)
        """,
        grace=1.0,
        DRIVER_DRAIN="1",
        DRIVER_ON_STOP=str(flag),
    )
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30, "the child"))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert flag.read_text() == "SIGTERM" and gone(pid)
    assert "ft_launcher still running 1 s after SIGTERM" in proc.stderr.read()


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

    from nvrx_appliance.node import gate
    from nvrx_appliance.node.supervise import Supervisor

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
    from nvrx_appliance.node import gate
    from nvrx_appliance.node.supervise import Supervisor

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


def test_an_exit_93_while_we_stop_ft_launcher_stands_and_is_not_reported_as_our_stop(tmp_path):
    # NVRx decides "do not restart" while the closed flag has us stop ft_launcher (a
    # peer's no-restart reached it at the same moment): returning our own 76 lost the 93
    # and, with it, the no-restart witness the entrypoint writes for a 93.
    ready = tmp_path / "ready"
    proc = supervise(
        tmp_path,
        f"""
        import signal, sys, time
        from pathlib import Path
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(93))
        Path({str(ready)!r}).touch()
        while True:
            time.sleep(0.1)
        """,
        grace=5.0,
    )
    wait_for(ready.exists, 30, "the child's TERM handler")
    (tmp_path / "closed").write_text('{"exit_code": 1}\n')
    assert proc.wait(timeout=30) == exitcodes.NVRX_NO_RESTART
    assert "NVRx's decision stands" in proc.stderr.read()
