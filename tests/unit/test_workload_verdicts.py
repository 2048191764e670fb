"""The training's own verdicts: what a worker's exit means (pure), the exit table as a
setting, and the workload guard with real processes (a verdict holds the worker's place,
a failed load falls back to the checkpoint before)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.checkpoints import fallback, tracked_record
from nvrx_appliance.checkpoints.checkpoint_dir import iteration_dir, tracker_text
from nvrx_appliance.layout import Layout
from nvrx_appliance.rank import workload_exit
from nvrx_appliance.settings import exit_actions
from nvrx_appliance.settings.chain import ChainSpec, check

# Lines as the pinned Megatron prints them (megatron/training/checkpointing.py and
# megatron/core/rerun_state_machine.py at 5d4cf1d), with a real torch read error.
MEGATRON_LOAD_FAILED = [
    " loading distributed checkpoint from /lustre/run/checkpoints at iteration 35",
    "Traceback (most recent call last):",
    '  File "/workspace/megatron-lm/megatron/training/checkpointing.py", line 1716, in load',
    "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory",
]
MEGATRON_LOADED = [
    " loading distributed checkpoint from /lustre/run/checkpoints at iteration 35",
    "  successfully loaded checkpoint from /lustre/run/checkpoints [ t 1/1, gtp_remat 1/1, p 1/1 ] at iteration 35",
    " iteration       36/     100 | consumed samples:          288 | elapsed time per iteration",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
]
MEGATRON_17 = [
    " iteration       59/     100 | consumed samples:          472 | lm loss: 2.1E+00 |",
    "Unexpected result nan on rank 0 at iteration #60 invocation #1 (message='loss is NaN')",
    "Rank 0, node gpu7, device 0, iteration #60: First rerun: unexpected result is not "
    "reproducible within the tolerance (nan != nan)!",
    "Exiting now. A checkpoint at the last iteration is being saved if further "
    "examination is needed",
]
MEGATRON_LEGACY = [
    " loading checkpoint from /lustre/run/checkpoints at iteration 20",
    "could not load the checkpoint",
    "invalid load key, '\\x00'.",
]


def test_megatrons_17_stops_the_chain_and_names_the_iteration_and_its_line():
    seen = workload_exit.judge(17, {"17": "stop-chain"}, "megatron", MEGATRON_17)
    assert seen is not None and seen.action == exit_actions.STOP_CHAIN
    assert seen.iteration == 60
    assert seen.line.startswith("Exiting now.")
    assert "result validation failed" in seen.meaning
    assert workload_exit.describe(seen).startswith("exit 17 at iteration 60: Megatron's")


def test_a_failed_load_is_recognised_only_on_evidence():
    failed = workload_exit.judge(1, {}, "megatron", MEGATRON_LOAD_FAILED)
    assert failed is not None and failed.load_failure is not None
    assert failed.load_failure.iteration == 35
    assert "PytorchStreamReader" in failed.load_failure.line
    # Loaded, then a crash: an ordinary failure, never a reason to set a checkpoint aside.
    crashed = workload_exit.judge(1, {}, "megatron", MEGATRON_LOADED)
    assert crashed is not None and crashed.load_failure is None
    assert crashed.action == exit_actions.RESTART and crashed.iteration == 36
    # A worker that died before saying anything about a checkpoint: not a load failure.
    assert workload_exit.judge(1, {}, "megatron", ["Killed"]).load_failure is None  # type: ignore[union-attr]


def test_megatrons_legacy_load_failure_exits_0_and_is_still_a_load_failure():
    seen = workload_exit.judge(0, {}, "megatron", MEGATRON_LEGACY)
    assert seen is not None and seen.load_failure is not None
    assert seen.load_failure.iteration == 20


def test_a_script_says_it_could_not_load_through_the_contract_line():
    line = f"{workload_exit.LOAD_FAILED_MARK} iteration=40"
    seen = workload_exit.judge(1, {}, "script", ["hello", line])
    assert seen is not None and seen.load_failure == workload_exit.LoadFailure(40, line)


def test_a_clean_exit_is_no_failure():
    assert workload_exit.judge(0, {}, "cpu", ["iteration 10/10 | loss 1.0"]) is None


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ("17=stop", "the action must be one of"),
        ("93=stop-chain", "NVRx's 'do not restart'"),
        ("seventeen=stop-chain", "is not CODE=ACTION"),
        ("17=stop-chain,17=restart", "listed twice"),
        ("0=stop-chain", "is not 1-255"),
    ],
)
def test_a_bad_exit_table_is_refused_naming_the_option(given, problem):
    found = check(
        ChainSpec(work_dir="/shared/w", workload="script", script="/x.py", workload_exits=given)
    )
    assert [p.option for p in found] == ["--workload-exits"], found
    assert problem in found[0].message and "e.g. --workload-exits" in found[0].message


def test_each_workload_has_its_table_and_a_script_chooses_its_own():
    assert exit_actions.resolve(None, "megatron") == {16: "resume-elsewhere", 17: "stop-chain"}
    assert exit_actions.resolve(None, "script") == {}
    assert exit_actions.resolve("3=stop-chain", "script") == {3: "stop-chain"}
    assert exit_actions.resolve("", "megatron") == {}


# --- the fall-back ------------------------------------------------------------------------


def _checkpoints(root: Path, iterations, tracked, *, torn=()) -> Path:
    """Checkpoints the tracker named in turn (the tracked record says so), and `torn`
    ones it never named."""
    ckpt = root / "checkpoints"
    for i in (*iterations, *torn):
        (ckpt / iteration_dir(i)).mkdir(parents=True)
        (ckpt / iteration_dir(i) / "shard").write_text("x")
    for i in iterations:
        tracked_record.append(ckpt / tracked_record.FILE, tracked_record.TRACKED, i)
    (ckpt / "latest_checkpointed_iteration.txt").write_text(tracker_text(tracked))
    return ckpt


def test_an_unloadable_checkpoint_is_set_aside_and_the_tracker_points_at_the_one_before(tmp_path):
    ckpt = _checkpoints(tmp_path, (25, 30, 35), 35)
    record = ckpt / "fallbacks.jsonl"
    done = fallback.set_aside(ckpt, record, 35, chain="c1", limit=2, floor=None,
                              who={"node": "node1"}, reason="torn")  # fmt: skip
    assert done.fell_back_to == 30
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "30\n"
    aside = [p.name for p in ckpt.iterdir() if p.name.startswith("iter_0000035.unloadable-")]
    assert len(aside) == 1 and (ckpt / aside[0] / "shard").read_text() == "x"  # kept, not deleted
    assert json.loads(record.read_text())["from"] == 35
    # Another rank that failed on the same checkpoint finds it done: no second fall-back.
    again = fallback.set_aside(ckpt, record, 35, chain="c1", limit=2, floor=None,
                               who={}, reason="torn")  # fmt: skip
    assert again.fell_back_to == 30 and len(record.read_text().splitlines()) == 1


def test_the_fall_back_is_bounded_per_chain_and_never_goes_below_the_chains_start(tmp_path):
    ckpt = _checkpoints(tmp_path, (20, 25, 30, 35), 35)
    record = ckpt / "fallbacks.jsonl"
    args = {"chain": "c1", "limit": 1, "who": {}, "reason": "torn"}
    assert fallback.set_aside(ckpt, record, 35, floor=None, **args).fell_back_to == 30
    refused = fallback.set_aside(ckpt, record, 30, floor=None, **args)
    assert refused.fell_back_to is None and "--checkpoint-fallbacks 1" in refused.message
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "30\n"  # untouched
    floor = fallback.set_aside(ckpt, record, 30, floor=30, **{**args, "limit": 5})
    assert floor.fell_back_to is None and "the chain started from 30" in floor.message
    assert (ckpt / iteration_dir(30)).is_dir()


# --- the guard, with real processes ---------------------------------------------------------


def _manifest(tmp_path: Path, **spec) -> Path:
    built = run_manifest.build(
        ChainSpec(work_dir=str(tmp_path), workload="cpu", **spec),
        created="2026-12-03T00:00:00Z", user="alice",
    )  # fmt: skip
    return run_manifest.save(built)


GENERATION = "2026-12-03T00:00:00Z/42/"


def _guard(tmp_path: Path, workload: str, *, cycle: int = 0, rank: int = 0) -> subprocess.Popen:
    control = Layout(tmp_path).control(42)
    control.mkdir(parents=True, exist_ok=True)
    script = tmp_path / f"workload{cycle}.py"
    script.write_text(textwrap.dedent(workload))
    env = {**os.environ, "NVRX_RUN_MANIFEST": str(_manifest(tmp_path)),
           "TORCHELASTIC_RESTART_COUNT": str(cycle), "RANK": str(rank)}  # fmt: skip
    argv = [sys.executable, "-m", "nvrx_appliance.rank.guard", "--control", str(control),
            "--exits", str(Layout(tmp_path).exit_records(42)), "--generation", GENERATION,
            "--", sys.executable, str(script)]  # fmt: skip
    # Its own process group, as torch elastic starts a worker.
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip


def _wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_a_verdict_is_written_and_the_worker_holds_until_ft_launcher_stops_it(tmp_path):
    proc = _guard(tmp_path, """
        import sys
        print(" iteration       60/     100 | lm loss: nan |", flush=True)
        sys.exit(17)
        """)  # fmt: skip
    verdict = Layout(tmp_path).control_files(42).verdict
    _wait_for(verdict)
    written = json.loads(verdict.read_text())
    assert (written["code"], written["action"], written["iteration"]) == (17, "stop-chain", 60)
    assert written["generation"] == GENERATION
    # ft_launcher sees no failure: the worker holds its place...
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=1)
    # ...until torch elastic's TERM to its group; then it exits as the workload did.
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 17
    out, _err = proc.communicate()
    assert "iteration       60/" in out  # the workload's output passes through unchanged
    exits = list(Layout(tmp_path).exit_records(42).glob("cycle0.*.json"))
    assert len(exits) == 1 and json.loads(exits[0].read_text())["code"] == 17
    # Its iteration, for the teardown, whichever worker wrote the verdict file.
    named = Layout(tmp_path).exit_records(42) / "verdict_iteration.json"
    assert json.loads(named.read_text())["iteration"] == 60


def test_an_ordinary_failure_passes_through_and_is_recorded(tmp_path):
    proc = _guard(tmp_path, "import sys; print('boom', file=sys.stderr); sys.exit(3)", cycle=2)
    assert proc.wait(timeout=60) == 3
    _out, err = proc.communicate()
    assert "boom" in err
    assert not Layout(tmp_path).control_files(42).verdict.exists()
    [account] = Layout(tmp_path).exit_records(42).glob("cycle2.*.json")
    assert json.loads(account.read_text())["action"] == "restart"


def test_a_failed_load_falls_back_and_the_worker_exits_for_an_in_place_restart(tmp_path):
    ckpt = _checkpoints(tmp_path, (10, 15), 15)
    proc = _guard(tmp_path, f"""
        import sys
        print("{workload_exit.LOAD_FAILED_MARK} iteration=15", file=sys.stderr, flush=True)
        sys.exit(1)
        """)  # fmt: skip
    assert proc.wait(timeout=60) == 1
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "10\n"
    assert any(p.name.startswith("iter_0000015.unloadable-") for p in ckpt.iterdir())
    assert not Layout(tmp_path).control_files(42).verdict.exists()
    assert "resuming from checkpoint 10" in proc.communicate()[1]


def test_the_report_counts_what_a_fall_back_cost_as_lost_training():
    from nvrx_appliance.goodput.gather import set_aside
    from nvrx_appliance.observe.training_log import CycleWork, Save

    before = CycleWork("7", 0, "progress log", saves=[Save(30, 100.0, 101.0, 101.0),
                                                      Save(35, 200.0, 201.0, 201.0)])  # fmt: skip
    after = CycleWork("7", 1, "progress log", saves=[Save(35, 900.0, 901.0, 901.0)])
    work = {("7", 0): before, ("7", 1): after}
    set_aside(work, [{"from": 35, "to": 30, "time": "1970-01-01T00:05:00Z"}])
    # The torn save at 35 was never kept: iterations 31-35 of cycle 0 are lost training;
    # the save of 35 made after the fall-back stands.
    assert [s.iteration for s in before.saves] == [30]
    assert before.steps == [(201.0, 35)]  # trained, and lost
    assert [s.iteration for s in after.saves] == [35]


def test_submit_warns_when_one_kept_checkpoint_leaves_nothing_to_fall_back_to(
    tmp_path, monkeypatch
):
    from click.testing import CliRunner

    from nvrx_appliance.cli.main import cli

    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none"))
    args = ["--work-dir", "/shared/verdicts/run", "--workload", "cpu", "--dry-run"]
    shown = CliRunner().invoke(cli, ["submit", *args, "--save-retention", "1"])
    assert shown.exit_code == 0, shown.output
    assert "--save-retention 1 keeps the tracked checkpoint and 0 before it" in shown.output
    default = CliRunner().invoke(cli, ["submit", *args])
    assert "--save-retention" not in default.stderr


def test_the_defaults_keep_a_checkpoint_for_each_fall_back_they_promise(tmp_path, monkeypatch):
    """At the defaults a torn save and the one before it can both be set aside: the keeper
    keeps the tracked checkpoint and one before it for each fall-back. Seen on the cluster
    with --save-retention 2: 55 set aside, 50 torn too, and 45 already removed."""
    from click.testing import CliRunner

    from nvrx_appliance.checkpoints.checkpoint_dir import retired
    from nvrx_appliance.cli.main import cli
    from nvrx_appliance.settings.chain import ChainSpec

    spec = ChainSpec()
    assert spec.save_retention == spec.checkpoint_fallbacks + 1 == 3
    saved = [5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55]
    kept = sorted(set(saved) - set(retired(saved, 55, spec.save_retention, set(saved))))
    assert kept == [45, 50, 55]  # 55 and 50 torn: the second fall-back reaches 45

    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none"))
    args = ["submit", "--work-dir", "/shared/verdicts/run", "--workload", "cpu", "--dry-run"]
    two = CliRunner().invoke(cli, [*args, "--save-retention", "2"])
    assert two.exit_code == 0, two.output
    assert (
        "--save-retention 2 keeps the tracked checkpoint and 1 before it, but "
        "--checkpoint-fallbacks 2 needs 2 before it: fall-back 2 would find none on disk and "
        "stop the chain; keep 3 or more (0 keeps all), or set --checkpoint-fallbacks 1"
    ) in two.stderr
    agreed = CliRunner().invoke(
        cli, [*args, "--save-retention", "2", "--checkpoint-fallbacks", "1"]
    )
    assert "--save-retention" not in agreed.stderr


def test_a_second_rank_that_failed_on_the_same_checkpoint_sets_nothing_more_aside(tmp_path):
    # Seen on the cluster: every rank fails to load the torn checkpoint 20; rank 0's guard
    # fell back to 15 first, and rank 1's, whose contract line was pushed out of its tail
    # by a long traceback, set 15 aside too. The line is kept whatever follows it.
    ckpt = _checkpoints(tmp_path, (10, 15), 15)  # rank 0 already fell back from 20
    proc = _guard(tmp_path, f"""
        import sys
        print("{workload_exit.LOAD_FAILED_MARK} iteration=20", file=sys.stderr, flush=True)
        for n in range(500):
            print(f"  File 'dcp.py', line {{n}}, in read_data", file=sys.stderr)
        print("RuntimeError: PytorchStreamReader failed reading zip archive", file=sys.stderr)
        sys.exit(1)
        """)  # fmt: skip
    assert proc.wait(timeout=60) == 1
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "15\n"
    assert (ckpt / iteration_dir(15)).is_dir()
    assert "the tracker already names iteration 15" in proc.communicate()[1]


def test_the_quoted_line_is_the_workloads_own_not_a_librarys_notice():
    # Seen on the cluster: a script's own last line on stdout, then torch's c10d warning on
    # stderr; the ledger quoted the warning.
    said = [
        "rank 0: the verdict at iteration 30: exit 17",
        "[W1203 09:48:46.704667130 socket.cpp:207] [c10d] The hostname of the client "
        "socket cannot be retrieved. err=-3",
    ]
    seen = workload_exit.judge(17, {"17": "stop-chain"}, "script", said)
    assert seen is not None and seen.line == "rank 0: the verdict at iteration 30: exit 17"
    crashed = workload_exit.judge(
        1,
        {},
        "script",
        ["Traceback (most recent call last):", "ValueError: bad batch", "cleanup done"],
    )
    assert crashed is not None and crashed.line == "ValueError: bad batch"


def test_a_data_error_on_another_rank_passes_through_and_sets_nothing_aside(tmp_path):
    # Reproduced with the guard (issue 40): rank 7's data loader raised "EOFError: Ran
    # out of input" in three cycles; the guard set 200 aside, then 100, then stopped the
    # chain. Rank 0 decides about loads; this is the workload's failure.
    ckpt = _checkpoints(tmp_path, (100, 200), 200)
    proc = _guard(tmp_path, """
        import pickle, sys
        pickle.loads(b"")  # a truncated data shard: EOFError: Ran out of input
        """, rank=7)  # fmt: skip
    assert proc.wait(timeout=60) == 1
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "200\n"
    assert not (ckpt / "fallbacks.jsonl").exists()
    [account] = Layout(tmp_path).exit_records(42).glob("cycle0.*.json")
    written = json.loads(account.read_text())
    assert (written["action"], written["load_failed"]) == ("restart", False)
    assert written["line"] == "EOFError: Ran out of input"


def test_rank_0s_read_error_inside_its_loading_window_falls_back_across_its_two_streams(tmp_path):
    # The loading line on stdout, the read error on stderr: judged in arrival order.
    ckpt = _checkpoints(tmp_path, (10, 15), 15)
    proc = _guard(tmp_path, """
        import sys, time
        print(" loading distributed checkpoint from /w/checkpoints at iteration 15", flush=True)
        time.sleep(1.0)  # the read itself: a torn shard fails a while after the line
        print("RuntimeError: PytorchStreamReader failed reading zip archive: failed "
              "finding central directory", file=sys.stderr, flush=True)
        sys.exit(1)
        """)  # fmt: skip
    assert proc.wait(timeout=60) == 1
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "10\n"
