"""The machine-wide cluster lock: strangers wait (and are told for whom), the holder's
own children (a test session running `cluster up`) go ahead."""

from __future__ import annotations

import subprocess
import sys
import threading

from nvrx_appliance.devcluster.lock import cluster_lock, holder
from nvrx_appliance.devcluster.poll import wait_until

HOLD = """
import sys
from pathlib import Path
from nvrx_appliance.devcluster.lock import cluster_lock
with cluster_lock(Path(sys.argv[1]), say=lambda line: None):
    print("held", flush=True)
    sys.stdin.read()  # hold until the test closes our stdin
"""


def test_a_stranger_waits_for_the_holder_and_is_told_who_it_is(tmp_path):
    path = tmp_path / "cluster.lock"
    other = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout.readline() == "held\n"
        assert holder(path) == other.pid
        said: list[str] = []
        got = threading.Event()

        def take() -> None:
            with cluster_lock(path, say=said.append):
                got.set()

        waiter = threading.Thread(target=take)
        waiter.start()
        wait_until(lambda: said, 10, "the waiting message")
        assert f"pid {other.pid}" in said[0]
        assert not got.is_set()
        other.stdin.close()  # the holder finishes
        waiter.join(timeout=10)
        assert got.is_set()
    finally:
        other.kill()
        other.wait()


def test_a_child_of_the_holder_proceeds_under_its_parents_lock(tmp_path):
    path = tmp_path / "cluster.lock"
    with cluster_lock(path, say=lambda line: None):
        assert holder(path) is not None
        child = subprocess.run(
            [sys.executable, "-c", HOLD, str(path)],
            input="",
            capture_output=True,
            text=True,
            timeout=20,
        )
        assert child.returncode == 0 and child.stdout == "held\n"
    assert holder(path) is None
