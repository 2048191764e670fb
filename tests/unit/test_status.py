"""`status` assembled from recorded inputs: Slurm's text, the ledger, real cycle-info files."""

import io
import json
from pathlib import Path

from click.testing import CliRunner
from rich.console import Console

from nvrx_appliance.slurm import parse, status, status_view
from nvrx_appliance.watch.parsing import cycle_info

FIXTURES = Path(__file__).parent / "fixtures" / "watch"
WORK = "/shared/run"

MANIFEST = {
    "created": "2026-11-30T18:00:00Z",
    "user": "alice",
    "spec": {"job_name": "demo", "work_dir": WORK},
    "shape": {"array_spec": "0-3%3", "active_tasks": 3},
}

# sacct -X -P: generation 4242 ended (task 0 failed on node1, spares cancelled),
# 4250 runs on node2 with one active task not admitted yet, 4251 still queued.
SACCT = f"""\
4242_0|4243|demo|alice|FAILED|1:0|node1|2026-11-30T18:07:50|2026-11-30T18:09:00|{WORK}
4242_1|4244|demo|alice|COMPLETED|0:0|node2|2026-11-30T18:07:50|2026-11-30T18:09:01|{WORK}
4242_2|4245|demo|alice|COMPLETED|0:0|node3|2026-11-30T18:07:50|2026-11-30T18:09:01|{WORK}
4242_3|4242|demo|alice|CANCELLED by 0|0:0|None assigned|Unknown|2026-11-30T18:09:00|{WORK}
4250_0|4252|demo|alice|RUNNING|0:0|node2|2026-11-30T18:09:03|Unknown|{WORK}
4250_1|4253|demo|alice|RUNNING|0:0|node3|2026-11-30T18:09:03|Unknown|{WORK}
4250_[2-3%3]|4250|demo|alice|PENDING|0:0|None assigned|Unknown|Unknown|{WORK}
4251_[0-3%3]|4251|demo|alice|PENDING|0:0|None assigned|Unknown|Unknown|{WORK}
4260_0|4261|demo|alice|RUNNING|0:0|node4|2026-11-30T18:09:03|Unknown|/elsewhere
"""
SQUEUE = f"""\
4252|4250|0|demo|alice|RUNNING|node2|None|{WORK}
4253|4250|1|demo|alice|RUNNING|node3|None|{WORK}
4250_2|4250|2|demo|alice|PENDING|(null)|Resources|{WORK}
4250_3|4250|3|demo|alice|PENDING|(null)|JobArrayTaskLimit|{WORK}
4251_0|4251|0|demo|alice|PENDING|(null)|Dependency|{WORK}
"""
LEDGER = [
    {
        "array_job_id": "4242",
        "chain": "2026-11-30T18:00:00Z",
        "task0_node": "node1",
        "exit_code": 1,
        "checkpoint_iteration_start": None,
        "checkpoint_iteration": 40,
        "action": "released_spares",
        "reason": "task 0 exited 1; releasing this generation's pending spares",
    },
    {"array_job_id": "1", "chain": "an older chain in the same dir", "exit_code": 93},
]


def _view():
    cycles = [cycle_info((FIXTURES / "two_cycles" / n).read_text()) for n in
              ("cycle_info.4242.0.0", "cycle_info.4242.0.1")]  # fmt: skip
    return status.assemble(
        manifest=MANIFEST,
        queue=parse.squeue_rows(SQUEUE),
        acct=parse.sacct_rows(SACCT),
        ledger=LEDGER,
        cycles={"4242": cycles},
        checkpoint_now=60,
        chain_marker=True,
    )


def test_each_generation_is_listed_once_in_order_and_other_chains_are_left_out():
    view = _view()
    assert [g.array_job_id for g in view.generations] == ["4242", "4250", "4251"]
    assert view.queued == ("4251",)


def test_an_ended_generation_shows_task_0s_node_exit_and_hand_off_iteration():
    ended = _view().generations[0]
    assert (ended.state, ended.task0_node, ended.exit_code) == ("ended", "node1", 1)
    assert (ended.running, ended.pending, ended.done) == (0, 0, 4)
    assert ended.checkpoint_end == 40 and ended.action == "released_spares"


def test_the_running_generation_says_it_still_waits_for_active_tasks():
    running = _view().generations[1]
    assert (running.state, running.running, running.pending) == ("running", 2, 2)
    assert running.task0_node == "node2"
    assert running.admission == "2 of 3 active tasks admitted; waiting for the scheduler"


def test_cycles_come_from_nvrxs_own_files():
    cycles = _view().generations[0].cycles
    assert [c.number for c in cycles] == [0, 1]
    assert all(c.end is not None for c in cycles)


def test_a_source_that_could_not_be_read_is_named_not_fatal():
    view = status.assemble(
        manifest=MANIFEST,
        queue=None,
        acct=None,
        ledger=LEDGER,
        cycles={},
        checkpoint_now=None,
        chain_marker=False,
        blind=["sacct: sacct did not answer within 30s"],
    )
    assert [g.array_job_id for g in view.generations] == ["4242"]
    assert view.generations[0].exit_code == 1  # the ledger still knows
    text = _rendered(view)
    assert "could not read sacct" in text


def _rendered(view):
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(status_view.render(view))
    return console.export_text()


def test_the_table_reads_like_the_chain():
    text = _rendered(_view())
    assert "checkpoint iteration now: 60" in text
    assert "queued generations: 4251" in text
    assert "released spares" in text and "waiting for the scheduler" in text


def test_status_json_round_trips():
    doc = json.loads(json.dumps(_view().to_json()))
    assert doc["generations"][0]["cycles"][1]["number"] == 1


def test_status_of_a_work_dir_without_a_chain_says_so(tmp_path):
    from nvrx_appliance.cli import cli

    result = CliRunner().invoke(cli, ["status", "x", "--work-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "holds no nvrx-appliance chain" in result.output
