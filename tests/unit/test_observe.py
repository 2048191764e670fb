"""The observation layer: the ledger's format as its writer writes it, a work dir read
without hanging or crashing, one set of Slurm states, and Slurm asked once per interval."""

import os
import threading

import pytest

from nvrx_appliance import manifest
from nvrx_appliance.chain import status
from nvrx_appliance.jobhost import ending, teardown
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe import run_files, slurm_output, workdir
from nvrx_appliance.observe.slurmcli import Slurm, SlurmUnavailable
from nvrx_appliance.observe.types import LIVE_STATES, RUNNING_STATES, terminal
from nvrx_appliance.settings.chain import ChainSpec


def test_what_the_teardown_appends_is_what_status_and_the_watcher_read(tmp_path):
    # The teardown stays stdlib-only, so the format is shared by this test, not by import.
    m = manifest.build(ChainSpec(work_dir=str(tmp_path), workload="cpu"), created="c", user="")
    manifest.save(m)
    layout = m.layout
    layout.tracker.parent.mkdir(parents=True)
    layout.tracker.write_text("40\n")
    teardown.main(
        ["--run-json", str(layout.run_json), "--array-job-id", "4242", "--task0-node", "node1", "--start", "2026-11-30T18:00:00Z",
         "--checkpoint-start", "20", "--exit-code", "1"]
    )  # fmt: skip
    [line] = workdir.ledger(layout)
    assert (line["array_job_id"], line["task0_node"], line["exit_code"]) == ("4242", "node1", 1)
    assert (line["checkpoint_iteration_start"], line["checkpoint_iteration"]) == (20, 40)
    [entry] = run_files.ledger_entries(layout.ledger.read_text())
    assert (entry.array_job_id, entry.exit_code, entry.action) == ("4242", 1, ending.NONE)
    assert entry.end is not None and entry.reason


def test_the_ledgers_action_words_the_watcher_reads_are_the_teardowns():
    from nvrx_appliance.observe.types import COMPLETED

    assert ending.COMPLETED == COMPLETED
    assert set(status.ACTION_WORDS) >= {
        ending.RELEASED_SPARES, ending.SAVED_AT_TIME_LIMIT, ending.COMPLETED,
        ending.CANCELLED_CHAIN, ending.BURN_GUARD, ending.FENCED, ending.NONE,
    }  # fmt: skip


def _with_reader_timeout(read):
    """Runs a read in a thread; a read that blocks fails the test instead of hanging it."""
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("value", read()), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "the read blocked"
    return result["value"]


def test_a_fifo_in_place_of_a_work_dir_file_reads_as_absent_and_never_blocks(tmp_path):
    layout = Layout(tmp_path)
    layout.tracker.parent.mkdir(parents=True)
    for path in (layout.ledger, layout.tracker, layout.submitted):
        os.mkfifo(path)
    assert _with_reader_timeout(lambda: workdir.ledger(layout)) == []
    assert _with_reader_timeout(lambda: workdir.checkpoint_iteration(layout)) is None
    assert _with_reader_timeout(lambda: workdir.submitted_ids(layout)) == []


def test_bytes_that_are_not_utf8_spoil_only_their_own_line(tmp_path):
    layout = Layout(tmp_path)
    good = b'{"array_job_id": "7", "exit_code": 0}\n'
    layout.ledger.write_bytes(b'{"array_job_id": "\xff\xfe", "exit_code": 1\n' + good)
    assert [e["array_job_id"] for e in workdir.ledger(layout)] == ["7"]


def test_a_run_json_that_is_not_one_is_refused_with_the_path(tmp_path):
    Layout(tmp_path).run_json.write_bytes(b"\xff{")
    with pytest.raises(workdir.NotFound, match=r"run\.json is not JSON"):
        workdir.load_manifest(tmp_path)


@pytest.mark.parametrize("state", ["STOPPED", "SIGNALING", "SUSPENDED", "CONFIGURING"])
def test_every_reader_counts_a_stopped_or_signaled_task_as_running(state):
    assert state in RUNNING_STATES and state in LIVE_STATES and not terminal(state)
    tasks = slurm_output.squeue_tasks(f"4301|4300|0|demo|alice|{state}|node1|None|/w\n")
    assert status._state({0: tasks[0].state}) == "running"


def test_one_squeue_parser_reads_each_callers_field_list():
    user_jobs = slurm_output.squeue_tasks("4251_3|4251|3|demo|alice|PENDING|(null)|Dependency|/w")
    [chain] = slurm_output.generations(
        slurm_output.squeue_tasks(
            "4251|3|PENDING|alice|2026-11-30T18:19:14|", slurm_output.CHAIN_TASKS
        )
    )
    assert (user_jobs[0].array_job_id, user_jobs[0].task_id, user_jobs[0].reason) == (
        "4251",
        3,
        "Dependency",
    )
    assert chain.array_job_id == "4251" and chain.pending[0].task_id == 3
    assert chain.submitted is not None and user_jobs[0].nodes == ""


class Answers:
    """Stands in for the Slurm commands (not reachable from a unit test): counts asks."""

    def __init__(self, out: str = "", fail: bool = False) -> None:
        self.asked, self.out, self.fail = 0, out, fail

    def __call__(self, argv, timeout):
        self.asked += 1
        if self.fail:
            raise SlurmUnavailable("squeue did not answer within 30s")
        return self.out


def test_callers_sharing_one_slurm_view_cost_one_squeue_per_interval():
    now = [100.0]
    answers = Answers("4252|4250|0|demo|alice|RUNNING|node2|None|/w\n")
    slurm = Slurm(run_command=answers, min_interval_s=5.0, clock=lambda: now[0])
    first = slurm.squeue(user="alice", name="demo")
    now[0] += 4.9
    assert slurm.squeue(user="alice", name="demo") == first  # a second follower, same answer
    assert answers.asked == 1
    now[0] += 0.2
    slurm.squeue(user="alice", name="demo")
    assert answers.asked == 2


def test_a_failed_answer_is_not_kept():
    answers = Answers(fail=True)
    slurm = Slurm(run_command=answers, min_interval_s=60.0, clock=lambda: 0.0)
    for _ in range(2):
        with pytest.raises(SlurmUnavailable):
            slurm.squeue(user="alice")
    assert answers.asked == 2
