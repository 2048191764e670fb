"""The training's own failures on the real cluster: a checkpoint that cannot be loaded
is set aside and the run resumes from the one before (in the successor generation, and
in the next cycle of the same one); a workload's 17 stops the chain at once, naming the
code and the iteration, and blames no node; a 16 resumes from its checkpoint on another
node and trains past it."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from nvrx_appliance.devcluster.poll import wait_until

from .chain_support import (
    cli,
    ledger,
    logs_on_failure,
    processes,
    ran,
    state,
    submit,
    tasks,
    tracker,
    unique,
    wait_idle,
    wait_ledger,
)
from .conftest import Cluster, cluster_cli

pytestmark = pytest.mark.cluster

SCRIPT = Path(__file__).parent / "verdict_script.py"
EXAMPLE = Path(__file__).parents[2] / "examples" / "train_script.py"
GENERATION_S = 240


def _resumed(work: Path, name: str, array_job_id: str) -> list[int]:
    found = []
    for log in sorted((work / "logs").glob(f"{name}_{array_job_id}*")):
        found += [
            int(m)
            for m in re.findall(r"resumed from iteration (\d+)", log.read_text(errors="replace"))
        ]
    return found


def _cycles(work: Path, array_job_id: str) -> list[Path]:
    return sorted(
        (work / "nvrx" / array_job_id / "cycle_infos").glob(f"cycle_info.{array_job_id}.*.[0-9]*")
    )


def _truncate(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size // 2)


def _script_chain(cluster: Cluster, label: str, args_text: str, *flags: str):
    work, name = cluster.workdir(label), unique(label)
    args = work.parent / f"{name}.args"
    args.write_text(args_text)
    generations = submit(
        cluster, work, name, "--workload", "script", "--script", str(SCRIPT),
        "--script-args", str(args), *flags,
    )  # fmt: skip
    return work, name, generations


def test_a_17_stops_the_chain_at_once_naming_the_code_and_iteration_and_blaming_no_node(
    cluster: Cluster,
):
    work, name, (first, second, third) = _script_chain(
        cluster, "verdict17",
        "--iterations 100000\n--step-seconds 0.05\n--save-interval 10\n--verdict-at 30:17\n",
        "--workload-exits", "17=stop-chain", "--train-tasks", "2", "--hot-spares", "0",
        "--cold-spares", "0", "--depth", "3", "--max-restarts", "3",
    )  # fmt: skip
    try:
        [entry] = wait_ledger(work, 1, timeout=GENERATION_S)
        wait_idle(cluster, name, timeout=90)
    finally:
        cli(cluster, "cancel", name)
    assert entry["action"] == "stopped_by_workload", logs_on_failure(work)
    assert (entry["verdict"]["code"], entry["verdict"]["iteration"]) == (17, 30), entry
    assert "exit 17 at iteration 30" in entry["reason"]
    # No cycle after the verdict, no later generation, no node blamed.
    assert len(_cycles(work, first)) == 1, logs_on_failure(work)
    for later in (second, third):
        records = cluster.wait_until(lambda later=later: tasks(cluster, later) or None, 60, later)
        assert all(state(r) == "CANCELLED" and not ran(r) for r in records.values()), records
    record = work / "exclusions.jsonl"
    excluded = [] if not record.exists() else [
        line for line in record.read_text().splitlines() if '"kind": "excluded"' in line
    ]  # fmt: skip
    assert excluded == [], excluded
    assert tracker(work) == 30  # every checkpoint kept
    shown = cli(cluster, "status", name).stdout
    assert "exit 17 at iteration 30" in shown, shown


def test_a_16_resumes_from_its_checkpoint_on_another_node_and_trains_past_it(cluster: Cluster):
    once = cluster.workdir("verdict16-once") / "once"
    once.parent.mkdir(parents=True, exist_ok=True)
    work, name, (first, second) = _script_chain(
        cluster, "verdict16",
        "--iterations 60\n--step-seconds 0.05\n--save-interval 10\n--verdict-at 30:16\n"
        f"--verdict-once {once}\n",
        "--workload-exits", "16=resume-elsewhere", "--train-tasks", "1", "--hot-spares", "0", "--cold-spares", "0", "--depth", "2",
    )  # fmt: skip
    try:
        entries = wait_ledger(work, 2, timeout=2 * GENERATION_S)
        wait_idle(cluster, name, timeout=90)
    finally:
        cli(cluster, "cancel", name)
    elsewhere, done = entries
    assert elsewhere["action"] == "resume_elsewhere", logs_on_failure(work)
    assert elsewhere["verdict"]["code"] == 16 and elsewhere["verdict"]["iteration"] == 30
    ran_on = tasks(cluster, first)[0]["NodeList"]
    assert elsewhere["verdict"]["nodes"] == [ran_on]
    assert tasks(cluster, second)[0]["NodeList"] != ran_on
    assert _resumed(work, name, second) == [30], logs_on_failure(work)
    assert (done["action"], done["final_iteration"]) == ("completed", 60), done


def test_task_0s_node_lost_and_the_two_newest_checkpoints_torn_falls_back_twice_at_the_defaults(
    cluster: Cluster,
):
    """At the defaults (--save-retention 3, --checkpoint-fallbacks 2) a torn save and the
    one before it are both set aside and the chain trains on from the third. Seen with
    --save-retention 2: 55 set aside, 50 torn too, and nothing before 50 left on disk."""
    work, name = cluster.workdir("fallback-twice"), unique("fallback-twice")
    first, second = submit(
        cluster, work, name, "--workload", "cpu", "--mode", "train", "--save-interval", "5",
        "--train-tasks", "1", "--hot-spares", "1", "--cold-spares", "0", "--depth", "2",
    )  # fmt: skip
    victim = ""
    try:
        wait_until(lambda: (tracker(work) or 0) >= 25, GENERATION_S, "five checkpoints", 0.5)
        # The successor waits until the checkpoints are torn, as a storage fault leaves them.
        cluster.slurm("scontrol", "hold", second)
        victim = tasks(cluster, first)[0]["NodeList"]
        assert cluster_cli("kill-node", victim).returncode == 0
        wait_ledger(work, 1, timeout=180)  # a peer fenced the dead task 0
        bad = tracker(work)
        assert bad is not None
        for iteration in (bad, bad - 5):
            shards = sorted((work / "checkpoints" / f"iter_{iteration:07d}").glob("*.distcp"))
            assert shards, logs_on_failure(work)
            _truncate(shards[0])
        cluster.slurm("scontrol", "release", second)
        wait_until(lambda: (tracker(work) or 0) > bad, 2 * GENERATION_S, "training past both", 1)
    finally:
        cli(cluster, "cancel", name)
        if victim:
            assert cluster_cli("revive-node", victim, timeout=180).returncode == 0
        wait_idle(cluster, name, timeout=90)
    record = [
        json.loads(line)
        for line in (work / "checkpoints" / "fallbacks.jsonl").read_text().splitlines()
    ]
    assert [(r["from"], r["to"]) for r in record] == [(bad, bad - 5), (bad - 5, bad - 10)], (
        logs_on_failure(work)
    )
    assert _resumed(work, name, second)[-1] == bad - 10, logs_on_failure(work)
    aside = sorted(p.name for p in (work / "checkpoints").iterdir() if ".unloadable-" in p.name)
    assert [n[: len("iter_0000000")] for n in aside] == [
        f"iter_{bad - 5:07d}", f"iter_{bad:07d}",
    ]  # fmt: skip
    assert all(e["action"] != "stopped_by_workload" for e in ledger(work)), ledger(work)
    assert all(e["action"] != "cancelled_chain" for e in ledger(work)), ledger(work)
    # What the fall-backs cost is lost training: generation 1 kept only the third newest.
    report = cli(cluster, "report", name, "--no-svg").stdout
    assert f"lost in generation {first}, cycle 0: iterations {bad - 9}-" in report, report
    assert f"after the checkpoint at {bad - 10}" in report, report


def test_a_truncated_checkpoint_before_an_in_job_restart_falls_back_in_the_same_generation(
    cluster: Cluster,
):
    work, name, (first,) = _script_chain(
        cluster, "fallback-cycle",
        "--iterations 100000\n--step-seconds 0.5\n--save-interval 10\n",
        "--train-tasks", "1", "--hot-spares", "0", "--cold-spares", "0", "--depth", "1",
        "--workload-exits", "",
    )  # fmt: skip
    try:
        wait_until(lambda: (tracker(work) or 0) >= 20, GENERATION_S, "two checkpoints", 0.2)
        bad = tracker(work)
        assert bad is not None
        _truncate(work / "checkpoints" / f"iter_{bad:07d}.pt")
        # A rank dies: NVRx restarts in place, the restart cannot load the torn one.
        pid = _rank_pid(work)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: (tracker(work) or 0) > bad, GENERATION_S, "training past the bad one", 1)
        resumed = _resumed(work, name, first)
        assert resumed[-1] == bad - 10, logs_on_failure(work)
        assert len(_cycles(work, first)) >= 3  # the kill, the failed load, the resumed one
    finally:
        cli(cluster, "cancel", name)
        wait_idle(cluster, name, timeout=90)
    assert any(
        p.name.startswith(f"iter_{bad:07d}.pt.unloadable-")
        for p in (work / "checkpoints").iterdir()
    )


def _rank_pid(work: Path) -> int:
    """The script's rank 0 of this chain, from /proc (its guard's command line names the
    script further on; only the workload's has it as its program)."""
    found = processes(
        lambda argv: any(a.endswith(b"verdict_script.py") for a in argv[1:3]),
        b"RANK=0",
        f"NVRX_APPLIANCE_WORK_DIR={work}".encode(),
    )
    assert found, "no rank 0 of the script found"
    return found[0]


def test_a_data_error_on_another_rank_at_one_iteration_sets_no_checkpoint_aside(
    cluster: Cluster,
):
    # Seen here before issue 40: rank 1's "EOFError: Ran out of input" (a truncated data
    # shard) at iteration 45 in each cycle set the good checkpoint 40 aside twice (the
    # tracker went 40 -> 30 -> 40 -> 30) and stopped the chain on "checkpoint 40 cannot
    # be loaded". It is the workload's failure: NVRx restarts it until it gives up (93),
    # and the chain's end says what the workload did.
    work, name, _ = _script_chain(
        cluster, "data-error",
        "--iterations 100000\n--step-seconds 0.05\n--save-interval 10\n--data-error-at 45:1\n",
        "--train-tasks", "1", "--hot-spares", "0", "--cold-spares", "0", "--depth", "2",
        "--workload-exits", "",
    )  # fmt: skip
    seen: list[int] = []

    def ended():
        now = tracker(work)
        if now is not None and (not seen or seen[-1] != now):
            seen.append(now)
        return ledger(work) or None

    try:
        [entry] = wait_until(ended, GENERATION_S, "the generation's end", 0.2)
        wait_idle(cluster, name, timeout=90)
    finally:
        cli(cluster, "cancel", name)
    assert seen and seen == sorted(seen) and seen[-1] == 40, seen  # never backwards
    assert not (work / "checkpoints" / "fallbacks.jsonl").exists(), logs_on_failure(work)
    assert not [p for p in (work / "checkpoints").iterdir() if ".unloadable-" in p.name]
    assert entry["action"] == "cancelled_chain", logs_on_failure(work)
    assert "NVRx decided not to restart after the workload failed" in entry["reason"]
    assert "EOFError: Ran out of input" in entry["reason"], entry["reason"]
    shown = cli(cluster, "status", name).stdout
    assert "EOFError: Ran out of input" in shown.splitlines()[0], shown


def test_a_16_that_comes_back_at_the_same_iteration_stops_the_chain_after_the_second_run(
    cluster: Cluster,
):
    # Measured before issue 40: a 16 at iteration 60 each time ran three generations,
    # because the second verdict was written by a rank that printed no iteration.
    work, name, (first, second, third) = _script_chain(
        cluster, "verdict16-again",
        "--iterations 100000\n--step-seconds 0.05\n--save-interval 10\n--verdict-at 30:16\n"
        "--verdict-again\n--verdict-quiet\n",
        "--workload-exits", "16=resume-elsewhere", "--train-tasks", "1", "--hot-spares", "0",
        "--cold-spares", "0", "--depth", "3",
    )  # fmt: skip
    try:
        entries = wait_ledger(work, 2, timeout=2 * GENERATION_S)
        wait_idle(cluster, name, timeout=90)
    finally:
        cli(cluster, "cancel", name)
    elsewhere, stopped = entries[:2]
    assert elsewhere["action"] == "resume_elsewhere", logs_on_failure(work)
    assert stopped["action"] == "stopped_by_workload", logs_on_failure(work)
    assert len(entries) == 2, entries  # no third run
    one, two = (tasks(cluster, g)[0]["NodeList"] for g in (first, second))
    assert one != two
    assert f"ran it on other nodes ({one}; this time on {two})" in stopped["reason"]
    # Where: the iteration a guard named, else the checkpoint both runs ended at.
    assert re.search(r"at (iteration|checkpoint) 30 after", stopped["reason"]), stopped["reason"]
    records = cluster.wait_until(lambda: tasks(cluster, third) or None, 60, third)
    assert all(state(r) == "CANCELLED" and not ran(r) for r in records.values()), records
