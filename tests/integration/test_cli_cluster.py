"""Every command a person runs on a chain, exactly as the README shows it (no --json),
on the real cluster: it exits 0, prints no traceback, and says what a person reads.

A traceback after a successful queue once went unseen because every cluster test
submitted with --json; this test is the human path end to end: submit, status (on a
terminal and through a pipe), the list of chains, status --watch, logs in each form,
nvrx-watch by job id and by name, cancel. (qualify's human output is
checked by test_image_handoff.py, which runs it as a person does.)
"""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nvrx_appliance.devcluster.poll import wait_until

from .chain_support import (
    CLI,
    FAST,
    cli,
    logs_on_failure,
    state,
    tasks,
    unique,
    wait_idle,
    wait_tracker,
)
from .conftest import Cluster

pytestmark = pytest.mark.cluster

WATCH = str(Path(sys.executable).parent / "nvrx-watch")


def no_traceback(done: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr


def lines_of(text: str, start: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip().startswith(start)]


def wide(cluster: Cluster, *args: str) -> subprocess.CompletedProcess:
    """A command whose tables should not wrap: as in a terminal 200 columns wide."""
    env = cluster.env(COLUMNS="200")
    return subprocess.run([CLI, *args], env=env, capture_output=True, text=True, timeout=120)


def _as_a_foreground_job() -> None:
    """Ctrl-C's signal as an interactive shell leaves it to the command it runs: at its
    default. A test suite started in the background (`&` without job control) inherits
    it ignored, and so would the command, which Ctrl-C then could not stop."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


class Terminal:
    """A command run on a pseudo-terminal, as in a person's shell: rich's live display
    only redraws on a terminal."""

    def __init__(self, argv: list[str], env: dict[str, str], columns: int = 200):
        self.master, replica = pty.openpty()
        self.proc = subprocess.Popen(
            argv, stdin=replica, stdout=replica, stderr=replica,
            env={**env, "COLUMNS": str(columns)}, preexec_fn=_as_a_foreground_job,
        )  # fmt: skip
        os.close(replica)
        self.seen = b""

    def read(self) -> str:
        while self.master >= 0 and select.select([self.master], [], [], 0.1)[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # the command ended and closed its side
                break
            if not chunk:
                break
            self.seen += chunk
        return self.seen.decode(errors="replace")

    def wait(self, timeout: float = 60) -> int:
        """The exit code of a command that ends by itself, all it showed read."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.read()
        code = self.proc.wait(timeout=1)
        self.read()
        os.close(self.master)
        self.master = -1
        return code

    def interrupt(self, timeout: float = 30) -> int:
        """Ctrl-C, as the terminal sends it; the command's exit code. The terminal goes
        on reading meanwhile, as a real one does: a command whose last redraw filled the
        pty's small buffer would otherwise block in that write and never exit."""
        self.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.read()
        code = self.proc.wait(timeout=1)
        self.read()
        os.close(self.master)
        self.master = -1
        return code


def test_a_person_submits_follows_reads_watches_and_cancels_a_chain(
    cluster: Cluster, tmp_path: Path
):
    work, name = cluster.workdir("human"), unique("human")
    done = cli(cluster, "submit", *FAST, "--work-dir", str(work), "--job-name", name,
               "--train-tasks", "2", "--hot-spares", "0", "--cold-spares", "0",
               "--depth", "2", "--train-samples", "1000000")  # fmt: skip
    no_traceback(done)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"Queued chain {name!r}: 2 generation(s) of array 0-1%2 (2 training + 0 hot + 0 " in out
    assert "  mode:     train (no injected faults)" in out
    first, second = lines_of(out, "jobs:")[0].split()[1:]
    assert f"  work dir: {work}" in out
    assert f"  follow:   nvrx-appliance status {first}" in out
    try:
        wait_tracker(work, 240)

        shown = wide(cluster, "status", first)
        no_traceback(shown)
        assert shown.returncode == 0, shown.stderr
        opening, then = shown.stdout.splitlines()[:2]
        assert opening.startswith(f"running: generation {first} (task 0 on ")
        assert opening.endswith("; 1 more queued behind it")
        assert then == f"next: nvrx-appliance logs {name} --follow"
        assert f"chain {name}" in shown.stdout and "mode: train   workload: cpu" in shown.stdout
        assert f"queued generations: {second}" in shown.stdout
        assert "running" in lines_of(shown.stdout, f"│ {first}")[0]
        assert "queued (Dependency)" in lines_of(shown.stdout, f"│ {second}")[0]

        # Through a pipe, no COLUMNS: nothing cut to 80 columns (a node, an id, a time).
        piped = cli(cluster, "status", name)
        no_traceback(piped)
        assert "…" not in piped.stdout, piped.stdout
        row = lines_of(piped.stdout, f"│ {first}")[0]
        node = opening.split("(task 0 on ")[1].split(")")[0]
        assert node in row
        # On a terminal 80 columns wide, values fold rather than end in an ellipsis.
        narrow = Terminal([CLI, "status", name], cluster.env(), columns=80)
        assert narrow.wait() == 0
        assert "…" not in narrow.read() and f"running: generation {first}" in narrow.read()

        # The list of chains: this one on one line, in words, with its work dir.
        listed = cli(cluster, "status")
        no_traceback(listed)
        assert listed.returncode == 0, listed.stderr
        mine = lines_of(listed.stdout, f"{name} ")[0].split()
        assert mine[1:3] == ["running", first] and mine[-1] == str(work)

        # A few refreshes on a terminal, then Ctrl-C: exit 0, nothing else said.
        live = Terminal([CLI, "status", name, "--watch", "2"], cluster.env())
        wait_until(lambda: live.read().count("checkpoint iteration now") >= 3, 60,
                   "three refreshes of status --watch", 0.2)  # fmt: skip
        assert live.interrupt() == 0
        assert "Traceback" not in live.read() and "Aborted" not in live.read()

        batch = cli(cluster, "logs", first)
        no_traceback(batch)
        assert batch.returncode == 0, batch.stderr
        assert batch.stdout.strip()
        assert f"==> {work}/logs/slurm-{name}-{first}_0.out <==" in batch.stderr
        hint = lines_of(batch.stderr, f"other logs of generation {first}:")[0]
        assert "--task 1" in hint and "--cycle 0" in hint and "--launcher" in hint
        for option, path in (
            (["--task", "1"], f"{work}/logs/slurm-{name}-{first}_1.out"),
            (["--cycle", "0"], f"{work}/logs/{name}_{first}_cycle0.log"),
            (["--launcher"], f"{work}/nvrx/{first}/logs/ft_launcher.log"),
        ):
            one = cli(cluster, "logs", name, *option)
            no_traceback(one)
            assert one.returncode == 0 and one.stdout.strip(), (option, one.stderr)
            assert f"==> {path} <==" in one.stderr

        following = Terminal([CLI, "logs", name, "--cycle", "0", "--follow"], cluster.env())
        wait_until(lambda: "iteration " in following.read(), 60, "logs --follow to print", 0.2)
        assert following.interrupt() == 0
        assert "Traceback" not in following.read()

        for chain in (first, name):  # a job id or the chain's name, as every command takes
            watched = subprocess.run(
                [WATCH, chain, "--dry-run"], capture_output=True, text=True, timeout=120,
                env=cluster.env(NVRX_WATCH_STATE_FILE=str(tmp_path / "state.json")),
            )  # fmt: skip
            no_traceback(watched)
            assert watched.returncode == 0, watched.stderr
            assert f"watching chain {name} of " in watched.stderr
            assert "blind" not in watched.stderr
    except BaseException:
        print(logs_on_failure(work))
        raise
    finally:
        cancelled = cli(cluster, "cancel", name)
    no_traceback(cancelled)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() == (
        f"Cancelled chain {name!r}: running {first}; queued {second}"
    )
    wait_idle(cluster, name, timeout=120)
    # Nothing of the chain is left in Slurm, and accounting says why.
    assert {state(t) for t in tasks(cluster, first).values()} == {"CANCELLED"}
    assert {state(t) for t in tasks(cluster, second).values()} == {"CANCELLED"}
    after = wide(cluster, "status", name, "--work-dir", str(work))
    no_traceback(after)
    assert after.returncode == 0 and "queued generations: none" in after.stdout
    assert "chain marker: absent" in after.stdout
    # Who cancelled, as sacct tells it, and the queued generation that never ran.
    headline = after.stdout.splitlines()[0]
    assert headline.startswith("ended: cancelled by "), headline
    assert f"1 generation(s) never ran ({second})" in headline, headline


def test_submit_refuses_a_checkpoint_directory_the_jobs_would_refuse_and_queues_nothing(
    cluster: Cluster,
):
    """A checkpoints/ that links to a group-writable project directory passed submit once,
    then every generation exited 72 until the burn guard stopped the chain."""
    work, name = cluster.workdir("ckpt-refused"), unique("ckpt-refused")
    project = work.parent / f"{name}-project"
    project.mkdir(parents=True)
    project.chmod(0o770)
    work.mkdir(parents=True, exist_ok=True)
    (work / "checkpoints").symlink_to(project)
    done = cli(cluster, "submit", *FAST, "--work-dir", str(work), "--job-name", name)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "--work-dir:" in done.stderr and "group- or world-writable (mode 0770)" in done.stderr
    assert f"chmod go-w {work / 'checkpoints'}" in done.stderr, done.stderr
    assert cluster.slurm("squeue", "-h", "--name", name).stdout.strip() == ""
    assert not (work / "run.json").exists()
