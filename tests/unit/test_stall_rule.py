"""The combined hang rule (rank/stall_rule.py) over flight-recorder dumps that real gloo
ranks wrote with the appliance's own watch (fixtures/flight_recorder/record.py: four
ranks, ranks 0-1 on nodeA and 2-3 on nodeB), and py-spy's frames of the built-in
trainer (test_hang_rule.py).

The recorder says the others wait for rank 3; its stack and process state say why: a
stopped rank or one stuck in the kernel names its node, one in the workload's own code is
the workload's stall and names nobody (the issue's false-blame cases)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from nvrx_appliance.rank import flight_record, stacks, stall_rule
from nvrx_appliance.rank.hang_rule import Frame, RankStack
from tests.unit.test_hang_rule import FRESH_S, FROZEN, NOW, SAVING, STILL_S, WAITING

FIXTURES = Path(__file__).parent / "fixtures" / "flight_recorder"
NODES = {0: "nodeA", 1: "nodeA", 2: "nodeB", 3: "nodeB"}
UPLOAD = (
    Frame("upload_metrics", "train_script.py", 88),
    Frame("train", "train_script.py", 120),
    Frame("<module>", "train_script.py", 150),
)
LOG_WRITE = (
    Frame("write", "train_script.py", 40),
    Frame("log_progress", "train_script.py", 61),
    Frame("<module>", "train_script.py", 150),
)
FORMING = (  # a cycle's start-up: the process group forms once every rank has come
    Frame("init_process_group", "torch/distributed/distributed_c10d.py", 1600),
    Frame("_init_distributed", "nvrx_appliance/workloads/trainer.py", 60),
)
BROADCAST_IN_SAVE = (
    Frame("broadcast_object_list", "torch/distributed/distributed_c10d.py", 3478),
    Frame("save_checkpoint", "train_script.py", 70),
    Frame("<module>", "train_script.py", 150),
)


def dumps(scenario: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(FIXTURES.glob(f"{scenario}.*.json"))]


def stack(rank: int, frames: tuple[Frame, ...], state: str = "S", node: str = "") -> RankStack:
    return RankStack(
        rank, node or NODES[rank], frames, taken=NOW - 1, still_since=NOW - 30, state=state
    )


def others_wait(late: RankStack, waiting=WAITING) -> list[RankStack]:
    return [*(stack(r, waiting) for r in range(4) if r != late.rank), late]


def judge(stacks, found, **kw):
    return stall_rule.judge(stacks, found, world_size=4, cycle=1, now=NOW, fresh_s=FRESH_S,
                            still_s=STILL_S, **kw)  # fmt: skip


def test_the_recorded_dumps_say_the_others_waited_for_rank_3_in_glooss_all_reduce():
    flight = flight_record.analyse(dumps("late"), 4)
    (stall,) = flight.stalls
    assert (stall.group, stall.seq, stall.op) == ("0", 4, "gloo:all_reduce")
    assert stall.waiting == (0, 1, 2) and stall.behind == (3,)
    assert flight.held_by() == (3,)
    assert sorted(stall.arrived) == [0, 1, 2]  # each waiting rank's entry time


def test_a_rank_still_in_the_collective_before_is_waiting_not_waited_for():
    # On the cluster a node froze inside a ring all-reduce after rank 0 had its result:
    # rank 0 went on to the next one, rank 1 stayed in it. Both wait for the frozen node;
    # the words once said they waited "for rank(s) 1, 2, 3".
    found = dumps("late")
    earlier = next(d for d in found if d["rank"] == 1)
    earlier["trace"]["pg_status"]["0"].update(
        last_enqueued_collective="3", last_completed_collective="2"
    )
    flight = flight_record.analyse(found, 4)
    (stall,) = flight.stalls
    assert stall.seq == 4 and stall.waiting == (0, 1, 2) and stall.behind == (3,)
    assert flight.held_by() == (3,)
    words = judge(others_wait(stack(3, FROZEN, "T")), found).words
    assert "waited in `gloo:all_reduce` #4 of process group 0 for rank(s) 3)" in words, words


def test_a_stopped_rank_the_others_wait_for_names_its_node():
    found = judge(others_wait(stack(3, FROZEN, "T")), dumps("late"))
    assert found.nodes == ("nodeB",) and found.kind == "hung"
    assert found.words.startswith(
        "nodeB hung in cycle 1: its 1 rank stopped in `_train_step` while the 3 "
        "others waited in `all_reduce`"
    ), found.words
    assert "flight recorder: rank(s) 0, 1, 2 waited in `gloo:all_reduce` #4 of process group 0 " \
        "for rank(s) 3" in found.words  # fmt: skip


def test_a_rank_stuck_in_the_kernel_that_py_spy_cannot_read_names_its_node():
    # The cluster's sick node in the kernel: frozen by the cgroup freezer; the kernel
    # names the wait (/proc/<pid>/wchan: `__refrigerator` for a task frozen running,
    # where it slept for one frozen asleep), no file system's, for 30 s.
    unreadable = replace(stack(3, (), "D"), wchan="__refrigerator")
    found = judge(others_wait(unreadable), dumps("late"))
    assert found.nodes == ("nodeB",)
    assert "its 1 rank stuck in the kernel (state D at `__refrigerator`) while" in found.words, (
        found.words
    )
    assert found.held == {"nodeB": [3]}


def test_a_rank_in_its_own_code_is_the_workloads_stall_and_names_no_node():
    found = judge(others_wait(stack(3, UPLOAD, "S")), dumps("late"))
    assert found.nodes == () and found.kind == "workload"
    assert found.stalled == {"nodeB": [3]}
    assert found.words.startswith(
        "the workload stalled in cycle 1: rank 3 on nodeB stood in its own code in "
        "`upload_metrics` (state S) while the 3 others waited in `all_reduce` for it"
    ), found.words
    assert found.words.endswith("no node is at fault, none is kept out")


def test_a_busy_rank_spinning_in_its_own_code_is_the_workloads_too():
    found = judge(others_wait(stack(3, UPLOAD, "R")), dumps("late"))
    assert found.kind == "workload" and found.nodes == ()


def test_rank_0_blocked_writing_its_log_on_a_stalled_file_system_is_the_workloads():
    # The issue's case is rank 0; the dumps' late rank is 3: the rule reads ranks, not numbers.
    found = judge(others_wait(stack(3, LOG_WRITE, "D")), dumps("late"))
    assert found.kind == "workload" and found.nodes == ()
    assert "blocked in the file system (state D) in `write`" in found.words


def test_a_hang_inside_a_save_is_judged_like_any_other():
    # gloo's broadcast tree: rank 0 waits in the save's 2nd broadcast, rank 1 in the 1st,
    # rank 2 wrote no dump (its stack waits in the save's broadcast): the others wait for 3.
    flight = flight_record.analyse(dumps("save"), 4)
    assert flight.held_by() == (2, 3)
    stacks = [stack(0, SAVING), stack(1, BROADCAST_IN_SAVE), stack(2, BROADCAST_IN_SAVE),
              stack(3, FROZEN, "T")]  # fmt: skip
    found = judge(stacks, dumps("save"))
    assert found.nodes == ("nodeB",), found.words
    assert "`gloo:broadcast` #5 of process group 0" in found.words


def test_a_rank_waiting_in_a_subgroup_is_not_the_cause_the_rank_it_waits_for_is():
    flight = flight_record.analyse(dumps("subgroup"), 4)
    assert {s.group for s in flight.stalls} == {"0", "1"}
    assert flight.held_by() == (3,)
    found = judge(others_wait(stack(3, FROZEN, "T")), dumps("subgroup"))
    assert found.nodes == ("nodeB",), found.words


def test_recorder_and_stacks_disagreeing_is_no_verdict_with_both():
    found = judge(others_wait(stack(3, WAITING, "S")), dumps("late"))
    assert found.nodes == () and found.kind == ""
    assert found.words.startswith("no verdict in cycle 1: the flight recorder shows every rank")
    assert "the stacks of rank(s) 3 wait in a collective too" in found.words


def test_a_held_rank_without_a_fresh_stack_is_no_verdict():
    old = replace(stack(3, FROZEN, "T"), taken=NOW - 60)
    found = judge(others_wait(old), dumps("late"))
    assert found.nodes == ()
    assert (
        "rank(s) 3 has no fresh stack (its last is 60 s old): the stacks cannot say why"
        in found.words
    )
    gone = judge([s for s in others_wait(old) if s.rank != 3], dumps("late"))
    assert gone.nodes == () and "rank(s) 3 has no stack: the stacks cannot say why" in gone.words


def test_a_stack_one_slow_read_late_still_judges_and_one_past_the_bound_does_not():
    # At the default 5 s period a frozen rank's sample can be 17 s old while its sampler
    # still runs: a period's wait, a read that used its whole period, a period before the
    # node's publisher shares it, and part of NVRx's check interval. Under the old bound
    # (two periods and the check, 15 s) that was "no fresh stack" and no verdict.
    bound = stacks.fresh_s(5)

    def at(age: float):
        late = replace(stack(3, FROZEN, "T"), taken=NOW - age)
        return stall_rule.judge(others_wait(late), dumps("late"), world_size=4, cycle=1,
                                now=NOW, fresh_s=bound, still_s=STILL_S)  # fmt: skip

    assert at(17).nodes == ("nodeB",), at(17).words
    assert at(bound + 1).nodes == () and "has no fresh stack" in at(bound + 1).words


def test_a_collective_enqueued_but_never_started_on_its_device_names_the_node():
    # NCCL's states on the recorded gloo dumps (gloo reports no device state): ranks 0-2
    # started #4 on their GPUs, rank 3 (its dump edited in) only enqueued it.
    found_dumps = dumps("late")
    for d in found_dumps:
        d["trace"]["entries"][-1]["state"] = "started"
    late = json.loads(json.dumps(found_dumps[-1]))
    late["rank"] = 3
    late["trace"]["entries"][-1]["state"] = "scheduled"
    spinning = stack(3, (Frame("item", "train_script.py", 90),), "R")
    found = judge(others_wait(spinning), [*found_dumps, late])
    assert found.nodes == ("nodeB",), found.words
    assert "never started on its device" in found.words


def test_without_any_dump_a_stopped_outlier_names_its_node_and_own_code_does_not():
    stopped = judge(others_wait(stack(3, FROZEN, "T")), [])
    assert stopped.nodes == ("nodeB",) and stopped.kind == "hung"
    own = judge(others_wait(stack(3, UPLOAD, "S")), [])
    assert own.nodes == () and own.kind == "workload"
    assert own.words.startswith("the workload stalled in cycle 1: rank 3 on nodeB stood in")


def test_a_cycles_start_up_names_a_stopped_node_while_the_others_form_the_group():
    found = judge(others_wait(stack(3, FROZEN, "T"), FORMING), [])
    assert found.nodes == ("nodeB",), found.words


def test_a_node_stopped_while_its_ranks_import_names_it_though_the_frame_reads_as_a_load():
    # Seen on the local cluster (a node frozen as its workers started): the stopped ranks
    # stood in importlib's `_load_unlocked`, whose name reads as I/O, and the old rule
    # gave "a checkpoint, the data or the file system held the ranks". A stopped rank
    # stands wherever the stop caught it; that frame says nothing about the file system.
    importing = (
        Frame("_load_unlocked", "<frozen importlib._bootstrap>", 690),
        Frame("_find_and_load", "<frozen importlib._bootstrap>", 1176),
        Frame("<module>", "nvrx_appliance/workloads/cpu.py", 12),
    )
    found = judge(others_wait(stack(3, importing, "T"), FORMING), [])
    assert found.nodes == ("nodeB",) and found.kind == "hung", found.words
    # Asleep in the same frame (imports from a stalled shared file system) it is still
    # the file system's: no node.
    slow = judge(others_wait(stack(3, importing, "S"), FORMING), [])
    assert slow.nodes == (), slow.words


def test_a_stall_of_every_rank_names_no_node():
    found = judge([stack(r, UPLOAD, "S") for r in range(4)], [])
    assert found.nodes == () and found.kind == ""


def test_a_one_node_evaluation_while_the_other_node_waits_is_the_workloads():
    # Only nodeA's ranks stalled in the all-reduce (rank 2's dump left out: it never
    # entered it); both of nodeB's ranks run their own evaluation.
    found_dumps = [d for d in dumps("late") if d["rank"] != 2]
    evaluating = (
        Frame("evaluate", "train_script.py", 101),
        Frame("<module>", "train_script.py", 150),
    )
    stacks = [
        stack(0, WAITING),
        stack(1, WAITING),
        stack(2, evaluating, "R"),
        stack(3, evaluating, "R"),
    ]
    found = judge(stacks, found_dumps)
    assert found.kind == "workload" and found.nodes == ()
    assert found.stalled == {"nodeB": [2, 3]}


def test_nvrxs_analyser_cannot_read_glooss_dumps_as_torch_writes_them(tmp_path):
    import asyncio
    import pickle

    import pytest
    from nvidia_resiliency_ext.attribution.trace_analyzer.fr_attribution import CollectiveAnalyzer

    for d in dumps("late"):
        (tmp_path / f"_dump_{d['rank']}.json").write_text(json.dumps(d["trace"]))
    with pytest.raises(TypeError):  # pg_status counts are strings in the JSON form
        asyncio.run(CollectiveAnalyzer({"fr_path": str(tmp_path)}).preprocess_FR_dumps())
    # The pickle form (`_dump_fr_trace`) holds them as ints; gloo's default group is then
    # keyed "" in pg_config while its entries say "0".
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    for d in dumps("late"):
        trace = d["trace"]
        for counts in trace["pg_status"].values():
            counts.update({k: int(v) for k, v in counts.items()})
        (pickled / f"_dump_{d['rank']}").write_bytes(pickle.dumps(trace))
    with pytest.raises(KeyError, match="'0'"):
        asyncio.run(CollectiveAnalyzer({"fr_path": str(pickled)}).preprocess_FR_dumps())


def test_the_workloads_stall_is_recorded_as_such_and_read_back_in_the_same_words():
    from nvrx_appliance.observe import hangs
    from nvrx_appliance.rank import stacks as rank_stacks

    found = judge(others_wait(stack(3, UPLOAD, "S")), dumps("late"))
    record = rank_stacks.record_of(found, [], generation="c/7/1", cycle=1,
                                   judged_by={"node": "nodeA", "rank": "0"}, hand_off=True)  # fmt: skip
    assert record["verdict"] == "workload" and record["nodes"] == [] and not record["hand_off"]
    assert record["stalled"] == {"nodeB": [3]}
    assert record["flight"] == [
        "rank(s) 0, 1, 2 waited in `gloo:all_reduce` #4 of process group 0 for rank(s) 3"
    ]
    read = hangs.parse(json.dumps(record), set())
    assert read is not None and hangs.sentence(read, 86400) == found.words
    assert hangs.grouped(read)[0] == found.words  # logs --stacks


# Issue 53, finding 4: a rank in state D names its node only when the kernel says it
# waits somewhere no file system is, and has for the still time; never from one sample.
EMIT = (
    Frame("emit", "logging/__init__.py", 1160),
    Frame("info", "logging/__init__.py", 1489),
    Frame("log_progress", "train_script.py", 61),
)


def test_rank_0_logging_to_a_stalled_file_system_is_the_workloads_by_its_kernel_wait():
    # `emit` is no I/O frame by its name; the kernel says where it waits: NFS's RPC.
    logging = replace(stack(3, EMIT, "D"), wchan="rpc_wait_bit_killable")
    found = judge(others_wait(logging), dumps("late"))
    assert found.kind == "workload" and found.nodes == (), found.words
    assert "blocked in the file system (state D, the kernel waits in `rpc_wait_bit_killable`)" in (
        found.words
    )
    paged = replace(stack(3, (Frame("read_shard", "train_script.py", 9),), "D"),
                    wchan="folio_wait_bit_common")  # an np.memmap read  # fmt: skip
    assert judge(others_wait(paged), dumps("late")).nodes == ()


def test_one_sample_in_the_kernel_names_no_node():
    # cuInit, a pinned-memory allocation, a page fault: a moment in D
    moment = replace(stack(3, EMIT, "D"), still_since=NOW - 2, wchan="os_acquire_mutex")
    found = judge(others_wait(moment), dumps("late"))
    assert found.nodes == () and found.kind == "", found.words
    assert "rank(s) 3 was in the kernel (state D) for 2 s only" in found.words


def test_a_rank_in_the_kernel_where_the_kernel_does_not_say_names_no_node():
    found = judge(others_wait(stack(3, (), "D")), dumps("late"))
    assert found.nodes == () and "and the kernel does not say where" in found.words, found.words


def test_a_rank_stopped_for_a_moment_names_no_node():
    # Sustained, as every node's evidence must be: a stop of a second (a debugger, a
    # profiler's attach) at the judgement is no node's fault.
    moment = replace(stack(3, FROZEN, "T"), still_since=NOW - 1)
    found = judge(others_wait(moment), dumps("late"))
    assert found.nodes == () and "rank(s) 3 was stopped for 1 s only" in found.words, found.words
