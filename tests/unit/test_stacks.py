"""The guard's stack files, pure parts and the small readers: py-spy's JSON read, a
sample as the rule sees it, the free hot spares, and the hand-off task 0 looks for."""

from __future__ import annotations

import json

from nvrx_appliance import manifest
from nvrx_appliance.jobhost import node_memory
from nvrx_appliance.node.health_check import Identity, judge_hang
from nvrx_appliance.observe import hangs
from nvrx_appliance.rank import sampler, stacks
from nvrx_appliance.rank.hang_rule import Frame, RankStack, judge
from nvrx_appliance.settings.chain import ChainSpec, check

DUMP = [
    {"pid": 7, "os_thread_id": 9, "frames": [{"name": "gloo_thread", "filename": "/x.py", "line": 1}]},
    {
        "pid": 7,
        "os_thread_id": 7,
        "frames": [
            {"name": "all_reduce", "filename": "/venv/torch/distributed/distributed_c10d.py",
             "short_filename": "torch/distributed/distributed_c10d.py", "line": 3252},
            {"name": "_train_step", "short_filename": "nvrx_appliance/workloads/trainer.py",
             "line": 233},
        ],
    },
]  # fmt: skip


def test_the_main_thread_is_read_from_py_spys_json_by_its_thread_id():
    frames = sampler.main_thread_frames(DUMP, 7)
    assert frames == [
        {"name": "all_reduce", "file": "torch/distributed/distributed_c10d.py", "line": 3252},
        {"name": "_train_step", "file": "nvrx_appliance/workloads/trainer.py", "line": 233},
    ]
    assert sampler.main_thread_frames(DUMP, 8) is None
    assert sampler.main_thread_frames({"not": "a dump"}, 7) is None


def test_free_hot_spares_count_the_spares_already_used_since_cycle_0():
    first = ({"node1", "node2"}, set())
    assert stacks.free_hot_spares(1, [first]) == 1
    assert stacks.free_hot_spares(1, [first, ({"node1", "node3"}, set())]) == 0  # node3 came in
    assert stacks.free_hot_spares(0, [first, ({"node1", "node2"}, {"node4"})]) == 1  # listed
    assert stacks.free_hot_spares(2, []) == 2


def test_task_0_hands_off_only_for_a_standing_verdict_of_its_generation_that_asks(tmp_path):
    gen = "chain-1/41/2026-12-04T10:00:00"
    assert stacks.hand_off_wanted(tmp_path / "none", gen) is None
    words = "node3 hung in cycle 2: its 2 ranks stopped in `_train_step` while 4 others waited"
    (tmp_path / "hung.node3").write_text(json.dumps({"generation": gen, "words": words}))
    assert stacks.hand_off_wanted(tmp_path, gen) is None  # a hot spare takes its place
    marker = {"generation": gen, "words": words, "hand_off": True}
    (tmp_path / "hung.node3").write_text(json.dumps(marker))
    assert stacks.hand_off_wanted(tmp_path, gen) == (
        f"{words}; no free hot spare, so the generation hands off"
    )
    assert stacks.hand_off_wanted(tmp_path, "chain-1/40/2026-12-04T09:00:00") is None
    (tmp_path / "withdrawn.node3").write_text("{}")
    assert stacks.hand_off_wanted(tmp_path, gen) is None


def _watch(tmp_path, monkeypatch) -> stacks.StackWatch:
    for name, value in (("RANK", "3"), ("WORLD_SIZE", "4"), ("SLURMD_NODENAME", "node3"),
                        ("TORCHELASTIC_RESTART_COUNT", "2")):  # fmt: skip
        monkeypatch.setenv(name, value)
    m = manifest.build(ChainSpec(work_dir=str(tmp_path), workload="cpu"), created="c", user="u")
    return stacks.StackWatch(m, "c/41/t", pid=1, say=lambda _: None)


def _verdict(tmp_path, held: list[int]):
    """A verdict of cycle 2 naming node3, whose rank(s) `held` the others stood still in."""
    hangs = tmp_path / "nvrx" / "41" / "hangs"
    hangs.mkdir(parents=True)
    judged = [{"name": "_train_step", "file": "trainer.py", "line": 226}]
    record = {"generation": "c/41/t", "cycle": 2, "held": {"node3": held},
              "stacks": [{"rank": 3, "frames": judged}]}  # fmt: skip
    (hangs / "cycle2.json").write_text(json.dumps(record))
    (hangs / "hung.node3").write_text(json.dumps({"generation": "c/41/t", "cycle": 2}))
    return hangs, judged


MOVED = {"frames": [{"name": "_train", "file": "trainer.py", "line": 9}], "state": "R"}


def test_a_verdict_is_withdrawn_when_a_rank_it_held_moves_again(tmp_path, monkeypatch):
    watch = _watch(tmp_path, monkeypatch)
    hangs, judged = _verdict(tmp_path, held=[3])
    watch._moved_since_verdict({"frames": judged, "state": "T"})  # where the judgement saw it
    assert not (hangs / "withdrawn.node3").exists()
    watch._moved_since_verdict(MOVED)
    assert (hangs / "withdrawn.node3").exists()


def test_a_sibling_that_waited_or_a_rank_stopped_by_torch_elastic_withdraws_nothing(
    tmp_path, monkeypatch
):
    # Issue 53: any rank of the named node once withdrew the verdict, so its siblings
    # changing frames as the workers were torn down took back a right verdict.
    watch = _watch(tmp_path, monkeypatch)
    hangs, _ = _verdict(tmp_path, held=[2])  # rank 2 held the others; this guard's is 3
    watch._moved_since_verdict(MOVED)
    assert not (hangs / "withdrawn.node3").exists()
    held = _watch(tmp_path / "other", monkeypatch)
    _verdict(tmp_path / "other", held=[3])
    held.stopping.set()  # torch elastic's TERM: the workers are being stopped
    held._moved_since_verdict(MOVED)
    assert not (tmp_path / "other" / "nvrx" / "41" / "hangs" / "withdrawn.node3").exists()


def test_under_the_nodes_publisher_a_guard_looks_for_the_marker_locally(tmp_path, monkeypatch):
    # Issue 53: every rank stat'ed hangs/hung.<node> on the shared file system at every
    # sample (~3,300 a second at 16,384 ranks); the node's publisher looks once a period
    # and keeps the marker in the node-local directory.
    from nvrx_appliance.node.stack_publisher import Publisher

    local = tmp_path / "local"
    monkeypatch.setenv(sampler.LOCAL_STACKS_ENV, str(local))
    watch = _watch(tmp_path, monkeypatch)
    hangs, _ = _verdict(tmp_path, held=[3])
    watch._moved_since_verdict(MOVED)
    assert not (hangs / "withdrawn.node3").exists()  # the publisher has not looked yet
    publisher = Publisher(local, tmp_path / "stacks", "node3", 5.0, print, hangs=hangs)
    publisher.prepare()
    publisher.look()
    assert json.loads((local / stacks.VERDICT).read_text())["cycle"] == 2
    watch._moved_since_verdict(MOVED)
    assert (hangs / "withdrawn.node3").exists()


def test_a_hang_record_reads_back_grouped_for_a_person():
    waiting = (Frame("all_reduce", "torch/distributed/distributed_c10d.py", 3252),
               Frame("_train_step", "nvrx_appliance/workloads/trainer.py", 233))  # fmt: skip
    frozen = (Frame("_train_step", "nvrx_appliance/workloads/trainer.py", 226),)
    ranks = [RankStack(0, "node1", waiting, 99.0, 0.0), RankStack(1, "node2", frozen, 99.0, 0.0)]
    found = judge(ranks, world_size=2, cycle=1, now=100.0, fresh_s=15, still_s=10)
    record = stacks.record_of(found, [], generation="c/41/t", cycle=1, judged_by={},
                              hand_off=False)  # fmt: skip
    hang = hangs.parse(json.dumps(record), withdrawn=set())
    assert hang is not None and hang.standing == ("node2",)
    assert hangs.grouped(hang) == [
        "node2 hung in cycle 1: its 1 rank stopped in `_train_step` while the 1 other waited "
        "in `all_reduce`",
        "  rank 0 on node1 waited in `all_reduce`:",
        "      all_reduce (torch/distributed/distributed_c10d.py:3252)",
        "      _train_step (nvrx_appliance/workloads/trainer.py:233)",
        "  rank 1 on node2 stood in `_train_step`:",
        "      _train_step (nvrx_appliance/workloads/trainer.py:226)",
    ]
    assert hangs.sentence(hang, 86400).endswith(
        "; kept out of the next rendezvous (a hot spare takes its place) and of this chain's "
        "generations for 24 h"
    )


def test_a_sampling_period_too_long_for_the_step_timeout_is_refused_naming_the_fix():
    [problem] = check(ChainSpec(work_dir="/w", workload="cpu", stack_sampling=20, step_timeout=30))
    assert problem.option == "--stack-sampling"
    assert "use at most 10 s, or 0 to turn sampling off" in problem.message
    assert not check(ChainSpec(work_dir="/w", workload="cpu", stack_sampling=0, step_timeout=30))


def test_the_hung_marker_the_guard_writes_is_the_one_node_memory_and_the_health_check_read(
    tmp_path,
):
    record = {"generation": "c/41/t", "cycle": 2, "words": "node3 hung in cycle 2: ...",
              "hand_off": True}  # fmt: skip
    (tmp_path / "hung.node3").write_text(json.dumps(stacks.marker_of(record)))
    [found] = node_memory.hung_nodes(str(tmp_path), "c", "41")
    assert found == {"node": "node3", "words": "node3 hung in cycle 2: ...",
                     "stacks": str(tmp_path / "cycle2.json"), "hand_off": True}  # fmt: skip
    me = Identity(generation="c/41/t", task=1, job_id="42", node="node3")
    assert not judge_hang((tmp_path / "hung.node3").read_text(), False, me).healthy
    assert stacks.hand_off_wanted(tmp_path, "c/41/t") is not None


def test_a_second_stall_of_the_scripts_own_code_on_one_node_with_another_rank_names_no_node(
    tmp_path, monkeypatch
):
    # Issue 53, finding 9: the generation's earlier stall of the workload's own code on
    # node3 (rank 2's) and this one (rank 3's, same node) once named node3 hung: "it held
    # the others again with other ranks on it". With two ranks a node, a stall that falls
    # on a random rank lands on one node twice by chance; its own code is never the node's.
    from tests.unit.test_stall_rule import UPLOAD, dumps

    watch = _watch(tmp_path, monkeypatch)  # rank 3 on node3, cycle 2, generation c/41/t
    hangs = tmp_path / "nvrx" / "41" / "hangs"
    hangs.mkdir(parents=True)
    earlier = {"generation": "c/41/t", "cycle": 1, "verdict": "workload", "stalled": {"node3": [2]}}
    (hangs / "cycle1.json").write_text(json.dumps(earlier))
    now = __import__("time").time()
    waiting = [{"name": "all_reduce", "file": "torch/distributed/distributed_c10d.py", "line": 1}]
    own = [{"name": f.name, "file": f.file, "line": f.line} for f in UPLOAD]
    nodes = {0: "node1", 1: "node1", 2: "node3", 3: "node3"}
    for node in ("node1", "node3"):
        samples = [
            {"generation": "c/41/t", "cycle": 2, "rank": r, "node": n, "epoch": now - 1,
             "still_since": now - 30, "state": "S", "frames": own if r == 3 else waiting}
            for r, n in nodes.items() if n == node
        ]  # fmt: skip
        watch.samples.mkdir(parents=True, exist_ok=True)
        (watch.samples / f"{node}.json").write_text(json.dumps({"node": node, "samples": samples}))
    where = watch.samples / "flight"
    where.mkdir()
    for d in dumps("late"):  # ranks 0-2 wait for rank 3 in the all-reduce
        (where / f"{nodes[d['rank']]}.rank{d['rank']}.json").write_text(
            json.dumps({**d, "generation": "c/41/t", "cycle": 2, "node": nodes[d["rank"]]})
        )
    watch.judge_first(hangs / "cycle2.json")
    record = json.loads((hangs / "cycle2.json").read_text())
    assert record["verdict"] == "workload" and record["nodes"] == [], record["words"]
    assert not (hangs / "hung.node3").exists()


WATCHDOG_LINE = (  # torch 2.13's ProcessGroupNCCL watchdog, as its LOG(ERROR) prints it
    "[rank1]:[E1218 20:27:21.433063423 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1024, "
    "NumelOut=1024, Timeout(ms)=600000) ran for 600081 milliseconds before timing out."
)


def test_nccls_watchdog_abort_is_judged_as_a_hang_with_its_words(tmp_path, monkeypatch):
    # Issue 53, finding 7: NCCL's 10-minute watchdog aborts every rank (exit 134) before
    # a 600 s stillness count ends; 134 was never judged, so a GPU hang of a script
    # restarted on the same node with no verdict.
    from nvrx_appliance.rank import kill_cause

    said = kill_cause.nccl_watchdog(["training...", WATCHDOG_LINE, "terminate called after..."])
    assert said == ("`WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, "
                    "Timeout(ms)=600000)` ran for 600081 milliseconds")  # fmt: skip
    assert kill_cause.nccl_watchdog(["Aborted (core dumped)"]) is None  # another abort
    watch = _watch(tmp_path, monkeypatch)
    assert watch.after_exit(kill_cause.ABORTED, stopping=False, watchdog=said)
    record = json.loads((tmp_path / "nvrx" / "41" / "hangs" / "cycle2.json").read_text())
    assert record["verdict"] == "none"  # no stacks here: judged, and nobody named
    assert record["words"].endswith(f"; NCCL's watchdog aborted the ranks (exit 134): {said}")
    assert watch.verdict() == {"verdict": "none", "words": record["words"]}
    other = _watch(tmp_path / "b", monkeypatch)  # an abort NCCL did not explain
    assert not other.after_exit(kill_cause.ABORTED, stopping=False, watchdog=None)


def test_a_workload_stall_a_stillness_kill_ended_says_to_raise_the_timeout_or_open_a_section():
    # Issue 53, finding 9: rank 0 saving longer than --out-of-section-timeout: the guards
    # end every waiting rank each cycle; the words now say what to do.
    words = stacks.ended_by(None, True, 20.0) + stacks.advice("workload", None)
    assert words == (
        "the guards ended the still ranks past --out-of-section-timeout (20 s); if that work "
        "is the workload's (a save, an evaluation, an upload), raise the timeout or open "
        "NVRx's checkpointing section around it"
    )
    assert stacks.advice("hung", None) == ""


def test_a_hang_record_accounts_for_its_kills_only_where_the_evidence_placed_or_saw_a_hang():
    # Node memory skips the kills a hang's verdict explains (issue 53, finding 2): the
    # workload's own stall, a named node, or a cycle that stood still and that the
    # evidence could not place. A rank killed while the others trained is its node's
    # failure, as before (tests/integration/test_bad_nodes.py kills one with SIGKILL).
    assert stacks.explains_kill({"verdict": "workload"})
    assert stacks.explains_kill({"verdict": "hung"})
    assert stacks.explains_kill({"verdict": "none", "stood_still": True})
    assert not stacks.explains_kill({"verdict": "none", "stood_still": False})
    moving = RankStack(0, "n1", (), taken=99.0, still_since=98.0)
    still = RankStack(1, "n2", (), taken=99.0, still_since=70.0)
    assert not stacks.stood_still([moving, still], [], now=100.0, still_s=10.0)
    assert stacks.stood_still([still], [], now=100.0, still_s=10.0)
    assert stacks.stood_still([moving], [{"rank": 1}], now=100.0, still_s=10.0)  # a summary
