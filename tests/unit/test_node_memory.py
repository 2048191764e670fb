"""Memory across generations (jobhost/node_memory.py and its pure half bad_nodes.py,
loaded by the teardown): which nodes a generation leaves behind as bad, the exclusion
record, the cap, and what it asks of Slurm for the queued generations.

The Slurm calls run against stand-ins for squeue, sinfo and scontrol (shell scripts on
PATH that record their argv); the real ones are tests/integration/test_bad_nodes.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from nvrx_appliance import manifest
from nvrx_appliance.chain import render, submit
from nvrx_appliance.jobhost import bad_nodes, node_memory
from nvrx_appliance.observe import exclusions
from nvrx_appliance.settings.chain import ChainSpec

# NVRx 0.7.0's log lines as ft_launcher.log holds them (every node's, through its log server).
LOG = """\
2026-12-02 16:16:20,101 [INFO] [node1] [workload:?(?) infra:0(0)] launcher.py:600 Starting
2026-12-02 16:16:22,671 [INFO] [node2] [workload:?(?) infra:1(0)] launcher.py:636 [default] Worker group UNHEALTHY. 8/8 attempts left; will restart worker group
2026-12-02 16:16:22,700 [INFO] [node1] [workload:?(?) infra:0(0)] launcher.py:760 [default] Joining cluster restart (group_rank=0)
2026-12-02 16:16:40,671 [INFO] [node2.cluster.example] [workload:?(?) infra:1(0)] launcher.py:636 [default] Worker group FAILED. 7/8 attempts left; will restart worker group
2026-12-02 16:16:52,730 [INFO] [node2] [workload:?(?) infra:1(0)] launcher.py:636 [default] Worker group UNHEALTHY. 6/8 attempts left; will restart worker group
2026-12-02 16:16:53,000 [INFO] [node3] [workload:?(?) infra:2(0)] launcher.py:636 [default] Worker group UNHEALTHY. 5/8 attempts left; will restart worker group
2026-12-02 16:16:56,074 [ERROR] [node4] [workload:?(?) infra:3(0)] launcher.py:1721 Agent .run() raised UnhealthyNodeException: Node node4_31168_0 has an unhealthy GPU.
2026-12-02 16:16:57,000 [ERROR] [node6] [workload:?(?) infra:4(0)] launcher.py:1721 Agent .run() raised UnhealthyNodeException: Node node6_1_0 is unhealthy.
2026-12-02 16:16:58,000 [WARNING] [node8] [workload:?(?) infra:5(0)] health_check.py:1562 Node health check failed: fail_count=1, failed_checks=['slurm drain: Slurm has drained node8 of task 5 (node8: bad fan); node8 leaves at this rendezvous']
2026-12-02 16:16:58,100 [ERROR] [node8] [workload:?(?) infra:5(0)] launcher.py:1721 Agent .run() raised UnhealthyNodeException: Node node8_1_0 is unhealthy.
E1202 16:16:57.967000 31168 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 1
"""


def test_a_generations_log_says_which_node_left_unhealthy_and_whose_ranks_failed():
    unhealthy, failures = bad_nodes.evidence(LOG.splitlines(keepends=True))
    assert unhealthy == {
        "node4": "Node node4_31168_0 has an unhealthy GPU.",
        "node6": "Node node6_1_0 is unhealthy.",
        "node8": bad_nodes.LEFT_DRAINED,  # the drain check's verdict, not a health fault
    }
    # node1 only joined the restarts the others caused; a domain name is Slurm's short name
    assert failures == {"node2": 3, "node3": 1}


def test_judged_bad_the_unhealthy_the_dead_task_0_and_repeated_rank_failures_never_a_drain():
    unhealthy, failures = bad_nodes.evidence(LOG.splitlines())
    found = dict(
        bad_nodes.judge(
            unhealthy, failures, drained=["node6"], fenced_task0="node7.example", threshold=3
        )
    )
    # node6 is drained now, node8 was when it left (resumed since?): both the admin's
    assert sorted(found) == ["node2", "node4", "node7"]
    assert found["node2"] == "its ranks failed 3 times in one generation"
    assert found["node4"].startswith("failed NVRx's health check: ")
    assert "fenced" in found["node7"]
    assert "node2" not in dict(
        bad_nodes.judge(unhealthy, failures, drained=[], fenced_task0="", threshold=0)
    )


def test_the_cap_keeps_the_arrays_size_usable_oldest_exclusions_first():
    usable = {"n1", "n2", "n3", "n4"}
    assert bad_nodes.cap(["n1", "n2", "n3"], usable, need=2) == (["n1", "n2"], ["n3"])
    # a node that is down or drained anyway costs nothing to keep out
    assert bad_nodes.cap(["gone", "n1"], usable, need=3) == (["gone", "n1"], [])
    assert bad_nodes.cap(["n1"], usable, need=4) == ([], ["n1"])


def test_an_exclusion_expires_and_the_latest_line_of_a_node_wins():
    lines = [
        exclusions.excluded_line("n1", "old", since="2026-01-01T00:00:00Z",
                                 until="2026-01-02T00:00:00Z", chain="c", generation="5",
                                 by="teardown"),
        exclusions.excluded_line("n2", "x", since="2026-01-01T00:00:00Z",
                                 until="2026-01-03T00:00:00Z", chain="c", generation="5",
                                 by="teardown"),
        exclusions.excluded_line("n1", "again", since="2026-01-02T12:00:00Z",
                                 until="2026-01-03T12:00:00Z", chain="c", generation="6",
                                 by="nvrx-watch"),
        "{torn",
    ]  # fmt: skip
    text = "".join(lines)
    now = "2026-01-02T13:00:00Z"
    # the teardown's reader and the host tools' agree on what is in force
    theirs = [(e["node"], e["reason"]) for e in bad_nodes.active(bad_nodes.parse_record(text), now)]
    ours = [(e.node, e.reason) for e in exclusions.read(text, now).active]
    assert theirs == ours == [("n2", "x"), ("n1", "again")]
    assert exclusions.read(text, "2026-01-04T00:00:00Z").active == ()


# --- the shell: the record, and Slurm for the queued generations ---------------------------


def _spec(tmp_path: Path, **extra) -> dict:
    spec = ChainSpec(work_dir=str(tmp_path / "w"), workload="cpu", job_name="demo",
                     train_tasks=2, hot_spares=1, cold_spares=0, **extra)  # fmt: skip
    return manifest.build(spec, created="chain-1", user="alice").to_json()


SQUEUE = "501|debug|node9\n502|debug|(null)\n500|debug|\n777|debug|\n"
SINFO = "node1|idle\nnode2|alloc\nnode3|mix\nnode4|idle\nnode5|drain\nnode6|down*\n"


def _stand_ins(tmp_path: Path, *, squeue=SQUEUE, sinfo=SINFO, hosts="", scontrol_code=0) -> dict:
    """squeue, sinfo and scontrol, saying what is given; sinfo asked for host names
    (%n|%N) says `hosts`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "hosts.out").write_text(hosts)
    outputs = {"squeue": (squeue, 0), "sinfo": (sinfo, 0), "scontrol": ("", scontrol_code)}
    for name, (out, code) in outputs.items():
        (tmp_path / f"{name}.out").write_text(out)
        (bin_dir / name).write_text(
            f'#!/bin/sh\necho "{name} $*" >> {tmp_path}/calls\n'
            + f'case "$*" in *%n*) cat {tmp_path}/hosts.out ;; *) cat {tmp_path}/{name}.out ;; esac\n'
            + f"exit {code}\n"
        )
        (bin_dir / name).chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


def _apply(tmp_path: Path, monkeypatch, record_lines: list[str], **stand_ins) -> list[str]:
    for key, value in _stand_ins(tmp_path, **stand_ins).items():
        monkeypatch.setenv(key, value)
    record = tmp_path / "exclusions.jsonl"
    record.write_text("".join(record_lines))
    (tmp_path / "submitted.json").write_text(json.dumps({"job_ids": ["500", "501", "502"]}))
    said: list[str] = []
    node_memory.apply(record=str(record), submitted=str(tmp_path / "submitted.json"),
                      manifest=_spec(tmp_path), user="alice", array_job_id="500",
                      log=said.append)  # fmt: skip
    return said


def _line(node: str, until: str = "2999-01-01T00:00:00Z") -> str:
    return exclusions.excluded_line(node, "test", since="2026-01-01T00:00:00Z", until=until,
                                    chain="chain-1", generation="499", by="teardown")  # fmt: skip


def _calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


def test_the_chains_own_queued_generations_exclude_the_record_within_the_cap(tmp_path, monkeypatch):
    said = _apply(tmp_path, monkeypatch, [_line("node1"), _line("node2"), _line("node5")])
    calls = _calls(tmp_path)
    assert calls[0] == ("squeue --noheader --user=alice --name=demo --states=PENDING "
                        "--format=%F|%P|%x")  # fmt: skip
    # 4 usable nodes, an array of 3 tasks: one usable node may go; node5 is drained anyway
    updates = {c for c in calls if c.startswith("scontrol update")}
    assert updates == {
        "scontrol update JobId=501 ExcNodeList=node9,node1,node5",  # the user's node9 kept
        "scontrol update JobId=502 ExcNodeList=node1,node5",
    }  # not 500 (this generation) nor 777 (not this chain's)
    assert [s for s in said if s.startswith("the cap")] == [
        "the cap: node2 stay(s) eligible for the queued generations: the partition debug "
        "has 4 usable nodes and the array needs 3"
    ]
    applied = exclusions.read((tmp_path / "exclusions.jsonl").read_text(), "2026-06-01T00:00:00Z")
    assert applied.applied is not None
    assert applied.applied.nodes == ("node1", "node5") and applied.applied.capped == ("node2",)
    assert applied.applied.jobs == ("501", "502") and applied.applied.need == 3


def test_an_expired_exclusion_is_taken_back_and_the_users_own_is_kept(tmp_path, monkeypatch):
    applied = json.dumps({"kind": "applied", "jobs": ["501"], "nodes": ["node1", "node4"],
                          "baselines": {"501": "node9"}})  # fmt: skip
    _apply(tmp_path, monkeypatch, [_line("node1", until="2000-01-01T00:00:00Z"),
                                   _line("node4"), applied + "\n"],
           squeue="501|debug|node[1,4,9]\n")  # fmt: skip
    assert [c for c in _calls(tmp_path) if c.startswith("scontrol update")] == [
        "scontrol update JobId=501 ExcNodeList=node9,node4"
    ]


def test_nothing_to_apply_asks_slurm_nothing(tmp_path, monkeypatch):
    _apply(tmp_path, monkeypatch, [_line("node1", until="2000-01-01T00:00:00Z")])
    assert _calls(tmp_path) == []


def test_no_queued_generation_left_is_said_and_the_record_kept(tmp_path, monkeypatch):
    # Slurm ended task 0's job itself (scancel): it counted the job finished at once, and
    # the next generation started while this teardown ran.
    said = _apply(tmp_path, monkeypatch, [_line("node1")], squeue="500|debug|\n")
    assert said == [
        "no later generation of this chain is queued (none is left, or Slurm ended this job "
        "itself and the next one started already): node1 stay(s) in the record for the "
        "generations queued after"
    ]
    assert not [c for c in _calls(tmp_path) if c.startswith("scontrol")]
    assert exclusions.read(
        (tmp_path / "exclusions.jsonl").read_text(), "2026-06-01T00:00:00Z"
    ).active


def test_a_slurm_failure_leaves_the_queued_generations_as_they_were_and_says_so(
    tmp_path, monkeypatch
):
    said = _apply(tmp_path, monkeypatch, [_line("node1")], scontrol_code=1)
    assert any("excluded nodes may be unchanged" in s for s in said)
    record = exclusions.read((tmp_path / "exclusions.jsonl").read_text(), "2026-06-01T00:00:00Z")
    assert record.applied is None  # nothing claims to be applied


# --- the teardown: ledger, record and successors, through the rendered batch script ------


def test_task_0s_teardown_remembers_the_generations_bad_nodes(tmp_path):
    work = tmp_path / "w"
    # No drain poller here: the generation's last poll is given (its own test: test_drain).
    spec = ChainSpec(work_dir=str(work), workload="cpu", runtime="bare", python="python3",
                     job_name="demo", train_tasks=2, hot_spares=1, drain_poll_interval=0)  # fmt: skip
    m = manifest.build(spec, created="chain-1", user="alice")
    work.mkdir()
    manifest.save(m)
    submit.write_teardown(m.layout)
    (work / "submitted.json").write_text(json.dumps({"job_ids": ["500", "501"]}))
    m.layout.nvrx_logs("500").mkdir(parents=True)
    m.layout.launcher_log("500").write_text(LOG)
    m.layout.drain("500").mkdir(parents=True)
    m.layout.drain_poll("500").write_text("generation=chain-1/500/\ndrained=node6\n")
    script = work / "demo.sbatch"
    script.write_text(render.render(m, template=submit.template_text()))
    env = _stand_ins(tmp_path, squeue="501|debug|\n")
    for name in ("srun", "scancel"):
        (tmp_path / "bin" / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {tmp_path}/calls\n')
        (tmp_path / "bin" / name).chmod(0o755)
    env |= {"SLURM_ARRAY_JOB_ID": "500", "SLURM_ARRAY_TASK_ID": "0", "SLURM_JOB_NAME": "demo",
            "SLURM_JOB_USER": "alice", "HOME": str(tmp_path)}  # fmt: skip
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    [entry] = [json.loads(x) for x in (work / "chain.jsonl").read_text().splitlines()]
    assert entry["drained"] == ["node6"]
    record = exclusions.read((work / "exclusions.jsonl").read_text(), "2026-01-01T00:00:00Z")
    assert [(e.node, e.generation) for e in record.active] == [("node2", "500"), ("node4", "500")]
    assert "node2 is kept out of this chain's queued generations until" in done.stderr
    # 4 usable nodes, an array of 3: one may be kept out, the oldest (node2); node4 says so
    assert "scontrol update JobId=501 ExcNodeList=node2" in _calls(tmp_path)
    assert "the cap: node4 stay(s) eligible" in done.stderr
    assert not (work / "__pycache__").exists()


@pytest.mark.parametrize("exclude_for", [0])
def test_no_memory_across_generations_when_exclude_for_is_zero(tmp_path, exclude_for):
    said: list[str] = []
    record = tmp_path / "exclusions.jsonl"
    (tmp_path / "ft.log").write_text(LOG)
    found = node_memory.remember(
        record=str(record), launcher_log=str(tmp_path / "ft.log"), drained=[], fenced_task0="",
        spec={"exclude_for": exclude_for, "exclude_after_failures": 3}, chain="c",
        array_job_id="500", log=said.append,
    )  # fmt: skip
    assert found == [] and not record.exists()


def test_a_job_whose_applied_line_was_lost_gets_ours_back_when_they_expire():
    # The append of the `applied` line failed (a full quota), or the teardown was killed
    # between the update and the append: job 501's list holds our node2 (expired) and
    # node3 beside its own node9, and the record says nothing of what it held before.
    entries = bad_nodes.parse_record(_line("node2", until="2000-01-01T00:00:00Z") + _line("node3"))
    usable = {"debug": {"node1", "node2", "node3", "node4"}}
    targets, baselines, _kept, _capped = bad_nodes.plan(
        [("501", "debug", "node[2-3],node9")], ["node3"], usable, 1, entries
    )
    assert baselines == {"501": "node9"}  # its own, without any node the record excluded
    assert targets == {"node9,node3": ["501"]}  # node2 taken back, node3 within the cap


def test_a_node_is_remembered_by_slurms_node_name_where_its_host_name_differs(
    tmp_path, monkeypatch
):
    for key, value in _stand_ins(tmp_path, hosts="gpu-host-4.example|node4\nnode5|node5\n").items():
        monkeypatch.setenv(key, value)
    log = tmp_path / "ft_launcher.log"
    log.write_text(
        "2026-12-02 16:16:56,074 [ERROR] [gpu-host-4.example] [workload:?(?) infra:3(0)] "
        "launcher.py:1721 Agent .run() raised UnhealthyNodeException: Node x has an unhealthy GPU.\n"
    )
    said: list[str] = []
    found = node_memory.remember(
        record=str(tmp_path / "exclusions.jsonl"), launcher_log=str(log), drained=["node4"],
        fenced_task0="gpu-host-4", spec={"exclude_for": 3600}, chain="c", array_job_id="500",
        log=said.append,
    )  # fmt: skip
    assert found == []  # node4 is Slurm's drained node: the administrator's, not ours
    found = node_memory.remember(
        record=str(tmp_path / "exclusions.jsonl"), launcher_log=str(log), drained=[],
        fenced_task0="", spec={"exclude_for": 3600}, chain="c", array_job_id="500",
        log=said.append,
    )  # fmt: skip
    assert [f["node"] for f in found] == ["node4"]
    assert "sinfo --noheader --Node --format=%n|%N" in _calls(tmp_path)


HUNG_LINE = (
    "2026-12-04 10:16:58,000 [WARNING] [node3] [workload:?(?) infra:2(0)] health_check.py:1562 "
    "Node health check failed: fail_count=1, failed_checks=['hung: node3 hung in cycle 2: its 2 "
    "ranks stopped in `_train_step` while the 4 others waited in `all_reduce`; node3 leaves at "
    "this rendezvous']\n"
    "2026-12-04 10:16:58,100 [ERROR] [node3] [workload:?(?) infra:2(0)] launcher.py:1721 Agent "
    ".run() raised UnhealthyNodeException: Node node3_1_0 is unhealthy.\n"
)


def _hang_marker(hangs: Path, node: str, generation: str = "c/500/") -> None:
    hangs.mkdir(parents=True, exist_ok=True)
    words = (
        f"{node} hung in cycle 2: its 2 ranks stopped in `_train_step` while the 4 others "
        "waited in `all_reduce`"
    )
    marker = {"generation": generation, "cycle": 2, "words": words, "record": "cycle2.json"}
    (hangs / f"hung.{node}").write_text(json.dumps(marker))


def test_a_hung_node_is_remembered_as_hung_with_its_stacks_and_in_words(tmp_path):
    said: list[str] = []
    record, hangs = tmp_path / "exclusions.jsonl", tmp_path / "hangs"
    (tmp_path / "ft.log").write_text(HUNG_LINE)
    _hang_marker(hangs, "node3")
    _hang_marker(hangs, "node9", generation="c/499/")  # another run's, under a reused id
    found = node_memory.remember(
        record=str(record), launcher_log=str(tmp_path / "ft.log"), drained=[], fenced_task0="",
        spec={"exclude_for": 86400, "exclude_after_failures": 3}, chain="c",
        array_job_id="500", log=said.append, hangs=str(hangs),
    )  # fmt: skip
    reason = (
        "hung in cycle 2: its 2 ranks stopped in `_train_step` while the 4 others waited in "
        "`all_reduce`; kept out of the next rendezvous and of this chain's generations for 24 h"
    )
    assert found == [{"node": "node3", "reason": reason}]  # once: not also as unhealthy
    [line] = [json.loads(x) for x in record.read_text().splitlines()]
    assert (line["evidence"], line["stacks"]) == ("hung", str(hangs / "cycle2.json"))
    [kept] = exclusions.read(record.read_text(), "2026-01-01T00:00:00Z").active
    assert (kept.node, kept.evidence, kept.reason) == ("node3", "hung", reason)


def test_a_withdrawn_hang_verdict_is_not_remembered(tmp_path):
    record, hangs = tmp_path / "exclusions.jsonl", tmp_path / "hangs"
    _hang_marker(hangs, "node3")
    (hangs / "withdrawn.node3").write_text("{}")
    found = node_memory.remember(
        record=str(record), launcher_log=str(tmp_path / "none.log"), drained=[],
        fenced_task0="", spec={"exclude_for": 86400}, chain="c", array_job_id="500",
        log=print, hangs=str(hangs),
    )  # fmt: skip
    assert found == []


def test_clear_reads_the_newest_part_of_a_long_record_as_apply_does(tmp_path):
    # On a long chain the record passes the read bound: clear() read its first 4 MiB and
    # worked from stale entries, apply() its last. Both read the newest now.
    record = tmp_path / "exclusions.jsonl"
    old = _line("node1", until="2000-01-01T00:00:00Z")
    with record.open("w") as fh:
        fh.write(old * (node_memory.RECORD_TAIL_BYTES // len(old) + 10))
        fh.write(_line("node7"))  # the newest: node7 kept out now
    said: list[str] = []
    node_memory.clear(record=str(record), nodes=["node7"], chain="chain-1", reason="the test's",
                      log=said.append)  # fmt: skip
    assert said == ["node7 no longer kept out: the test's"]
    assert (
        '"until"' in record.read_text().splitlines()[-1]
        and "cleared: the test's" in (record.read_text().splitlines()[-1])
    )
