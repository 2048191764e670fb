"""Drain awareness: task 0's poller (chain/drain_poller.py) writes one marker per running
task; each node's entrypoint answers NVRx's node health check from its own task's
marker (node/health_check.py).

The poller runs here against stand-ins for sinfo and squeue (shell scripts on PATH: a
drained node or a hung controller cannot be ordered up in a unit test); the health check
is asked by NVRx 0.7.0's own client (shared_utils/health_check.py, NodeHealthCheck), the
one ft_launcher builds from --ft-node-health-check-endpoint. The real thing end to end
is tests/integration/test_bad_nodes.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import psutil
import pytest
from nvidia_resiliency_ext.shared_utils.health_check import NodeHealthCheck
from nvidia_resiliency_ext.shared_utils.proto import nvhcd_pb2, nvhcd_pb2_grpc

from nvrx_appliance import manifest
from nvrx_appliance.jobhost import drain_poller
from nvrx_appliance.node import health_check
from nvrx_appliance.node.health_check import DrainCheck, Identity, judge
from nvrx_appliance.node.identity import Node
from nvrx_appliance.settings.chain import ChainSpec

POLLER = Path(drain_poller.__file__)
GEN = "chain-1/500/2026-12-01T10:00:00"
ME = Identity(generation=GEN, task=3, job_id="503", node="node5")


def _marker(*, task="3", job_id="503", nodes="node5", drained=None, generation=GEN) -> str:
    running = drain_poller.RunningTask(task, job_id, nodes.split())
    return drain_poller.marker(generation, running, drained or {})


# --- the consumer's rules ---------------------------------------------------------------


def test_a_drained_node_of_this_task_fails_the_check_and_says_why():
    verdict = judge(_marker(drained={"node5": "bad dimm"}), ME)
    assert not verdict.healthy
    assert "node5" in verdict.why and "bad dimm" in verdict.why
    assert health_check.answer(verdict)["fail_count"] == 1


def test_a_drained_node_of_the_same_task_takes_the_whole_task_out():
    # segment-scoped, as the reference: a task's nodes leave together
    verdict = judge(_marker(nodes="node5 node6", drained={"node6": "x"}), ME)
    assert not verdict.healthy


@pytest.mark.parametrize(
    "marker, why",
    [
        (None, ""),  # not polled yet
        ("", ""),
        (_marker(), ""),  # polled, clean
        (_marker(generation="chain-0/500/2026-01-01T00:00:00", drained={"node5": "x"}),
         "generation"),  # a reused array job id of another run
        (_marker(job_id="999", drained={"node5": "x"}), "another allocation"),  # a requeue
        (_marker(task="4", drained={"node5": "x"}), "another allocation"),
        (_marker(nodes="node9", drained={"node9": "x"}), "does not name this node"),
    ],
)  # fmt: skip
def test_no_marker_or_one_of_another_allocation_fails_open(marker, why):
    verdict = judge(marker, ME)
    assert verdict.healthy
    assert why in verdict.why


def test_a_marker_another_user_could_have_written_is_ignored(tmp_path):
    path = tmp_path / "task_3"
    path.write_text(_marker(drained={"node5": "x"}))
    path.chmod(0o666)
    text, problem = health_check.read_marker(path, os.geteuid())
    assert text is None and "not a file of this job's user" in problem
    path.chmod(0o600)
    assert health_check.read_marker(path, os.geteuid())[0] == path.read_text()


# --- NVRx's own client against the entrypoint's service ----------------------------------


def _check(tmp_path, site="", log=None) -> health_check.DrainCheck:
    return health_check.DrainCheck(
        tmp_path / "task_3", ME, site_endpoint=site, log=(log if log is not None else print)
    )


def test_nvrx_s_health_check_client_hears_drained_only_while_the_marker_says_so(tmp_path):
    said: list[str] = []
    check = _check(tmp_path, log=said.append)
    with health_check.serving(check) as socket:
        assert socket is not None
        nvrx = NodeHealthCheck(endpoint=socket)  # what ft_launcher builds from the flag
        assert nvrx() is True  # no marker yet: fails open
        (tmp_path / "task_3").write_text(_marker(drained={"node5": "test"}))
        assert nvrx() is False
        (tmp_path / "task_3").write_text(_marker())
        assert nvrx() is True
    assert any("Slurm has drained node5 of task 3 (node5: test)" in s for s in said)
    assert not Path(socket).parent.exists()  # the private socket directory goes with it


class _SiteService(nvhcd_pb2_grpc.HealthCheckServiceServicer):
    """A stand-in for a site's nvhcd (NVIDIA's node health check daemon, not installable
    here): it answers with the fail_count it is given and records the request's args."""

    def __init__(self, fail_count: int):
        self.fail_count = fail_count
        self.args: list[list[str]] = []

    def RunHealthCheck(self, request, context):
        self.args.append(list(request.args))
        output = json.dumps({"fail_count": self.fail_count, "failed_checks": ["gpu"]})
        return nvhcd_pb2.HealthCheckResponse(success=True, exit_code=0, output=output)


@pytest.mark.parametrize("site_fails", [True, False])
def test_the_sites_own_health_check_is_still_asked_with_nvrx_s_request(tmp_path, site_fails):
    site_socket = tmp_path / "nvhcd.sock"
    service = _SiteService(1 if site_fails else 0)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    nvhcd_pb2_grpc.add_HealthCheckServiceServicer_to_server(service, server)
    server.add_insecure_port(f"unix://{site_socket}")
    server.start()
    try:
        with health_check.serving(_check(tmp_path, site=str(site_socket))) as socket:
            assert NodeHealthCheck(endpoint=socket)() is (not site_fails)
    finally:
        server.stop(grace=None)
    assert service.args and "--no-slurm" in service.args[0]  # NVRx's default arguments


def test_a_site_service_that_does_not_answer_reads_as_healthy_as_nvrx_reads_it(tmp_path):
    said: list[str] = []
    gone = tmp_path / "gone.sock"
    with health_check.serving(_check(tmp_path, site=str(gone), log=said.append)) as socket:
        assert NodeHealthCheck(endpoint=socket)() is True
    assert any("did not answer" in s for s in said)


def test_the_entrypoint_names_its_socket_only_while_the_chain_polls_samples_stacks_or_beats(
    tmp_path,
):
    node = Node("500", 3, 0, "503", "node5")
    off = manifest.build(
        ChainSpec(work_dir=str(tmp_path), workload="cpu", drain_poll_interval=0,
                  stack_sampling=0, node_silence_timeout=0,
                  health_check_endpoint="/run/nvhcd.sock"),
        created="c", user="u",
    )  # fmt: skip
    with health_check.endpoint(off, node, GEN, print) as health:
        assert health is None  # ft_launcher gets the spec's own endpoint
    on = manifest.build(ChainSpec(work_dir=str(tmp_path), workload="cpu"), created="c", user="u")
    with health_check.endpoint(on, node, GEN, print) as health:
        assert health is not None and os.path.exists(health)
    hangs_only = manifest.build(
        ChainSpec(work_dir=str(tmp_path), workload="cpu", drain_poll_interval=0),
        created="c", user="u",
    )  # fmt: skip
    with health_check.endpoint(hangs_only, node, GEN, print) as health:
        assert health is not None  # a hung node leaves at the next rendezvous
    liveness_only = manifest.build(
        ChainSpec(work_dir=str(tmp_path), workload="cpu", drain_poll_interval=0,
                  stack_sampling=0),
        created="c", user="u",
    )  # fmt: skip
    with health_check.endpoint(liveness_only, node, GEN, print) as health:
        assert health is not None  # a node taken for dead leaves if it comes back


# --- the producer ----------------------------------------------------------------------------

SINFO_DRAINED = "node5|test reason | with a bar\nnode5|test reason | with a bar\nnode9|other\n"
SQUEUE_RUNNING = "0|501|node1\n3|503|node[5-6]\n4|504|node7\n"


def _stand_ins(tmp_path, *, sinfo=SINFO_DRAINED, squeue=SQUEUE_RUNNING, sinfo_code=0,
               sinfo_sleep=0) -> dict[str, str]:  # fmt: skip
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, out, code, pause in (
        ("sinfo", sinfo, sinfo_code, sinfo_sleep),
        ("squeue", squeue, 0, 0),
    ):
        (tmp_path / f"{name}.out").write_text(out)
        # One process, not a shell and its sleep: a poller that gives up on a hung
        # command kills the command, and a sleep of a shell would outlive the test.
        (bin_dir / name).write_text(
            f"#!{sys.executable}\nimport sys, time\n"
            f"open({str(tmp_path / 'calls')!r}, 'a').write(' '.join(sys.argv) + '\\n')\n"
            f"time.sleep({pause})\n"
            f"sys.stdout.buffer.write(open({str(tmp_path / f'{name}.out')!r}, 'rb').read())\n"
            f"sys.exit({code})\n"
        )
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}


def _poll(tmp_path, env, python=sys.executable, timeout="5") -> subprocess.CompletedProcess:
    return subprocess.run(
        [python, str(POLLER), "--array-job-id", "500", "--generation", GEN,
         "--dir", str(tmp_path / "drain"), "--interval", "1", "--timeout", timeout, "--once"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_one_pass_is_one_sinfo_and_one_squeue_and_a_marker_per_running_task(tmp_path):
    done = _poll(tmp_path, _stand_ins(tmp_path))
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[0].rsplit("/", 1)[1] for c in calls] == ["sinfo", "squeue"]
    assert "--jobs=500" in calls[1] and "--states=RUNNING" in calls[1]
    drain = tmp_path / "drain"
    assert sorted(p.name for p in drain.iterdir()) == ["last_poll", "task_0", "task_3", "task_4"]
    assert oct(drain.stat().st_mode & 0o777) == "0o700"
    hit = (drain / "task_3").read_text()
    assert judge(hit, ME).healthy is False  # the consumer reads what the producer wrote
    assert "node5: test reason | with a bar" in hit
    assert judge((drain / "task_4").read_text(), Identity(GEN, 4, "504", "node7")).healthy
    assert "Slurm drained node5" in done.stderr
    assert "drained=node5\n" in (drain / "last_poll").read_text()


@pytest.mark.parametrize(
    "failure",
    [dict(sinfo_code=1), dict(sinfo_sleep=30)],  # an error, and a controller that hangs
    ids=["error", "timeout"],
)
def test_a_pass_slurm_does_not_answer_changes_no_marker(tmp_path, failure):
    _poll(tmp_path, _stand_ins(tmp_path))
    drain = tmp_path / "drain"
    before = {p.name: (p.read_text(), p.stat().st_ino) for p in drain.glob("task_*")}
    # Slurm now says the node is clean, but cannot answer: nothing may read as clean.
    done = _poll(tmp_path, _stand_ins(tmp_path, sinfo="", **failure), timeout="2")
    after = {p.name: (p.read_text(), p.stat().st_ino) for p in drain.glob("task_*")}
    assert after == before
    assert "pass skipped, every marker kept as it was" in done.stderr
    last = (drain / "last_poll").read_text()
    assert "outcome=skipped: sinfo " in last and "drained=node5\n" in last


def test_an_unchanged_marker_is_not_rewritten(tmp_path):
    env = _stand_ins(tmp_path)
    _poll(tmp_path, env)
    inode = (tmp_path / "drain" / "task_3").stat().st_ino
    _poll(tmp_path, env)
    assert (tmp_path / "drain" / "task_3").stat().st_ino == inode
    # ...and a node put back into service is written once, as clean
    done = _poll(tmp_path, _stand_ins(tmp_path, sinfo=""))
    assert judge((tmp_path / "drain" / "task_3").read_text(), ME).healthy
    assert "node5 no longer drained" in done.stderr


def _python36() -> str | None:
    found = shutil.which("python3.6")
    if found is None:
        return None
    env = {**os.environ, "PYENV_VERSION": "3.6"}
    probe = "import sys; assert sys.version_info[:2] == (3, 6); print(sys.executable)"
    done = subprocess.run([found, "-c", probe], capture_output=True, text=True, env=env)
    return done.stdout.strip() if done.returncode == 0 else None


@pytest.mark.skipif(_python36() is None, reason="no Python 3.6 on this machine")
def test_the_poller_runs_on_the_oldest_host_python(tmp_path):
    done = _poll(tmp_path, _stand_ins(tmp_path), python=_python36() or "")
    assert done.returncode == 0, done.stderr
    assert judge((tmp_path / "drain" / "task_3").read_text(), ME).healthy is False


@pytest.mark.skipif(_python36() is None, reason="no Python 3.6 on this machine")
def test_a_drain_reason_in_any_encoding_never_ends_the_poller_on_python_3_6_in_the_c_locale(
    tmp_path,
):
    # Python 3.6 in the C locale decodes (and encodes) text as ASCII: an en dash or "°C"
    # in an administrator's reason, or a byte that is not UTF-8, once killed the poller.
    env = _stand_ins(tmp_path) | {"LC_ALL": "C", "LANG": "C"}
    (tmp_path / "sinfo.out").write_bytes(b"node5|fan \xe2\x80\x93 90\xc2\xb0C\nnode6|bad \xff\n")
    done = _poll(tmp_path, env, python=_python36() or "")
    assert done.returncode == 0, done.stderr
    marker = (tmp_path / "drain" / "task_3").read_bytes().decode()
    assert "drained=node5 node6\n" in marker
    assert "node5: fan \u2013 90\u00b0C; node6: bad \ufffd" in marker


# --- the entrypoint and the real ft_launcher ----------------------------------------------


def test_a_real_ft_launcher_on_a_drained_node_leaves_at_its_rendezvous_with_1_never_93(tmp_path):
    from tests.unit.test_entrypoint_main import entrypoint, srun_stand_in, write_manifest

    run_json = write_manifest(tmp_path)
    m = manifest.load(run_json)
    marker = m.layout.drain_marker("700", 0)
    marker.parent.mkdir(parents=True, mode=0o700)
    this_node = drain_poller.RunningTask("0", "700", ["nodeT"])
    marker.write_text(
        drain_poller.marker(f"{m.chain_id}/700/", this_node, {"nodeT": "issue 23 unit test"})
    )
    done = entrypoint("--manifest", str(run_json), env=srun_stand_in(SLURMD_NODENAME="nodeT"),
                      timeout=180)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Slurm has drained nodeT of task 0 (nodeT: issue 23 unit test)" in done.stderr
    nvrx_log = m.layout.launcher_log("700").read_text()
    assert "failed_checks=['slurm drain: Slurm has drained nodeT" in nvrx_log
    assert "raised UnhealthyNodeException" in nvrx_log
    assert not list(m.layout.cycle_infos("700").glob("cycle_info.700.0.*"))  # never trained


# --- task 0's batch script starts and stops the poller ------------------------------------


def _generation(tmp_path, **settings) -> tuple[Path, Path, dict[str, str]]:
    from nvrx_appliance.chain import render, submit

    work = tmp_path / "w"
    spec = ChainSpec(work_dir=str(work), workload="cpu", runtime="bare", python=sys.executable,
                     job_name="demo", **settings)  # fmt: skip
    m = manifest.build(spec, created="chain-1", user="alice")
    work.mkdir()
    manifest.save(m)
    submit.write_teardown(m.layout)
    script = work / "demo.sbatch"
    script.write_text(render.render(m, template=submit.template_text()))
    env = _stand_ins(tmp_path)
    # srun trains until the poller's first pass is on disk (60 s at most), as a generation
    # would: the trap then stops a poller that is running, not one that never began.
    wait = 'for i in $(seq 600); do [ -e "$WAIT_FOR" ] && break; sleep 0.1; done\n'
    for name in ("srun", "scancel", "scontrol"):
        body = f'#!/bin/sh\necho "$0 $*" >> {tmp_path}/calls\n' + (wait if name == "srun" else "")
        (tmp_path / "bin" / name).write_text(body)
        (tmp_path / "bin" / name).chmod(0o755)
    env |= {"SLURM_ARRAY_JOB_ID": "500", "SLURM_ARRAY_TASK_ID": "0", "SLURM_JOB_NAME": "demo",
            "SLURM_JOB_USER": "alice", "HOME": str(tmp_path),
            "WAIT_FOR": str(m.layout.drain_poll("500"))}  # fmt: skip
    return script, m.layout.drain("500"), env


def test_task_0s_batch_script_polls_in_the_background_and_its_trap_stops_the_poller(tmp_path):
    script, drain, env = _generation(tmp_path, drain_poll_interval=1)
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "polling Slurm every 1 s for drained nodes of array 500" in done.stderr
    assert (drain / "last_poll").read_text().startswith("generation=chain-1/500/")
    pollers = [p for p in psutil.process_iter(["cmdline"])
               if str(drain) in " ".join(p.info["cmdline"] or [])]  # fmt: skip
    assert pollers == []  # nothing of the generation outlives its batch script


def test_the_trap_never_signals_the_pid_of_a_poller_that_already_ended(tmp_path):
    # Once the poller ended and its shell collected it, its pid may be another process's.
    script, _drain, env = _generation(tmp_path, drain_poll_interval=1)
    # A poller that says its pid where srun waits for it, and ends at once.
    (script.parent / "drain_poller.py").write_text(
        "import os\npath = os.environ['WAIT_FOR']\nos.makedirs(os.path.dirname(path))\n"
        "open(path + '.tmp', 'w').write(str(os.getpid()))\nos.rename(path + '.tmp', path)\n"
    )
    # srun trains until that poller is gone from the process table (collected).
    gone = 'for i in $(seq 600); do [ -e "/proc/$(cat "$WAIT_FOR")" ] || break; sleep 0.1; done\n'
    srun = tmp_path / "bin" / "srun"
    srun.write_text(srun.read_text() + gone)
    # Every `kill` of the batch shell, recorded (a function comes before the builtin).
    (tmp_path / "bash_env").write_text(
        f'kill() {{ echo "kill $*" >> {tmp_path}/kills; builtin kill "$@"; }}\n'
    )
    env["BASH_ENV"] = str(tmp_path / "bash_env")
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    pid = (script.parent / "nvrx" / "500" / "drain" / "last_poll").read_text()
    kills = (tmp_path / "kills").read_text().splitlines()
    assert f"kill {pid}" not in kills and f"kill -0 {pid}" not in kills, kills


def test_a_poller_others_could_have_written_is_not_started_and_the_generation_runs_on(tmp_path):
    script, drain, env = _generation(tmp_path)
    env["WAIT_FOR"] = str(script)  # no poller will write anything: srun need not wait
    (script.parent / "drain_poller.py").chmod(0o666)
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "nvrx drain poller: ERROR: not started" in done.stderr
    assert "writable by group or others (mode 666)" in done.stderr
    assert not drain.exists()
    assert any(" srun " in f" {c} " or c.split()[0].endswith("srun")
               for c in (tmp_path / "calls").read_text().splitlines())  # fmt: skip


def test_a_node_a_hang_verdict_named_fails_the_health_check_until_withdrawn(tmp_path):
    said: list[str] = []
    me = Identity(generation=GEN, task=1, job_id="501", node="node3")
    hangs = tmp_path / "hangs"
    hangs.mkdir()
    check = DrainCheck(tmp_path / "none", me, site_endpoint="", log=said.append, hangs=hangs)
    assert check.check().healthy  # no verdict
    words = "node3 hung in cycle 2: its rank stopped in `_train_step` while 1 other waited"
    (hangs / "hung.node3").write_text(json.dumps({"generation": GEN, "words": words}))
    found = check.check()
    assert not found.healthy and found.why == f"{words}; node3 leaves at this rendezvous"
    # What NVRx logs, and node memory tells apart from a drain and from a GPU fault.
    assert health_check.answer(found)["failed_checks"] == [f"hung: {found.why}"]
    (hangs / "withdrawn.node3").write_text("{}")
    assert check.check().healthy


def test_a_hang_marker_of_another_generation_is_ignored(tmp_path):
    me = Identity(generation=GEN, task=1, job_id="501", node="node3")
    other = json.dumps({"generation": "other-chain/9/", "words": "node3 hung"})
    assert health_check.judge_hang(other, False, me).healthy


# --- hung nodes: the generation's pending tasks keep off them --------------------------------


def test_a_pending_task_gets_the_hung_node_beside_its_own_exclusions():
    pending = drain_poller.bad_nodes.parse_pending(
        "3|debug|node1\n4|debug|node[3,7]\n5|debug|(null)\n"
    )
    assert drain_poller.pending_exclusions(pending, ["node3"]) == {
        "3": "node1,node3",  # the user's own --exclude stays
        "5": "node3",
    }  # task 4 keeps node3 out already: left alone


def test_a_hang_verdict_sets_the_excluded_nodes_of_the_generations_pending_tasks(tmp_path):
    hangs = tmp_path / "hangs"
    hangs.mkdir()
    (hangs / "hung.node3").write_text(json.dumps({"generation": GEN, "words": "node3 hung"}))
    # A verdict withdrawn (its ranks moved again) keeps nothing off its node.
    (hangs / "hung.node8").write_text(json.dumps({"generation": GEN, "words": "node8 hung"}))
    (hangs / "withdrawn.node8").write_text("{}")
    env = _stand_ins(tmp_path, squeue="3|debug|node1\n4|debug|\n")
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$0 $*" >> {tmp_path}/calls\n')
    scontrol.chmod(0o755)
    done = subprocess.run(
        [sys.executable, str(POLLER), "--array-job-id", "500", "--generation", GEN,
         "--dir", str(tmp_path / "drain"), "--interval", "0", "--hangs", str(hangs), "--once"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    calls = [c.split(" ", 1) for c in (tmp_path / "calls").read_text().splitlines()]
    assert [(Path(c[0]).name, c[1]) for c in calls] == [
        ("squeue", "--noheader --array --jobs=500 --states=PENDING --format=%K|%P|%x"),
        ("scontrol", "update JobId=500_3 ExcNodeList=node1,node3"),
        ("scontrol", "update JobId=500_4 ExcNodeList=node3"),
    ]  # no sinfo: --interval 0 polls no drains
    assert "pending task 500_3 now excludes node1,node3: a hang verdict named node3" in done.stderr
