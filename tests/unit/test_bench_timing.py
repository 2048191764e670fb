"""The benchmarks read their moments out of Slurm's, NVRx's and the trainer's records."""

from __future__ import annotations

import json

import pytest

from bench import timing
from nvrx_appliance.observe.slurm_output import sacct_rows

CTLD_LOG = """\
[2026-11-30T18:28:35.989] _slurm_rpc_submit_batch_job: JobId=1 InitPrio=4294901759 usec=520
[2026-11-30T18:28:36.926] sched/backfill: _start_job: Started JobId=1_0(4) in main on node1
[2026-11-30T18:28:36.927] sched/backfill: _start_job: Started JobId=1_1(5) in main on node2
[2026-11-30T18:28:40.041] _job_complete: JobId=1_0(4) WTERMSIG 9
[2026-11-30T18:28:40.042] _job_complete: JobId=1_0(4) done
[2026-11-30T18:28:44.641] _slurm_rpc_kill_job: REQUEST_KILL_JOB JobId=2_[0-4%2] uid 0
[2026-11-30T18:28:44.646] _slurm_rpc_kill_job: REQUEST_KILL_JOB JobId=1_1 uid 0
[2026-11-30T18:28:44.774] sched: Allocate JobId=8_0(10) NodeList=node2 #CPUs=1 Partition=main
[2026-11-30T18:28:58.111] Killing JobId=8_0(10) on failed node node2
[2026-11-30T18:28:58.111] error: Nodes node2 not responding, setting DOWN
a line without a stamp JobId=9_0(11) done
"""

# sacct --parsable2, slurm_output.CHAIN_ACCOUNTING
SACCT = """\
1_0|4|c|root|NODE_FAIL|0:0|node1|2026-11-30T18:28:36|2026-11-30T18:28:40|/w
1_1|5|c|root|FAILED|71:0|node2|2026-11-30T18:28:36|2026-11-30T18:28:41|/w
1_[2-3%2]|1|c|root|CANCELLED by 0|0:0|None assigned|2026-11-30T18:28:44|2026-11-30T18:28:44|/w
"""


def at(text: str) -> float:
    return timing.local_epoch(text)


def test_slurmctld_log_gives_task_starts_ends_and_cancels_to_the_millisecond():
    events = timing.ctld_events(CTLD_LOG)
    assert [(e.kind, e.array_job_id, e.task_id) for e in events] == [
        ("start", "1", 0),
        ("start", "1", 1),
        ("end", "1", 0),
        ("kill", "2", None),  # a pending range: the whole array
        ("kill", "1", 1),
        ("start", "8", 0),
        ("end", "8", 0),  # NODE_FAIL: slurmctld gave up on the node
    ]
    assert events[2].time - events[0].time == pytest.approx(3.116)


def test_slurmd_log_gives_when_a_jobs_srun_and_batch_script_ended():
    text = (
        "[2026-11-30T18:41:15.323] Launching batch job 38 for UID 0\n"
        "[2026-11-30T18:41:16.492] [38.0] done with job\n"
        "[2026-11-30T18:41:19.497] [38.batch] done with job\n"
    )
    ends = timing.step_ends(text)
    assert [(e.raw_id, e.step) for e in ends] == [("38", "0"), ("38", "batch")]
    assert timing.step_end(ends, "38", "batch") - timing.step_end(ends, "38") == pytest.approx(
        3.005
    )
    assert timing.step_end(ends, "39") is None


def test_nvrx_profiling_events_name_the_host_and_the_cycle_entered():
    text = (
        "2026-11-30 19:14:31,779 [INFO] [node1] [workload:?(?) infra:0(0)] profiling.py:93   "
        "- Cycle: 2 Event: failure_detected Node: node1_16270_0 Rank: 0 "
        "Time: 2026-11-30 19:14:31.779 UTC\n"
        "2026-11-30 19:14:32,101 [INFO] [node2] [workload:?(?) infra:1(0)] profiling.py:93   "
        "- Cycle: 2 Event: rendezvous_started Node: node2_16272_0 Rank: None "
        "Time: 2026-11-30 19:14:32.101 UTC\n"
        "2026-11-30 19:14:31,780 [INFO] [node1] launcher.py:636 Worker group UNHEALTHY\n"
    )
    events = timing.nvrx_events(text)
    assert [(e.cycle, e.event, e.host) for e in events] == [
        (2, "failure_detected", "node1"),
        (2, "rendezvous_started", "node2"),
    ]
    assert events[0].time == timing.utc_epoch("2026-11-30T19:14:31.779Z")
    assert timing.nvrx_event(events, "rendezvous_started", 2, "node2") == events[1].time
    assert timing.nvrx_event(events, "rendezvous_started", 2, "node1") is None


def test_a_task_takes_the_logs_millisecond_stamp_and_falls_back_to_sacct():
    tasks = timing.tasks(sacct_rows(SACCT), timing.ctld_events(CTLD_LOG))
    zero, one = tasks[0], tasks[1]
    assert (zero.start, zero.start_from) == (at("2026-11-30T18:28:36.926"), "slurmctld")
    assert (zero.end, zero.end_from) == (at("2026-11-30T18:28:40.042"), "slurmctld")
    # task 1's end is not in the log: sacct's whole second
    assert (one.end, one.end_from) == (at("2026-11-30T18:28:41"), "sacct")
    assert one.exit_code == 71
    assert (zero.raw_id, one.raw_id) == ("4", "5")  # the ids slurmd's log uses


def test_pending_tasks_that_never_ran_are_expanded_and_have_no_start():
    tasks = timing.tasks(sacct_rows(SACCT))
    assert [t.task_id for t in tasks] == [0, 1, 2, 3]
    assert [t.ran for t in tasks] == [True, True, False, False]
    assert tasks[3].start is None and tasks[3].state == "CANCELLED"


def test_a_log_stamp_of_another_moment_is_not_taken_for_the_task():
    # A task id reused after a controller restart: its old line is far from sacct's time.
    stale = "[2026-11-30T17:00:00.000] sched: Allocate JobId=1_0(4) NodeList=node1\n"
    [zero, *_] = timing.tasks(sacct_rows(SACCT), timing.ctld_events(stale))
    assert zero.start_from == "sacct"


def test_a_generation_ends_when_its_last_task_that_ran_ends():
    tasks = timing.tasks(sacct_rows(SACCT), timing.ctld_events(CTLD_LOG))
    assert timing.generation_end(tasks) == (at("2026-11-30T18:28:41"), "sacct")


def test_a_generation_with_a_task_still_running_has_not_ended():
    running = SACCT.replace("2026-11-30T18:28:41|/w", "Unknown|/w")
    assert timing.generation_end(timing.tasks(sacct_rows(running))) is None


def test_phases_add_up_to_the_total():
    marks = [
        timing.Mark("a", 10.0, "x"),
        timing.Mark("b", 12.5, "x", phase="first"),
        timing.Mark("c", 13.0, "x", phase="second"),
    ]
    parts = timing.segments(marks)
    assert parts == [("first", 2.5), ("second", 0.5)]
    assert sum(s for _, s in parts) == marks[-1].time - marks[0].time


def test_a_checkpoints_first_read_brackets_the_restore():
    files = [timing.FileTimes(atime=105.0, mtime=100.0), timing.FileTimes(atime=105.4, mtime=99.0)]
    assert timing.first_read(files) == (105.0, 105.4)


def test_a_checkpoint_never_read_after_writing_gives_no_restore_time():
    # noatime mounts, or no restore: the access time did not move past the write.
    files = [timing.FileTimes(atime=105.0, mtime=100.0), timing.FileTimes(atime=99.0, mtime=99.0)]
    assert timing.first_read(files) is None
    assert timing.first_read([]) is None


def test_cycle_info_files_in_nvrx_format():
    text = json.dumps(
        {
            "job_id": "57",
            "cycle_number": 1,
            "cycle_start_time": "2026-11-30T18:30:00.250000Z",
            "cycle_end_time": "",
            "active_nodes": "node[1-2]",
        }
    )
    found = timing.cycle(text)
    assert (found.array_job_id, found.number, found.end) == ("57", 1, None)
    assert found.start == timing.utc_epoch("2026-11-30T18:30:00.25+00:00")


def test_progress_events_skip_a_line_being_appended():
    text = '{"event": "start", "iteration": 5, "time": 1.0}\n{"event": "st'
    events = timing.progress_events(text)
    assert [e["event"] for e in events] == ["start"]


def test_first_event_matches_kind_time_and_fields():
    events = [
        {"event": "step", "time": 1.0, "cycle": 0},
        {"event": "step", "time": 2.0, "cycle": 0},
        {"event": "step", "time": 3.0, "cycle": 1},
    ]
    assert timing.first_event(events, "step", after=1.0)["time"] == 2.0
    assert timing.first_event(events, "step", cycle=1)["time"] == 3.0
    assert timing.first_event(events, "start") is None


def test_summary_and_ratio():
    assert timing.summary([3.0, 1.0, 2.0]) == {"n": 3, "median_s": 2.0, "min_s": 1.0, "max_s": 3.0}
    assert timing.summary([])["median_s"] is None
    assert timing.ratio(3.0, 1.5) == 2.0
    assert timing.ratio(3.0, None) is None
