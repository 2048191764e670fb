"""Task 0's teardown: what it decides, and that its bash wiring keeps 93 untouched.

The decision tests call the pure functions. The script tests run the real rendered
sbatch under bash with stand-ins for srun and scancel (a shell script each, on PATH):
the real ones are exercised on the local cluster by tests/integration/test_chain_*.
"""

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from nvrx_appliance import manifest
from nvrx_appliance.chain import render, submit
from nvrx_appliance.devcluster.poll import wait_until
from nvrx_appliance.jobhost import ending, teardown
from nvrx_appliance.node import control
from nvrx_appliance.settings.chain import ChainSpec


def _entry(exit_code, start, end, chain="c1"):
    return {
        "array_job_id": "1",
        "exit_code": exit_code,
        "checkpoint_iteration_start": start,
        "checkpoint_iteration": end,
        "chain": chain,
    }


def test_exit_93_cancels_the_whole_chain():
    action, reason = ending.decide(93, [], _entry(93, 20, 20), burn_guard=2)
    assert action == ending.CANCELLED_CHAIN and "93" in reason


def test_a_no_restart_witness_cancels_the_chain_even_when_srun_said_143():
    action, _ = ending.decide(143, [], _entry(143, 20, 40), 2, no_restart_witness=True)
    assert action == ending.CANCELLED_CHAIN


def test_an_ordinary_end_releases_only_this_generations_spares():
    action, _ = ending.decide(1, [], _entry(1, 20, 40), burn_guard=2)
    assert action == ending.RELEASED_SPARES


@pytest.mark.parametrize(
    ("entry", "burnt"),
    [
        (_entry(1, None, None), True),  # died before the first checkpoint of a fresh run
        (_entry(1, 40, 40), True),  # resumed and died without moving
        (_entry(1, 40, 60), False),  # died, but after training on
        (_entry(1, None, 20), False),  # fresh run that reached a checkpoint
        (_entry(0, 40, 40), False),  # ended cleanly: training was already done
    ],
)
def test_a_generation_is_burnt_when_it_neither_ended_cleanly_nor_moved_the_checkpoint(entry, burnt):
    assert ending.burnt(entry) is burnt


def test_the_burn_guard_fires_on_the_nth_consecutive_burnt_generation():
    burnt = _entry(1, 40, 40)
    assert ending.decide(1, [], burnt, burn_guard=2)[0] == ending.RELEASED_SPARES
    action, reason = ending.decide(1, [burnt], burnt, burn_guard=2)
    assert action == ending.BURN_GUARD
    assert reason.startswith("burn guard: 2 consecutive generations ended without training")


def test_a_generation_that_trained_resets_the_burn_count():
    history = [_entry(1, 0, 0), _entry(1, 0, 20)]
    assert ending.decide(1, history, _entry(1, 20, 20), 2)[0] == ending.RELEASED_SPARES


def test_burn_guard_zero_is_off():
    burnt = _entry(1, 40, 40)
    assert ending.decide(1, [burnt] * 5, burnt, burn_guard=0)[0] == ending.RELEASED_SPARES


def test_an_earlier_chain_in_the_same_work_dir_does_not_count():
    text = "\n".join(json.dumps(_entry(1, 0, 0, chain="old")) for _ in range(3))
    history = ending.chain_history(ending.parse_ledger(text + "\n{torn"), "c1")
    assert history == []


def test_training_done_ends_the_chain_whatever_the_exit_code():
    action, reason = ending.decide(0, [], _entry(0, 180, 200), 2, done=200)
    assert action == ending.COMPLETED and "training completed at iteration 200" in reason
    assert ending.decide(93, [], _entry(93, 180, 200), 2, done=200)[0] == ending.CANCELLED_CHAIN


def test_a_save_at_the_time_limit_is_not_a_failure_and_not_burnt():
    entry = _entry(0, 40, 40)  # told to save before anything new was trained
    action, reason = ending.decide(0, [entry], entry, 2, time_limit_notice=True)
    assert action == ending.SAVED_AT_TIME_LIMIT and "saved at the time limit" in reason
    assert not ending.burnt(entry)


def test_exit_0_without_the_notice_or_the_marker_is_neither_completion_nor_a_save():
    # e.g. an exit duration of the workload's own, or a script that simply returned
    assert ending.decide(0, [], _entry(0, 20, 40), 2)[0] == ending.RELEASED_SPARES
    # the notice came, but the workload did not save (it ignored the signal): killed
    assert ending.decide(143, [], _entry(143, 20, 20), 2, time_limit_notice=True)[0] == (
        ending.RELEASED_SPARES
    )


@pytest.mark.parametrize(("marker", "tracked", "done"), [
    ("200\n", 200, 200),
    ("100\n", 200, None),  # left by a shorter run of this work dir: training went on
    ("200\n", 180, None),  # names a checkpoint the tracker does not hold
    ("", 200, None),
])  # fmt: skip
def test_the_marker_counts_only_when_it_names_the_tracked_checkpoint(marker, tracked, done):
    assert ending.training_done(marker, tracked) == done


def test_cancelling_the_chain_is_by_its_job_ids_and_user_and_pending_only():
    argv = ending.scancel_argv(
        ending.BURN_GUARD, job_name="demo", user="alice", array_job_id="7", chain_ids=["5", "6"]
    )
    assert argv == ["scancel", "--state=PENDING", "--user=alice", "5", "6", "7"]
    # No recorded ids (a work dir without submitted.json): by name, as before.
    argv = ending.scancel_argv(ending.BURN_GUARD, job_name="demo", user="alice", array_job_id="7")
    assert argv == ["scancel", "--state=PENDING", "--name=demo", "--user=alice"]
    argv = ending.scancel_argv(
        ending.RELEASED_SPARES, job_name="demo", user="alice", array_job_id="7"
    )
    assert argv == ["scancel", "--state=PENDING", "--user=alice", "7"]


# --- the rendered script under bash, with srun/scancel stand-ins ---------------------

STANDIN = """#!/bin/sh
# stand-in for {name}: records its argv, says ${{STANDIN_STDERR}}, exits with ${{{var}:-0}}
# (srun first sleeps ${{SRUN_SLEEP:-0}} s, like a generation that is still training, and
# on TERM takes ${{SRUN_DRAIN:-0}} s to finish, like a workload saving, then exits
# ${{SRUN_TERM_EXIT:-143}}; scontrol says KillWait when asked for the config)
echo "{name} $*" >> "$STANDIN_LOG"
if [ "{name}" = srun ]; then
    trap 'sleep "${{SRUN_DRAIN:-0}}"; exit ${{SRUN_TERM_EXIT:-143}}' TERM
    sleep "${{SRUN_SLEEP:-0}}" & wait $!
fi
if [ "{name} $1 $2" = "scontrol show config" ] && [ -n "$KILL_WAIT" ]; then
    echo "KillWait                = $KILL_WAIT sec"
fi
[ -n "$STANDIN_STDERR" ] && echo "$STANDIN_STDERR" >&2
exit ${{{var}:-0}}
"""


def _prepare(tmp_path, *, srun_exit, scancel_exit=0, python=None, ledger_lines=(), scancel_says=""):
    work = tmp_path / "work"
    spec = ChainSpec(
        work_dir=str(work), workload="cpu", runtime="bare", python=python or "python3",
        burn_guard=2, job_name="demo",
    )  # fmt: skip
    m = manifest.build(spec, created="chain-1", user="alice")
    work.mkdir()
    manifest.save(m)
    (work / "chain.active").write_text("{}\n")
    (work / "chain.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ledger_lines))
    script = work / "demo.sbatch"
    script.write_text(render.render(m, template=submit.template_text()))
    submit.write_teardown(m.layout)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, var in (("srun", "SRUN_EXIT"), ("scancel", "SCANCEL_EXIT"), ("scontrol", "X")):
        (bin_dir / name).write_text(STANDIN.format(name=name, var=var))
        (bin_dir / name).chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "STANDIN_LOG": str(tmp_path / "calls"),
        "SRUN_EXIT": str(srun_exit),
        "SCANCEL_EXIT": str(scancel_exit),
        "STANDIN_STDERR": scancel_says,
        "SLURM_ARRAY_JOB_ID": "500",
        "SLURM_ARRAY_TASK_ID": "0",
        "SLURM_JOB_NAME": "demo",
        "SLURM_JOB_USER": "alice",
        "SLURMD_NODENAME": "node1",
    }
    return script, work, env


def _outcome(tmp_path, work):
    calls = (tmp_path / "calls").read_text().splitlines()
    ledger = [json.loads(x) for x in (work / "chain.jsonl").read_text().splitlines()]
    return calls, ledger


def _run_generation(tmp_path, **kwargs):
    script, work, env = _prepare(tmp_path, **kwargs)
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    return (done, work, *_outcome(tmp_path, work))


def test_slurms_term_at_the_time_limit_runs_the_teardown_at_once_with_143(tmp_path):
    script, work, env = _prepare(tmp_path, srun_exit=0)
    env["SRUN_SLEEP"] = "60"
    # Its own process group, so the stand-in srun left sleeping can be cleaned up after.
    proc = subprocess.Popen(
        ["bash", str(script)], env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    calls = tmp_path / "calls"
    try:
        wait_until(lambda: calls.exists() and "srun" in calls.read_text(), 10, "srun to start")
        proc.send_signal(signal.SIGTERM)
        # Well before the stand-in's 60 s: the trap does not wait for srun to return.
        assert proc.wait(timeout=20) == 143
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    _, ledger = _outcome(tmp_path, work)
    assert (ledger[-1]["exit_code"], ledger[-1]["action"]) == (143, "released_spares")
    closed = control.decode_fields((work / "nvrx/500/control/closed").read_text())
    assert closed["exit_code"] == "143"


def _signalled_generation(script, env, calls, signalling) -> tuple[int, float]:
    """Run the batch script, call `signalling(proc)` once srun has started, and return the
    script's exit code and how long after the signal it came. Its own process group, so
    what the stand-in srun leaves sleeping is killed after."""
    proc = subprocess.Popen(
        ["bash", str(script)], env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        wait_until(lambda: calls.exists() and "srun" in calls.read_text(), 10, "srun to start")
        signalling(proc)
        sent = time.monotonic()
        return proc.wait(timeout=20), time.monotonic() - sent
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _term_to_the_batch_step(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)  # Slurm signals the batch step's processes


def test_slurms_term_gives_a_saving_workload_two_thirds_of_killwait(tmp_path):
    # The case: a workload that needs a few seconds to save on TERM. Before, the
    # trap ran at once (143) while it saved; now the shell waits for srun's own end.
    script, work, env = _prepare(tmp_path, srun_exit=0)
    env.update(SRUN_SLEEP="60", SRUN_DRAIN="2", SRUN_TERM_EXIT="0", KILL_WAIT="9")
    code, _ = _signalled_generation(script, env, tmp_path / "calls", _term_to_the_batch_step)
    assert code == 0  # srun's own code: it finished within the drain
    _, ledger = _outcome(tmp_path, work)
    assert ledger[-1]["exit_code"] == 0


def test_a_peers_shell_waits_on_slurms_term_for_its_step_to_finish(tmp_path):
    # Ending the shell at once would have Slurm kill the step with it, cutting short a
    # workload that saves on TERM; Slurm's KillWait bounds the wait instead.
    script, _work, env = _prepare(tmp_path, srun_exit=0)
    env.update(SLURM_ARRAY_TASK_ID="1", SRUN_SLEEP="60", SRUN_DRAIN="2", SRUN_TERM_EXIT="0")
    code, after = _signalled_generation(script, env, tmp_path / "calls", _term_to_the_batch_step)
    assert (code, after >= 2) == (0, True)  # srun's own code, after its 2 s


def test_a_term_drain_that_runs_out_leaves_the_teardown_its_third_of_killwait(tmp_path):
    script, work, env = _prepare(tmp_path, srun_exit=0)
    env.update(SRUN_SLEEP="60", SRUN_DRAIN="60", KILL_WAIT="6")  # drain: 4 s
    code, after = _signalled_generation(script, env, tmp_path / "calls", _term_to_the_batch_step)
    assert code == 143 and 3 <= after < 6
    _, ledger = _outcome(tmp_path, work)
    assert (ledger[-1]["exit_code"], ledger[-1]["action"]) == (143, "released_spares")


def test_the_time_limit_signal_writes_the_notice_and_srun_runs_on_to_its_save(tmp_path):
    script, work, env = _prepare(tmp_path, srun_exit=0)
    env["SRUN_SLEEP"] = "3"  # the workload saves and ends on its own after the notice
    notice = work / "nvrx/500/control/time_limit"

    def near_the_limit(proc: subprocess.Popen) -> None:
        proc.send_signal(signal.SIGURG)  # Slurm's --signal=B:URG@margin, to this shell only
        wait_until(notice.exists, 10, "the time-limit notice")

    code, _ = _signalled_generation(script, env, tmp_path / "calls", near_the_limit)
    assert code == 0  # the shell did not take the signal for srun's end
    generation, reason, _time = notice.read_text().splitlines()
    assert generation.startswith("generation=chain-1/500/")
    assert reason == "reason=Slurm: task 0 is near its time limit"
    _, ledger = _outcome(tmp_path, work)
    assert (ledger[-1]["exit_code"], ledger[-1]["action"]) == (0, "saved_at_time_limit")
    assert (work / "chain.active").exists()  # the chain goes on


def test_training_done_cancels_every_queued_generation_and_ends_the_chain(tmp_path):
    script, work, env = _prepare(tmp_path, srun_exit=0)
    (work / "checkpoints").mkdir()
    (work / "checkpoints/latest_checkpointed_iteration.txt").write_text("200\n")
    (work / "checkpoints/training_done.txt").write_text("200\n")
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    calls, ledger = _outcome(tmp_path, work)
    assert done.returncode == 0
    assert "scancel --state=PENDING --name=demo --user=alice" in calls
    assert (ledger[-1]["action"], ledger[-1]["final_iteration"]) == ("completed", 200)
    assert not (work / "chain.active").exists()  # the watcher must not page "exhausted"


def test_exit_93_passes_through_the_trap_untouched_and_cancels_the_chain(tmp_path):
    done, work, calls, ledger = _run_generation(tmp_path, srun_exit=93)
    assert done.returncode == 93
    closed = control.decode_fields((work / "nvrx/500/control/closed").read_text())
    assert closed["exit_code"] == "93"
    assert "scancel --state=PENDING --name=demo --user=alice" in calls
    assert ledger[-1]["action"] == "cancelled_chain" and ledger[-1]["task0_node"] == "node1"
    assert not (work / "chain.active").exists()  # the chain ended on purpose


def test_an_ordinary_failure_releases_spares_and_keeps_the_chain(tmp_path):
    done, work, calls, ledger = _run_generation(tmp_path, srun_exit=1)
    assert done.returncode == 1
    assert "scancel --state=PENDING --user=alice 500" in calls
    assert ledger[-1]["action"] == "released_spares" and ledger[-1]["exit_code"] == 1
    assert (work / "chain.active").exists()


def test_the_chain_is_cancelled_by_its_own_job_ids_not_a_name_another_chain_shares(tmp_path):
    # `submit --force` may have queued another chain under the same name: not ours to end.
    script, work, env = _prepare(tmp_path, srun_exit=93)
    (work / "submitted.json").write_text(json.dumps({"job_ids": ["500", "501", "502"]}))
    subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    calls, ledger = _outcome(tmp_path, work)
    assert ledger[-1]["action"] == "cancelled_chain"
    assert "scancel --state=PENDING --user=alice 500 501 502" in calls
    assert not [call for call in calls if "--name=" in call]


@pytest.mark.parametrize(
    "generation, ends",
    [
        ("chain-1/500/", True),  # ours (the scontrol stand-in gives no submit time)
        ("chain-0/500/2025-06-01T00:00:00", False),  # another run's, under a reused id
        (None, False),  # it names none
    ],
)
def test_a_no_restart_witness_ends_the_chain_only_when_it_names_this_generation(
    tmp_path, generation, ends
):
    # Task 0's entrypoint failed before it set stale files aside (its container did not
    # start): a witness another run left must not end this chain, nor record 93.
    script, work, env = _prepare(tmp_path, srun_exit=1)
    fields = {"generation": generation} if generation else {}
    (_control(work) / "no_restart").write_text(control.encode_fields({**fields, "exit_code": 93}))
    subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    calls, ledger = _outcome(tmp_path, work)
    assert ledger[-1]["action"] == ("cancelled_chain" if ends else "released_spares")
    assert ("scancel --state=PENDING --user=alice 500" in calls) is not ends


@pytest.mark.parametrize(
    "generation, saved",
    [("chain-1/500/", True), ("chain-0/500/2025-06-01T00:00:00", False), (None, False)],
)
def test_a_time_limit_notice_counts_only_when_it_names_this_generation(tmp_path, generation, saved):
    script, work, env = _prepare(tmp_path, srun_exit=0)
    fields = {"generation": generation} if generation else {}
    (_control(work) / "time_limit").write_text(control.encode_fields({**fields, "reason": "x"}))
    subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    _calls, ledger = _outcome(tmp_path, work)
    assert ledger[-1]["action"] == ("saved_at_time_limit" if saved else "released_spares")


def test_the_ledger_entry_is_written_before_node_memory_reads_anything(tmp_path, monkeypatch):
    # Slurm's SIGKILL at KillWait while node memory reads a hung file (a FIFO, a stalled
    # launcher log) must not cost the generation its ledger entry.
    _script, work, env = _prepare(tmp_path, srun_exit=1)
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # the scancel stand-in, never a real Slurm

    def killed(**_kwargs):
        raise KeyboardInterrupt("KillWait")

    monkeypatch.setattr(teardown.node_memory, "remember", killed)
    with pytest.raises(KeyboardInterrupt):
        teardown.main(
            ["--run-json", str(work / "run.json"), "--array-job-id", "500", "--exit-code", "1",
             "--job-name", "demo", "--user", "alice", "--generation", "chain-1/500/"]
        )  # fmt: skip
    _calls, ledger = _outcome(tmp_path, work)
    assert [entry["array_job_id"] for entry in ledger] == ["500"]


def test_the_ledger_entry_carries_the_stragglers_task_0_named_and_what_it_did(tmp_path):
    script, work, env = _prepare(tmp_path, srun_exit=1)
    stragglers = work / "nvrx" / "500" / "stragglers"
    stragglers.mkdir(parents=True)
    named = {"generation": "chain-1/500/", "node": "node2", "cycle": 0, "slowdown": 2.1,
             "lost_s": 24, "action": "reported: --straggler-action report names it and "
             "changes nothing", "words": "node2 is a straggler in cycle 0 of generation 500"}  # fmt: skip
    (stragglers / "named.node2").write_text(json.dumps(named))
    # One another run left under the same array job id, and a decision file: not named.
    (stragglers / "named.node4").write_text(json.dumps({**named, "generation": "chain-0/500/"}))
    (stragglers / "leave.node2").write_text("generation=chain-1/500/\n")
    subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    _calls, ledger = _outcome(tmp_path, work)
    assert ledger[-1]["stragglers"] == [
        {key: named[key] for key in ("node", "cycle", "slowdown", "lost_s", "action", "words")}
    ]
    # ...and a generation without one says nothing of them.
    (tmp_path / "quiet").mkdir()
    _done, _work, _calls, quiet = _run_generation(tmp_path / "quiet", srun_exit=1)
    assert "stragglers" not in quiet[-1]


def test_the_second_burnt_generation_trips_the_burn_guard(tmp_path):
    earlier = {"array_job_id": "499", "exit_code": 1, "checkpoint_iteration": None,
               "checkpoint_iteration_start": None, "chain": "chain-1"}  # fmt: skip
    done, _work, calls, ledger = _run_generation(tmp_path, srun_exit=1, ledger_lines=[earlier])
    assert ledger[-1]["action"] == "burn_guard"
    assert "scancel --state=PENDING --name=demo --user=alice" in calls
    assert "burn guard: 2 consecutive generations" in done.stderr


def test_a_failed_scancel_is_loud_and_recorded(tmp_path):
    done, work, _calls, ledger = _run_generation(tmp_path, srun_exit=93, scancel_exit=1)
    assert done.returncode == 93
    assert "THE CHAIN IS NOT RELEASED" in done.stderr
    assert ledger[-1]["scancel_ok"] is False
    assert (work / "chain.active").exists()  # still expected to live: the watcher must see it


def test_an_array_with_nothing_left_pending_is_not_a_failed_release(tmp_path):
    says = "scancel: error: Kill job error on job id 500: Invalid job id specified"
    done, _work, _calls, ledger = _run_generation(
        tmp_path, srun_exit=143, scancel_exit=1, scancel_says=says
    )
    assert ledger[-1]["scancel_ok"] is True
    assert "NOT RELEASED" not in done.stderr


def test_without_a_usable_python_the_bash_fallback_still_cancels_on_93(tmp_path):
    done, work, calls, ledger = _run_generation(tmp_path, srun_exit=93, python="/nonexistent/py")
    assert done.returncode == 93
    assert "could not run the teardown" in done.stderr
    assert "scancel --state=PENDING --name=demo --user=alice" in calls
    assert (work / "nvrx/500/control/closed").exists() and ledger == []


def test_a_ledger_line_that_is_not_utf8_is_skipped_and_the_burn_guard_still_fires(tmp_path):
    script, work, env = _prepare(tmp_path, srun_exit=1)
    earlier = {"array_job_id": "499", "exit_code": 1, "checkpoint_iteration": None,
               "checkpoint_iteration_start": None, "chain": "chain-1"}  # fmt: skip
    (work / "chain.jsonl").write_bytes(
        b"\xff\xfe torn \x80\n" + json.dumps(earlier).encode() + b"\n"
    )
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    calls = (tmp_path / "calls").read_text().splitlines()
    ledger = ending.parse_ledger((work / "chain.jsonl").read_bytes().decode(errors="replace"))
    assert "skipped 1 unreadable line(s) of the ledger" in done.stderr
    assert ledger[-1]["action"] == "burn_guard" and ledger[-1]["array_job_id"] == "500"
    assert "scancel --state=PENDING --name=demo --user=alice" in calls


def test_a_run_json_others_can_write_does_not_steer_the_teardown(tmp_path):
    script, work, env = _prepare(tmp_path, srun_exit=1)
    run_json = work / "run.json"
    planted = json.loads(run_json.read_text())
    planted["spec"]["burn_guard"] = 1  # one failed generation would cancel the whole chain
    run_json.write_text(json.dumps(planted))
    run_json.chmod(0o666)
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    calls, ledger = _outcome(tmp_path, work)
    assert "ignoring" in done.stderr and "group- or world-writable" in done.stderr
    # Nothing run.json says is believed, its paths neither: no ledger entry, said so, and
    # only this generation's own spares are released.
    assert ledger == [] and "this generation is not recorded" in done.stderr
    assert calls[-1] == "scancel --state=PENDING --user=alice 500"


@pytest.mark.parametrize(
    "spoil, why",
    [
        (lambda path: path.chmod(0o666), "writable by group or others (mode 666)"),
        (lambda path: path.unlink(), "missing or not a regular file"),
        (lambda path: path.parent.chmod(0o777), "writable by group or others (mode 777)"),
    ],
)
@pytest.mark.parametrize(
    "name", ["teardown.py", "ending.py", "hostlib.py", "node_memory.py", "bad_nodes.py"]
)
def test_a_teardown_file_others_could_have_written_is_not_run(tmp_path, spoil, why, name):
    # The planted teardown (or a module it imports) would record a ledger entry; the bash
    # fallback records none.
    script, work, env = _prepare(tmp_path, srun_exit=93)
    spoil(work / name)
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    calls, ledger = _outcome(tmp_path, work)
    assert done.returncode == 93
    assert f"not running the teardown: {work}" in done.stderr and why in done.stderr
    assert "scancel --state=PENDING --name=demo --user=alice" in calls and ledger == []


def _oldest_python() -> str | None:
    """A Python 3.6 (RHEL 8's python3), if this machine has one; its real path."""
    probe = "import sys; assert sys.version_info[:2] == (3, 6); print(sys.executable)"
    for name in ("python3.6", "python36"):
        found = shutil.which(name)
        if found is None:
            continue
        # PYENV_VERSION: where python3.6 is a pyenv shim, select that version.
        env = {**os.environ, "PYENV_VERSION": "3.6"}
        done = subprocess.run([found, "-c", probe], capture_output=True, text=True, env=env)
        if done.returncode == 0:
            return done.stdout.strip()
    return None


@pytest.mark.skipif(_oldest_python() is None, reason="no Python 3.6 on this machine")
def test_the_teardown_runs_on_python_3_6_and_keeps_the_burn_guard(tmp_path):
    earlier = {"array_job_id": "499", "exit_code": 1, "checkpoint_iteration": None,
               "checkpoint_iteration_start": None, "chain": "chain-1"}  # fmt: skip
    done, _work, calls, ledger = _run_generation(
        tmp_path, srun_exit=1, python=_oldest_python(), ledger_lines=[earlier]
    )
    assert "could not run the teardown" not in done.stderr, done.stderr
    assert ledger[-1]["action"] == "burn_guard"
    assert "scancel --state=PENDING --name=demo --user=alice" in calls


def test_every_slurm_call_of_the_batch_script_is_bounded_by_a_timeout():
    text = render.render(
        manifest.build(ChainSpec(work_dir="/shared/w", workload="cpu"), created="c", user="a"),
        template=submit.template_text(),
    )
    bounded = 'timeout "$SLURM_CALL_TIMEOUT" '
    pattern = r"(?:^\s*|\$\()((?:" + re.escape(bounded) + r")?(?:scancel|scontrol|squeue|sacct))\b"
    calls = re.findall(pattern, text, flags=re.MULTILINE)
    assert len(calls) == 4 and all(call.startswith(bounded) for call in calls), calls


# --- a peer's batch script: the closed flag of its own generation, and the fence -----------


def _as_peer(env, job_id="502"):
    return env | {"SLURM_ARRAY_TASK_ID": "2", "SLURM_JOB_ID": job_id}


def _control(work):
    directory = work / "nvrx" / "500" / "control"
    directory.mkdir(parents=True, mode=0o700, exist_ok=True)
    return directory


@pytest.mark.parametrize(
    "generation, leaves", [("chain-1/500/", True), ("chain-0/500/2025-06-01T00:00:00", False)]
)
def test_a_late_spare_leaves_on_its_own_generations_flag_and_not_on_another_runs(
    tmp_path, generation, leaves
):
    script, work, env = _prepare(tmp_path, srun_exit=0)
    flag = {"exit_code": None, "generation": generation, "reason": "fenced by task 1"}
    (_control(work) / "closed").write_text(control.encode_fields(flag))
    done = subprocess.run(["bash", str(script)], env=_as_peer(env), capture_output=True, text=True)
    calls = (tmp_path / "calls").read_text().splitlines()
    started = any(call.startswith("srun ") for call in calls)
    assert (done.returncode, started) == ((71, False) if leaves else (0, True)), done.stdout


def _fence_claim(work, job_id):
    claim = {"generation": "chain-1/500/", "job_id": job_id, "by": "task 1 node 0 (node2)",
             "reason": "task 0's liveness lease is 16.0 s old", "task0_host": "node1",
             "task0_started": "2026-01-01T00:00:01+00:00", "checkpoint_start": 40}  # fmt: skip
    path = _control(work) / "fence"
    path.write_text(json.dumps(claim) + "\n")
    path.chmod(0o600)


def test_the_peer_that_won_the_fence_cancels_task_0_and_the_pending_spares_and_records_it_once(
    tmp_path,
):
    script, work, env = _prepare(tmp_path, srun_exit=71)
    _fence_claim(work, job_id="502")
    (work / "checkpoints").mkdir()
    (work / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("40\n")
    # The winner, and another peer of the same generation that also saw the stale lease.
    for job_id in ("502", "501"):
        done = subprocess.run(
            ["bash", str(script)], env=_as_peer(env, job_id), capture_output=True, text=True
        )
        assert done.returncode == 71  # the entrypoint's own code, untouched
    calls, ledger = _outcome(tmp_path, work)
    scancels = [call for call in calls if call.startswith("scancel")]
    assert scancels == ["scancel --user=alice 500_0", "scancel --state=PENDING --user=alice 500"]
    [entry] = ledger
    assert (entry["action"], entry["array_job_id"], entry["task0_node"]) == (
        "fenced",
        "500",
        "node1",
    )
    assert entry["exit_code"] is None and entry["scancel_ok"] is True
    assert "fenced by task 1" in entry["reason"]
    # It did not train after all: it counts as burnt for the burn guard.
    assert ending.burnt(entry)


def _relay_claim(work, job_id):
    claim = {"generation": "chain-1/500/", "job_id": job_id, "by": "task 2 node 0 (node3)",
             "reason": "the closed flag appeared", "time": "2026-01-01T00:00:09+00:00"}  # fmt: skip
    path = _control(work) / "relay"
    path.write_text(json.dumps(claim) + "\n")
    path.chmod(0o600)


@pytest.mark.parametrize("fenced", [False, True])
def test_the_peer_that_won_the_relay_cancels_every_other_task_but_task_0_once(tmp_path, fenced):
    # Issue 24: the nodes that poll rarely learn of the end from Slurm's TERM. Task 0 is
    # never in the relay: its trap must run, and decide what exit 93 means.
    script, work, env = _prepare(tmp_path, srun_exit=71 if fenced else 76)
    _relay_claim(work, job_id="502")
    if fenced:
        _fence_claim(work, job_id="502")
    for job_id, task in (("502", "2"), ("501", "1")):  # the winner, and another peer
        done = subprocess.run(
            ["bash", str(script)],
            env=_as_peer(env, job_id) | {"SLURM_ARRAY_TASK_ID": task},
            capture_output=True,
            text=True,
        )
        assert done.returncode == (71 if fenced else 76)  # the entrypoint's own code
    calls, _ = _outcome(tmp_path, work)
    scancels = [call for call in calls if call.startswith("scancel")]
    # The default shape is tasks 0-2: task 2 relays to task 1 alone.
    relayed = ["scancel --user=alice 500_[1]"]
    fence = ["scancel --user=alice 500_0", "scancel --state=PENDING --user=alice 500"]
    assert scancels == (fence + relayed if fenced else relayed)


@pytest.mark.parametrize(
    "task, last, expression",
    [(1, 1, ""), (1, 2, "[2]"), (2, 2, "[1]"), (3, 7, "[1-2,4-7]"), (1, 7, "[2-7]")],
)
def test_a_relay_names_every_task_of_the_array_but_task_0_and_itself(task, last, expression):
    assert ending.others(task, last) == expression
    argv = ending.relay_argv(user="u", array_job_id="9", task_id=task, last_task=last)
    assert argv == (["scancel", "--user=u", f"9_{expression}"] if expression else [])


def test_a_relay_spares_the_task_that_fenced_task_0_so_its_script_cancels_task_0s_job():
    # Issue 52: a relay's TERM reached the fencer's batch script while it cancelled task
    # 0's job on a silent node; the successor then waits for Slurm to find the node dead.
    assert ending.others(1, 4, spared=[3]) == "[2,4]"
    assert ending.others(1, 2, spared=[2]) == ""
    argv = ending.relay_argv(user="u", array_job_id="9", task_id=1, last_task=4, spared=[3])
    assert argv == ["scancel", "--user=u", "9_[2,4]"]


def test_the_relay_reads_which_task_fenced_from_its_claim(tmp_path):
    claim = tmp_path / "fence"
    claim.write_text(json.dumps({"generation": "c/500/t", "task_id": 3, "job_id": "503"}))
    claim.chmod(0o600)
    args = argparse.Namespace(fence_claim=str(claim), generation="c/500/t")
    assert teardown.fencer(args) == [3]
    assert teardown.fencer(argparse.Namespace(fence_claim=str(claim), generation="c/499/t")) == []
    assert (
        teardown.fencer(argparse.Namespace(fence_claim=str(tmp_path / "none"), generation="")) == []
    )


def test_a_fenced_generation_whose_task_0_ends_after_all_counts_once_for_the_burn_guard():
    fenced = _entry(None, 5, 5, chain="c1") | {"action": "fenced"}
    own = _entry(143, 5, 5, chain="c1")
    assert ending.chain_history([fenced, own], "c1") == [own]
    assert ending.consecutive_burnt(ending.chain_history([fenced, own], "c1")) == 1


# --- what the batch script and the teardown read: bounded, never blocking -----------------


def _run_bounded(script, env, timeout=30):
    """The generation under bash in a session of its own, killed whole if it outlives
    `timeout` (a read that blocks on a FIFO would otherwise hold the test for ever)."""
    proc = subprocess.Popen(
        ["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        _out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the generation's batch script still ran after {timeout} s")
    return proc.returncode, err


def _tracker(work):
    (work / "checkpoints").mkdir(exist_ok=True)
    return work / "checkpoints" / "latest_checkpointed_iteration.txt"


@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(os.mkfifo, id="fifo"),
        pytest.param(lambda path: path.symlink_to("/dev/zero"), id="dev-zero"),
        pytest.param(lambda path: path.write_text("7" * 5000 + "\n"), id="5000-digits"),
    ],
)
def test_a_tracker_that_is_no_number_still_gets_srun_started_and_a_ledger_entry(tmp_path, plant):
    # A FIFO hung `cat` before srun and the teardown's read; /dev/zero ran it out of
    # memory; 5,000 digits made int() raise on Python 3.11, so the bash fallback ran
    # without ledger or burn guard.
    script, work, env = _prepare(tmp_path, srun_exit=1)
    plant(_tracker(work))
    code, err = _run_bounded(script, env)
    calls, ledger = _outcome(tmp_path, work)
    assert code == 1
    assert any(call.startswith("srun ") for call in calls)
    assert "could not run the teardown" not in err, err
    assert ledger[-1]["action"] == "released_spares"
    assert ledger[-1]["checkpoint_iteration"] is None
    assert ledger[-1]["checkpoint_iteration_start"] is None


def test_a_ledger_of_a_gigabyte_is_read_from_its_end_within_a_small_memory(tmp_path):
    # Read whole, a 1 GiB ledger took 24 s and 4 GB, near KillWait: the burn guard needs
    # only the newest lines. The file is sparse (its head is zeros), so it costs no disk.
    _, work, _ = _prepare(tmp_path, srun_exit=1)
    earlier = {"array_job_id": "499", "exit_code": 1, "checkpoint_iteration": None,
               "checkpoint_iteration_start": None, "chain": "chain-1"}  # fmt: skip
    ledger = work / "chain.jsonl"
    with ledger.open("wb") as fh:
        fh.truncate(1 << 30)
        fh.seek(1 << 30)
        fh.write(b"\n" + json.dumps(earlier).encode() + b"\n")
    budget = 256 << 20  # address space for the whole interpreter, well under the file

    def limit_memory():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (budget, budget))

    args = ["--exit-code", "1", "--run-json", str(work / "run.json"),
            "--array-job-id", "500", "--job-name", "demo", "--user", "alice"]  # fmt: skip
    bin_dir = tmp_path / "bin"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "STANDIN_LOG": str(tmp_path / "calls")}
    done = subprocess.run(
        ["python3", str(work / "teardown.py"), *args], env=env, capture_output=True,
        text=True, timeout=20, preexec_fn=limit_memory,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with ledger.open("rb") as fh:
        fh.seek(1 << 30)
        last = json.loads(fh.read().splitlines()[-1])
    assert (last["array_job_id"], last["action"]) == ("500", "burn_guard")
