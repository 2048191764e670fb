"""A test session leaves nothing running (tests/conftest.py, tests/process_tree.py).

Each case runs a session of its own (pytest in a subprocess, with this suite's
conftest as a plugin and a token of its own) over a test file that does what NVRx did
to the suite: ft_launcher's RankMonitorServer ignores SIGTERM and is left with parent 1
when the launcher is SIGKILLed. The session must fail naming the process, and end it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil

from tests import process_tree

ROOT = Path(__file__).resolve().parents[2]

# A launcher that forks a monitor ignoring SIGTERM, then is killed hard: the monitor
# is left running with parent 1. It writes its pid once it ignores the signal.
ORPHAN = """
import os, subprocess, sys, time
from pathlib import Path

MONITOR = (
    "import os, signal, sys, time; from pathlib import Path; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "Path(sys.argv[1] + '.tmp').write_text(str(os.getpid())); "
    "os.rename(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(600)"
)


def orphan(pid_file):
    launcher = subprocess.Popen([sys.executable, "-c",
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-c', {MONITOR!r}, {str(pid_file)!r}]); "
        "time.sleep(600)"])
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    launcher.kill()
    launcher.wait()
    return int(pid_file.read_text())
"""


def session(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess, int]:
    """pytest over `body` as a session of its own; and the orphan's pid. Its rootdir is
    the test's folder, so the inner test's id reads the same wherever this clone lives
    (from a clone under /tmp, pytest named it ../pytest-of-root/.../test_inner.py)."""
    test = tmp_path / "test_inner.py"
    test.write_text(ORPHAN + textwrap.dedent(body))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "-q", str(test)],
        cwd=ROOT, env={**process_tree.unmarked(os.environ), "PIDS": str(tmp_path / "pid")},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return done, int((tmp_path / "pid").read_text())


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_unit_test_that_leaves_an_orphan_running_fails_naming_it_and_it_is_ended(tmp_path):
    done, pid = session(
        tmp_path,
        """
        def test_a_launcher_killed_hard(tmp_path):
            orphan(Path(os.environ["PIDS"]))
    """,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert f"left running (killed now): pid {pid}" in out
    assert "started by test_inner.py::test_a_launcher_killed_hard" in out
    assert gone(pid)


def test_a_process_that_outlives_the_session_fails_it_though_every_test_passed(tmp_path):
    done, pid = session(
        tmp_path,
        """
        import pytest

        @pytest.fixture(scope="session")
        def monitor():
            return orphan(Path(os.environ["PIDS"]))

        def test_uses_a_session_fixture(monitor):
            assert monitor
    """,
    )
    out = done.stdout + done.stderr
    assert "1 passed" in out and done.returncode == 1, out
    assert "1 process(es) of this session outlived it (killed now):" in out
    assert f"pid {pid}" in out and "started outside any test" in out
    assert gone(pid)


def test_a_test_that_ends_the_tree_it_started_passes(tmp_path):
    done, pid = session(
        tmp_path,
        """
        from tests import process_tree

        def test_ends_what_it_started(request):
            orphan(Path(os.environ["PIDS"]))
            process_tree.end(os.environ[process_tree.SESSION], request.node.nodeid)
    """,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert gone(pid)
