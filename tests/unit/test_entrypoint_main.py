"""nvrx-entrypoint end to end on this machine: refusals, the dry run, and real ft_launcher.

There is no Slurm in unit tests, so each run gets the variables srun would set for one
task per node (a stand-in named as such); ft_launcher and the workload are the real ones.
"""

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from nvrx_appliance import exitcodes, manifest
from nvrx_appliance.layout import ControlFiles
from nvrx_appliance.lease import POLL_S
from nvrx_appliance.node import (
    control,
    controldir,
    detect,
    launch,
    lifecycle,
    looks,
    rendezvous,
    time_limit,
)
from nvrx_appliance.node.gate import Leave
from nvrx_appliance.node.identity import Node
from nvrx_appliance.node.supervise import Save
from tests import process_tree
from tests.unit import entrypoint_support as support

# The entrypoint's log lines: the one timestamp format (clock.log_stamp), then who speaks.
STAMPED = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z nvrx-entrypoint: ")
ENTRYPOINT = [sys.executable, "-c", "from nvrx_appliance.cli.entrypoint import main; main()"]
FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
DEAD_HOST = "192.0.2.1"  # TEST-NET-1: nothing ever answers there


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def write_manifest(tmp_path, **settings) -> Path:
    settings = {
        "workload": "cpu",
        "train_tasks": 1,
        "hot_spares": 0,
        "gpus_per_node": 1,
        "fault_ranks": "0",  # the only rank of this one-rank world
        "rdzv_port": free_port(),
    } | settings
    return manifest.save(support.run_manifest(tmp_path / "work", **settings))


def srun_stand_in(array_job_id="700", task_id=0, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return (
        env
        | {
            "SLURM_ARRAY_JOB_ID": array_job_id,
            "SLURM_ARRAY_TASK_ID": str(task_id),
            "SLURM_JOB_ID": str(int(array_job_id) + task_id),
            "SLURM_NODEID": "0",
            "SLURM_PROCID": "0",
            "SLURM_NNODES": "1",
            "SLURM_JOB_NUM_NODES": "1",
            "SLURM_TASKS_PER_NODE": "1",
        }
        | extra
    )


def entrypoint(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*ENTRYPOINT, *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def control_dir(run_json: Path, array_job_id="700") -> Path:
    return run_json.parent / "nvrx" / array_job_id / "control"


# --- refusals: one line, our own code, nothing published --------------------------------


def test_a_missing_manifest_is_one_line_and_code_70(tmp_path):
    result = entrypoint("--manifest", str(tmp_path / "run.json"), env=srun_stand_in())
    assert result.returncode == exitcodes.MANIFEST_INVALID
    assert result.stderr.strip().count("\n") == 0
    assert "does not exist" in result.stderr
    assert STAMPED.match(result.stderr), result.stderr


def test_no_manifest_at_all_names_both_ways_to_give_one(tmp_path):
    env = srun_stand_in()
    env.pop("NVRX_RUN_MANIFEST", None)
    result = entrypoint(env=env)
    assert result.returncode == exitcodes.MANIFEST_INVALID
    assert "--manifest" in result.stderr and "NVRX_RUN_MANIFEST" in result.stderr


def test_a_run_json_others_can_write_is_refused_before_anything_is_created(tmp_path):
    run_json = write_manifest(tmp_path)
    run_json.chmod(0o664)
    result = entrypoint("--manifest", str(run_json), env=srun_stand_in())
    assert result.returncode == exitcodes.MANIFEST_INVALID
    assert "writable by group or others (mode 0664)" in result.stderr
    assert not (run_json.parent / "nvrx").exists()


def test_a_checkpoint_directory_others_can_write_is_refused_saying_how_to_fix_it(tmp_path):
    # A member of the group could plant an iter_ that a fall-back would point the
    # tracker at (issue 40).
    run_json = write_manifest(tmp_path)
    checkpoints = manifest.load(run_json).layout.checkpoints
    checkpoints.mkdir(mode=0o775)
    checkpoints.chmod(0o775)
    result = entrypoint("--manifest", str(run_json), env=srun_stand_in())
    assert result.returncode == exitcodes.RECORD_REFUSED, result.stderr
    assert f"checkpoint directory {checkpoints} is group- or world-writable (mode 0775)" in (
        result.stderr
    )
    assert f"chmod go-w {checkpoints}" in result.stderr
    assert not control_dir(run_json).joinpath("rdzv.json").exists()  # nothing published


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda d: d | {"version": 7}, "version 7 is not supported"),
        (lambda d: d | {"spec": d["spec"] | {"global_batch": 3, "gpus_per_node": 2}}, "divisible"),
        (lambda d: d | {"shape": d["shape"] | {"min_nodes": 9}}, "does not match"),
    ],
)
def test_a_bad_manifest_publishes_nothing(tmp_path, edit, why):
    run_json = write_manifest(tmp_path)
    run_json.write_text(json.dumps(edit(json.loads(run_json.read_text()))))
    result = entrypoint("--manifest", str(run_json), env=srun_stand_in())
    assert result.returncode == exitcodes.MANIFEST_INVALID
    assert why in result.stderr
    assert not (run_json.parent / "nvrx").exists()


def test_outside_srun_it_says_so(tmp_path):
    run_json = write_manifest(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    result = entrypoint("--manifest", str(run_json), env=env)
    assert result.returncode == exitcodes.USAGE
    assert "srun" in result.stderr


def test_an_explicit_segment_without_cluster_uuid_is_refused_before_publishing(tmp_path):
    run_json = write_manifest(tmp_path, segment="1")
    result = entrypoint("--manifest", str(run_json), env=srun_stand_in(PATH=str(tmp_path)))
    assert result.returncode == exitcodes.SEGMENT_MISMATCH
    assert "--segment auto" in result.stderr
    assert not control_dir(run_json).exists()


def test_numa_binding_without_numactl_fails_clearly_before_publishing(tmp_path):
    run_json = write_manifest(tmp_path, gpus_per_numa=2)
    # PATH without numactl (and without nvidia-smi): ft_launcher is found beside Python.
    result = entrypoint("--manifest", str(run_json), env=srun_stand_in(PATH=str(tmp_path)))
    assert result.returncode == exitcodes.LAUNCH_FAILED
    assert "numactl" in result.stderr
    assert not control_dir(run_json).exists()


# --- the dry run and detect ------------------------------------------------------------


def test_the_dry_run_shows_everything_and_publishes_nothing(tmp_path):
    run_json = write_manifest(tmp_path, mode="handoff")
    result = entrypoint("--manifest", str(run_json), "--dry-run", "--json", env=srun_stand_in())
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["node"]["hosts_rendezvous"] is True
    assert plan["ft_launcher"][plan["ft_launcher"].index("--rdzv-id") + 1] == "700"
    assert "nvrx_appliance.workloads.cpu" in plan["workload"]
    assert plan["env"]["set"]["NVRX_INJECT_GPU_FAILURE"] == "1:0,2:0"
    assert plan["segment"] is None
    assert not (run_json.parent / "nvrx").exists()


def test_the_dry_run_runs_the_workload_argv_recorded_in_run_json_verbatim(tmp_path):
    run_json = write_manifest(tmp_path)
    data = json.loads(run_json.read_text())
    data["workload"] = ["/opt/team/train.py", "--recorded", "at submit"]
    run_json.write_text(json.dumps(data))
    result = entrypoint("--manifest", str(run_json), "--dry-run", "--json", env=srun_stand_in())
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["workload"] == [
        sys.executable,
        "-u",
        "/opt/team/train.py",
        "--recorded",
        "at submit",
    ]
    assert plan["env"]["set"]["NVRX_APPLIANCE_CHECKPOINT_DIR"] == str(
        tmp_path / "work" / "checkpoints"
    )
    assert "NVRX_INJECT_GPU_FAILURE" in plan["env"]["unset"]  # train mode: nothing injected


def test_a_run_json_without_a_workload_is_refused_before_anything_is_published(tmp_path):
    run_json = write_manifest(tmp_path)
    data = json.loads(run_json.read_text())
    data["workload"] = []
    run_json.write_text(json.dumps(data))
    result = entrypoint("--manifest", str(run_json), env=srun_stand_in())
    assert result.returncode == exitcodes.MANIFEST_INVALID
    assert "names no workload to run; resubmit" in result.stderr
    assert not (run_json.parent / "nvrx").exists()


def test_the_dry_run_works_off_cluster_in_words(tmp_path):
    run_json = write_manifest(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    result = entrypoint("--dry-run", env=env | {"NVRX_RUN_MANIFEST": str(run_json)})
    assert result.returncode == 0, result.stderr
    assert "ft_launcher --nnodes 1:1" in result.stdout
    assert "not under Slurm" in result.stdout


def test_detect_reports_gpus_and_the_auto_decision(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"  # stand-in: there is no GPU here
    smi.write_text(f'#!/bin/sh\ncat "{FIXTURES / "gb200-tray.txt"}"\n')
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    env = os.environ | {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    result = entrypoint("detect", "--json", env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert len(report["gpus"]) == 4
    assert report["cluster_uuid"] == "6c1e2a07-93d4-4b58-a1f0-2d7e5b9c4e11"
    assert report["auto_segment"] == 1
    words = entrypoint("detect", env=env).stdout
    assert "--ft-segment 1" in words


# --- real ft_launcher --------------------------------------------------------------------


def test_task_0s_exit_93_from_a_real_ft_launcher_comes_out_as_93(tmp_path):
    run_json = write_manifest(
        tmp_path, mode="no-restart", fault_ranks="0", fault_delay=0.5, save_interval=5
    )
    result = entrypoint("--manifest", str(run_json), env=srun_stand_in(), timeout=180)
    assert result.returncode == exitcodes.NVRX_NO_RESTART, result.stderr
    directory = control_dir(run_json)
    rec = control.decode(ControlFiles(directory).record.read_text())
    assert rec.host == socket.gethostname() and rec.segment is None
    assert ControlFiles(directory).lease.exists()
    assert ControlFiles(directory).no_restart.exists()
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    # Every line the entrypoint wrote opens with the one log timestamp (clock.log_stamp).
    ours = [line for line in result.stderr.splitlines() if "nvrx-entrypoint: " in line]
    assert any("ft_launcher exited 93" in line for line in ours), result.stderr
    assert all(STAMPED.match(line) for line in ours), ours


def publish_as_task_0(run_json: Path, host: str, array_job_id="700", active_tasks=None) -> Path:
    m = manifest.load(run_json)
    directory = control_dir(run_json, array_job_id)
    controldir.prepare(directory, os.geteuid())
    ControlFiles(directory).lease.write_text("{}\n")
    controldir.publish(
        directory,
        support.record(
            host=host, port=m.spec.rdzv_port, array_job_id=array_job_id, job_id=array_job_id,
            active_tasks=active_tasks,
        ),
    )  # fmt: skip
    return directory


def start_peer(run_json: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*ENTRYPOINT, "--manifest", str(run_json)],
        env=srun_stand_in(task_id=1),
        stderr=subprocess.PIPE,
        text=True,
    )


def ft_launcher_of(proc: subprocess.Popen):
    def find():
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if "ft_launcher" in " ".join(child.cmdline()):
                    return child
            except psutil.Error:
                continue
        return None

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = find()
        if found:
            return found
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.1)
    raise AssertionError("ft_launcher never started")


def stop(proc: subprocess.Popen) -> None:
    """The entrypoint and everything it started: ft_launcher runs in a session of its
    own, and NVRx's rank monitor, which ignores SIGTERM, is left with parent 1 when the
    launcher dies hard. Their environment names this test (tests/process_tree.py)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    process_tree.end_started()


def test_a_late_peer_dialing_a_dead_host_leaves_within_the_grace_of_the_flag(tmp_path):
    # The race the seeds only bound: a cold spare passed the gate just before task 0's
    # trap wrote the flag, and its ft_launcher dials a store that is gone (300 s).
    grace = 1
    run_json = write_manifest(tmp_path, closed_flag_grace=grace, lease_stale_after=600)
    # Task 0 read a throttle of 3 from the controller (raised after submit): the peer,
    # which no longer asks Slurm, sizes its ft_launcher from task 0's record.
    directory = publish_as_task_0(run_json, DEAD_HOST, active_tasks=3)
    proc = start_peer(run_json)
    try:
        launcher = ft_launcher_of(proc)
        argv = launcher.cmdline()
        assert argv[argv.index("--nnodes") + 1] == "1:3"
        time.sleep(1)  # it is dialing now; the flag comes later, as in the race
        flag = {"exit_code": 1, "generation": control.generation(support.CHAIN, "700")}
        ControlFiles(directory).closed.write_text(json.dumps(flag) + "\n")
        flagged = time.monotonic()
        assert proc.wait(timeout=30) == exitcodes.STOPPED_BY_CLOSED_FLAG
        assert time.monotonic() - flagged <= grace + 2
        assert not launcher.is_running()
        # The first peer to leave on the end claims the relay for its batch script.
        relay = json.loads(ControlFiles(directory).relay.read_text())
        assert relay["job_id"] == "701" and "closed flag" in relay["reason"]
    finally:
        stop(proc)


def test_a_peer_whose_task_0_died_without_a_trap_fences_it_when_the_lease_goes_stale(tmp_path):
    grace, stale = 1, 6
    run_json = write_manifest(tmp_path, closed_flag_grace=grace, lease_stale_after=stale)
    directory = publish_as_task_0(run_json, DEAD_HOST)
    holder = {"host": "node1", "started": "2026-01-01T00:00:01+00:00", "checkpoint_start": 40}
    task0 = controldir.LeaseKeeper(directory, 0.5, holder=holder, warn=print)
    task0.start()
    proc = start_peer(run_json)
    try:
        launcher = ft_launcher_of(proc)
        task0.stop()  # task 0 dies: no trap, no flag, its lease just stops moving
        died = time.monotonic()
        assert proc.wait(timeout=30) == exitcodes.TASK0_GONE
        # It sees the last refresh within a poll, and the lease unchanged for `stale`
        # within another; then the grace.
        assert time.monotonic() - died <= stale + 2 * POLL_S + grace + 2
        assert "fenced task 0" in proc.stderr.read()
        assert not launcher.is_running()
        # The generation is closed on task 0's behalf, for every node and late spare...
        flag = control.decode_fields(ControlFiles(directory).closed.read_text())
        assert (
            flag["generation"] == f"{support.CHAIN}/700/" and "fenced by task 1" in flag["reason"]
        )
        # ...and the claim tells this job's batch script to cancel task 0's job.
        claim = json.loads(ControlFiles(directory).fence.read_text())
        assert (claim["job_id"], claim["task0_host"], claim["checkpoint_start"]) == (
            "701",
            "node1",
            40,
        )
    finally:
        task0.stop()
        stop(proc)


def test_a_watcher_whose_ft_launcher_gives_up_on_the_dead_store_first_still_fences(tmp_path):
    # Issue 24: with a few watchers, one whose ft_launcher ends on its own (it cannot
    # reach task 0's store) before the lease is stale must not just leave: if all of
    # them did, nobody would fence task 0 until Slurm declared its node dead.
    grace, stale = 1, 6
    run_json = write_manifest(
        tmp_path, closed_flag_grace=grace, lease_stale_after=stale, store_connect_wait=1,
        lease_watchers=1,
    )  # fmt: skip
    directory = publish_as_task_0(run_json, DEAD_HOST)
    task0 = controldir.LeaseKeeper(directory, 0.5, holder={"host": "node1"}, warn=print)
    task0.start()
    proc = start_peer(run_json)
    try:
        ft_launcher_of(proc)
        task0.stop()  # task 0 dies; its store never answered anyway
        died = time.monotonic()
        code = proc.wait(timeout=60)
        err = proc.stderr.read()
        assert "ft_launcher ended on its own" in err, err
        assert "fenced task 0" in err, err
        assert code not in (exitcodes.OK, exitcodes.NVRX_NO_RESTART)  # ft_launcher's own
        assert time.monotonic() - died <= stale + 2 * POLL_S + 2
        assert ControlFiles(directory).fence.exists() and ControlFiles(directory).relay.exists()
    finally:
        task0.stop()
        stop(proc)


def test_a_task_0_whose_lease_writes_fail_stops_its_workers_before_the_lease_is_stale(tmp_path):
    # The partition case: task 0 is alive and trains, but the shared file system refuses
    # its lease refreshes (an immutable file refuses them even to root).
    if shutil.which("chattr") is None or os.geteuid() != 0:
        pytest.skip("needs root and chattr (e2fsprogs) to make the lease refuse writes")
    grace, stale = 1, 6
    run_json = write_manifest(
        tmp_path, closed_flag_grace=grace, lease_stale_after=stale, mode="train"
    )
    proc = subprocess.Popen(
        [*ENTRYPOINT, "--manifest", str(run_json)],
        env=srun_stand_in(), stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lease = ControlFiles(control_dir(run_json)).lease
    frozen = False
    try:
        launcher = ft_launcher_of(proc)
        workers = wait_for_workers(launcher)
        frozen = subprocess.run(["chattr", "+i", str(lease)], check=False).returncode == 0
        if not frozen:
            pytest.skip(f"this file system cannot make {lease} immutable")
        assert proc.wait(timeout=60) == exitcodes.SELF_FENCED
        stopped_at = fs_now(tmp_path)
        assert "not refreshed its liveness lease" in proc.stderr.read()
        assert not any(alive(p) for p in [launcher, *workers])
        # Everything was down while a peer would still have judged task 0 alive.
        assert stopped_at - lease.stat().st_mtime < stale
    finally:
        if frozen:
            subprocess.run(["chattr", "-i", str(lease)], check=False)
        stop(proc)


def test_task_0_told_to_stop_by_slurm_closes_the_generation_at_once(tmp_path):
    # Its batch shell may be what died (no trap will run): without the flag, the peers
    # would wait for the lease to go stale while task 0's ft_launcher shuts down.
    run_json = write_manifest(tmp_path, mode="train")
    proc = subprocess.Popen(
        [*ENTRYPOINT, "--manifest", str(run_json)],
        env=srun_stand_in(), stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        ft_launcher_of(proc)
        flag = ControlFiles(control_dir(run_json)).closed
        assert not flag.exists()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        assert code not in (exitcodes.NVRX_NO_RESTART, exitcodes.STOPPED_BY_CLOSED_FLAG)
        closed = control.decode_fields(flag.read_text())
        assert closed["generation"] == f"{support.CHAIN}/700/"
        assert "got SIGTERM from Slurm" in closed["reason"]
    finally:
        stop(proc)


def progress(run_json: Path) -> list[dict]:
    path = run_json.parent / "logs" / "progress.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_time_limit_notice_makes_every_worker_save_and_the_node_end_0(tmp_path):
    # The whole path on one node: notice -> the supervisor's save signal to the real
    # ft_launcher -> every rank of the cpu trainer saves at one iteration -> exit 0.
    run_json = write_manifest(tmp_path, mode="train", gpus_per_node=2, save_interval=100_000)
    proc = subprocess.Popen(
        [*ENTRYPOINT, "--manifest", str(run_json)],
        env=srun_stand_in(), stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not any(e["event"] == "step" and e["iteration"] >= 20 for e in progress(run_json)):
            assert time.monotonic() < deadline and proc.poll() is None, "no training"
            time.sleep(0.2)
        time_limit.write_notice(control_dir(run_json), f"{support.CHAIN}/700/", "a test's notice")
        assert proc.wait(timeout=60) == 0
        err = proc.stderr.read()
    finally:
        stop(proc)
    assert "a test's notice: asking the workload to save and end" in err
    [saved] = [e for e in progress(run_json) if e["event"] == "saved_at_time_limit"]
    tracker = run_json.parent / "checkpoints" / "latest_checkpointed_iteration.txt"
    assert int(tracker.read_text()) == saved["iteration"] >= 20


def task0_generation(tmp_path, **settings) -> tuple[manifest.Manifest, Path, str]:
    """A train chain's generation 700 as task 0 sees it: its manifest, its control
    directory (made, owner-only) and its generation token."""
    run_json = write_manifest(tmp_path, mode="train", **settings)
    directory = control_dir(run_json)
    directory.mkdir(parents=True, mode=0o700)
    return manifest.load(run_json), directory, f"{support.CHAIN}/700/"


# NVRx 0.7.0's line (launcher.py:1728) when a launcher's node failed the health check in
# a job array; every launcher logs into one file, each behind its host name.
DECIDED = (
    "[INFO] [{}] [workload:?(?) infra:0(0)] launcher.py:1728 Job array deployment: "
    "exiting with code 1 for replacement.\n"
)


def test_task_0_writes_the_notice_at_its_exit_duration_counted_from_its_own_start(tmp_path):
    # Counted by task 0's entrypoint, not by worker processes: an in-job restart starts
    # new workers, and cannot reset it.
    m, directory, token = task0_generation(tmp_path, exit_duration_min=1)
    started = time.monotonic()
    deadline = lifecycle.exit_deadline(m, started)
    assert deadline == started + 60
    node = Node("700", 0, 0, "700", "node1")
    lease_watch = controldir.LeaseWatch(directory, token)
    check = looks.watch(
        m, node, directory, lease_watch, is_task0=True, period=0.0, exit_at=started - 1
    )
    verdict = check()
    assert isinstance(verdict, Save) and "exit duration of 1 min" in verdict.reason
    assert time_limit.noticed(directory, token) == verdict.reason  # every node sees it
    later = looks.watch(m, node, directory, lease_watch, is_task0=False, period=0.0)
    assert isinstance(later(), Save)
    assert lifecycle.exit_deadline(manifest.load(write_manifest(tmp_path / "b")), 0) is None


def test_task_0_closes_the_generation_the_moment_its_ft_launcher_decides_to_leave(tmp_path):
    # NVRx's line for a task 0 whose node failed the health check; the same line from a
    # peer's launcher (every launcher logs into one file) is an in-job replacement.
    m, directory, token = task0_generation(tmp_path)
    log = launch.nvrx_logfile(m, "700")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("2026-12-03 07:34:01,126 " + DECIDED.format("node2"))
    lease_watch = controldir.LeaseWatch(directory, token)
    node = Node("700", 0, 0, "700", "node1")
    check = looks.watch(m, node, directory, lease_watch, is_task0=True, period=0.0)
    assert check() is None and not controldir.closed(directory, token)
    with log.open("a") as out:
        out.write("2026-12-03 07:34:02,129 " + DECIDED.format("node1"))
    # Closed for every peer at once; task 0's own ft_launcher is left to end with its code.
    assert check() is None and controldir.closed(directory, token)
    assert check() is None
    peer = looks.watch(
        m, Node("700", 1, 0, "701", "node2"), directory, lease_watch, is_task0=False, period=0.0
    )
    verdict = peer()
    assert verdict is not None and verdict.over


def test_a_look_lists_the_control_directory_once_and_reads_only_what_it_lists(
    tmp_path, monkeypatch
):
    # A read of the verdict and the notice on each look took a 10,000-node generation to
    # 216 control-dir calls a second, over issue 24's 200 (bench row 7).
    m, directory, token = task0_generation(tmp_path)
    reads: list[str] = []
    for name in ("closed", "workload_verdict"):
        real = getattr(controldir, name)
        monkeypatch.setattr(controldir, name, lambda d, t, real=real, name=name:
                            reads.append(name) or real(d, t))  # fmt: skip
    real_notice = time_limit.noticed
    monkeypatch.setattr(
        time_limit, "noticed", lambda d, t: reads.append("notice") or real_notice(d, t)
    )
    check = looks.watch(
        m, Node("700", 1, 0, "701", "node2"), directory, controldir.LeaseWatch(directory, token),
        is_task0=False, period=0.0,
    )  # fmt: skip
    for _ in range(6):
        assert check() is None
    assert reads == []
    # A notice is read, and seen, at the next look after it appears.
    time_limit.write_notice(directory, token, "a test's notice")
    assert isinstance(check(), Save) and reads == ["notice"]


def test_task_0_stops_its_ft_launcher_when_it_does_not_end_after_deciding_to(tmp_path, monkeypatch):
    m, directory, token = task0_generation(tmp_path)
    log = launch.nvrx_logfile(m, "700")
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("2026-12-03 07:34:02,129 " + DECIDED.format("node1"))
    clock = [1000.0]
    monkeypatch.setattr(looks.time, "monotonic", lambda: clock[0])
    check = looks.watch(
        m, Node("700", 0, 0, "700", "node1"), directory, controldir.LeaseWatch(directory, token),
        is_task0=True, period=0.0,
    )  # fmt: skip
    assert check() is None and controldir.closed(directory, token)
    clock[0] += looks.ENDING_BOUND_S - 1
    assert check() is None  # NVRx's own waits: left to end on its own
    clock[0] += 2
    stop = check()
    assert isinstance(stop, Leave) and stop.exit_code == 1 and "has not ended" in stop.message


def test_task_0_marks_megatrons_training_done_once_the_tracker_reaches_the_last_iteration(
    tmp_path,
):
    # Megatron writes no marker of its own; at 1600 samples of 8 it ends at iteration 200.
    m = support.run_manifest(
        tmp_path / "work", workload="megatron", train_tasks=1, hot_spares=0, gpus_per_node=8,
        train_samples=1600,
    )  # fmt: skip
    m.layout.checkpoints.mkdir(parents=True)
    m.layout.tracker.write_text("180\n")  # saved at the time limit, short of the end
    lifecycle.mark_megatron_done(m)
    assert not m.layout.training_done.exists()
    m.layout.tracker.write_text("200\n")
    lifecycle.mark_megatron_done(m)
    assert m.layout.training_done.read_text() == "200\n"


def alive(process) -> bool:
    """Running, and not a zombie that only waits for this machine's init to reap it."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for_workers(launcher) -> list:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        workers = [
            c for c in launcher.children(recursive=True) if "workloads.cpu" in " ".join(c.cmdline())
        ]
        if workers:
            return workers
        time.sleep(0.1)
    raise AssertionError("the workers never started")


def fs_now(directory: Path) -> float:
    """The file system's clock, as the peers read it."""
    probe = directory / ".now"
    probe.touch()
    os.utime(probe, None)
    return probe.stat().st_mtime


def test_a_peer_on_task_0s_old_node_never_starts_ft_launcher(tmp_path):
    run_json = write_manifest(tmp_path, lease_stale_after=600)
    publish_as_task_0(run_json, socket.gethostname())
    result = entrypoint("--manifest", str(run_json), env=srun_stand_in(task_id=1))
    assert result.returncode == exitcodes.TASK0_GONE
    assert "refusing to host the rendezvous" in result.stderr
    assert "ft_launcher" not in result.stderr.replace("stopping ft_launcher", "")


def test_the_dry_run_sizes_max_nodes_from_the_array_throttle(tmp_path):
    run_json = write_manifest(tmp_path, train_tasks=2, hot_spares=1, cold_spares=3)
    env = srun_stand_in(NVRX_ARRAY_THROTTLE="4")
    plan = json.loads(
        entrypoint("--manifest", str(run_json), "--dry-run", "--json", env=env).stdout
    )
    assert plan["ft_launcher"][plan["ft_launcher"].index("--nnodes") + 1] == "2:4"


def test_a_segment_that_does_not_divide_the_world_is_an_inconsistent_manifest(tmp_path):
    run_json = write_manifest(tmp_path, train_tasks=2, segment="3")
    result = entrypoint("--manifest", str(run_json), env=srun_stand_in())
    assert result.returncode == exitcodes.MANIFEST_INVALID
    assert "multiple of the segment 3" in result.stderr
    assert not (run_json.parent / "nvrx").exists()


def test_task_0_sets_aside_a_control_dir_another_run_left_under_a_reused_job_id(tmp_path):
    m = manifest.load(write_manifest(tmp_path))
    old = m.layout.control("700")
    old.mkdir(parents=True, mode=0o700)
    files = ControlFiles(old)
    for path in (files.record, files.lease, files.closed):
        path.write_text("{}\n")

    # A peer never touches it: only task 0 knows that it has not published yet.
    rendezvous.make_dirs(m, Node("700", 3, 0, "703", "peer"))
    assert ControlFiles(old).closed.exists()

    directory = rendezvous.make_dirs(m, Node("700", 0, 0, "700", "task0"))
    assert directory == old and list(directory.iterdir()) == []
    [aside] = old.parent.glob("control.stale.*")
    assert sorted(p.name for p in aside.iterdir()) == sorted(
        [files.record.name, files.lease.name, files.closed.name]
    )


def test_a_peer_at_the_gate_only_reads_the_control_directory(tmp_path, monkeypatch):
    # Issue 24: a peer used to stamp a clock-probe file of its own on every poll (one
    # setattr a second per node). It now judges the lease by its own clock.
    m = manifest.load(write_manifest(tmp_path))
    peer = Node("700", 1, 0, "701", "node2")
    directory = rendezvous.make_dirs(m, peer)
    token = control.generation(support.CHAIN, "700")
    keeper = controldir.LeaseKeeper(directory, 60, holder={"generation": token}, warn=print)
    keeper.start()
    seen = []

    def pause(seconds):  # between polls: what is in the directory; task 0 publishes late
        seen.append(sorted(p.name for p in directory.iterdir()))
        if len(seen) == 3:
            controldir.publish(directory, support.record(array_job_id="700", generation=token))

    monkeypatch.setattr(rendezvous.time, "sleep", pause)
    fabric = detect.Fabric(cluster_uuid=None, reason="none")
    try:
        joined = rendezvous.gate_loop(m, peer, fabric, directory, token)
    finally:
        keeper.stop()
    assert joined.host == "node1" and len(seen) == 3
    files = ControlFiles(directory)
    assert seen == [[files.lease.name]] * 3, seen


@pytest.mark.parametrize("text", ["²\n", "7" * 5000 + "\n", "release\n"])
def test_task_0_publishes_whatever_the_tracker_holds(tmp_path, text):
    # "²" passes str.isdigit and int() refuses it: every generation's task 0 died
    # publishing its lease. A tracker that is no number is "no checkpoint yet".
    m = manifest.load(write_manifest(tmp_path))
    m.layout.checkpoints.mkdir(parents=True)
    m.layout.tracker.write_text(text)
    assert rendezvous.checkpoint_start(m) is None
    m.layout.tracker.write_text("40\n")
    assert rendezvous.checkpoint_start(m) == 40
