"""`status` assembled from recorded inputs: Slurm's text, the ledger, real cycle-info files."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from nvrx_appliance import manifest
from nvrx_appliance.chain import status
from nvrx_appliance.cli import status_view
from nvrx_appliance.image import qualification as q
from nvrx_appliance.image import qualification_status
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe import slurm_output
from nvrx_appliance.observe.run_files import cycle_info
from nvrx_appliance.observe.times import parse_time
from nvrx_appliance.settings.chain import ChainSpec
from tests.unit.images import cpu_manifest

FIXTURES = Path(__file__).parent / "fixtures" / "watch"
WORK = "/shared/run"

MANIFEST = {
    "created": "2026-11-30T18:00:00Z",
    "user": "alice",
    "spec": {"job_name": "demo", "work_dir": WORK, "time_limit": "01:00:00"},
    "shape": {"array_spec": "0-3%3", "active_tasks": 3},
}

# sacct -X -P: generation 4242 ended (task 0 failed on node1, spares cancelled),
# 4250 runs on node2 with one active task not admitted yet, 4251 still queued.
SACCT = f"""\
4242_0|4243|demo|alice|FAILED|1:0|node1|2026-11-30T18:07:50|2026-11-30T18:09:00|{WORK}
4242_1|4244|demo|alice|COMPLETED|0:0|node2|2026-11-30T18:07:50|2026-11-30T18:09:01|{WORK}
4242_2|4245|demo|alice|COMPLETED|0:0|node3|2026-11-30T18:07:50|2026-11-30T18:09:01|{WORK}
4242_3|4242|demo|alice|CANCELLED by 0|0:0|None assigned|Unknown|2026-11-30T18:09:00|{WORK}
4250_0|4252|demo|alice|RUNNING|0:0|node2|2026-11-30T18:09:03|Unknown|{WORK}
4250_1|4253|demo|alice|RUNNING|0:0|node3|2026-11-30T18:09:03|Unknown|{WORK}
4250_[2-3%3]|4250|demo|alice|PENDING|0:0|None assigned|Unknown|Unknown|{WORK}
4251_[0-3%3]|4251|demo|alice|PENDING|0:0|None assigned|Unknown|Unknown|{WORK}
4260_0|4261|demo|alice|RUNNING|0:0|node4|2026-11-30T18:09:03|Unknown|/elsewhere
"""
SQUEUE = f"""\
4252|4250|0|demo|alice|RUNNING|node2|None|{WORK}
4253|4250|1|demo|alice|RUNNING|node3|None|{WORK}
4250_2|4250|2|demo|alice|PENDING|(null)|Resources|{WORK}
4250_3|4250|3|demo|alice|PENDING|(null)|JobArrayTaskLimit|{WORK}
4251_0|4251|0|demo|alice|PENDING|(null)|Dependency|{WORK}
"""
LEDGER = [
    {
        "array_job_id": "4242",
        "chain": "2026-11-30T18:00:00Z",
        "task0_node": "node1",
        "exit_code": 1,
        "checkpoint_iteration_start": None,
        "checkpoint_iteration": 40,
        "action": "released_spares",
        "reason": "task 0 exited 1; releasing this generation's pending spares",
    },
    {"array_job_id": "1", "chain": "an older chain in the same dir", "exit_code": 93},
]


NOW = "2026-11-30T18:19:03"  # ten minutes after generation 4250's task 0 started


def _view():
    cycles = [cycle_info((FIXTURES / "two_cycles" / n).read_text()) for n in
              ("cycle_info.4242.0.0", "cycle_info.4242.0.1")]  # fmt: skip
    return status.assemble(
        manifest=MANIFEST,
        queue=slurm_output.squeue_tasks(SQUEUE),
        acct=slurm_output.sacct_rows(SACCT),
        ledger=LEDGER,
        cycles={"4242": cycles},
        checkpoint_now=60,
        chain_marker=True,
        now=parse_time(NOW),
    )


def test_each_generation_is_listed_once_in_order_and_other_chains_are_left_out():
    view = _view()
    assert [g.array_job_id for g in view.generations] == ["4242", "4250", "4251"]
    assert view.queued == ("4251",)


def test_an_ended_generation_shows_task_0s_node_exit_and_hand_off_iteration():
    ended = _view().generations[0]
    assert (ended.state, ended.task0_node, ended.exit_code) == ("ended", "node1", 1)
    assert (ended.running, ended.pending, ended.done) == (0, 0, 4)
    assert ended.checkpoint_end == 40 and ended.action == "released_spares"


def test_the_running_generation_says_it_still_waits_for_active_tasks():
    running = _view().generations[1]
    assert (running.state, running.running, running.pending) == ("running", 2, 2)
    assert running.task0_node == "node2"
    assert running.admission == "2 of 3 active tasks admitted; waiting for the scheduler"


def test_cycles_come_from_nvrxs_own_files():
    cycles = _view().generations[0].cycles
    assert [c.number for c in cycles] == [0, 1]
    assert all(c.end is not None for c in cycles)


def test_a_source_that_could_not_be_read_is_named_not_fatal():
    view = status.assemble(
        manifest=MANIFEST,
        queue=None,
        acct=None,
        ledger=LEDGER,
        cycles={},
        checkpoint_now=None,
        chain_marker=False,
        blind=["sacct: sacct did not answer within 30s"],
    )
    assert [g.array_job_id for g in view.generations] == ["4242"]
    assert view.generations[0].exit_code == 1  # the ledger still knows
    text = _rendered(view)
    assert "could not read sacct" in text


def _rendered(view):
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(status_view.render(view))
    return console.export_text()


def test_the_table_reads_like_the_chain():
    text = _rendered(_view())
    assert "checkpoint iteration now: 60" in text
    assert "queued generations: 4251" in text
    assert "released spares" in text and "waiting for the scheduler" in text


def test_status_shows_the_shape_submit_validated_and_the_chains_wandb_run():
    spec = ChainSpec(work_dir=WORK, workload="megatron", train_tasks=4, gpus_per_node=8,
                     tensor_parallel=4, context_parallel=4, global_batch=4,
                     megatron_args=["--wandb-project", "p", "--wandb-exp-name", "x"])  # fmt: skip
    m = manifest.build(spec, created="2026-11-30T18:00:00Z", user="alice").to_json()
    view = status.assemble(
        manifest={**MANIFEST, "shape": m["shape"], "wandb": m["wandb"]},
        queue=slurm_output.squeue_tasks(SQUEUE), acct=slurm_output.sacct_rows(SACCT),
        ledger=LEDGER, cycles={}, checkpoint_now=60, chain_marker=True, now=parse_time(NOW),
    )  # fmt: skip
    text = _rendered(view)
    assert (
        "shape: 32 ranks = TP 4 x PP 1 x CP 4 x DP 2; global batch 4 = micro 1 x DP 2 x 2 "
        "microbatches"
    ) in text
    assert "W&B run: nvrx-chain-20261130180000 (every generation logs to it)" in text
    assert view.to_json()["wandb_run_id"] == "nvrx-chain-20261130180000"


def test_a_generation_a_peer_fenced_says_so():
    fenced = [{**LEDGER[0], "action": "fenced", "reason": "task 0's lease went stale"}]
    view = status.assemble(
        manifest=MANIFEST, queue=slurm_output.squeue_tasks(SQUEUE), acct=slurm_output.sacct_rows(SACCT),
        ledger=fenced, cycles={}, checkpoint_now=60, chain_marker=True, now=parse_time(NOW),
    )  # fmt: skip
    assert "fenced dead task 0" in _rendered(view)


def test_a_save_at_the_time_limit_and_a_completed_chain_say_so_plainly():
    saved = {**LEDGER[0], "exit_code": 0, "action": "saved_at_time_limit"}
    done = {**LEDGER[0], "array_job_id": "4250", "exit_code": 0, "action": "completed",
            "checkpoint_iteration": 200, "final_iteration": 200}  # fmt: skip
    view = status.assemble(
        manifest=MANIFEST, queue=[], acct=slurm_output.sacct_rows(SACCT),
        ledger=[saved, done], cycles={}, checkpoint_now=200, chain_marker=False,
        now=parse_time(NOW),
    )  # fmt: skip
    assert view.completed_at == 200 and view.to_json()["completed_at"] == 200
    text = _rendered(view)
    assert "saved at the time limit" in text and "training completed" in text
    assert "training completed at iteration 200" in text
    assert "training completed at iteration" not in _rendered(_view())  # a chain that trains on


def test_an_ended_generations_straggler_is_shown_with_what_task_0_did_about_it():
    named = {"node": "node3", "cycle": 0, "slowdown": 2.1, "lost_s": 24,
             "action": "replaced: it costs 292 s until the generation ends, more than a "
                       "restart (9 s, this cycle's own start-up (a lower bound))",
             "words": "node3 is a straggler in cycle 0 of generation 4242: ..."}  # fmt: skip
    view = status.assemble(
        manifest=MANIFEST, queue=slurm_output.squeue_tasks(SQUEUE),
        acct=slurm_output.sacct_rows(SACCT), ledger=[{**LEDGER[0], "stragglers": [named]}],
        cycles={}, checkpoint_now=60, chain_marker=True, now=parse_time(NOW),
    )  # fmt: skip
    text = " ".join(_rendered(view).split())
    assert (
        "generation 4242: node3 was a straggler in cycle 0 (2.10x its peers' own step; the run "
        "lost 24 s waiting for it): replaced: it costs 292 s until the generation ends"
    ) in text
    assert "was a straggler" not in _rendered(_view())  # a ledger that names none


def test_status_json_round_trips():
    doc = json.loads(json.dumps(_view().to_json()))
    assert doc["generations"][0]["cycles"][1]["number"] == 1


def test_status_of_a_work_dir_without_a_chain_says_so(tmp_path):
    from nvrx_appliance.cli.main import cli

    result = CliRunner().invoke(cli, ["status", "x", "--work-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "holds no nvrx-appliance chain" in result.output


# --- the image and its qualification -------------------------------------------------------

IMAGE = "/images/appliance.sqsh"
PASSED = {"status": "passed", "record": IMAGE + ".qualification.json",
          "date": "2026-12-01T09:30:00Z", "cluster": "alps", "why": ""}  # fmt: skip


def _image_manifest(status_json=None):
    image = (
        {**cpu_manifest(), qualification_status.KEY: status_json} if status_json else cpu_manifest()
    )
    return {**MANIFEST, "spec": {**MANIFEST["spec"], "image": IMAGE}, "image": image}


def _image_view(manifest, qualify_record=None):
    return status.assemble(
        manifest=manifest,
        queue=[],
        acct=[],
        ledger=[],
        cycles={},
        checkpoint_now=None,
        chain_marker=False,
        qualify_record=qualify_record,
    )


def test_a_bare_metal_chain_says_it_runs_no_image():
    view = _view()
    assert view.image.kind == "bare metal"
    assert "image: bare metal (no image)" in _rendered(view)
    assert json.loads(json.dumps(view.to_json()))["image"]["kind"] == "bare metal"


def test_an_image_shows_its_versions_and_when_and_where_it_was_qualified():
    view = _image_view(_image_manifest(PASSED))
    text = _rendered(view)
    assert "image: appliance.sqsh (NVRx 0.7.0, Megatron-LM unknown, PyTorch 2.13.0+cpu)" in text
    assert "qualification at submit: passed on 2026-12-01T09:30:00Z on cluster alps" in text
    doc = json.loads(json.dumps(view.to_json()))["image"]
    assert doc["versions"]["PyTorch"] == "2.13.0+cpu"
    assert (doc["qualification"], doc["qualified_on"], doc["qualified_cluster"]) == (
        "passed", "2026-12-01T09:30:00Z", "alps",
    )  # fmt: skip


def test_an_image_nothing_vouched_for_at_submit_says_not_qualified_and_why():
    none = {"status": "none", "record": "r", "date": "", "cluster": "", "why": "none at r"}
    assert "qualification at submit: not qualified (none at r)" in _rendered(
        _image_view(_image_manifest(none))
    )
    # A run.json from before submit recorded the qualification status does not claim either way.
    view = _image_view(_image_manifest())
    assert view.image.qualification == "unknown"
    assert "not qualified (submitted by an nvrx-appliance that did not record it)" in (
        _rendered(view)
    )


def test_a_registry_image_has_no_manifest_to_qualify():
    manifest = {
        **MANIFEST,
        "spec": {**MANIFEST["spec"], "image": "registry.example#nvidia/pytorch:25.01-py3"},
    }
    text = _rendered(_image_view(manifest))
    assert (
        "image: registry.example#nvidia/pytorch:25.01-py3   qualification at submit: not qualified"
        in text
    )


def _qualify_record(checks):
    return q.record(
        image=IMAGE, image_manifest=cpu_manifest(), checks=checks, cluster={"cluster_name": "alps"},
        chain={}, started="s", finished="2026-12-01T09:30:00Z", tool_version="0.1.0",
    )  # fmt: skip


def test_a_qualify_runs_own_record_is_shown_check_by_check():
    checks = [
        q.Check(q.CHECKPOINT_BEFORE_FAULT, True, "lost task 0 after checkpoint iteration 10"),
        q.Check(q.RESUMED_EXACTLY, False, "generation 102 resumed at 5, not 10"),
        q.Check(q.TRAINING_WENT_ON, None, "waiting for the checks before it"),
    ]
    view = _image_view(_image_manifest(PASSED), _qualify_record(checks))
    text = _rendered(view)
    assert (
        "this chain's qualification run: failed, finished 2026-12-01T09:30:00Z on cluster alps"
        in text
    )
    assert "FAIL" in text and "generation 102 resumed at 5, not 10" in text
    doc = json.loads(json.dumps(view.to_json()))["qualify_run"]
    assert [c["passed"] for c in doc["checks"]] == [True, False, None]
    assert _image_view(_image_manifest(PASSED)).qualify_run is None


def test_status_reads_the_image_from_run_json_and_the_work_dirs_qualification_record(tmp_path):
    from nvrx_appliance import manifest as run_manifest
    from nvrx_appliance.cli.main import cli
    from nvrx_appliance.settings.chain import ChainSpec

    spec = ChainSpec(work_dir=str(tmp_path), workload="cpu", image=IMAGE, runtime="pyxis",
                     job_name="qual")  # fmt: skip
    image = {**cpu_manifest(), qualification_status.KEY: PASSED}
    run_manifest.save(
        run_manifest.build(spec, created="2026-12-01T09:00:00Z", user="a", image=image)
    )
    checks = [q.Check(name, True, "seen") for name in (q.CHECKPOINT_BEFORE_FAULT,
              q.RESUMED_EXACTLY, q.TRAINING_WENT_ON)]  # fmt: skip
    Layout(tmp_path).qualification.write_text(json.dumps(_qualify_record(checks)))
    # No Slurm: status still shows the work dir's record, and fails (below).
    env = {"SLURM_CONF": str(tmp_path / "none.conf")}
    result = CliRunner().invoke(
        cli, ["status", "qual", "--work-dir", str(tmp_path), "--json"], env=env
    )
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["image"]["name"] == "appliance.sqsh"
    assert doc["image"]["qualification"] == "passed"
    assert doc["qualify_run"]["result"] == "passed"
    assert doc["blind"]  # squeue and sacct are named as unread


# --- times, pending reasons, and a Slurm that does not answer ----------------------------


def test_a_generation_shows_when_it_started_how_long_it_ran_and_the_time_left():
    ended, running, queued = _view().generations
    assert (running.elapsed_s, running.time_left_s) == (600, 3000)
    assert running.started == parse_time("2026-11-30T18:09:03")
    assert (ended.elapsed_s, ended.time_left_s) == (70, None)
    assert (queued.started, queued.elapsed_s, queued.time_left_s) == (None, None, None)
    text = _rendered(_view())
    assert "10 min" in text and "50 min" in text


def test_a_queued_generation_says_why_squeue_holds_it_and_has_no_node():
    queued = _view().generations[2]
    assert queued.pending_reason == "Dependency"
    assert queued.task0_node == ""
    assert "queued (Dependency)" in _rendered(_view())
    assert "(null)" not in _rendered(_view())


def test_status_json_names_its_schema_and_gives_times_in_iso_utc(tmp_path):
    from nvrx_appliance.cli.main import cli

    doc = _view().to_json()
    started = doc["generations"][1]["started"]
    assert started.endswith("Z") and parse_time(started) == parse_time("2026-11-30T18:09:03")
    assert doc["generations"][0]["cycles"][0]["start"].endswith("Z")
    (tmp_path / "run.json").write_text(
        json.dumps({**MANIFEST, "spec": {**MANIFEST["spec"], "work_dir": str(tmp_path)}})
    )
    result = CliRunner().invoke(cli, ["status", "demo", "--work-dir", str(tmp_path), "--json"],
                                env={"SLURM_CONF": str(tmp_path / "no-such.conf")})  # fmt: skip
    out = json.loads(result.stdout)
    assert (out["schema"], out["schema_version"]) == ("nvrx-appliance/status", 1)


def test_status_says_plainly_when_slurm_cannot_be_reached_and_fails(tmp_path):
    from nvrx_appliance.cli.main import cli

    manifest = {**MANIFEST, "spec": {**MANIFEST["spec"], "work_dir": str(tmp_path)}}
    (tmp_path / "run.json").write_text(json.dumps(manifest))
    env = {"SLURM_CONF": str(tmp_path / "no-such.conf")}
    for extra in ([], ["--json"]):
        result = CliRunner().invoke(
            cli, ["status", "demo", "--work-dir", str(tmp_path), *extra], env=env
        )
        assert result.exit_code == 1
        assert "Slurm could not be reached" in result.stderr
        assert "no-such.conf does not exist" in result.stderr
    assert json.loads(result.stdout)["slurm_reachable"] is False


def test_status_and_cancel_without_slurm_conf_name_that_as_the_cause(tmp_path, monkeypatch):
    from nvrx_appliance.cli.main import cli
    from nvrx_appliance.observe import slurmcli

    # This machine has no Slurm configuration of its own: the real squeue fails.
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setattr(slurmcli, "DEFAULT_SLURM_CONF", str(tmp_path / "slurm.conf"))
    for command in ("status", "cancel"):
        result = CliRunner().invoke(cli, [command, "4242"])
        assert result.exit_code == 1, result.output
        assert "Slurm could not be reached" in result.stderr
        assert "SLURM_CONF is not set" in result.stderr
        assert "no job" not in result.stderr


@pytest.mark.parametrize(
    "tracker", [b"\xff12\n", b"7" * 5000 + b"\n"], ids=["not-utf8", "5000-digits"]
)
def test_status_neither_hangs_on_a_fifo_nor_crashes_on_bytes_that_are_not_utf8(tmp_path, tracker):
    from nvrx_appliance import manifest as run_manifest
    from nvrx_appliance.settings.chain import ChainSpec

    spec = ChainSpec(work_dir=str(tmp_path), workload="cpu", runtime="bare", job_name="odd")
    m = run_manifest.build(spec, created="2026-12-01T09:00:00Z", user="a")
    run_manifest.save(m)
    os.mkfifo(m.layout.ledger)  # planted, or left by a broken tool: nobody ever writes it
    cycles = m.layout.cycle_infos("101")
    cycles.mkdir(parents=True)
    (cycles / "cycle_info.101.0.0").write_bytes(b'{"job_id": "101", "\xff\xfe": 1}')
    m.layout.checkpoints.mkdir()
    m.layout.tracker.write_bytes(tracker)  # 5,000 digits: more than Python 3.11's int() takes
    # A separate process with a deadline: a hang must fail the test, not stall the suite.
    done = subprocess.run(
        [str(Path(sys.executable).parent / "nvrx-appliance"), "status", "odd",
         "--work-dir", str(tmp_path), "--json"],
        env={**os.environ, "SLURM_CONF": str(tmp_path / "none.conf")},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    # Slurm is unreachable here, which status reports with exit 1; it must not hang
    # or crash on the planted files meanwhile.
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    doc = json.loads(done.stdout)
    assert doc["blind"] and doc["job_name"] == "odd"


def test_status_watch_refuses_to_refresh_faster_than_the_floor(tmp_path):
    from nvrx_appliance.cli.main import cli

    result = CliRunner().invoke(cli, ["status", "1", "--work-dir", str(tmp_path), "--watch", "0"])
    assert result.exit_code == 2
    assert "--watch" in result.output and "x>=2" in result.output


def test_a_straggler_replaced_in_the_running_generation_is_said_for_the_rest_of_the_chain(
    tmp_path, slurm
):
    """Seen: after --straggler-action replace took node3 out and the pace came back,
    status said only "running": the goodput rule no longer saw a slow node, and the
    generation's ledger line comes only at its end. What task 0 wrote down (its
    `named.<node>` file) is said until the ledger says it."""
    from nvrx_appliance.cli.main import cli
    from nvrx_appliance.node import control

    spec = ChainSpec(work_dir=str(tmp_path), workload="cpu", runtime="bare", job_name="slow",
                     straggler_action="replace")  # fmt: skip
    m = manifest.build(spec, created="2026-12-01T09:00:00Z", user="alice")
    manifest.save(m)
    slurm.add("4250", "slow", str(tmp_path), "RUNNING", nodes="node1",
              start="2026-12-01T09:01:00")  # fmt: skip
    named = {"generation": control.generation(m.chain_id, "4250", "x"), "node": "node3",
             "cycle": 0, "slowdown": 2.5, "lost_s": 75,
             "action": "replaced: it costs 292 s until the generation ends, more than a restart",
             "words": "node3 is a straggler in cycle 0 of generation 4250: ..."}  # fmt: skip
    path = m.layout.straggler_named("4250", "node3")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(named))
    # Another chain's file under a reused array job id says nothing here.
    other = m.layout.straggler_named("4250", "node9")
    other.write_text(json.dumps({**named, "node": "node9",
                                 "generation": control.generation("older", "4250", "x")}))  # fmt: skip
    result = CliRunner().invoke(cli, ["status", "slow"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert (
        "generation 4250: node3 was a straggler in cycle 0 (2.50x its peers' own step; the run "
        "lost 75 s waiting for it): replaced: it costs 292 s until the generation ends"
    ) in text
    assert "node9" not in text
    # Once the teardown has written the generation's line, the ledger says it (once).
    m.layout.ledger.write_text(json.dumps({"array_job_id": "4250", "chain": m.chain_id,
                                           "exit_code": 0, "action": "released_spares",
                                           "stragglers": [named]}) + "\n")  # fmt: skip
    again = " ".join(CliRunner().invoke(cli, ["status", "slow"]).output.split())
    assert again.count("node3 was a straggler in cycle 0") == 1
