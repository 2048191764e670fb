"""The late-node rule (goodput/late_node.py): who the others wait for inside the
collectives names a node late for any reason, with its cost, through the straggler
rule's own verdict (goodput/straggler.py)."""

from __future__ import annotations

import pytest

from nvrx_appliance.goodput import late_node, straggler
from nvrx_appliance.observe import collective_waits
from nvrx_appliance.observe.training_log import CycleWork, OwnSteps

POLL_HZ = 10
STEPS_HZ = 5  # collectives completed a second: a data-parallel run's all-reduces


def rank(node: str, r: int, share: float, seconds: int = 60, start: float = 5000.0):
    """A rank polled POLL_HZ times a second for `seconds`, `share` of them inside a
    collective, one snapshot a second; `start` is its own clock (nodes' clocks differ)."""
    history = tuple(
        (start + t, t * POLL_HZ, round(t * POLL_HZ * share), t * STEPS_HZ)
        for t in range(seconds + 1)
    )
    return collective_waits.RankWaits(node, r, history)


def run(shares: dict[str, float], seconds: int = 60) -> list[collective_waits.RankWaits]:
    out = []
    for i, (node, share) in enumerate(sorted(shares.items())):
        # clocks 40 s apart: only shares are compared across nodes
        out += [rank(node, 2 * i + k, share, seconds, 5000.0 + 40 * i) for k in range(2)]
    return out


def test_the_node_the_others_wait_for_is_named_with_its_cost():
    [found] = late_node.judge(run({"node1": 0.7, "node2": 0.1, "node3": 0.68}))
    assert found.node == "node2"
    assert found.own == pytest.approx(0.1, abs=0.01)
    assert found.peers == pytest.approx(0.69, abs=0.01)
    # its peers waited 0.59 of the 60 s the figures cover
    assert found.lost_s == pytest.approx(0.59 * 60, rel=0.03)
    assert found.slowdown == pytest.approx(1 / 0.41, rel=0.03)


def test_healthy_peers_name_nobody():
    assert late_node.judge(run({"node1": 0.42, "node2": 0.35, "node3": 0.4})) == []


def test_all_equally_slow_names_nobody():
    # every node waits a lot (a slow network for all): nobody is late to the others
    assert late_node.judge(run({"node1": 0.8, "node2": 0.8, "node3": 0.78})) == []


def test_one_node_has_no_peers_and_figures_short_of_the_window_judge_nothing():
    assert late_node.judge(run({"node1": 0.1})) == []
    assert late_node.judge(run({"node1": 0.7, "node2": 0.1}, seconds=20)) == []


def test_a_spell_that_passed_names_nobody():
    # node2 was late in the first third of the window only
    def spelled(node: str, r: int, late: bool) -> collective_waits.RankWaits:
        polls = waiting = 0
        history = []
        for t in range(61):
            history.append((1000.0 + t, polls, waiting, t * STEPS_HZ))
            share = 0.7 if not late else (0.1 if 30 <= t < 40 else 0.7)
            polls, waiting = polls + POLL_HZ, waiting + round(POLL_HZ * share)
        return collective_waits.RankWaits(node, r, tuple(history))

    waits = [spelled("node1", 0, False), spelled("node2", 1, True), spelled("node3", 2, False)]
    assert late_node.judge(waits) == []


def test_a_late_node_is_a_straggler_by_the_waits_and_its_words_say_so():
    work = CycleWork("42", 1, "progress log", waits=run({"node1": 0.7, "node2": 0.1}))
    [found] = straggler.judge(work)
    assert (found.node, found.measure) == ("node2", straggler.WAITS)
    assert found.words.startswith("node2 is a straggler in cycle 1 of generation 42: its peers "
                                  "wait inside collectives 70% of the time against 10% on its "
                                  "ranks, late to each one (2.50x over the last 30 s); the run "
                                  "has lost 36 s waiting for it")  # fmt: skip
    assert found.pace == "2.50x, late to its peers' collectives"
    # keeping it costs its peers' excess wait for every second left
    assert straggler.cost_ahead(found, 100.0, None) == pytest.approx(60.0, rel=0.02)
    replace, why = straggler.worth_replacing(found, 100.0, None, (20.0, "measured"))
    assert replace and why.startswith("replaced: it costs 60 s until the generation ends")


def test_a_node_named_by_its_own_step_is_named_once_by_that_measure():
    own = [
        OwnSteps(1000.0 + 5 * i, 10 * (i + 1), 10, {"node1": 0.1, "node2": 0.3}) for i in range(12)
    ]
    waits = run({"node1": 0.7, "node2": 0.1})
    [found] = straggler.judge(CycleWork("42", 0, "progress log", own_steps=own, waits=waits))
    assert (found.node, found.measure) == ("node2", straggler.OWN_STEP)
    assert found.words.startswith("node2 is a straggler in cycle 0 of generation 42: its own step")
    assert found.words.endswith("; its peers also wait inside collectives 70% of the time "
                                "against 10% on its ranks")  # fmt: skip


def test_published_figures_are_read_for_their_generation_and_cycle_only():
    body = {
        "node": "node1",
        "waits": [
            {"generation": "42", "cycle": 1, "node": "node1", "rank": 0,
             "history": [[1.0, 10, 3], [2.0, 20, 9]]},
            {"generation": "42", "cycle": 0, "node": "node1", "rank": 1, "history": [[1.0, 1, 0]]},
            {"generation": "41", "cycle": 1, "node": "node1", "rank": 2, "history": [[1.0, 1, 0]]},
            {"generation": "42", "cycle": 1, "node": "node1", "rank": 3,
             "history": [[1.0, 1, 5], "torn"]},
        ],
    }  # fmt: skip
    found = collective_waits.parse(body, "42", 1)
    # figures without the collectives completed (the watch's before issue 53) read -1
    assert [(w.rank, w.history) for w in found] == [(0, ((1.0, 10, 3, -1), (2.0, 20, 9, -1)))]


def test_the_newest_generations_newest_cycle_is_read_back_even_without_a_progress_log(tmp_path):
    import json

    from nvrx_appliance.goodput import wait_record
    from nvrx_appliance.layout import Layout

    layout = Layout(tmp_path)
    late = run({"node1": 0.7, "node2": 0.1})

    def publish(generation: str, cycle: int, node: str) -> None:
        entries = [
            {"generation": generation, "cycle": cycle, "node": w.node, "rank": w.rank,
             "history": [list(h) for h in w.history]}
            for w in late if w.node == node
        ]  # fmt: skip
        where = layout.stacks(generation) / f"cycle{cycle}"
        where.mkdir(parents=True, exist_ok=True)
        (where / f"{node}.json").write_text(json.dumps({"node": node, "waits": entries}))

    for generation, cycle in (("7", 0), ("8", 0), ("8", 1)):
        for node in ("node1", "node2"):
            publish(generation, cycle, node)
    work: dict = {}
    wait_record.attach(layout, work, ["7", "8"], create=False)
    assert work == {}  # the goodput account: only what the workload recorded
    wait_record.attach(layout, work, ["7", "8"])
    assert list(work) == [("8", 1)] and work["8", 1].source == wait_record.SOURCE
    [found] = straggler.judge(work["8", 1])
    assert (found.node, found.generation, found.cycle) == ("node2", "8", 1)


def test_the_local_clusters_descheduled_node_is_named_from_its_recorded_figures():
    # The published figures of tests/integration/test_straggler_cluster.py's descheduled
    # node (node2: its ranks run 0.2 s of every 0.6 s), as the nodes' files held them in
    # its run of 2026-12-06 (with the collectives completed, issue 53).
    import json
    from pathlib import Path

    from nvrx_appliance.rank.flight_site import sitecustomize as site

    assert late_node.TICK_S == site.TICK_S
    recorded = Path(__file__).parent / "fixtures" / "late_node" / "descheduled.json"
    bodies = json.loads(recorded.read_text())
    waits = [w for body in bodies.values() for w in collective_waits.parse(body, "49", 0)]
    # per poll its ranks looked nearly as busy in collectives as their peers (0.65 against
    # 0.87); by wall time they were not: they were stopped. Both its ranks lag, and each
    # part of the window completed hundreds of collectives: the node's own lag.
    [found] = late_node.judge(waits)
    assert found.node == "node2"
    assert found.own == pytest.approx(0.22, abs=0.02)
    assert found.peers == pytest.approx(0.88, abs=0.02)
    assert late_node.withheld(waits) == []


# Issue 53: a node is named only when the lag is the node's, never from the workload's
# own work on some of its ranks, however long.


def save_run(ranks_per_node: int, saving: set[int], completed_hz: float = 0.0, nodes: int = 4):
    """A run whose `saving` ranks work alone (rank 0's checkpoint save, paced as slow
    shared storage is) while every other rank waits in the barrier after it: they wait
    93% of the time, the savers 3%; `completed_hz` collectives complete a second."""
    out = []
    for n in range(nodes):
        for k in range(ranks_per_node):
            r = n * ranks_per_node + k
            share = 0.03 if r in saving else 0.93
            history = tuple(
                (5000.0 + t, t * POLL_HZ, round(t * POLL_HZ * share), int(t * completed_hz))
                for t in range(61)
            )
            out.append(collective_waits.RankWaits(f"node{n + 1}", r, history))
    return out


def test_rank_0_saving_alone_names_no_straggler_with_two_or_four_ranks_a_node():
    # The run: rank 0 alone writes a checkpoint for 35 s while the others wait in
    # the barrier after it; its node's share was 48% against 93% (1.82x; 1.33x at 4 ranks
    # a node, still over the rule), and it was named a straggler.
    for per_node in (2, 4):
        waits = save_run(per_node, {0}, completed_hz=STEPS_HZ)
        assert late_node.judge(waits) == [], per_node
        [why] = late_node.withheld(waits)
        assert why.startswith("node1 lags (inside collectives "), why
        assert "but only its rank(s) 0 lag while its rank(s) " in why
        assert "the lag follows those ranks' own work (rank 0's save" in why
        work = CycleWork("42", 0, "progress log", waits=waits)
        assert straggler.judge(work) == []
        assert straggler.withheld(work) == [
            f"no straggler named in cycle 0 of generation 42: {why}"
        ]


def test_a_scripts_own_stall_on_its_last_rank_names_no_straggler():
    # The second run: the last rank stands 100 s in its own `upload_metrics`
    # while the others wait in the all-reduce; node2 was named ("86% against 44%").
    waits = save_run(2, {3}, nodes=2)
    assert late_node.judge(waits) == []
    assert (
        "but only its rank(s) 3 lag while its rank(s) 2 wait like its peers"
        in (late_node.withheld(waits)[0])
    )


def test_every_rank_of_a_node_held_in_one_long_wait_is_not_a_straggler():
    # A node whose every rank writes (a checkpoint format where each model-parallel rank
    # of data-parallel rank 0 saves): the others wait in one barrier; no collective
    # completes, so nobody is late "to each one".
    waits = save_run(2, {0, 1}, completed_hz=0.0)
    assert late_node.judge(waits) == []
    assert (
        "but its peers completed 0 collective(s) in 10 s: one long wait"
        in (late_node.withheld(waits)[0])
    )
    # The same shares, spread over collectives that complete: a slow node.
    [found] = late_node.judge(save_run(2, {0, 1}, completed_hz=STEPS_HZ))
    assert found.node == "node1"


def test_a_node_of_one_rank_cannot_tell_its_lag_from_its_ranks_work():
    waits = save_run(1, {0}, completed_hz=STEPS_HZ)
    assert late_node.judge(waits) == []
    assert "but it runs one rank (rank 0)" in late_node.withheld(waits)[0]


def test_figures_without_collective_counts_name_nobody():
    waits = [
        collective_waits.RankWaits(w.node, w.rank, tuple(h[:3] for h in w.history))
        for w in run({"node1": 0.7, "node2": 0.1})
    ]
    assert late_node.judge(waits) == []
    assert "do not count the collectives completed" in late_node.withheld(waits)[0]


def test_figures_of_ranks_on_nccl_are_not_judged():
    # On NCCL "enqueued and not completed" is GPU work queued (torch 2.13's
    # ProcessGroupNCCL updates pg_status from CUDA events), not a waiting CPU.
    waits = [
        collective_waits.RankWaits(w.node, w.rank, w.history, nccl=True)
        for w in run({"node1": 0.7, "node2": 0.1})
    ]
    assert late_node.judge(waits) == []
    assert late_node.withheld(waits)[0].startswith(
        "time inside collectives is not measured on NCCL (node1, node2)"
    )
    body = {"waits": [{"generation": "4", "cycle": 0, "node": "n", "rank": 0, "nccl": True,
                       "history": [[1.0, 10, 3, 2]]}]}  # fmt: skip
    assert collective_waits.parse(body, "4", 0)[0].nccl


def test_status_says_why_the_running_generation_names_no_straggler():
    # "Where the evidence cannot tell, say 'no verdict' with what was seen": in the words
    # a person reads (status, its human output).
    from nvrx_appliance.chain import status
    from tests.unit import test_status as st

    work = CycleWork("4250", 0, "progress log", waits=save_run(2, {0}, completed_hz=STEPS_HZ))
    view = status.assemble(
        manifest=st.MANIFEST, queue=st.slurm_output.squeue_tasks(st.SQUEUE),
        acct=st.slurm_output.sacct_rows(st.SACCT), ledger=st.LEDGER, cycles={},
        checkpoint_now=60, chain_marker=True, now=st.parse_time(st.NOW),
        stragglers=straggler.judge(work),
        unnamed=[(work.generation, why) for why in straggler.withheld(work)],
    )  # fmt: skip
    text = " ".join(st._rendered(view).split())
    assert "straggler: no straggler named in cycle 0 of generation 4250: node1 lags " in text
    assert "but only its rank(s) 0 lag while its rank(s) 1 wait like its peers" in text
    assert "straggler: node1 is a straggler" not in text


def test_a_rank_stopped_through_a_whole_part_lags_and_does_not_wait():
    # A rank that took no polls in a part (stopped throughout) waited in none of it: its
    # node's lag is every rank's, and the node is named.
    waits = save_run(2, {0, 1}, completed_hz=STEPS_HZ)
    frozen = waits[1]
    at_stop = frozen.history[40]  # its counts stand still from its 40th second on
    stopped = tuple(h if h[0] < at_stop[0] else (h[0], at_stop[1], at_stop[2], h[3])
                    for h in frozen.history)  # fmt: skip
    waits[1] = collective_waits.RankWaits(frozen.node, frozen.rank, stopped)
    [found] = late_node.judge(waits)
    assert found.node == "node1"
