"""The slow-node rule (goodput/straggler.py) and the evidence it reads: the cpu trainer's
own step times in the progress log, Megatron's straggler report lines."""

from __future__ import annotations

import json

import pytest

from nvrx_appliance.chain import status
from nvrx_appliance.goodput import straggler
from nvrx_appliance.observe.training_log import (
    CycleWork,
    OwnSteps,
    ProgressRecord,
    from_megatron_log,
)

HEALTHY = {"node1": 0.100, "node2": 0.104, "node3": 0.097, "node4": 0.101}


def cycle(*intervals: dict[str, float], steps: int = 10) -> CycleWork:
    """A cycle whose logged intervals (of `steps` steps each) hold these own step times."""
    own = [
        OwnSteps(1000.0 + 5.0 * i, (i + 1) * steps, steps, dict(s)) for i, s in enumerate(intervals)
    ]
    return CycleWork("42", 0, "progress log", own_steps=own)


def slow(node: str, factor: float, base: dict[str, float] = HEALTHY) -> dict[str, float]:
    return {**base, node: base[node] * factor}


def test_a_node_persistently_slower_than_its_peers_is_named_with_its_slowdown():
    work = cycle(*[slow("node3", 1.6)] * 12)
    [found] = straggler.judge(work)
    assert found.node == "node3"
    assert found.slowdown == pytest.approx(1.6 * 0.097 / 0.101, rel=0.01)
    assert found.steps == 120
    assert "node3 is a straggler in cycle 0 of generation 42" in found.words
    assert "1.54x over the last 120 steps" in found.words


def test_what_a_straggler_cost_is_its_excess_over_its_peers_times_the_steps():
    work = cycle(*[{"node1": 0.1, "node2": 0.1, "node3": 0.3}] * 12)
    [found] = straggler.judge(work)
    assert found.lost_s == pytest.approx(120 * 0.2)
    assert "the run has lost 24 s waiting for it" in found.words


def test_one_slow_step_names_nobody():
    # One step of 5 s in an interval of ten: that interval's mean is 0.6 s, six times
    # its peers', but only in one part of the window.
    intervals = [HEALTHY] * 12
    intervals[7] = slow("node2", 6.0)
    assert straggler.judge(cycle(*intervals)) == []


def test_a_slow_spell_that_passed_names_nobody():
    intervals = [slow("node1", 2.0)] * 5 + [HEALTHY] * 7
    assert straggler.judge(cycle(*intervals)) == []


def test_jitter_between_healthy_nodes_names_nobody():
    swings = [0.8, 1.3, 1.1, 0.7, 1.5, 1.0, 0.9, 1.25, 1.4, 0.85, 1.2, 0.95]
    intervals = [slow("node2", f) for f in swings]
    assert straggler.judge(cycle(*intervals)) == []


def test_too_few_steps_to_judge_names_nobody():
    assert straggler.judge(cycle(*[slow("node3", 3.0)] * 11)) == []


def test_a_single_node_has_no_peers_and_is_never_a_straggler():
    assert straggler.judge(cycle(*[{"node1": 5.0}] * 20)) == []


def test_the_verdict_is_about_the_recent_past_a_recovered_node_is_let_go():
    intervals = [slow("node4", 2.0)] * 30 + [HEALTHY] * 12
    assert straggler.judge(cycle(*intervals)) == []


def test_the_slowest_of_two_stragglers_comes_first():
    both = {**slow("node1", 1.5), "node4": 0.101 * 2.5}
    assert [s.node for s in straggler.judge(cycle(*[both] * 12))] == ["node4", "node1"]


def test_replacing_pays_only_when_the_cost_to_the_generations_end_exceeds_a_restart():
    [found] = straggler.judge(cycle(*[{"node1": 0.1, "node2": 0.1, "node3": 0.3}] * 12))
    measured = (60.0, "the median of this chain's 2 in-job restart(s)")
    # Intervals of 10 steps logged 5 s apart: 0.5 s a step. 450 s left hold 900 steps,
    # each 0.2 s longer than it need be: 180 s.
    assert found.wall_step_s == pytest.approx(0.5)
    replace, why = straggler.worth_replacing(found, 450.0, None, measured)
    assert replace and why == (
        "replaced: it costs 180 s until the generation ends, more than a restart (60 s, "
        "the median of this chain's 2 in-job restart(s))"
    )
    keep, why = straggler.worth_replacing(found, 100.0, None, measured)
    assert not keep and why.startswith("kept: it costs 40 s until the generation ends, no more")
    # Training ends in 100 steps, long before the time limit: 20 s to lose, kept.
    keep, _ = straggler.worth_replacing(found, 3600.0, 100, measured)
    assert not keep
    keep, why = straggler.worth_replacing(found, 3600.0, None, (None, "not measured yet"))
    assert not keep and "restart cost is not measured yet" in why


def test_a_restart_costs_the_chains_measured_median_else_this_cycles_start_up():
    def work(generation, number, setup_at, first_step, last_sign):
        w = CycleWork(
            generation, number, "progress log", setup=[("worker processes start", setup_at)]
        )
        w.steps, w.last_sign = [(first_step, 1)], last_sign
        return w

    first = work("7", 0, 100.0, 112.0, 300.0)
    assert straggler.restart_cost([first], first) == (
        12.0, "this cycle's own start-up (a lower bound)"
    )  # fmt: skip
    restarts = [first, work("7", 1, 305.0, 330.0, 500.0), work("7", 2, 505.0, 540.0, 600.0)]
    assert straggler.restart_cost(restarts, restarts[-1]) == (
        35.0, "the median of this chain's 2 in-job restart(s)"
    )  # fmt: skip


def test_the_trainers_step_events_carry_each_nodes_own_step_time():
    record = ProgressRecord()
    for i in range(12):
        record.feed(
            {"event": "step", "slurm_array_job_id": "42", "cycle": 1, "iteration": 10 * (i + 1),
             "time": 1000.0 + i, "own_step_s": {"node1": 0.1, "node2": 0.25}, "own_steps": 10}
        )  # fmt: skip
    work = record.record()[("42", 1)]
    assert work.own_steps[0] == OwnSteps(1000.0, 10, 10, {"node1": 0.1, "node2": 0.25})
    [found] = straggler.judge(work)
    assert (found.node, found.cycle, round(found.slowdown, 2)) == ("node2", 1, 2.5)


def test_a_step_event_without_own_step_times_is_still_a_step():
    record = ProgressRecord()
    event = {"event": "step", "slurm_array_job_id": "42", "iteration": 10, "time": 1.0}
    record.feed(json.loads(json.dumps(event)))
    work = record.record()[("42", 0)]
    assert work.steps == [(1.0, 10)] and work.own_steps == []


def megatron_lines(slowest: int, ms: float, reports: int) -> list[str]:
    lines = []
    for r in range(reports):
        stamp = f"2026-12-01 10:{r // 60:02d}:{r % 60:02d}"
        lines.append(
            f" [{stamp}] iteration {20 * (r + 1):8d}/    1000 | consumed samples: 1 | "
            "elapsed time per iteration (ms): 812.3 |"
        )
        lines.append(
            f"INFO:megatron.core.utils:[{stamp}] | MnRtt/Rnk: 400.00ms/0 | "
            f"MxRtt/Rnk: {ms:.2f}ms/{slowest} | MnPwr/Rnk: 601796W/8 | MxPwr/Rnk: 683801W/1 | "
            "MnEtpt/Rnk: 296.02TF/0 | MxEtpt/Rnk: 297.32TF/8"
        )
    return lines


def test_megatrons_straggler_report_names_a_rank_and_nobody_acts_on_it():
    work = from_megatron_log(megatron_lines(slowest=5, ms=800.0, reports=7), "42", 0)
    assert work is not None and work.own_steps_by_rank
    assert work.own_steps[1] == OwnSteps(
        work.own_steps[1].time, 40, 20, {"rank 0": 0.4, "rank 5": 0.8}
    )
    [found] = straggler.judge(work)
    assert found.node == "rank 5" and found.slowdown == pytest.approx(2.0)
    assert "rank 5 (Megatron's report names ranks, not nodes) is a straggler" in found.words
    assert straggler.worth_replacing(found, 10.0**6, None, (1.0, "")) == (
        False,
        "the evidence names a rank, not a node: kept",
    )


def test_status_names_the_running_generations_straggler_and_forgets_an_ended_ones():
    from tests.unit import test_status as st

    def view(generation: str):
        work = cycle(*[{"node2": 0.1, "node3": 0.3}] * 12)
        work.generation = generation
        return status.assemble(
            manifest=st.MANIFEST, queue=st.slurm_output.squeue_tasks(st.SQUEUE),
            acct=st.slurm_output.sacct_rows(st.SACCT), ledger=st.LEDGER, cycles={},
            checkpoint_now=60, chain_marker=True, now=st.parse_time(st.NOW),
            stragglers=straggler.judge(work),
        )  # fmt: skip

    text = st._rendered(view("4250"))
    assert (
        "straggler: node3 is a straggler in cycle 0 of generation 4250: its own step takes "
        "300 ms against 100 ms on its peers (3.00x over the last 120 steps); the run has "
        "lost 24 s waiting for it"
    ) in " ".join(text.split())
    assert view("4242").stragglers == ()


def test_report_says_what_a_straggler_cost_in_wall_time_and_node_seconds():
    from nvrx_appliance.goodput import summary
    from nvrx_appliance.goodput.account import account
    from nvrx_appliance.observe.training_log import from_progress_log
    from tests.unit.test_goodput import T0, chain_inputs

    events = [
        {"event": "start", "slurm_array_job_id": "11", "cycle": 0, "time": T0 + 115, "iteration": 0}
    ] + [
        {"event": "step", "slurm_array_job_id": "11", "cycle": 0, "time": T0 + 116 + i,
         "iteration": 10 * (i + 1), "own_step_s": {"node1": 0.1, "node2": 0.4}, "own_steps": 10}
        for i in range(12)
    ]  # fmt: skip
    result = account(chain_inputs(work=from_progress_log(events)))
    text = "\n".join(summary.lines(result))
    assert (
        "straggler in generation 11, cycle 0: node2, 4.00x its peers' step; the run lost 36 s "
        "waiting for it (72 node-seconds on its 2 nodes)"
    ) in text
    [found] = summary.to_json(result)["stragglers"]
    assert (found["node"], found["lost_node_seconds"]) == ("node2", pytest.approx(72.0))
    assert found["action"] is None  # the generation's ledger entry says nothing of it
    # Once its generation's ledger entry says what task 0 did about it, the report says it.
    acted = {"array_job_id": "11", "action": "saved_at_time_limit",
             "stragglers": [{"node": "node2", "action": "kept: task 0's own node is not "
                             "replaced in-job (that would end the generation)"}]}  # fmt: skip
    result = account(chain_inputs(work=from_progress_log(events), ledger=[acted]))
    assert (
        "waiting for it (72 node-seconds on its 2 nodes); kept: task 0's own node is not "
        "replaced in-job"
    ) in "\n".join(summary.lines(result))
    assert summary.to_json(result)["stragglers"][0]["action"].startswith("kept: task 0's own")


def test_a_straggler_told_to_leave_fails_nvrxs_health_check_with_the_reason(tmp_path):
    from nvidia_resiliency_ext.shared_utils.health_check import NodeHealthCheck

    from nvrx_appliance.node import health_check, straggler_leave
    from tests.unit.test_drain import GEN, ME

    [found] = straggler.judge(cycle(*[{"node4": 0.1, "node5": 0.3}] * 12))
    said: list[str] = []
    check = health_check.DrainCheck(tmp_path / "task_3", ME, site_endpoint="", log=said.append)
    check.leave = tmp_path / "leave.node5"
    with health_check.serving(check) as socket:
        assert socket is not None
        nvrx = NodeHealthCheck(endpoint=socket)  # what ft_launcher builds from the flag
        assert nvrx() is True  # nobody decided anything yet
        for other in ("another generation", GEN):
            node = "node5" if other != GEN else "node4"  # ...or about another node
            text = straggler_leave.decision(other, node, 40, found, "replaced: it costs")
            check.leave.write_text(text)
            check.leave.chmod(0o600)
            assert nvrx() is True
        check.leave.write_text(straggler_leave.decision(GEN, "node5", 40, found, "replaced: x"))
        check.leave.chmod(0o666)  # anyone could have written it: not trusted
        assert nvrx() is True
        check.leave.chmod(0o600)
        assert nvrx() is False
    assert said[-1].startswith("a straggler: node5 is a straggler in cycle 0 of generation 42")
    assert said[-1].endswith("; replaced: x; node5 leaves")


def _replace_chain(work_dir, time_limit: str = "01:00:00", action: str = "replace"):
    from nvrx_appliance import manifest
    from nvrx_appliance.settings.chain import ChainSpec

    spec = ChainSpec(
        work_dir=str(work_dir), workload="cpu", train_tasks=2, hot_spares=1, mode="train",
        straggler_action=action, time_limit=time_limit,
    )  # fmt: skip
    m = manifest.build(spec, created="2026-01-01T00:00:00Z", user="test")
    manifest.save(m)
    events = [
        {"event": "start", "slurm_array_job_id": "7", "cycle": 0, "time": 1000.0,
         "iteration": 0, "setup": {"launched": 988.0}},
    ] + [
        {"event": "step", "slurm_array_job_id": "7", "cycle": 0, "time": 1001.0 + i,
         "iteration": 10 * (i + 1), "own_step_s": {"node1": 0.02, "node2": 0.05}, "own_steps": 10}
        for i in range(12)
    ]  # fmt: skip
    m.layout.logs.mkdir(parents=True, exist_ok=True)
    m.layout.progress_log.write_text("".join(json.dumps(e) + "\n" for e in events))
    return m


def _judge(m, node: str) -> tuple[list[str], object]:
    import time

    from nvrx_appliance.node.straggler_leave import StragglerLeave

    said: list[str] = []
    judge = StragglerLeave(
        m, array_job_id="7", generation=GEN_7, node=node, is_task0=True,
        replacing=m.spec.straggler_action == "replace", started=time.monotonic(), workload=[],
        log=said.append,
    )  # fmt: skip
    judge._judge()
    return said, judge


GEN_7 = "2026-01-01T00:00:00Z/7/2026-01-01T00:00:00"


def test_task_0_decides_that_a_straggler_leaves_once_and_writes_why(tmp_path):
    m = _replace_chain(tmp_path)
    said, judge = _judge(m, "node1")
    leave = m.layout.straggler_leave("7", "node2")
    fields = dict(line.split("=", 1) for line in leave.read_text().splitlines())
    assert (fields["generation"], fields["node"], fields["iteration"]) == (GEN_7, "node2", "0")
    # 3,600 s left at 0.1 s a step: 36,000 steps, each 30 ms longer than it need be.
    assert fields["why"] == (
        "replaced: it costs 1080 s until the generation ends, more than a restart "
        "(13 s, this cycle's own start-up (a lower bound))"
    )
    assert oct(leave.stat().st_mode & 0o777) == "0o600"
    assert (
        said[-1]
        == "node2 leaves after the next checkpoint (after iteration 0); a spare takes its place"
    )
    judge._judge()
    assert len([s for s in said if "leaves after" in s]) == 1  # decided once


def test_task_0_names_a_straggler_for_the_ledger_under_report_and_decides_nothing(tmp_path):
    from nvrx_appliance.node import straggler_leave

    m = _replace_chain(tmp_path, action="report")
    said, judge = _judge(m, "node1")
    named = m.layout.straggler_named("7", "node2")
    record = json.loads(named.read_text())
    assert {k: record[k] for k in ("generation", "node", "cycle", "slowdown", "lost_s")} == {
        "generation": GEN_7, "node": "node2", "cycle": 0, "slowdown": 2.5, "lost_s": 4,
    }  # fmt: skip
    assert record["action"] == straggler_leave.REPORTED
    assert record["words"].startswith("node2 is a straggler in cycle 0 of generation 7")
    assert oct(named.stat().st_mode & 0o777) == "0o600"
    assert said == [f"{record['words']}; {straggler_leave.REPORTED}"]
    assert not m.layout.straggler_leave("7", "node2").exists()
    inode = named.stat().st_ino
    judge._judge()
    assert named.stat().st_ino == inode  # unchanged: not rewritten


def test_a_replaced_straggler_is_named_for_the_ledger_with_why(tmp_path):
    m = _replace_chain(tmp_path)
    _judge(m, "node1")
    record = json.loads(m.layout.straggler_named("7", "node2").read_text())
    assert record["action"].startswith("replaced: it costs 1080 s until the generation ends")


def test_a_straggler_on_task_0s_own_node_or_not_worth_a_restart_is_kept(tmp_path):
    said, _ = _judge(_replace_chain(tmp_path / "own"), "node2")
    assert said == [
        "node2 is a straggler in cycle 0 of generation 7: its own step takes 50 ms against "
        "20 ms on its peers (2.50x over the last 120 steps); the run has lost 4 s waiting for "
        "it; kept: task 0's own node is not replaced in-job (that would end the generation)"
    ]
    m = _replace_chain(tmp_path / "short", time_limit="00:00:30")
    said, _ = _judge(m, "node1")
    assert said[0].endswith(
        "; kept: it costs 9 s until the generation ends, no more than a restart (13 s, this "
        "cycle's own start-up (a lower bound))"
    )
    assert not m.layout.straggler_leave("7", "node2").exists()


def test_the_leaving_straggler_marks_that_it_ended_its_ranks_so_no_guard_judges_a_hang(
    tmp_path,
):
    import time

    from nvrx_appliance.node.straggler_leave import StragglerLeave
    from nvrx_appliance.rank import kill_cause

    m = _replace_chain(tmp_path)
    _judge(m, "node1")  # task 0 decides: node2 leaves after the next checkpoint
    stragglers = m.layout.stragglers("7")
    m.layout.tracker.parent.mkdir(parents=True, exist_ok=True)
    m.layout.tracker.write_text("10\n")  # the next checkpoint
    said: list[str] = []
    leaver = StragglerLeave(
        m, array_job_id="7", generation=GEN_7, node="node2", is_task0=False, replacing=True,
        started=time.monotonic(), workload=[], log=said.append,
    )  # fmt: skip
    assert kill_cause.not_a_hang(oom_before=0, oom_now=0, stragglers=stragglers,
                                 node="node2", generation=GEN_7) is None  # fmt: skip
    leaver._leave_if_told()
    assert said and "is a straggler told to leave" in said[-1]
    why = kill_cause.not_a_hang(oom_before=0, oom_now=0, stragglers=stragglers, node="node2",
                                generation=GEN_7)  # fmt: skip
    assert why is not None and why.startswith("the straggler leaver ended this node's ranks")
