"""nvrx-watch against the local Slurm cluster: what it reports and what --act does when a
generation's task 0 is killed so hard its teardown trap never runs, when a 93 was not
honoured, when the chain ran out, and when slurmctld cannot be reached.

Each test submits stand-in generations of a chain (a job array under
--dependency=singleton and --no-requeue whose task 0 arms a teardown trap, like the
appliance's sbatch; the spares only sleep) under its own job name and work dir, and
cancels what it submitted.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.unit.test_watch_cli import CELL, production_cell

pytestmark = pytest.mark.cluster

WATCH = str(Path(sys.executable).parent / "nvrx-watch")
GRACE = "3"  # seconds: short enough for a test, long enough that "before grace" is observable

GENERATION = """#!/bin/bash
#SBATCH --dependency=singleton
#SBATCH --no-requeue
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH --output=/dev/null
# Stand-in generation: task 0 arms the teardown trap first (it releases this array's
# pending spares), then trains (sleeps); a SIGKILL of this shell means the trap never runs.
# Submitted without --array, the plain job is its own task 0.
if [[ ${SLURM_ARRAY_TASK_ID:-0} == 0 ]]; then
    trap 'scancel --state=PENDING --user="$SLURM_JOB_USER" "${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}"' EXIT
    [[ -n ${TASK0_EXIT:-} ]] && exit "$TASK0_EXIT"
fi
sleep 600
"""


class Chain:
    """Generations of one test chain: submit, observe, clean up."""

    def __init__(self, cluster, prefix: str, user: str | None = None) -> None:
        self.cluster = cluster
        self.name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.user = user
        self.work = cluster.workdir(prefix)
        self.work.chmod(0o777)
        self.script = self.work / "generation.sbatch"
        self.script.write_text(GENERATION)
        self.script.chmod(0o755)
        self.plain: set[str] = set()  # generations submitted without --array

    def submit(
        self,
        array: str | None,
        task0_exit: int | None = None,
        name: str | None = None,
        hold: bool = False,
    ) -> str:
        """One generation: a job array, or a plain job when `array` is None."""
        argv = [
            "sbatch", "--parsable", f"--job-name={name or self.name}",
            *([f"--array={array}"] if array else []),
            *(["--hold"] if hold else []),
            f"--chdir={self.work}", "--export=ALL" + (f",TASK0_EXIT={task0_exit}" if task0_exit is not None else ""),
            str(self.script),
        ]  # fmt: skip
        if self.user:
            argv = ["runuser", "-u", self.user, "--", *argv]
        job = self.cluster.slurm(*argv).stdout.strip().split(";")[0]
        if array is None:
            self.plain.add(job)
        return job

    def tasks(self, array_job_id: str) -> dict[int, str]:
        """Task id -> state of the array's tasks still in the queue."""
        out = self.cluster.slurm(
            "squeue", "-h", "-r", "-j", array_job_id, "-o", "%K|%T", check=False
        ).stdout
        tasks = (line.split("|") for line in out.split())
        return {int(k) if k.isdigit() else 0: s for k, s in tasks}  # a plain job: its own 0

    def wait_tasks(
        self, array_job_id: str, predicate, what: str, timeout: float = 90
    ) -> dict[int, str]:
        def check():
            tasks = self.tasks(array_job_id)
            return [tasks] if predicate(tasks) else None  # a list: an empty queue is an answer

        return self.cluster.wait_until(check, timeout, what, 0.5)[0]

    def kill_task0(self, array_job_id: str) -> None:
        """SIGKILL task 0's batch shell: the trap never runs, as on a hard node death."""
        self.cluster.slurm("scancel", "--signal=KILL", "--batch", f"{array_job_id}_0")
        self.cluster.wait_until(
            lambda: self.task0_end(array_job_id),
            90,
            f"sacct to record the end of {array_job_id}_0",
            0.5,
        )

    def task0_end(self, array_job_id: str) -> str | None:
        task0 = array_job_id if array_job_id in self.plain else f"{array_job_id}_0"
        for record in self.cluster.sacct(task0):
            if record["JobName"] != self.name:
                continue  # accounting still holds an earlier cluster's job of that id
            if record["State"].split()[0] not in ("PENDING", "RUNNING") and record["End"] not in (
                "",
                "Unknown",
            ):
                return record["End"]
        return None

    def cancel(self) -> None:
        self.cluster.slurm("scancel", f"--name={self.name}", check=False)
        self.cluster.slurm("scancel", f"--name={self.name}-other", check=False)


@pytest.fixture
def chains(cluster):
    made: list[Chain] = []

    def make(prefix: str, user: str | None = None) -> Chain:
        made.append(Chain(cluster, prefix, user))
        return made[-1]

    yield make
    for chain in made:
        chain.cancel()


def watch(cluster, state: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = cluster.env(NVRX_WATCH_STATE_FILE=str(state / "state.json"), **env)
    return subprocess.run([WATCH, *args], env=full_env, capture_output=True, text=True, timeout=180)


def reported(result: subprocess.CompletedProcess, detector: str) -> bool:
    return f"] {detector}:" in result.stderr


def watch_until(cluster, state: Path, detector: str, *args: str) -> subprocess.CompletedProcess:
    """Pass after pass (observe-only), until the detector reports: the grace period is a
    condition the watcher itself decides, so the test polls it rather than sleeping."""
    return cluster.wait_until(
        lambda: (lambda r: r if reported(r, detector) else None)(watch(cluster, state, *args)),
        90,
        f"nvrx-watch to report {detector}",
        1.0,
    )


def test_task0_sigkilled_is_an_orphaned_generation_and_act_releases_exactly_its_pending_spares(
    cluster, chains, tmp_path
):
    chain = chains("watch-orphan")
    first = chain.submit("0-4%2")
    successor = chain.submit("0-4%2")
    other_chain = chain.submit("0-2%1", name=f"{chain.name}-other")
    chain.wait_tasks(first, lambda t: t.get(0) == "RUNNING", "task 0 to run")
    chain.kill_task0(first)
    chain.wait_tasks(
        first,
        lambda t: 0 not in t and sum(s == "RUNNING" for s in t.values()) == 2,
        "the throttle to admit a spare",
    )
    only_orphans = ("--disable", "stranded_generation")

    within_grace = watch(cluster, tmp_path, first, "--grace", "3600", *only_orphans)
    assert not reported(within_grace, "orphaned_generation"), within_grace.stderr

    observed = watch_until(
        cluster, tmp_path, "orphaned_generation", first, "--grace", GRACE, *only_orphans
    )
    command = f"scancel --state=PENDING --user=root --name={chain.name} {first}"
    assert command in observed.stderr
    assert f"observe-only (pass --act to run it): {command}" in observed.stderr
    assert observed.returncode == 0  # a warning, and every source observed
    pending_before = {k for k, s in chain.tasks(first).items() if s == "PENDING"}
    assert pending_before == {3, 4}  # observing changed nothing

    acted = watch(cluster, tmp_path, first, "--grace", GRACE, "--act", *only_orphans)
    assert f"acted on orphaned_generation: ran {command}" in acted.stderr
    left = chain.wait_tasks(
        first, lambda t: "PENDING" not in t.values(), "the pending spares to go"
    )
    assert sorted(left) == [1, 2] and set(left.values()) == {"RUNNING"}  # running spares untouched
    assert len(chain.tasks(successor)) == 5  # the next generation is untouched
    assert len(chain.tasks(other_chain)) == 3  # so is another chain of the same user


def test_spares_stuck_after_task0_died_are_a_stranded_generation_and_act_frees_their_nodes(
    cluster, chains, tmp_path
):
    chain = chains("watch-stranded")
    first = chain.submit("0-2%2")
    successor = chain.submit("0-1%2")
    chain.wait_tasks(
        first, lambda t: t.get(0) == "RUNNING" and t.get(1) == "RUNNING", "two tasks to run"
    )
    chain.kill_task0(first)
    stuck = chain.wait_tasks(
        first,
        lambda t: set(t) == {1, 2} and set(t.values()) == {"RUNNING"},
        "spares to be admitted",
    )
    assert chain.tasks(successor).get(0) == "PENDING"  # singleton: blocked behind the stuck spares

    observed = watch_until(cluster, tmp_path, "stranded_generation", first, "--grace", GRACE)
    assert observed.returncode == 2  # critical
    assert (
        "task 0 ended" in observed.stderr and f"{len(stuck)} task(s) still run" in observed.stderr
    )
    command = f"scancel --user=root --name={chain.name} {first}"
    assert f"observe-only (pass --act to run it): {command}" in observed.stderr

    acted = watch(cluster, tmp_path, first, "--grace", GRACE, "--act")
    assert f"acted on stranded_generation: ran {command}" in acted.stderr
    chain.wait_tasks(first, lambda t: not t, "the stranded generation to end")
    chain.wait_tasks(
        successor, lambda t: t.get(0) == "RUNNING", "the successor generation to start"
    )


@pytest.mark.parametrize("array", ["0-1%1", None], ids=["arrays", "plain-jobs"])
def test_a_93_with_successors_still_queued_is_chain_not_cancelled(cluster, chains, tmp_path, array):
    chain = chains("watch-93")
    # The stand-in trap releases only its own spares: the chain cancel "failed". Without
    # --array each generation is one plain job (generations submitted by hand).
    verdict = chain.submit(array, task0_exit=93, hold=True)
    successors = [chain.submit(array), chain.submit(array)]
    cluster.slurm("scontrol", "release", verdict)  # successors are queued before it ends
    cluster.wait_until(lambda: chain.task0_end(verdict), 90, "the 93 generation to end", 0.5)
    result = watch(cluster, tmp_path, verdict)
    assert reported(result, "chain_not_cancelled"), result.stderr
    assert result.returncode == 2
    assert re.search(
        rf"generation {verdict} of {chain.name} ended 93 .* {successors[0]}, {successors[1]}",
        result.stderr,
    )
    assert f"scancel --state=PENDING --user=root --name={chain.name}" in result.stderr
    assert all(chain.tasks(s) for s in successors)  # reported, never acted on


def test_a_script_that_finds_its_libraries_through_scontrol_is_followed_there(cluster, tmp_path):
    # The job itself runs the scontrol idiom and its libraries, and records what it got.
    records = 'printf "%s\\n" "${FT_ARGS[@]}" >"$CELL_DIR/ft_args.txt"\n'
    text = CELL.replace('srun ft_launcher "${FT_ARGS[@]}" train.py\n', records)
    name = f"watch-cell-{uuid.uuid4().hex[:6]}"
    cell = production_cell(cluster.workdir("watch-cell") / "llm.sbatch", name, text)
    job = cluster.sbatch(f"--job-name={name}", "--output=/dev/null", str(cell))
    cluster.wait_finished(job, 1, 90)
    [flag, cycle_dir, *_] = (cell.parent / "ft_args.txt").read_text().split("\n")
    assert flag == "--ft-cycle-info-dir"
    assert cycle_dir == f"{cell.parent}/runs/{name}/nvrx/{job}/cycle_infos"
    result = watch(cluster, tmp_path, job)
    lib = cell.parent / "lib"
    assert f"; from batch script {cell} + {lib}/paths.sh + {lib}/launch.sh" in result.stderr
    assert "1 cycle(s)" in result.stderr  # the recorded cycle in runs/NAME/nvrx/4343/
    assert result.returncode == 0, result.stderr


def test_a_finished_chain_whose_marker_remains_is_exhausted(cluster, chains, tmp_path):
    chain = chains("watch-exhausted")
    (chain.work / "chain.active").write_text("")
    only = chain.submit("0-0", task0_exit=0)
    cluster.wait_until(lambda: chain.task0_end(only), 90, "the last generation to end", 0.5)
    result = watch(cluster, tmp_path, only, "--work-dir", str(chain.work))
    assert reported(result, "chain_exhausted") and result.returncode == 2, result.stderr
    (chain.work / "chain.active").unlink()  # the run finished on purpose
    assert watch(cluster, tmp_path, only, "--work-dir", str(chain.work)).returncode == 0


class _Beats(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.beats.append(self.path)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def heartbeat():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Beats)
    server.beats = []
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def unreachable_conf(cluster, tmp_path: Path) -> Path:
    """The cluster's slurm.conf with the controller's address wrong: slurmctld keeps
    running for everyone else, this client cannot reach it."""
    text = Path(cluster.slurm_env["SLURM_CONF"]).read_text()
    text = re.sub(r"(?m)^SlurmctldHost=.*$", "SlurmctldHost=ctl(127.0.0.1)\nSlurmctldPort=9", text)
    conf = tmp_path / "unreachable" / "slurm.conf"
    conf.parent.mkdir()
    conf.write_text(text)
    return conf


def test_an_unreachable_slurmctld_is_a_degraded_pass_with_no_heartbeat(
    cluster, chains, tmp_path, heartbeat
):
    chain = chains("watch-blind")
    job = chain.submit("0-1%1")
    url = f"http://127.0.0.1:{heartbeat.server_address[1]}/beat"
    healthy = watch(cluster, tmp_path, job, NVRX_WATCH_HEARTBEAT_URL=url)
    assert healthy.returncode == 0, healthy.stderr
    assert heartbeat.beats == ["/beat"]

    conf = str(unreachable_conf(cluster, tmp_path))
    for state in (tmp_path, tmp_path / "fresh"):  # job id remembered, and never seen before
        blind = watch(
            cluster,
            state,
            job,
            "--command-timeout",
            "30",
            SLURM_CONF=conf,
            NVRX_WATCH_HEARTBEAT_URL=url,
        )
        assert blind.returncode == 1, blind.stderr
        assert "cannot observe slurm" in blind.stderr
        assert "Unable to contact slurm controller" in blind.stderr
    assert heartbeat.beats == ["/beat"]  # no beat from a watcher that could not see


@pytest.fixture
def other_user():
    """A throwaway system user, removed with its jobs afterwards."""
    name = f"nvrxw{uuid.uuid4().hex[:6]}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True
    )
    yield name
    subprocess.run(
        ["scancel", "--user", name], env={**os.environ}, check=False, capture_output=True
    )
    subprocess.run(["userdel", name], check=False)


def test_act_never_touches_another_users_job_or_another_chain(
    cluster, chains, tmp_path, other_user
):
    cluster.slurm("scancel", "--user", other_user, check=False)
    ours = chains("watch-owner")
    theirs = Chain(cluster, "watch-owner", user=other_user)
    theirs.name = ours.name  # the same chain name, another owner: another chain
    our_gen = ours.submit("0-3%1")
    their_gen = theirs.submit("0-3%1")
    ours_other = ours.submit("0-2%1", name=f"{ours.name}-other")
    try:
        for chain, gen in ((ours, our_gen), (theirs, their_gen)):
            chain.wait_tasks(gen, lambda t: t.get(0) == "RUNNING", f"task 0 of {gen} to run")
            chain.kill_task0(gen)
        only_orphans = ("--disable", "stranded_generation")

        # Their chain: seen and reported, but root is not its owner, so nothing is done.
        seen = watch_until(
            cluster,
            tmp_path / "theirs",
            "orphaned_generation",
            their_gen,
            "--grace",
            GRACE,
            "--act",
            *only_orphans,
        )
        assert (
            f"not acting on orphaned_generation: chain {ours.name} belongs to {other_user}, not to root"
            in seen.stderr
        )
        assert "PENDING" in theirs.tasks(their_gen).values()

        # Our chain of the same name: only our generation's pending spares go.
        acted = watch_until(
            cluster,
            tmp_path / "ours",
            "orphaned_generation",
            our_gen,
            "--grace",
            GRACE,
            "--act",
            *only_orphans,
        )
        assert (
            f"acted on orphaned_generation: ran scancel --state=PENDING --user=root --name={ours.name} {our_gen}"
            in acted.stderr
        )
        ours.wait_tasks(our_gen, lambda t: "PENDING" not in t.values(), "our pending spares to go")
        assert "PENDING" in theirs.tasks(their_gen).values()
        assert len(ours.tasks(ours_other)) == 3
    finally:
        cluster.slurm("scancel", "--user", other_user, check=False)


def test_a_real_chain_resolves_through_its_run_json_and_its_real_cycle_infos(cluster, tmp_path):
    """The no-restart demo, submitted by `nvrx-appliance submit`: ft_launcher exits 93, the
    trap cancels the chain. Afterwards the watcher, given only the first job id, finds
    run.json from Slurm, reads the cycle-info files ft_launcher wrote on the cluster and
    the ledger, and has nothing to page: the chain ended on purpose."""
    from .chain_support import submit, unique, wait_idle, wait_ledger

    work = cluster.workdir("watch-real")
    name = unique("watch-real")
    first, *_ = submit(
        cluster, work, name,
        "--mode", "no-restart", "--train-tasks", "1", "--hot-spares", "0",
        "--cold-spares", "1", "--depth", "2", "--fault-delay", "3",
    )  # fmt: skip
    [entry] = wait_ledger(work, 1, timeout=240)
    wait_idle(cluster, name, timeout=60)
    assert entry["exit_code"] == 93

    metrics = tmp_path / "nvrx.prom"
    result = watch(cluster, tmp_path, first, "--metrics-file", str(metrics))
    assert result.returncode == 0, result.stderr
    assert f"watching chain {name} of root through Slurm;" in result.stderr
    assert f"; from run.json ({work}/run.json)" in result.stderr
    files = sorted(p.name for p in (work / "nvrx" / first / "cycle_infos").iterdir())
    cycles = [f for f in files if not f.endswith(".current")]
    assert cycles and all(f.startswith(f"cycle_info.{first}.") for f in cycles)
    text = metrics.read_text()
    assert f'nvrx_watch_cycles{{chain="{name}",owner="root"}} {len(cycles)}' in text
    assert f'nvrx_watch_source_up{{chain="{name}",owner="root",source="cycles"}} 1' in text
    assert "chain_not_cancelled" not in result.stderr and "chain_exhausted" not in result.stderr
