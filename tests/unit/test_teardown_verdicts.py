"""Task 0's teardown and node memory on the workload's own verdicts: what they decide
(pure), and the teardown run as the batch script runs it, on a generation's files."""

import json
import subprocess

from nvrx_appliance.jobhost import bad_nodes, ending, node_memory

CHAIN = "2026-12-03T00:00:00Z"


def _entry(**extra):
    return {"array_job_id": "7", "exit_code": 78, "checkpoint_iteration_start": 50,
            "checkpoint_iteration": 55, "chain": CHAIN, **extra}  # fmt: skip


def _verdict(code=17, action="stop-chain", iteration=60, **extra):
    return {"generation": f"{CHAIN}/7/", "code": code, "action": action,
            "iteration": iteration, "line": "Exiting now.",
            "words": f"exit {code} at iteration {iteration}: Megatron's result validation failed",
            **extra}  # fmt: skip


def test_a_17_stops_the_chain_with_the_code_the_iteration_and_the_line():
    action, reason = ending.decide(78, [], _entry(), burn_guard=2, verdict=_verdict())
    assert action == ending.STOPPED_BY_WORKLOAD
    assert "exit 17 at iteration 60" in reason and "'Exiting now.'" in reason
    assert "every checkpoint is kept" in reason
    assert ending.scancel_argv(action, job_name="j", user="u", array_job_id="7")[2] == "--name=j"


def test_a_16_resumes_elsewhere_once_and_stops_when_it_comes_back_at_that_iteration():
    first, reason = ending.decide(78, [], _entry(), 2, verdict=_verdict(16, "resume-elsewhere"))
    assert first == ending.RESUME_ELSEWHERE and "kept off this generation's nodes" in reason
    before = _entry(array_job_id="6", action=ending.RESUME_ELSEWHERE,
                    verdict={"code": 16, "iteration": 60, "nodes": ["node1"]})  # fmt: skip
    again, reason = ending.decide(
        78, [before], _entry(), 2, verdict=_verdict(16, "resume-elsewhere")
    )
    assert again == ending.STOPPED_BY_WORKLOAD
    assert "after generation 6 already ran it on other nodes (node1; " in reason
    # At another iteration it is a new question: resumed elsewhere again.
    other, _ = ending.decide(
        78, [before], _entry(), 2, verdict=_verdict(16, "resume-elsewhere", 80)
    )
    assert other == ending.RESUME_ELSEWHERE


def test_a_16_comes_back_at_one_iteration_whichever_rank_wrote_the_verdict_first():
    # Measured on the cluster: the second 16 was written by a rank that printed no
    # training line (no iteration), and the chain ran a third generation before stopping.
    before = _entry(array_job_id="6", action=ending.RESUME_ELSEWHERE, checkpoint_iteration=60,
                    verdict={"code": 16, "iteration": 60, "nodes": ["node1"]})  # fmt: skip
    blind = _verdict(16, "resume-elsewhere", None, nodes=["node2"])
    again, reason = ending.decide(78, [before], _entry(checkpoint_iteration=60), 2, verdict=blind)
    assert again == ending.STOPPED_BY_WORKLOAD
    assert "at iteration 60 after generation 6" in reason
    assert "(node1; this time on node2)" in reason  # the nodes of both runs
    # Neither names one: the checkpoint both ended at says where.
    unnamed = {**before, "verdict": {"code": 16, "iteration": None, "nodes": ["node1"]}}
    _, said = ending.decide(78, [unnamed], _entry(checkpoint_iteration=60), 2, verdict=blind)
    assert "at checkpoint 60 after generation 6" in said
    # Trained on past that checkpoint: another question, resumed elsewhere again.
    moved, _ = ending.decide(78, [before], _entry(checkpoint_iteration=80), 2, verdict=blind)
    assert moved == ending.RESUME_ELSEWHERE


def test_the_verdicts_iteration_comes_from_any_guard_of_its_generation_that_named_it():
    blind = _verdict(16, "resume-elsewhere", None)
    accounts = [{"code": 16, "iteration": None}, {"code": 16, "iteration": 60},
                {"code": 1, "iteration": 75}]  # fmt: skip
    assert ending.verdict_iteration(blind, accounts) == 60
    assert ending.verdict_iteration(_verdict(16, "resume-elsewhere", 59), accounts) == 59
    assert ending.verdict_iteration(blind, accounts[:1]) is None


def test_93_after_the_workload_failed_the_same_way_says_what_the_workload_did():
    exits = [{"code": 1, "iteration": 60, "meaning": "the workload exited 1", "cycle": str(c)}
             for c in range(4)]  # fmt: skip
    action, reason = ending.decide(93, [], _entry(), 2, exits=exits)
    assert action == ending.CANCELLED_CHAIN
    assert "after the workload failed 4 times at iteration 60 with exit 1" in reason


def test_93_stays_93_whatever_the_workload_said():
    action, _ = ending.decide(93, [], _entry(), 2, verdict=_verdict(16, "resume-elsewhere"))
    assert action == ending.CANCELLED_CHAIN


def test_a_verdict_of_another_generation_is_never_obeyed():
    text = json.dumps(_verdict(generation=f"{CHAIN}/6/"))
    assert ending.verdict_of(text, CHAIN, "7") is None
    assert ending.verdict_of(json.dumps(_verdict()), CHAIN, "7") is not None


def test_each_cycles_cause_is_its_earliest_failure():
    texts = [json.dumps({"generation": f"{CHAIN}/7/", "cycle": "0", "node": n, "epoch": t})
             for n, t in (("node2", 10.2), ("node1", 10.0))]  # fmt: skip
    assert [e["node"] for e in ending.parse_exits(texts, CHAIN, "7")] == ["node1"]


def test_node_memory_never_counts_what_the_workload_explains():
    exits = [
        {"node": "node1", "action": "restart", "iteration": 60},  # ...and again on node2:
        {"node": "node2", "action": "restart", "iteration": 60},  # the data's
        {"node": "node3", "action": "stop-chain", "iteration": 70},  # a verdict
        {"node": "node3", "action": "restart", "iteration": 75, "load_failed": True},
        {"node": "node4", "action": "restart", "iteration": 12},  # the node's own
        {"node": "node4", "action": "restart", "iteration": 40},
    ]
    failures, iterations = bad_nodes.node_failures(exits)
    assert failures == {"node4": 2} and iterations == {"node4": [12, 40]}


STALL = (
    "the workload stalled in cycle 3: rank 3 on node2 stood in its own code in "
    "`upload_metrics` (state S) while the 3 others waited in `all_reduce` for it; flight "
    "recorder: ...; no node is at fault, none is kept out"
)


def test_kills_a_hang_verdict_explained_are_never_the_nodes_failures():
    # Issue 53, finding 2: the script's last rank stood 100 s in its own `upload_metrics`
    # every time it reached iteration 45; the hang rule said "the workload's" four times,
    # yet node memory kept node4 out for 24 h: "its ranks failed 3 times in one
    # generation". Each cycle's earliest kill was a hang's: its verdict accounts for it.
    hang = {"verdict": "workload", "words": STALL}
    exits = [{"node": "node4", "action": "restart", "iteration": None, "code": 137, "hang": hang}
             for _ in range(3)]  # fmt: skip
    exits.append({"node": "node1", "action": "restart", "iteration": 44, "code": 137,
                  "hang": {"verdict": "none", "words": "no verdict in cycle 4: ..."}})  # fmt: skip
    failures, _ = bad_nodes.node_failures(exits)
    assert failures == {}
    assert bad_nodes.judge({}, failures, drained=[], fenced_task0="", threshold=3) == []


def test_93_after_the_workloads_own_stalls_says_so_in_true_words():
    hang = {"verdict": "workload", "words": STALL}
    exits = [{"node": f"node{n}", "cycle": str(c), "code": 137, "iteration": None, "hang": hang}
             for c, n in enumerate((4, 1, 4, 3))]  # fmt: skip
    action, reason = ending.decide(93, [], _entry(exit_code=93), 2, exits=exits)
    assert action == ending.CANCELLED_CHAIN
    assert reason.startswith(
        "ft_launcher exited 93: NVRx decided not to restart after the workload failed 4 times, "
        "each time a timeout ended its own stall (rank 3 on node2 stood in its own code in "
        "`upload_metrics` (state S)), which names no node; cancelling"
    ), reason


def test_an_exclusion_for_failures_that_recur_elsewhere_is_cleared(tmp_path):
    record = tmp_path / "exclusions.jsonl"
    node_memory._append(str(record), [{
        "kind": "excluded", "node": "node1", "reason": "its ranks failed 3 times in one generation",
        "since": "2026-01-01T00:00:00Z", "until": "2999-01-01T00:00:00Z", "iterations": [60],
    }])  # fmt: skip
    said = []
    node_memory.clear(record=str(record), nodes=[], chain=CHAIN, reason="recurred", log=said.append,
                      recurring={60: {"node2", "node3"}})  # fmt: skip
    entries = bad_nodes.parse_record(record.read_text())
    assert bad_nodes.active(entries, node_memory.hostlib.record_time()) == []
    assert said == ["node1 no longer kept out: recurred"]


def test_the_batch_script_stops_the_chain_on_a_verdict_and_records_it(tmp_path):
    # The real rendered sbatch under bash, as in test_teardown.py: task 0's srun ends 78
    # (every node stopped its ft_launcher on the verdict) and the trap runs the teardown.
    from tests.unit.test_teardown import _control, _outcome, _prepare

    script, work, env = _prepare(tmp_path, srun_exit=78)
    verdict = _verdict(generation="chain-1/500/", node="node1", rank="0", cycle="0")
    (_control(work) / "verdict").write_text(json.dumps(verdict))
    (_control(work) / "verdict").chmod(0o600)
    exits = work / "nvrx" / "500" / "exits"
    (exits / "verdict_nodes").mkdir(parents=True, mode=0o700)
    (exits / "verdict_nodes" / "node1").touch()
    (exits / "cycle0.node1.json").write_text(json.dumps({**verdict, "epoch": 1.0}))
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 78, done.stderr
    calls, ledger = _outcome(tmp_path, work)
    entry = ledger[-1]
    assert entry["action"] == "stopped_by_workload"
    assert (entry["verdict"]["code"], entry["verdict"]["iteration"]) == (17, 60)
    assert entry["verdict"]["nodes"] == ["node1"]
    assert any(c.startswith("scancel --state=PENDING") for c in calls), calls
    assert not (work / "chain.active").exists()  # the chain ended on purpose
    assert "exit 17 at iteration 60" in done.stderr
    assert (_control(work) / "verdict").exists()  # evidence kept


def test_a_verdict_another_run_left_under_a_reused_array_job_id_is_not_obeyed(tmp_path):
    from tests.unit.test_teardown import _control, _outcome, _prepare

    script, work, env = _prepare(tmp_path, srun_exit=78)
    old = _verdict(generation="chain-0/500/2025-06-01T00:00:00")
    (_control(work) / "verdict").write_text(json.dumps(old))
    (_control(work) / "verdict").chmod(0o600)
    subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    _calls, ledger = _outcome(tmp_path, work)
    assert ledger[-1]["action"] == "released_spares"
