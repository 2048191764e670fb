"""The Slurm source, against what squeue, sacct and scontrol printed on the local cluster
for a chain whose generation 18 lost task 0 to a SIGKILL, and for a chain of plain jobs
(no arrays) whose job 1 ended 93 (fixtures/watch/record_slurm.sh). The commands' output
is replayed through the same platform code and parsers."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from nvrx_appliance.observe import slurm_output
from nvrx_appliance.observe.slurm_output import CHAIN_TASKS, ENDINGS, IDENTITY
from nvrx_appliance.observe.times import parse_time
from nvrx_appliance.watch import detectors
from nvrx_appliance.watch.config import Settings, Thresholds
from nvrx_appliance.watch.findings import (
    CRITICAL,
    FOLLOW_UP,
    OBSERVED,
    SLURM,
    UNAVAILABLE,
    Run,
    Snapshot,
    SourceStatus,
)
from nvrx_appliance.watch.platform import SlurmPlatform, SlurmUnavailable
from nvrx_appliance.watch.watcher import PassResult, Watcher

RECORDED = Path(__file__).parent / "fixtures" / "watch" / "slurm"


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


class Replay:
    """Answers each Slurm command with what the cluster printed for it, and counts calls.

    `follow_up_error`: the per-generation `sacct -j A_0` fails with this message, as
    slurmcli reports a sacct that did not answer or failed.
    """

    def __init__(
        self,
        squeue: str = "squeue_task0_killed.txt",
        sacct: str = "sacct_task0_killed.txt",
        follow_up_error: str = "",
    ) -> None:
        self.squeue, self.sacct, self.follow_up_error = squeue, sacct, follow_up_error
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> str:
        self.calls.append(list(argv))
        assert timeout > 0  # every call is bounded
        if argv[0] == "squeue":
            return recorded(self.squeue)
        if argv[0] == "scontrol":
            job = argv[-1]
            if job == "999":
                raise SlurmUnavailable(
                    "scontrol --oneliner failed: " + recorded("scontrol_unknown.txt").strip()
                )
            return recorded("scontrol_task0.txt" if job.endswith("_0") else "scontrol_array.txt")
        if argv[0] == "sacct":
            if slurm_output.sacct_format(IDENTITY) in argv:
                return "" if argv[-1] == "999" else recorded("sacct_describe.txt")
            if "--jobs" in argv and self.follow_up_error:
                raise SlurmUnavailable(self.follow_up_error)
            return recorded(self.sacct)
        if argv[0] == "scancel":
            return ""
        raise AssertionError(f"unexpected command {argv}")


def one_pass(tmp_path: Path, replay: Replay, name: str, at: str, **settings) -> PassResult:
    """One pass of the watcher over the chain `name`, at the recorded time `at`."""
    watcher = Watcher(
        run=Run(job_name=name, owner="root"),
        platform=SlurmPlatform(run=replay),
        thresholds=Thresholds(),
        settings=settings.pop(
            "settings", Settings(state_file=str(tmp_path / "state" / "state.json"))
        ),
        caller="root",
        logger=logging.getLogger("test_watch_slurm"),
        clock=lambda: parse_time(at),
        **settings,
    )
    return watcher.pass_once()


def test_squeue_groups_array_tasks_into_generations():
    running, queued = slurm_output.generations(
        slurm_output.squeue_tasks(recorded("squeue_running.txt"), CHAIN_TASKS)
    )
    assert (running.array_job_id, queued.array_job_id) == ("18", "21")
    assert running.task0.state == "RUNNING" and running.task0.nodes == "node3"
    assert [t.task_id for t in running.pending] == [2, 3]
    assert len(queued.pending) == 4 and queued.task0.state == "PENDING"
    assert running.submitted == parse_time("2026-11-30T18:19:14")


def test_after_a_sigkill_task0_is_gone_from_the_queue_and_spares_were_admitted():
    killed, _ = slurm_output.generations(
        slurm_output.squeue_tasks(recorded("squeue_task0_killed.txt"), CHAIN_TASKS)
    )
    assert killed.task0 is None
    assert sorted(t.task_id for t in killed.running) == [1, 2]
    assert [t.task_id for t in killed.pending] == [3]


def test_sacct_reports_how_task0_ended_and_nothing_for_live_or_folded_tasks():
    [killed] = slurm_output.task0_endings(
        slurm_output.sacct_rows(recorded("sacct_task0_killed.txt"), ENDINGS)
    )
    assert (killed.array_job_id, killed.state, killed.exit_code) == ("18", "FAILED", 0)
    assert killed.end == parse_time("2026-11-30T18:19:20")
    [verdict] = slurm_output.task0_endings(
        slurm_output.sacct_rows(recorded("sacct_no_restart.txt"), ENDINGS)
    )
    assert (verdict.array_job_id, verdict.exit_code) == ("23", 93)


def test_scontrol_still_knows_the_dead_task0():
    [record] = slurm_output.scontrol_records(recorded("scontrol_task0.txt"))
    ending = slurm_output.scontrol_ending(record)
    assert (ending.array_job_id, ending.state, ending.exit_code, ending.source) == (
        "18",
        "FAILED",
        0,
        "scontrol",
    )


def test_a_job_id_resolves_to_its_chain_owner_work_dir_and_script():
    info = SlurmPlatform(run=Replay()).describe("18")
    assert (info.job_name, info.owner, info.source) == ("watch-rec-7357", "root", "scontrol")
    assert info.work_dir == "/shared/work/watch-record"
    assert info.command == "/shared/work/watch-record/gen.sbatch"


def test_an_id_scontrol_has_forgotten_falls_back_to_sacct_and_an_unknown_one_to_none():
    replay = Replay()
    platform = SlurmPlatform(run=replay)
    assert platform.describe("999") is None
    assert [c[0] for c in replay.calls] == ["scontrol", "sacct"]


def test_an_unreachable_controller_is_not_an_unknown_job():
    def unreachable(argv, timeout):
        raise SlurmUnavailable(
            "scontrol --oneliner failed: slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
        )

    with pytest.raises(SlurmUnavailable):
        SlurmPlatform(run=unreachable).describe("18")


def test_one_pass_costs_one_squeue_and_one_sacct_for_the_whole_chain():
    replay = Replay(squeue="squeue_running.txt")
    platform = SlurmPlatform(run=replay)
    platform.generations("watch-rec-7357", "root")
    platform.endings("watch-rec-7357", "root", 3600)
    assert [c[0] for c in replay.calls] == ["squeue", "sacct"]
    squeue = replay.calls[0]
    assert squeue[squeue.index("--name") + 1] == "watch-rec-7357"
    assert (
        squeue[squeue.index("--user") + 1] == "root"
    )  # another user's same-named job is not the chain


def test_the_recorded_sigkill_state_is_an_orphaned_and_stranded_generation_after_the_grace():
    platform = SlurmPlatform(run=Replay())
    generations = platform.generations("watch-rec-7357", "root")
    endings = platform.endings("watch-rec-7357", "root", 3600)
    ended_at = endings[0].end
    run = Run(job_name="watch-rec-7357", owner="root")
    snap = Snapshot(
        run=run,
        observed_at=ended_at + Thresholds().grace - 1,
        caller="root",
        sources={SLURM: SourceStatus(OBSERVED)},
        generations=generations,
        endings=endings,
    )
    assert detectors.run(snap, Thresholds()) == []  # the trap might still be running
    found = {
        f.detector: f
        for f in detectors.run(
            replace(snap, observed_at=ended_at + Thresholds().grace), Thresholds()
        )
    }
    assert set(found) == {"orphaned_generation", "stranded_generation"}
    assert (
        found["orphaned_generation"].action.command
        == "scancel --state=PENDING --user=root --name=watch-rec-7357 18"
    )
    assert "on node3,node4" in found["stranded_generation"].summary


def test_task0_missing_from_the_windowed_sacct_is_asked_for_by_id_then_scontrol():
    replay = Replay(sacct="sacct_no_restart.txt")  # knows nothing of generation 18
    endings = SlurmPlatform(run=replay).task0_endings(["18"])
    assert [(e.array_job_id, e.source) for e in endings] == [("18", "scontrol")]
    assert [c[0] for c in replay.calls] == ["sacct", "scontrol"]


# --- a chain of plain jobs (no arrays) ----------------------------------------------------

PLAIN = "watch-rec-10163-plain"  # job 1 ended 93; 2 (queued before that) runs, 3 waits
PLAIN_ENDED = "2026-12-01T01:55:23"


def test_each_plain_job_is_a_generation_that_is_its_own_task0():
    running, waiting = slurm_output.generations(
        slurm_output.squeue_tasks(recorded("singleton/squeue.txt"), CHAIN_TASKS)
    )
    assert (running.array_job_id, running.task0.state, running.task0.nodes) == (
        "2",
        "RUNNING",
        "node1",
    )
    assert (waiting.array_job_id, waiting.task0.state) == ("3", "PENDING")
    assert waiting.pending == (waiting.task0,) and running.alive
    [verdict] = slurm_output.task0_endings(
        slurm_output.sacct_rows(recorded("singleton/sacct.txt"), ENDINGS)
    )
    assert (verdict.array_job_id, verdict.state, verdict.exit_code) == ("1", "FAILED", 93)
    assert verdict.end == parse_time(PLAIN_ENDED)


def test_a_chain_of_plain_jobs_that_ended_93_with_successors_queued_is_reported(tmp_path):
    replay = Replay(squeue="singleton/squeue.txt", sacct="singleton/sacct.txt")
    result = one_pass(tmp_path, replay, PLAIN, "2026-12-01T01:56:23")
    [finding] = result.findings
    assert (finding.detector, finding.severity) == ("chain_not_cancelled", CRITICAL)
    assert "generation 1 of watch-rec-10163-plain ended 93" in finding.summary
    assert "generation(s) 2, 3 are still queued" in finding.summary
    assert result.exit_code == 2
    # Every job is its own task 0, in the queue or in the windowed sacct: nothing to
    # ask about a task '<id>_0' that cannot exist.
    assert [c[0] for c in replay.calls] == ["squeue", "sacct"]


# --- a follow-up query that fails -----------------------------------------------------------

SACCT_TIMED_OUT = "sacct did not answer within 30s"  # slurmcli's words for a hung slurmdbd


def test_a_failed_follow_up_keeps_what_squeue_and_sacct_showed_and_pages_the_blindness(
    tmp_path,
):
    # Generation 23 ended 93 (the windowed sacct); 18 lost task 0 and 21 is queued
    # (squeue). Asking sacct how 18's task 0 ended fails: the 93 is still sound.
    replay = Replay(sacct="sacct_no_restart.txt", follow_up_error=SACCT_TIMED_OUT)
    result = one_pass(tmp_path, replay, "watch-rec-7357", "2026-11-30T18:20:21")
    found = {f.detector: f for f in result.findings}
    assert set(found) == {"chain_not_cancelled", "source_unavailable"}
    assert found["chain_not_cancelled"].severity == CRITICAL
    assert "generation(s) 18, 21 are still queued" in found["chain_not_cancelled"].summary
    assert SACCT_TIMED_OUT in found["source_unavailable"].summary
    assert result.snapshot.sources[SLURM].state == OBSERVED
    assert result.snapshot.sources[FOLLOW_UP].state == UNAVAILABLE
    assert result.exit_code == 2 and result.degraded and not result.heartbeat_sent


# --- what sacct says of a job scontrol has forgotten ------------------------------------------


def test_sacct_names_the_script_a_plain_job_was_submitted_with():
    [line] = recorded("singleton/sacct_describe.txt").splitlines()
    [row] = slurm_output.sacct_rows(line, IDENTITY)
    assert (row.name, row.user, row.work_dir) == (PLAIN, "root", "/shared/work/watch-record")
    # Submitted from its work dir as `sbatch ... plain.sbatch`; scontrol said the same file.
    script = slurm_output.submitted_script(row.submit_line, row.work_dir)
    assert script == "/shared/work/watch-record/plain.sbatch"
    [record] = slurm_output.scontrol_records(recorded("singleton/scontrol_P.txt"))
    assert record["Command"] == "/shared/work/watch-record/plain.sbatch"


@pytest.mark.parametrize(
    ("submit_line", "script"),
    [
        ("sbatch -J llm -N 4 --time 1:00:00 --hold cell.sbatch --steps 10", "/w/cell.sbatch"),
        ("/usr/bin/sbatch -Hv --export=ALL,X=1 /abs/cell.sbatch", "/abs/cell.sbatch"),
        ("sbatch --exclusive --no-requeue -o out.log ../cells/c.sh", "/cells/c.sh"),
        ("sbatch --chdir /elsewhere cell.sbatch", ""),  # relative to an unknown submit dir
        ("sbatch -D /elsewhere /abs/cell.sbatch", "/abs/cell.sbatch"),
        ("sbatch --wrap=hostname", ""),
        ("salloc -N 1", ""),
        ("", ""),
    ],
)
def test_the_script_in_a_submit_line_skips_sbatch_options_and_their_values(submit_line, script):
    assert slurm_output.submitted_script(submit_line, "/w") == script


@pytest.mark.parametrize("dry_run", [False, True])
def test_dry_run_runs_no_action_even_with_act_and_logs_the_command(tmp_path, caplog, dry_run):
    replay = Replay(sacct="sacct_no_restart.txt")  # task 0 of 18 SIGKILLed, spares left
    settings = Settings(state_file=str(tmp_path / "state.json"), act=True, dry_run=dry_run)
    caplog.set_level(logging.INFO, logger="test_watch_slurm")
    result = one_pass(tmp_path, replay, "watch-rec-7357", "2026-11-30T18:25:00", settings=settings)
    ran = [c for c in replay.calls if c[0] == "scancel"]
    release = "scancel --state=PENDING --user=root --name=watch-rec-7357 18"
    if dry_run:
        assert ran == [] and result.acted == []
        assert f"dry run (not run): {release}" in caplog.text
        assert not (tmp_path / "state.json").exists()  # a dry run writes nothing
    else:  # the same pass with --act alone does run it
        assert release.split() in ran
