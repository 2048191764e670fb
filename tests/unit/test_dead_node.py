"""A node task 0 found dead (issue 52): what task 0 writes and does, by what the node was
doing, and how every reader says it afterwards (the health check, the guard, the node
memory, status and report). Real files in a work dir; the cycle-info files are NVRx's
format, written as task 0's own launcher writes them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nvrx_appliance.chain import status
from nvrx_appliance.jobhost import node_memory
from nvrx_appliance.node import control, controldir, dead_node, health_check
from nvrx_appliance.node import liveness_rule as rule
from nvrx_appliance.observe import deaths, exclusions, workdir
from nvrx_appliance.rank import kill_cause
from nvrx_appliance.settings.chain import ChainSpec, check
from tests.unit.entrypoint_support import CHAIN, record, run_manifest

GEN = control.generation(CHAIN, "4242")
ME = health_check.Identity(generation=GEN, task=1, job_id="4243", node="node2")


def _cycle(manifest, number: int, active: str, standby: str = "") -> None:
    folder = manifest.layout.cycle_infos("4242")
    folder.mkdir(parents=True, exist_ok=True)
    doc = {
        "job_id": "4242", "cycle_number": number, "attempt_index": 0,
        "cycle_start_time": f"2026-01-01T00:0{number}:00.000000Z", "cycle_end_time": "",
        "active_nodes": active, "standby_nodes": standby, "active_ranks": "0-3",
        "cycle_log_file": "", "generation": "0",
    }  # fmt: skip
    (folder / f"cycle_info.4242.0.{number}").write_text(json.dumps(doc))


def _judge(tmp_path, silent_node: str, *, hot_spares: int = 1, training: bool = True):
    manifest = run_manifest(tmp_path, hot_spares=hot_spares, train_tasks=2)
    control_dir = manifest.layout.control("4242")
    controldir.prepare(control_dir, os.geteuid())
    said: list[str] = []
    judge = dead_node.DeadNodes(
        manifest, array_job_id="4242", generation=GEN, me="node1", control_dir=control_dir,
        workload=["python", "train.py"], log=said.append, training=lambda: training,
    )  # fmt: skip
    return manifest, control_dir, judge, said


def _silent(node: str, task: int = 1) -> rule.Silent:
    return rule.Silent(node, last_heard=0.0, silent_s=10.4, task=task)


def test_a_training_node_that_went_silent_is_a_silent_death_and_task_0_restarts_on_a_spare(
    tmp_path,
):
    manifest, control_dir, judge, said = _judge(tmp_path, "node2")
    _cycle(manifest, 0, "node[1-2]", "node3")
    judge(_silent("node2"))
    folder = manifest.layout.deaths("4242")
    [death] = workdir.deaths(manifest.layout, ["4242"])["4242"]
    assert (death.node, death.kind, death.cycle, death.hand_off) == ("node2", "silent", 0, False)
    assert " UTC; no reset, no exit: a silent death (no liveness beat for 10 s in cycle 0)" in (
        death.words
    )
    assert death.words.startswith("node2 stopped answering at ")
    assert said[0].endswith("a hot spare took its place in the next cycle")
    # Task 0's own ranks are ended for the restart, and why is written first.
    assert (folder / "stopped.node1.cycle0").exists()
    assert not controldir.closed(control_dir, GEN)
    # Judged once: a second call (a listener started again) writes nothing more.
    judge(_silent("node2"))
    assert len(said) == 2  # the words and the ranks ended, once


def test_with_no_free_hot_spare_the_generation_hands_off(tmp_path):
    manifest, control_dir, judge, _ = _judge(tmp_path, "node2", hot_spares=0)
    _cycle(manifest, 0, "node[1-2]")
    judge(_silent("node2"))
    [death] = workdir.deaths(manifest.layout, ["4242"])["4242"]
    assert death.hand_off
    assert controldir.closed(control_dir, GEN)  # the peers leave; the next generation starts
    assert not (manifest.layout.deaths("4242") / "stopped.node1.cycle0").exists()
    assert "no hot spare was free, so the generation handed off" in deaths.sentence(death)


def test_a_node_of_task_0s_own_array_task_hands_the_generation_off(tmp_path):
    # Two nodes a task: task 0's second node dies. The cycle cannot form around task 0
    # without its task whole; a new generation replaces it.
    manifest, control_dir, judge, _ = _judge(tmp_path, "node2")
    _cycle(manifest, 0, "node[1-4]", "node[5-6]")
    judge(_silent("node2", task=0))
    [death] = workdir.deaths(manifest.layout, ["4242"])["4242"]
    assert death.hand_off and controldir.closed(control_dir, GEN)


def test_a_node_that_crashed_first_or_a_spare_is_remembered_but_restarts_nothing(tmp_path):
    manifest, control_dir, judge, _ = _judge(tmp_path, "node2")
    _cycle(manifest, 0, "node[1-2]", "node3")
    _cycle(manifest, 1, "node[1,3]")  # NVRx restarted without node2: its peers read a reset
    judge(_silent("node2"))
    judge(_silent("node4"))  # a hot spare that never trained here
    found = {d.node: d for d in workdir.deaths(manifest.layout, ["4242"])["4242"]}
    assert (found["node2"].kind, found["node2"].cycle) == ("crashed", 0)
    assert "after NVRx had ended cycle 0 on its own: its ranks failed first" in (
        found["node2"].words
    )
    assert found["node4"].kind == "spare"
    assert found["node4"].words.startswith("hot spare node4 stopped answering at ")
    assert not list(manifest.layout.deaths("4242").glob("stopped.*"))
    assert not controldir.closed(control_dir, GEN)


def test_a_crash_nvrx_is_already_restarting_from_is_no_silent_death_and_hands_nothing_off(
    tmp_path,
):
    # The node died with its link up: its peers read a reset, NVRx stopped task 0's ranks
    # at once, and the next round waits for a spare; no new cycle-info file yet.
    manifest, control_dir, judge, _ = _judge(tmp_path, "node2", hot_spares=0, training=False)
    _cycle(manifest, 0, "node[1-2]")
    judge(_silent("node2"))
    [death] = workdir.deaths(manifest.layout, ["4242"])["4242"]
    assert (death.kind, death.hand_off) == ("crashed", False)
    assert not controldir.closed(control_dir, GEN)  # NVRx's own round goes on
    assert not list(manifest.layout.deaths("4242").glob("stopped.*"))


def test_a_node_taken_for_dead_that_comes_back_fails_its_health_check(tmp_path):
    manifest, _, judge, _ = _judge(tmp_path, "node2")
    _cycle(manifest, 0, "node[1-2]", "node3")
    judge(_silent("node2"))
    text = (manifest.layout.deaths("4242") / "dead.node2").read_text()
    found = health_check.judge_dead(text, ME)
    assert not found.healthy and found.check == "dead"
    assert found.why.endswith("; node2 leaves at this rendezvous")
    other = health_check.Identity(generation=GEN.replace("4242", "4000"), task=1, job_id="1",
                                  node="node2")  # fmt: skip
    assert health_check.judge_dead(text, other).healthy  # another run's record: ignored
    assert health_check.judge_dead(None, ME).healthy


def test_the_ranks_task_0_ended_for_a_dead_node_are_no_hang_and_no_failure(tmp_path):
    manifest, _, judge, _ = _judge(tmp_path, "node2")
    _cycle(manifest, 0, "node[1-2]", "node3")
    judge(_silent("node2"))
    folder = manifest.layout.deaths("4242")
    why = kill_cause.for_a_dead_node(folder, "node1", GEN, "0")
    assert why and why.startswith("task 0 ended this node's ranks for the restart: node2 ")
    assert kill_cause.for_a_dead_node(folder, "node1", GEN, "1") is None  # another cycle
    assert kill_cause.for_a_dead_node(folder, "node3", GEN, "0") is None  # another node
    assert kill_cause.for_a_dead_node(folder, "node1", "c/1/x", "0") is None


LOG_TASK0_STOPPED = (
    "2026-12-02 16:16:22,671 [INFO] [node1] [workload:?(?) infra:0(0)] launcher.py:636 "
    "[default] Worker group FAILED. 8/8 attempts left; will restart worker group\n"
)


def test_the_chain_remembers_a_dead_node_in_words_and_never_the_node_that_restarted(tmp_path):
    manifest, _, judge, _ = _judge(tmp_path, "node2")
    _cycle(manifest, 0, "node[1-2]", "node3")
    judge(_silent("node2"))
    log = tmp_path / "ft.log"
    log.write_text(LOG_TASK0_STOPPED)
    record = tmp_path / "exclusions.jsonl"
    found = node_memory.remember(
        record=str(record), launcher_log=str(log), drained=[], fenced_task0="",
        spec={"exclude_for": 86400, "exclude_after_failures": 1}, chain=CHAIN,
        array_job_id="4242", log=print, deaths=str(manifest.layout.deaths("4242")),
    )  # fmt: skip
    # node1's worker group "FAILED" because task 0 ended it for the restart: not node1's.
    assert [f["node"] for f in found] == ["node2"]
    assert found[0]["reason"].endswith("; kept out of this chain's generations for 24 h")
    assert "no reset, no exit: a silent death" in found[0]["reason"]
    [kept] = exclusions.read(record.read_text(), "2026-01-01T00:00:00Z").active
    assert (kept.node, kept.evidence) == ("node2", "dead")
    # A record another run left under a reused array job id is not ours.
    assert node_memory.dead_nodes(str(manifest.layout.deaths("4242")), "other", "4242") == []


def test_status_and_report_say_the_death_in_words(tmp_path):
    manifest, _, judge, _ = _judge(tmp_path, "node2")
    _cycle(manifest, 0, "node[1-2]", "node3")
    judge(_silent("node2"))
    view = status.assemble(
        manifest=manifest.to_json(),
        queue=[], acct=[], ledger=[{"array_job_id": "4242", "chain": CHAIN}], cycles={},
        checkpoint_now=None, chain_marker=False,
        deaths=workdir.deaths(manifest.layout, ["4242"]),
    )  # fmt: skip
    [generation] = view.generations
    [words] = generation.deaths
    assert words.startswith("node2 stopped answering at ")
    assert "a hot spare took its place in the next cycle; kept out of this chain's " in words


def test_a_record_of_the_liveness_socket_is_validated(tmp_path):
    good = record(liveness_port=40000, liveness_key="ab" * 32)
    assert control.decode(control.encode(good)) == good
    for changes, words in (
        (dict(liveness_port=0, liveness_key="ab" * 32), "neither null nor a UDP port"),
        (dict(liveness_port=40000, liveness_key="zz" * 32), "hex key"),
        (dict(liveness_port=40000, liveness_key=None), "must be given together"),
    ):
        with pytest.raises(control.RecordError, match=words):
            control.decode(control.encode(record(**changes)))


@pytest.mark.parametrize("timeout", [1, 2])
def test_a_silence_timeout_shorter_than_three_beats_is_refused_with_the_fix(tmp_path, timeout):
    found = [str(p) for p in check(ChainSpec(work_dir=str(tmp_path), node_silence_timeout=timeout))]
    assert any(
        p.startswith("--node-silence-timeout: ")
        and f"{timeout} s is fewer" in p
        and "or 0 to turn liveness off" in p
        for p in found
    ), found
    for fine in (0, 3, 10):
        spec = ChainSpec(work_dir=str(tmp_path), node_silence_timeout=fine)
        assert not [p for p in check(spec) if "silence" in p.option]


def test_deaths_read_back_skip_torn_and_foreign_files(tmp_path: Path):
    assert deaths.parse("{not json") is None
    assert deaths.parse(json.dumps({"node": "n", "generation": "x"}), generation="y") is None
    found = deaths.parse(json.dumps({"node": "n", "kind": "??", "cycle": True}))
    assert found is not None and (found.kind, found.cycle) == ("silent", -1)
