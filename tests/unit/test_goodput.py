"""The goodput account, on a chain whose every second is known: two generations of
three and two nodes, a hang in an in-job restart, task 0's node dying, a time limit.

Times are seconds after T0. Training runs at 0.1 s an iteration, logs every 10
iterations, and a save stands it still for 0.5 s. The expected figures are worked out
by hand in the comments, from those numbers alone.
"""

from __future__ import annotations

import json
import math

import pytest

from nvrx_appliance.goodput import summary
from nvrx_appliance.goodput.account import (
    CATEGORIES,
    CHAIN_END,
    HAND_OFFS,
    HANGS,
    IDLE_SPARES,
    LOST,
    NOT_YET_SAVED,
    PRODUCTIVE,
    RESTARTS,
    SAVES,
    START_UP,
    UNKNOWN,
    Allocation,
    Inputs,
    account,
)
from nvrx_appliance.observe.training_log import from_progress_log
from nvrx_appliance.observe.types import Cycle

T0 = 1_800_000_000.0
STEP, SAVE = 0.1, 0.5


def alloc(generation, task, node, start, end, state="COMPLETED"):
    return Allocation(
        generation, task, (node,), state, T0 + start, None if end is None else T0 + end
    )


def cycle(generation, number, start, end, active):
    return Cycle(generation, 0, number, T0 + start, None if end is None else T0 + end, active)


def training(generation, cycle_number, started, first, last, saves=(), setup=True, fault=None):
    """A cycle's progress events: start at `started` from iteration `first`, a step event
    every 10 iterations up to `last`, a 0.5 s save at each iteration in `saves`."""

    def event(name, at, **fields):
        return {"event": name, "slurm_array_job_id": generation, "cycle": cycle_number,
                "time": T0 + at, **fields}  # fmt: skip

    marks = {"launched": started - 4, "imported": started - 3, "joined": started - 2,
             "built": started - 1} if setup else {}  # fmt: skip
    out = [event("start", started, iteration=first, setup={k: T0 + v for k, v in marks.items()})]
    clock = started
    for iteration in range(first + 1, last + 1):
        clock += STEP
        if iteration % 10 == 0:
            out.append(event("step", clock, iteration=iteration))
        if iteration in saves:
            clock += SAVE
            out.append(event("checkpoint", clock, iteration=iteration, seconds=SAVE))
    if fault is not None:
        out.append(event("fault", clock + fault, kind="hang", rank=0))
    return out


def chain_inputs(**changes):
    allocations = (
        alloc("10", 0, "node1", 0, 100, "CANCELLED"),
        alloc("10", 1, "node2", 1, 101),  # a hot spare, never active
        alloc("10", 2, "node3", 60, 61),  # a cold spare admitted as the generation ended
        alloc("11", 0, "node2", 102, 200, "TIMEOUT"),
        alloc("11", 1, "node1", 103, 200, "TIMEOUT"),
    )
    cycles = {
        "10": [cycle("10", 0, 10, 40, "node1"), cycle("10", 1, 42, None, "node[1]")],
        "11": [cycle("11", 0, 110, None, "node2")],
    }
    events = [
        # Cycle 0: saves 50 (20.0-20.5), logs 70 at 22.5, hangs; NVRx ends it at 40.
        *training("10", 0, 15, 0, 70, saves=(50,), fault=0.3),
        # Cycle 1 resumes at 50: saves 100 (52.0-52.5), logs 130 at 55.5, then the node dies.
        *training("10", 1, 47, 50, 130, saves=(100,)),
        # Next generation: resumes at 100, saves 150 (120.0-120.5), trains to 930 (198.5).
        *training("11", 0, 115, 100, 930, saves=(150,), setup=False),
    ]
    fields = {
        "job_name": "chain",
        "work_dir": "/shared/run",
        "now": T0 + 1000,
        "allocations": allocations,
        "cycles": cycles,
        "work": from_progress_log(events),
        "ledger": [
            {
                "array_job_id": "10",
                "action": "fenced",
                "exit_code": None,
                "checkpoint_iteration_start": None,
                "checkpoint_iteration": 100,
            },
        ],
        "work_source": "progress log",
    }
    return Inputs(**{**fields, **changes})


def test_every_node_second_of_the_allocation_is_in_exactly_one_category():
    result = account(chain_inputs())
    # 100 + 100 + 1 (generation 10) + 98 + 97 (generation 11)
    assert result.allocation_node_s == pytest.approx(396.0)
    assert sum(result.categories.values()) == pytest.approx(396.0)
    assert list(result.categories) == list(CATEGORIES)
    for node in result.nodes:
        for before, after in zip(node.pieces, node.pieces[1:], strict=False):
            assert before.end == pytest.approx(after.start)


def test_each_cause_gets_the_time_the_run_spent_on_it():
    got = account(chain_inputs()).categories
    assert got[PRODUCTIVE] == pytest.approx(5 + 5 + 5)  # 15-20, 47-52, 115-120
    assert got[SAVES] == pytest.approx(3 * SAVE)
    # 20 iterations after the save at 50, 30 after 100, 780 after 150, at 0.1 s each
    assert got[LOST] == pytest.approx(2.0 + 3.0 + 78.0)
    assert got[HANGS] == pytest.approx(40 - 22.5)  # the last logged step to NVRx's end
    assert got[START_UP] == pytest.approx(15 + 13)  # node start -> training start
    assert got[RESTARTS] == pytest.approx(47 - 40)
    assert got[HAND_OFFS] == pytest.approx(100 - 55.5)  # after the last sign of training
    assert got[CHAIN_END] == pytest.approx(200 - 198.5)
    assert got[IDLE_SPARES] == pytest.approx(100 + 1 + 97)
    assert got[UNKNOWN] == 0 and got[NOT_YET_SAVED] == 0


def test_training_lost_counts_the_iterations_after_each_last_kept_checkpoint():
    result = account(chain_inputs())
    assert [(x.generation, x.cycle, x.kept, x.last, x.iterations) for x in result.lost] == [
        ("10", 0, 50, 70, 20),
        ("10", 1, 100, 130, 30),
        ("11", 0, 150, 930, 780),
    ]
    assert result.lost_iterations == 830
    assert result.step_s == pytest.approx(STEP)
    assert result.log_interval == 10


def test_start_up_and_restarts_are_split_at_the_workloads_own_marks():
    parts = account(chain_inputs()).parts
    assert parts[START_UP]["launch and rendezvous"] == pytest.approx(10 + 8)
    assert parts[START_UP]["import torch"] == pytest.approx(1)
    assert parts[START_UP]["checkpoint load"] == pytest.approx(1 + 5)
    assert parts[RESTARTS]["NVRx restart and rendezvous"] == pytest.approx(2)
    assert sum(parts[RESTARTS].values()) == pytest.approx(7)


def test_generations_say_how_they_ended_and_how_long_the_hand_off_took():
    result = account(chain_inputs())
    first, second = result.generations
    assert first.ending == "task 0 lost (fenced by a peer)"
    assert second.ending == "time limit"
    assert first.successor_resumed_s == pytest.approx(115 - 55.5)
    assert result.queue_wait_s == pytest.approx(1.0)  # 101 -> 102
    assert result.wall_s == pytest.approx(200)
    assert result.goodput_ratio == pytest.approx(15 / 396)


def test_a_running_generation_has_training_not_yet_saved_not_lost():
    inputs = chain_inputs(
        allocations=(
            *chain_inputs().allocations[:3],
            alloc("11", 0, "node2", 102, None, "RUNNING"),
            alloc("11", 1, "node1", 103, None, "RUNNING"),
        ),
        now=T0 + 198.5,
    )
    result = account(inputs)
    assert result.not_yet_saved_iterations == 780
    assert result.categories[NOT_YET_SAVED] == pytest.approx(198.5 - 120.5)
    assert result.lost_iterations == 50 and result.categories[CHAIN_END] == 0
    assert result.generations[-1].ending == "running"
    assert sum(result.categories.values()) == pytest.approx(result.allocation_node_s)


def test_a_running_generation_between_cycles_has_lost_its_work_and_is_restarting():
    cycles = dict(chain_inputs().cycles)
    cycles["11"] = [cycle("11", 0, 110, 199, "node2"), cycle("11", 1, 203, None, "node2")]
    running = (alloc("11", 0, "node2", 102, None, "RUNNING"),)
    inputs = chain_inputs(
        allocations=(*chain_inputs().allocations[:3], *running), cycles=cycles, now=T0 + 210
    )
    result = account(inputs)
    assert result.lost[-1].iterations == 780 and result.not_yet_saved_iterations == 0
    assert result.categories[HANGS] == pytest.approx(17.5 + (199 - 198.5))
    assert result.categories[RESTARTS] == pytest.approx(7 + (210 - 199))


def test_what_cannot_be_known_is_unknown_with_the_reason_never_a_zero():
    no_cycle_infos = account(chain_inputs(cycles={"11": chain_inputs().cycles["11"]}))
    [reason] = no_cycle_infos.parts[UNKNOWN]
    assert "generation 10 left no cycle-info files" in reason
    assert no_cycle_infos.parts[UNKNOWN][reason] == pytest.approx(201.0)

    blind = account(chain_inputs(allocations=None, blind=("sacct: timed out",)))
    assert blind.allocation_node_s is None and blind.goodput_ratio is None
    assert summary.headline(blind).endswith("unknown (Slurm's accounting did not answer)")
    assert summary.to_json(blind)["goodput_ratio"] is None


def test_a_script_without_a_progress_log_is_split_only_as_far_as_the_cycles_go():
    why = "the script writes no progress log (docs/workload-contract.md)"
    result = account(chain_inputs(work={}, work_source=why))
    assert result.categories[START_UP] == pytest.approx(10 + 8)  # until each first cycle
    assert result.categories[RESTARTS] == pytest.approx(2)  # between cycle 0 and 1
    assert result.parts[UNKNOWN] == {why: pytest.approx(30 + 58 + 90)}
    assert result.categories[PRODUCTIVE] == 0 and result.lost == ()
    assert sum(result.categories.values()) == pytest.approx(396.0)
    text = "\n".join(summary.lines(result))
    assert f"no training record ({why}): progress is the tracker's alone" in text
    assert "generation 10: " in text and ", checkpoint 0 -> 100, ended:" in text


def test_lost_iterations_without_a_measured_step_time_are_unknown_not_free():
    events = [
        {"event": "start", "slurm_array_job_id": "11", "cycle": 0, "time": T0 + 115, "iteration": 0},
        {"event": "step", "slurm_array_job_id": "11", "cycle": 0, "time": T0 + 116, "iteration": 8},
    ]  # fmt: skip
    inputs = chain_inputs(
        allocations=chain_inputs().allocations[3:],
        cycles={"11": chain_inputs().cycles["11"]},
        work=from_progress_log(events),
    )
    result = account(inputs)
    assert result.step_s is None
    assert result.parts[UNKNOWN] == {
        "no measured step time to convert lost iterations": pytest.approx(1.0)
    }


def test_the_summary_reads_like_the_account_and_the_json_carries_every_category():
    result = account(chain_inputs())
    text = "\n".join(summary.lines(result))
    assert text.startswith("Goodput of chain chain: 3.8% of the allocation trained (15 of 396")
    assert "training lost" in text and "830 iteration(s)" in text
    assert "lost in generation 11, cycle 0: iterations 151-930 (780)" in text
    assert "generation 10: " in text and "ended: task 0 lost (fenced by a peer)" in text
    assert "the next generation trained 59.5 s later" in text
    assert "iterations logged every 10: up to 9 more" in text
    doc = json.loads(json.dumps(summary.to_json(result)))
    assert [c["name"] for c in doc["categories"]] == list(CATEGORIES)
    assert math.isclose(sum(c["node_seconds"] for c in doc["categories"]), 396.0)
    assert doc["training_lost"]["iterations"] == 830
    assert doc["generations"][0]["start"].endswith("Z")


def test_start_up_is_cut_where_task_0_published_its_rendezvous_record():
    parts = account(chain_inputs(published={"10": T0 + 6})).parts[START_UP]
    assert parts["container and entrypoint"] == pytest.approx(6)  # node1: 0 -> 6
    assert parts["ft_launcher and rendezvous"] == pytest.approx(4)  # 6 -> cycle 0 at 10
    assert parts["launch and rendezvous"] == pytest.approx(8)  # generation 11: no record


def test_a_generation_that_saved_before_its_time_limit_says_so():
    ledger = [{"array_job_id": "11", "action": "saved_at_time_limit", "exit_code": 0}]
    result = account(chain_inputs(ledger=ledger))
    assert result.generations[1].ending == "time limit (saved first)"


def test_a_generation_the_workload_stopped_says_what_the_workload_did():
    verdict = {"code": 17, "iteration": 60, "action": "stop-chain"}
    ledger = [
        {"array_job_id": "10", "action": "cancelled_chain", "exit_code": 93,
         "workload": "failed 4 times at iteration 60 with exit 1: the workload exited 1"},
        {"array_job_id": "11", "action": "stopped_by_workload", "exit_code": 78, "verdict": verdict},
    ]  # fmt: skip
    first, second = account(chain_inputs(ledger=ledger)).generations
    assert first.ending == (
        "NVRx: do not restart (93) after the workload failed 4 times at iteration 60 with exit "
        "1: the workload exited 1"
    )
    assert second.ending == "the workload stopped the chain: exit 17 at iteration 60"
