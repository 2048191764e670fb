"""The exclusion record as people and the watcher see it: `status` lists what is kept out
and whether the cap let it apply; nvrx-watch's suspect_node reads the same record and,
with --act only, adds to it (never a Slurm call, never a drain)."""

from __future__ import annotations

import datetime
import io
import json
import logging
from pathlib import Path

from rich.console import Console

from nvrx_appliance.chain import status
from nvrx_appliance.cli import status_view
from nvrx_appliance.clock import iso_utc
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe import exclusions
from nvrx_appliance.watch.config import Settings, Thresholds
from nvrx_appliance.watch.findings import Run
from nvrx_appliance.watch.platform import NullPlatform
from nvrx_appliance.watch.watcher import Watcher

NOW = 1_800_000_000.0
MANIFEST = {
    "created": "c1",
    "user": "alice",
    "spec": {"job_name": "demo", "work_dir": "/w", "time_limit": "01:00:00"},
    "shape": {"array_spec": "0-2%3", "active_tasks": 3},
}


def _record(text: str) -> exclusions.Record:
    return exclusions.read(text, "2026-06-01T00:00:00Z")


def _line(node: str, reason: str = "its ranks failed 3 times in one generation") -> str:
    return exclusions.excluded_line(node, reason, since="2026-05-01T00:00:00Z",
                                    until="2026-06-02T00:00:00Z", chain="c1", generation="41",
                                    by="teardown")  # fmt: skip


def _rendered(record: exclusions.Record, ledger=()) -> str:
    view = status.assemble(manifest=MANIFEST, queue=[], acct=[], ledger=list(ledger), cycles={},
                           checkpoint_now=None, chain_marker=True, exclusions=record)  # fmt: skip
    console = Console(width=220, record=True, file=io.StringIO())
    console.print(status_view.render(view))
    return console.export_text()


def test_status_lists_each_excluded_node_why_until_when_and_whether_it_applied():
    applied = {"kind": "applied", "time": "2026-05-01T00:00:09Z", "jobs": ["42", "43"],
               "nodes": ["node2"], "capped": ["node3"], "need": 3}  # fmt: skip
    text = _rendered(_record(_line("node2") + _line("node3") + json.dumps(applied) + "\n"))
    assert "nodes kept out of the queued generations (the exclusion record)" in text
    rows = {line.split()[1]: line for line in text.splitlines() if line.startswith("│ node")}
    assert "its ranks failed 3 times in one generation" in rows["node2"]
    assert "2026-06-02T00:00:00Z" in rows["node2"]
    assert "in the ExcNodeList of 42, 43 since 2026-05-01T00:00:09Z" in rows["node2"]
    assert "NOT applied: the cap keeps 3 usable nodes in the partition" in rows["node3"]
    assert "never drained by the appliance" in text


def test_status_says_a_generations_drained_nodes_and_shows_no_table_without_exclusions():
    ledger = [{"array_job_id": "41", "chain": "c1", "drained": ["node4"], "exit_code": 1}]
    text = _rendered(_record(""), ledger)
    assert "generation 41: Slurm drained node4; a drained node left at a rendezvous" in text
    assert "nodes kept out" not in text


def test_status_json_carries_the_record():
    view = status.assemble(manifest=MANIFEST, queue=[], acct=[], ledger=[], cycles={},
                           checkpoint_now=None, chain_marker=True,
                           exclusions=_record(_line("node2")))  # fmt: skip
    doc = view.to_json()
    assert [e["node"] for e in doc["excluded"]] == ["node2"] and doc["applied"] is None


# --- nvrx-watch -----------------------------------------------------------------------------


def _cycles(folder: Path) -> str:
    """Four NVRx cycle-info files of generation 41: three short cycles all on node2."""
    folder.mkdir(parents=True)
    start = NOW - 3000
    for number in range(4):
        begin = start + 600 * number
        doc = {
            "job_id": "41",
            "attempt_index": 0,
            "cycle_number": number,
            "cycle_start_time": datetime.datetime.fromtimestamp(begin, datetime.UTC).isoformat(),
            "cycle_end_time": datetime.datetime.fromtimestamp(begin + 60, datetime.UTC).isoformat()
            if number < 3 else "",
            "active_nodes": "node[1-2]" if number % 2 else "node[2-3]",
            "standby_nodes": "",
        }  # fmt: skip
        (folder / f"cycle_info.41.0.{number}").write_text(json.dumps(doc))
    return str(folder / "cycle_info.*")


def _pass(tmp_path: Path, *, act: bool, owner="alice", exclude_for=3600) -> tuple:
    work = tmp_path / "w"
    glob = (
        _cycles(work / "nvrx" / "41" / "cycle_infos")
        if not work.exists()
        else str(work / "nvrx" / "41" / "cycle_infos" / "cycle_info.*")
    )
    run = Run(job_name="demo", owner=owner, work_dir=str(work), cycle_glob=glob, chain="c1",
              exclude_for=exclude_for)  # fmt: skip
    watcher = Watcher(run=run, platform=NullPlatform(), thresholds=Thresholds(),
                      settings=Settings(state_file=str(tmp_path / "state.json"), act=act),
                      caller="alice", logger=logging.getLogger("test_bad_nodes_views"),
                      clock=lambda: NOW)  # fmt: skip
    return watcher.pass_once(), Layout(work).exclusions


def test_suspect_node_with_act_adds_the_node_to_the_chains_record_once(tmp_path):
    result, record = _pass(tmp_path, act=True)
    [finding] = [f for f in result.findings if f.detector == "suspect_node"]
    assert finding.action is not None and finding.action.nodes == ("node2",)
    assert result.acted == [f"add node2 to the exclusion record {record}"]
    [entry] = exclusions.read(record.read_text(), iso_utc(NOW) or "").active
    assert (entry.node, entry.by, entry.generation) == ("node2", "nvrx-watch", "41")
    assert entry.until == iso_utc(NOW + 3600) and entry.reason.startswith("nvrx-watch suspect_node")
    assert oct(record.stat().st_mode & 0o777) == "0o600"
    # the next pass reads the same record: node2 is kept out already, nothing to say
    again, _ = _pass(tmp_path, act=True)
    assert [f for f in again.findings if f.detector == "suspect_node"] == []


def test_suspect_node_without_act_only_says_what_it_would_add(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="test_bad_nodes_views")
    result, record = _pass(tmp_path, act=False)
    assert result.acted == [] and not record.exists()
    assert "observe-only (pass --act to run it): add node2 to the exclusion record" in caplog.text


def test_another_users_chain_or_a_chain_without_memory_gets_no_exclusion(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="test_bad_nodes_views")
    result, record = _pass(tmp_path, act=True, owner="bob")
    assert result.acted == [] and not record.exists()
    assert "belongs to bob, not to alice" in caplog.text
    result, record = _pass(tmp_path / "off", act=True, exclude_for=0)
    [finding] = [f for f in result.findings if f.detector == "suspect_node"]
    assert finding.action is None and not record.exists()
