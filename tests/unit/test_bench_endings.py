"""The figures of the time-limit and completion benchmarks, from recorded-shape inputs."""

from __future__ import annotations

import pytest

from bench import endings
from bench.extract import Incomplete
from bench.report import Metric, Result, table
from bench.timing import Task


def event(kind: str, gen: str, iteration: int, time: float) -> dict:
    return {"event": kind, "slurm_array_job_id": gen, "iteration": iteration, "time": time}


def test_a_save_at_the_limit_loses_nothing_and_the_handoff_runs_from_the_last_step():
    events = [
        event("step", "10", 1200, 100.0),
        event("checkpoint", "10", 1200, 100.2),
        event("step", "10", 1370, 110.0),
        event("checkpoint", "10", 1373, 110.3),
        event("saved_at_time_limit", "10", 1373, 110.4),
        event("start", "11", 1373, 140.0),
        event("step", "11", 1380, 141.0),
    ]
    s = endings.boundary_sample(events, "10", "11")
    assert (s["iterations_lost"], s["seconds_lost"], s["saved_at_limit"]) == (0, 0.0, True)
    assert s["handoff_s"] == pytest.approx(30.6)


def test_running_into_the_limit_loses_what_was_trained_after_the_last_checkpoint():
    events = [
        event("checkpoint", "10", 1200, 100.0),
        event("step", "10", 1330, 108.0),  # then Slurm killed it
        event("start", "11", 1200, 150.0),
        event("step", "11", 1210, 151.0),
    ]
    s = endings.boundary_sample(events, "10", "11")
    assert (s["iterations_lost"], s["seconds_lost"], s["handoff_s"]) == (130, 8.0, 43.0)


def test_a_boundary_without_the_successors_resume_is_dropped_not_guessed():
    with pytest.raises(Incomplete, match="the resume of 11"):
        endings.boundary_sample([event("step", "10", 5, 1.0)], "10", "11")


def task(gen: str, start: float | None, end: float) -> Task:
    node = "node1" if start is not None else ""
    return Task(gen, 0, "COMPLETED", 0, node, start, end, "sacct", "sacct")


def test_completion_counts_the_generations_that_started_after_training_ended():
    appliance = [task("20", 0.0, 60.0), task("21", None, 61.0), task("22", None, 61.0)]
    s = endings.completion_sample(appliance, ["20", "21", "22"], "20")
    assert (s["generations_started_after"], s["queue_held_s"]) == (0, 1.0)
    seeds = [task("20", 0.0, 60.0), task("21", 62.0, 80.0), task("22", 82.0, 101.0)]
    s = endings.completion_sample(seeds, ["20", "21", "22"], "20")
    assert (s["generations_started_after"], s["later_started"], s["queue_held_s"]) == (
        2, ["21", "22"], 41.0,
    )  # fmt: skip


def test_a_count_in_the_table_says_its_unit_and_has_no_ratio_to_the_floor():
    result = Result(
        "completion", "9 completion", metrics=[Metric("started", [2, 2], unit="generations")]
    )
    floor = Result(
        "floor",
        "1 floor",
        metrics=[Metric("scheduler floor: last task of N ends -> task 0 of N+1 starts", [1.0])],
    )
    row = table([floor, result]).splitlines()[-1]
    assert "started (generations)" in row and "x |" not in row
