"""The hang rule over NCCL's flight recorder (issue 53, findings 5 and 6). No GPU here:
the recorder's summaries are built field by field from torch 2.13's sources, as the
watch (rank/flight_site/sitecustomize.py) writes them from `_dump_nccl_trace_json`:

- FlightRecorderDetail.hpp `dump_json`: `pg_status` per pg id with
  `last_enqueued_collective`, `last_started_collective`, `last_completed_collective`
  as strings; each entry's `pg_id`, `process_group` [name, desc], `collective_seq_id`,
  `p2p_seq_id`, `is_p2p`, `profiling_name`, `time_created_ns`, and `state`: "completed"
  once its end event was seen, "started" once its start event was, else "scheduled";
- ProcessGroupNCCL.cpp (WorkNCCL's constructor): `ncclStartEvent_ = enableTiming ? ... :
  nullptr`, enableTiming from TORCH_NCCL_ENABLE_TIMING (ProcessGroupNCCL.hpp), so without
  it no entry ever reads "started";
- FlightRecorder.hpp: point-to-point entries carry `is_p2p` and their own `p2p_seq_id`,
  while the group's status counts every work of the group.

What only a GPU can show is in scripts/gpu_check.py's NCCL hang check (`make gpu-check`).
"""

from __future__ import annotations

from dataclasses import replace

from nvrx_appliance.rank import flight_record, stall_rule
from nvrx_appliance.rank.hang_rule import Frame, RankStack
from tests.unit.test_hang_rule import FRESH_S, NOW, STILL_S

NODES = {0: "nodeA", 1: "nodeA", 2: "nodeB", 3: "nodeB"}
TRAIN_STEP = (Frame("train_step", "pretrain.py", 210), Frame("<module>", "pretrain.py", 400))
EVALUATE = (Frame("evaluate", "pretrain.py", 300), Frame("<module>", "pretrain.py", 400))


def nccl_fr_fixture_from_torch_2_13_source(
    rank: int,
    *,
    enqueued: int,
    completed: int,
    states: dict[int, str] | None = None,
    timing: bool = False,
    p2p_group: str | None = None,
) -> dict:
    """One rank's summary of NCCL's recorder: the default group "0" of 4 ranks, its
    collectives 1..enqueued recorded (all-reduces), those up to `completed` done; the
    pending ones "scheduled" unless `states` says "started" (possible with timing only);
    with `p2p_group`, a pipeline group whose last work is a send."""
    states = states or {}

    def entry(seq: int) -> dict:
        state = "completed" if seq <= completed else states.get(seq, "scheduled")
        assert timing or state != "started", "no start event without TORCH_NCCL_ENABLE_TIMING"
        return {"pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": seq,
                "p2p_seq_id": 0, "is_p2p": False, "profiling_name": "nccl:all_reduce",
                "state": state, "time_created_ns": 1_000_000 + seq}  # fmt: skip

    status = {"0": {"last_enqueued_collective": str(enqueued),
                    "last_started_collective": str(max(states, default=-1) if timing else -1),
                    "last_completed_collective": str(completed)}}  # fmt: skip
    entries = [entry(seq) for seq in range(1, enqueued + 1)]
    if p2p_group is not None:
        status["1"] = {"last_enqueued_collective": str(enqueued), "last_started_collective": "-1",
                       "last_completed_collective": str(enqueued - 1)}  # fmt: skip
        entries.append({"pg_id": 1, "process_group": [p2p_group, "pipeline"],
                        "collective_seq_id": enqueued, "p2p_seq_id": 9, "is_p2p": True,
                        "profiling_name": "nccl:send 3->0", "state": "scheduled",
                        "time_created_ns": 2_000_000})  # fmt: skip
    return {
        "generation": "c/7/1", "cycle": 1, "version": 2, "rank": rank, "node": NODES[rank],
        "recorder": "_dump_nccl_trace_json", "timing": timing,
        "stalled": {"pg": "0", "seq": enqueued, "since": NOW - 60},
        "trace": {"pg_status": status, "pg_config": {"0": {"ranks": [0, 1, 2, 3]}},
                  "entries": entries},
    }  # fmt: skip


def stack(rank: int, frames=TRAIN_STEP, state: str = "R", unchanged_s: float = 30.0) -> RankStack:
    """A rank on a GPU: NCCL's waiters spin in `.item()` or a synchronize (state R, CPU
    busy, so never still by their CPU), their frames unchanged for `unchanged_s`."""
    return RankStack(rank, NODES[rank], frames, taken=NOW - 1, still_since=NOW - 1,
                     state=state, same_since=NOW - unchanged_s)  # fmt: skip


def judge(stacks, dumps):
    return stall_rule.judge(stacks, dumps, world_size=4, cycle=1, now=NOW, fresh_s=FRESH_S,
                            still_s=STILL_S)  # fmt: skip


def test_without_timing_a_gpu_hang_of_a_live_rank_is_every_rank_waiting_and_says_why():
    # The sick GPU's rank enqueued the all-reduce like the others; none ever starts.
    dumps = [nccl_fr_fixture_from_torch_2_13_source(r, enqueued=7, completed=6) for r in range(4)]
    found = judge([stack(r) for r in range(4)], dumps)
    assert found.nodes == () and found.kind == ""
    assert found.words.startswith("no verdict in cycle 1: the flight recorder shows every rank")
    assert found.words.endswith(
        "; NCCL records no start without TORCH_NCCL_ENABLE_TIMING, so whose GPU holds the "
        "others is not seen"
    ), found.words


def test_with_timing_a_rank_whose_collective_never_started_names_its_node_only_when_it_stood():
    started = {7: "started"}
    dumps = [
        nccl_fr_fixture_from_torch_2_13_source(
            r, enqueued=7, completed=6, timing=True, states=started if r != 3 else {}
        )
        for r in range(4)
    ]
    assert flight_record.analyse(dumps, 4).device == frozenset({3})
    # Its CPU stood in one call for 30 s, waiting on its GPU: the node's.
    found = judge([stack(r) for r in range(4)], dumps)
    assert found.nodes == ("nodeB",) and found.kind == "hung", found.words
    assert "never started on its device, while its stack stood unchanged in `train_step`" in (
        found.words
    )
    # Issue 53, finding 5: rank 0's (here 3's) all-reduce queued behind minutes of its own
    # GPU evaluation: its CPU runs the evaluation, its frames change. Not the node's.
    evaluating = stack(3, EVALUATE, unchanged_s=2.0)
    found = judge([*(stack(r) for r in range(3)), evaluating], dumps)
    assert found.nodes == () and found.kind == "workload", found.words
    assert "had not started its collective on its device while it ran its own code in " \
        "`evaluate`" in found.words  # fmt: skip


def test_a_rank_behind_on_nccl_standing_in_its_own_code_is_unknown_not_the_workloads():
    # Issue 53, finding 6: NCCL's waiters stand in `.item()` or a synchronize, in the
    # script's own frames. A rank behind (it never enqueued #7) whose frames stood still
    # may wait on its own GPU as well as run its own work: no verdict. On gloo the same
    # stack is the workload's stall (tests/unit/test_stall_rule.py).
    dumps = [nccl_fr_fixture_from_torch_2_13_source(r, enqueued=7, completed=6) for r in range(3)]
    found = judge([*(stack(r) for r in range(3)), stack(3)], dumps)
    assert found.nodes == () and found.kind == "", found.words
    assert "on NCCL a rank waiting on its own GPU stands so" in found.words
    # Its CPU moving through its own code: the workload's own work, no node.
    moving = judge([*(stack(r) for r in range(3)), stack(3, unchanged_s=1.0)], dumps)
    assert moving.kind == "workload" and moving.nodes == ()


def test_a_group_carrying_point_to_point_operations_is_left_out_and_said():
    # A pipeline group's status counts its sends with its collectives: "enqueued 7,
    # completed 6" there says nothing sure about whom anyone waits for.
    dumps = [
        nccl_fr_fixture_from_torch_2_13_source(r, enqueued=7, completed=7, p2p_group="1")
        for r in range(4)
    ]
    flight = flight_record.analyse(dumps, 4)
    assert flight.stalls == () and flight.p2p == ("1",)
    # With the default group stalled too, the words say what was left out.
    mixed = [
        nccl_fr_fixture_from_torch_2_13_source(r, enqueued=7, completed=6, p2p_group="1")
        for r in range(3)
    ]
    found = judge([stack(r) for r in range(4)], mixed)
    assert "process group 1 left out: its status counts point-to-point operations" in found.words


def test_a_stopped_rank_on_nccl_names_its_node_as_on_gloo():
    dumps = [nccl_fr_fixture_from_torch_2_13_source(r, enqueued=7, completed=6) for r in range(3)]
    stopped = replace(stack(3), state="T", still_since=NOW - 30)
    found = judge([*(stack(r) for r in range(3)), stopped], dumps)
    assert found.nodes == ("nodeB",) and found.kind == "hung", found.words
