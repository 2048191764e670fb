"""A test session leaves nothing running (tests/process_tree.py).

Every process the suite starts carries the session's token in its environment, and the
id of the test that started it. A unit test that leaves one running fails at its
teardown, naming it (it is killed then). At the end of the session, unit and cluster
tests alike, any process of the session still running fails the session. Both give a
process a grace to exit: one a test has just killed is not a leak.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import process_tree

# Seconds a process is given to exit before it counts as left behind: after a unit test
# or a session of them, and after a session that ran cluster tests (their job steps end
# within Slurm's KillWait once cancelled).
TEST_GRACE_S = 5.0
CLUSTER_GRACE_S = 60.0
_OWNER = pytest.StashKey[bool]()


def _pids_file(token: str) -> Path:
    """Where the pytest processes of the session (pytest-xdist's workers) write their
    pids: they carry the token too, and are no leak."""
    return Path(os.environ.get("TMPDIR", "/tmp")) / f"nvrx-test-session-{token}.pids"


def pytest_configure(config: pytest.Config) -> None:
    owner = process_tree.SESSION not in os.environ
    if owner:  # the session's first process: pytest itself, or xdist's controller
        os.environ[process_tree.SESSION] = secrets.token_hex(8)
    config.stash[_OWNER] = owner
    with _pids_file(os.environ[process_tree.SESSION]).open("a") as fh:
        fh.write(f"{os.getpid()}\n")


def _spared(token: str) -> set[int]:
    try:
        return {int(line) for line in _pids_file(token).read_text().split()}
    except (OSError, ValueError):
        return set()


@pytest.fixture(autouse=True)
def _processes_end_with_their_test(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Marks what the test starts; a unit test fails if any of it outlives the test."""
    token, test = os.environ[process_tree.SESSION], request.node.nodeid
    monkeypatch.setenv(process_tree.TEST, test)
    yield
    if "integration" in Path(str(request.node.fspath)).parts:
        _pids_file(token).with_suffix(".cluster").touch()
        return  # a cluster test's job steps end in Slurm's time: the session's check waits
    left = process_tree.outlived(token, TEST_GRACE_S, test=test, spare=_spared(token))
    if left:
        pytest.fail(
            "left running (killed now): " + "; ".join(map(str, left)) + ". End the whole "
            "tree the test starts (tests/process_tree.py: end)",
            pytrace=False,
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not session.config.stash.get(_OWNER, False):
        return  # an xdist worker: the controller looks once every worker has finished
    token = os.environ[process_tree.SESSION]
    cluster = _pids_file(token).with_suffix(".cluster")
    grace = CLUSTER_GRACE_S if cluster.exists() else TEST_GRACE_S
    left = process_tree.outlived(token, grace, spare=_spared(token))
    _pids_file(token).unlink(missing_ok=True)
    cluster.unlink(missing_ok=True)
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{len(left)} process(es) of this session outlived it (killed now):"]
    lines += [f"  {survivor}" for survivor in left]
    if reporter is not None:
        reporter.write_line("\n".join(lines), red=True, bold=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
