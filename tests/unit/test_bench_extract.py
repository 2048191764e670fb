"""Each scenario's figures, from the artefacts one sample leaves behind."""

from __future__ import annotations

import pytest

from bench import extract, handoff, spare
from bench.report import Result
from bench.timing import CtldEvent, Cycle, FileTimes, NvrxEvent, StepEnd, Task


def task(array: str, task_id: int, start, end, *, node="node1", state="COMPLETED", code=0):
    """A task as timing.tasks makes it; its raw job id is array + task, e.g. "302"."""
    ran = start is not None
    return Task(array, task_id, state, code, node if ran else "", start, end, "slurmctld",
                "slurmctld", raw_id=f"{array}{task_id}" if ran else "")  # fmt: skip


def test_floor_is_last_task_end_to_the_successors_task_0_start():
    previous = [
        task("10", 0, 100.0, 101.0),
        task("10", 1, 100.0, 101.2),
        task("10", 2, 101.3, 101.5),
    ]
    successor = [task("11", 0, 102.1, 103.0), task("11", 1, 102.1, 103.0)]
    sample = extract.floor_sample(previous, successor)
    assert sample["total_s"] == pytest.approx(0.6)
    assert sample["phases"] == {"scheduler": pytest.approx(0.6)}


def test_floor_refuses_a_generation_that_has_not_ended():
    previous = [task("10", 0, 100.0, None)]
    with pytest.raises(extract.Incomplete, match="previous_end"):
        extract.floor_sample(previous, [task("11", 0, 102.0, 103.0)])
    # accounting that lags: the successor's task 0 not recorded yet
    ended = [task("10", 0, 100.0, 101.0)]
    with pytest.raises(extract.Incomplete, match="successor_task0_start"):
        extract.floor_sample(ended, [task("11", 1, 102.0, 103.0)])


def handoff_seen(**changes) -> extract.HandoffSeen:
    values = dict(
        killed_at=1000.0,
        victim="node1",
        generation=[
            task("20", 0, 900.0, 1019.0, state="NODE_FAIL"),
            task("20", 1, 900.0, 1011.5, node="node2", state="FAILED", code=71),
            task("20", 2, 1012.0, 1016.0, node="node2", state="FAILED", code=71),
        ],
        successor=[task("21", 0, 1020.0, None, node="node3"), task("21", 1, 1020.0, None)],
        record_written=1022.0,
        cycle0=Cycle("21", 0, 1026.0, None, "node[3-4]"),
        checkpoint=[FileTimes(1030.0, 990.0), FileTimes(1030.2, 990.0)],
        resumed={"event": "start", "time": 1030.5, "iteration": 40, "host": "node3"},
        first_step={"event": "step", "time": 1030.7, "iteration": 41},
        first_cold=2,
        dead_closed=None,
        nvrx=[
            NvrxEvent(0, "rendezvous_started", "node4", 1024.0),  # a peer, not task 0
            NvrxEvent(0, "rendezvous_started", "node3", 1025.0),
        ],
    )
    return extract.HandoffSeen(**{**values, **changes})


def test_handoff_phases_add_up_from_node_death_to_first_step():
    sample = extract.handoff_sample(handoff_seen())
    assert sample["total_s"] == pytest.approx(30.7)
    assert sum(sample["phases"].values()) == pytest.approx(sample["total_s"])
    assert sample["phases"] == {
        "detection + teardown": pytest.approx(19.0),
        "scheduler": pytest.approx(1.0),
        "entrypoint start (task 0)": pytest.approx(2.0),
        "ft_launcher start (task 0)": pytest.approx(3.0),
        "rendezvous": pytest.approx(1.0),
        "worker start": pytest.approx(4.0),
        extract.RESTORE: pytest.approx(0.5),
        "first step": pytest.approx(0.2),
    }
    assert sample["resumed_iteration"] == 40
    assert sample["dead_generation_closed_s"] is None  # a hard death runs no trap
    # the cold spare admitted when the hot spare left, sent away by the stale lease
    assert sample["cold_spares_held_s"] == [pytest.approx(4.0)]


def test_handoff_says_whether_slurm_or_the_peers_ended_the_dead_generation_last():
    assert extract.handoff_sample(handoff_seen())["ended_last"] == "task 0 (Slurm: node failure)"
    late_peer = handoff_seen(
        generation=[
            task("20", 0, 900.0, 1012.0, state="NODE_FAIL"),
            task("20", 1, 900.0, 1019.0, node="node2", state="FAILED", code=71),
        ]
    )
    sample = extract.handoff_sample(late_peer)
    assert sample["ended_last"] == "peers (stale lease)"
    assert sample["peer_exit_codes"] == [71]


def test_a_handoff_sample_without_a_restore_reading_is_dropped_with_the_reason():
    never_read = handoff_seen(checkpoint=[FileTimes(980.0, 990.0)])
    with pytest.raises(extract.Incomplete, match="checkpoint_first_read"):
        extract.handoff_sample(never_read)
    with pytest.raises(extract.Incomplete, match="rendezvous_record, cycle0_start"):
        extract.handoff_sample(handoff_seen(record_written=None, cycle0=None))


def test_a_cold_spare_admitted_before_the_closed_flag_escaped():
    generation = [
        task("30", 0, 100.0, 120.0),
        task("30", 1, 100.0, 118.0, node="node2"),
        task("30", 2, 118.2, 123.5, node="node3", state="FAILED", code=76),
    ]
    steps = [StepEnd(120.5, "302", "0"), StepEnd(123.5, "302", "batch")]
    seen = extract.SpareSeen(generation, closed_at=119.5, step_ends=steps, train_tasks=1,
                             hot_spares=1)  # fmt: skip
    [sample] = extract.spare_samples(seen)
    assert sample["escaped"] is True
    assert sample["held_s"] == pytest.approx(5.3)
    assert sample["flag_to_srun_end_s"] == pytest.approx(1.0)
    assert sample["srun_end_to_job_end_s"] == pytest.approx(3.0)
    assert sample["exit_code"] == 76


def test_a_cold_spare_admitted_after_the_flag_did_not_escape_and_pending_ones_are_counted():
    generation = [
        task("30", 0, 100.0, 120.0),
        task("30", 1, 100.0, 118.0, node="node2"),
        task("30", 2, 120.3, 120.4, node="node3", state="FAILED", code=71),
        task("30", 3, None, 120.1, state="CANCELLED"),
    ]
    seen = extract.SpareSeen(generation, closed_at=120.0, step_ends=[], train_tasks=1,
                             hot_spares=1)  # fmt: skip
    [sample] = extract.spare_samples(seen)
    assert sample["escaped"] is False and sample["flag_to_srun_end_s"] is None
    assert extract.spare_fates(generation, first_cold=2) == {"ran": 1, "cancelled": 1}


def norestart_seen(**changes) -> extract.NoRestartSeen:
    values = dict(
        decided=200.0,
        exited_93=205.0,
        closed=205.3,
        teardown_done=205.8,
        generation=[
            task("40", 0, 190.0, 208.9, code=93),
            task("40", 1, 190.0, 203.0, node="node2", code=93),
            task("40", 2, 203.5, 209.2, node="node2", code=76),
        ],
        step_ends=[StepEnd(206.2, "402", "0"), StepEnd(209.2, "402", "batch")],
        queued=["41", "42"],
        queued_tasks=[task("41", 0, None, 205.0), task("42", 0, None, 205.0)],
        kills=[
            CtldEvent(205.6, "kill", "41", None),
            CtldEvent(205.7, "kill", "42", None),
            CtldEvent(209.0, "kill", "42", None),  # a later cancel of the same job
        ],
        queue_empty=209.4,
        nvrx=[
            NvrxEvent(1, "worker_terminated", "node2", 200.5),  # the hot spare's
            NvrxEvent(1, "worker_terminated", "node1", 201.3),
        ],
    )
    return extract.NoRestartSeen(**{**values, **changes})


def test_no_restart_from_exit_93_to_an_empty_queue():
    sample = extract.norestart_sample(norestart_seen())
    assert sample["exit93_to_empty_s"] == pytest.approx(4.4)
    assert sample["exit93_to_cancelled_s"] == pytest.approx(0.7)
    assert sample["total_s"] == pytest.approx(9.4)  # from NVRx giving up
    assert sample["phases"] == {
        "stop the surviving workers": pytest.approx(1.3),
        "ft_launcher shutdown": pytest.approx(3.7),
        "srun return + trap": pytest.approx(0.3),
        "teardown: scancel + ledger": pytest.approx(0.5),
        "Slurm ends the generation's jobs": pytest.approx(3.4),
        "squeue reflects it": pytest.approx(0.2),
    }
    # The escaped spare ended last, 3 s after its srun: Slurm's share, not ours.
    assert sample["last_task"] == "40_2"
    assert sample["last_task_srun_end_to_job_end_s"] == pytest.approx(3.0)


def test_a_queued_generation_missing_from_the_log_takes_saccts_end():
    seen = norestart_seen(
        queued_tasks=[task("41", 0, None, 205.0), task("42", 0, None, 206.0)],
        kills=[CtldEvent(205.6, "kill", "41", None)],
    )
    assert extract.cancelled_at(seen.queued, seen.queued_tasks, seen.kills) == (206.0, "sacct: End")
    assert extract.cancelled_at(["43"], seen.queued_tasks, seen.kills) is None


def test_no_restart_without_the_witness_file_is_dropped():
    with pytest.raises(extract.Incomplete, match="no_restart_file"):
        extract.norestart_sample(norestart_seen(exited_93=None))


def restart_seen(**changes) -> extract.RestartSeen:
    values = dict(
        fault_at=500.0,
        rank=1,
        next=Cycle("50", 3, 503.0, None, "node1"),
        checkpoint=[FileTimes(506.0, 490.0)],
        resumed={"event": "start", "time": 506.3, "iteration": 30, "host": "node1"},
        first_step={"event": "step", "time": 506.4},
        nvrx=[
            # NVRx names the cycle being entered: cycle 2 failed, cycle 3 follows
            NvrxEvent(3, "failure_detected", "node1", 500.1),
            NvrxEvent(3, "worker_terminated", "node1", 501.4),
            NvrxEvent(3, "rendezvous_started", "node2", 501.5),
            NvrxEvent(3, "rendezvous_started", "node1", 502.4),
            NvrxEvent(2, "rendezvous_started", "node1", 400.0),
        ],
    )
    return extract.RestartSeen(**{**values, **changes})


def test_in_job_restart_from_the_fault_to_the_next_cycles_first_step():
    sample = extract.restart_sample(restart_seen())
    assert sample["total_s"] == pytest.approx(6.4)
    assert sample["phases"] == {
        "detection": pytest.approx(0.1),
        "stop the surviving workers": pytest.approx(1.3),
        "wait for the next round": pytest.approx(1.0),
        "rendezvous": pytest.approx(0.6),
        "worker start": pytest.approx(3.0),
        extract.RESTORE: pytest.approx(0.3),
        "first step": pytest.approx(0.1),
    }
    assert sample["cycle"] == 3


def test_the_trainers_setup_times_split_the_worker_start():
    setup = {"launched": 503.1, "imported": 504.5, "joined": 505.0, "built": 505.8}
    resumed = {"event": "start", "time": 506.3, "host": "node1", "setup": setup}
    phases = extract.restart_sample(restart_seen(resumed=resumed))["phases"]
    assert "worker start" not in phases
    assert {k: phases[k] for k in list(phases)[4:9]} == {
        "spawn + interpreter": pytest.approx(0.1),
        "import torch": pytest.approx(1.4),
        "join the process group": pytest.approx(0.5),
        "build the model": pytest.approx(0.8),
        "restore setup": pytest.approx(0.2),
    }


def test_setup_times_out_of_order_keep_the_worker_start_whole():
    # a trainer clock that disagrees with the checkpoint's access time: no split is
    # better than a negative phase
    setup = {"launched": 503.1, "imported": 504.5, "joined": 505.0, "built": 506.5}
    resumed = {"event": "start", "time": 506.3, "host": "node1", "setup": setup}
    phases = extract.restart_sample(restart_seen(resumed=resumed))["phases"]
    assert phases["worker start"] == pytest.approx(3.0)


def test_an_in_job_restart_without_nvrxs_log_is_dropped_naming_it():
    with pytest.raises(extract.Incomplete, match="failure_detected, worker_terminated"):
        extract.restart_sample(restart_seen(nvrx=[]))


def test_handoff_overhead_leaves_out_the_floor_and_the_workloads_restore():
    sample = extract.handoff_sample(handoff_seen())  # 30.7 s, of it 0.5 s restore, 19 s detection
    metrics = {m.label: m for m in handoff.metrics([sample], 1.2, "node death", None)}
    overhead = metrics["overhead beyond floor and restore"]
    assert overhead.samples == [pytest.approx(29.0)]
    assert overhead.met() is False  # 3 s target
    assert metrics["of which not Slurm's node-failure detection"].samples == [pytest.approx(10.0)]


def test_the_hand_off_target_is_the_lease_the_floor_and_six_seconds():
    # Issue 11: a dead task 0 is fenced one lease after its death; what follows is the
    # scheduler and the successor's start.
    assert handoff.target(None) is None
    assert handoff.target(1.0) == pytest.approx(handoff.LEASE_S + 7.0)
    sample = extract.handoff_sample(handoff_seen())  # 30.7 s
    [total, *_] = handoff.metrics([sample], 1.0, "node death", handoff.target(1.0))
    assert total.label == "node death -> successor's first step" and total.met() is False


def test_spares_that_left_before_srun_are_counted_not_shown_as_empty_rows():
    def escaped(held, flag_to_srun_end=None, srun_end_to_job_end=None, code=71):
        return {"escaped": True, "held_s": held, "flag_to_srun_end_s": flag_to_srun_end,
                "srun_end_to_job_end_s": srun_end_to_job_end, "exit_code": code}  # fmt: skip

    result = Result(spare.NAME, spare.TITLE, samples=[escaped(0.02), escaped(0.03)])
    spare.finish(result, floor=0.9)
    assert [m.label for m in result.metrics] == ["escaped spare: admitted -> its job ended"]
    assert "escaped spares that left before starting srun: 2" in result.notes

    result = Result(spare.NAME, spare.TITLE, samples=[escaped(0.02), escaped(4.0, 1.0, 3.0, 76)])
    spare.finish(result, floor=0.9)
    assert len(result.metrics) == 3 and result.metrics[1].samples == [1.0]
    assert "escaped spares that left before starting srun: 1" in result.notes
