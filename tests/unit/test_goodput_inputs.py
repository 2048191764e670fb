"""What the goodput account reads: Megatron-LM's lines, the progress log, sacct; and what
it gives: `nvrx-appliance report` as people run it, the picture, the watcher's gauges."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.goodput import gather, picture
from nvrx_appliance.goodput.account import CATEGORIES, account
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe.slurm_output import ALLOCATIONS, sacct_rows
from nvrx_appliance.observe.times import parse_time
from nvrx_appliance.observe.training_log import (
    MEGATRON_LOG,
    MegatronRecord,
    from_megatron_log,
    from_progress_log,
    megatron_line,
)
from nvrx_appliance.settings.chain import ChainSpec
from nvrx_appliance.watch import goodput_metrics, target
from nvrx_appliance.watch import run_loop as watch_shell
from nvrx_appliance.watch.config import Settings, Thresholds
from tests.unit.test_goodput import T0, chain_inputs, training

# A per-cycle log as NVRx 0.7.0 writes it (each worker line behind its rank), holding the
# lines Megatron-LM prints at the pinned release: print_datetime, training_log,
# checkpointing's save/load lines and the fault injector's warning. No GPU here, so the
# lines are composed from those format strings, not captured from a run.
MEGATRON = "\n".join(  # print_datetime's lines end in a blank, as Megatron prints them
    [
        "0: [after megatron is initialized] datetime: 2026-12-01 10:00:05.000000 ",
        "0:  successfully loaded checkpoint from /ckpt [ t 1/1, gtp_remat 1/1, p 1/1 ] at iteration 200",
        "0: [after model, optimizer, and learning rate scheduler are built] datetime: 2026-12-01 10:00:20.000000 ",
        "0: [after dataloaders are built] datetime: 2026-12-01 10:00:25.000000 ",
        "0: [before the start of training step] datetime: 2026-12-01 10:00:26.000000 ",
        "7:  [2026-12-01 10:00:36.000000] iteration      210/    1000 | consumed samples:         6720 | elapsed time per iteration (ms): 1000.0 | learning rate: 1.000000E-04 | global batch size:    32 | lm loss: 5.000000E+00 | loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |",
        "0: [2026-12-01 10:00:46.000000] saving checkpoint at iteration     220 to /ckpt in torch_dist format",
        "0:   [2026-12-01 10:00:47.500000] scheduled an async checkpoint save at iteration     220 to /ckpt",
        "7:  [2026-12-01 10:00:57.500000] iteration      230/    1000 | consumed samples:         7360 | elapsed time per iteration (ms): 1050.0 | global batch size:    32 |",
        "0:   [2026-12-01 10:01:00.000000] successfully saved checkpoint from iteration     220 to /ckpt [ t 1/1, gtp_remat 1/1, p 1/1 ]",
        "3: WARNING:megatron.core.fault_injector:[2026-12-01 10:01:02.000000] FAULT INJECTION: Rank 3 will inject fault GPU_SLEEP at 2026-12-01 10:01:05.000000",
        "0: [2026-12-01 10:01:08.000000] saving checkpoint at iteration     240 to /ckpt in torch_dist format",
        "0: some other output of the run",
    ]
)


def at(text: str) -> float:
    stamp = parse_time(text)
    assert stamp is not None
    return stamp


def test_megatrons_own_lines_give_the_cycles_training_record():
    lines = [line for line in MEGATRON.splitlines() if megatron_line(line)]
    assert "some other output" not in "".join(lines)
    work = from_megatron_log(lines, "4242", 1)
    assert work is not None and work.source == MEGATRON_LOG
    assert work.started == at("2026-12-01 10:00:26") and work.start_iteration == 200
    assert [label for label, _ in work.setup] == [
        "initialize Megatron",
        "model, optimizer and checkpoint load",
        "data loaders",
        "data and the training loop",
    ]
    assert work.steps == [(at("2026-12-01 10:00:36"), 210), (at("2026-12-01 10:00:57.5"), 230)]
    assert work.step_seconds == [1.0, 1.05]
    kept, dying = work.saves
    # The async save stood training still until it was scheduled; the tracker named it later.
    assert (kept.iteration, kept.began, kept.ended, kept.committed) == (
        220, at("2026-12-01 10:00:46"), at("2026-12-01 10:00:47.5"), at("2026-12-01 10:01:00"),
    )  # fmt: skip
    assert (dying.iteration, dying.committed) == (240, None)  # began, never committed
    assert work.faults == [(at("2026-12-01 10:01:05"), "GPU_SLEEP fault on rank 3")]
    assert work.last_iteration == 240


def test_a_log_without_megatrons_lines_is_no_record():
    assert from_megatron_log(["0: hello", "0: iteration of something else"], "1", 0) is None


def test_progress_events_without_a_generation_are_not_a_generations_record():
    events = [{"event": "start", "time": T0, "iteration": 0, "cycle": 0}]
    assert from_progress_log(events) == {}


def test_step_time_leaves_out_the_saves_between_logged_steps():
    work = from_progress_log(training("5", 0, 10, 0, 60, saves=(20, 40)))[("5", 0)]
    assert work.step_seconds == pytest.approx([0.1] * 5)
    assert work.log_interval == 10


WORK = "/shared/run"
SACCT = f"""\
12_0|12|chain|alice|CANCELLED by 0|node1|2026-12-01T10:00:00|2026-12-01T10:00:05|2026-12-01T10:05:00|{WORK}
12_1|13|chain|alice|COMPLETED|node[2-3]|2026-12-01T10:00:00|2026-12-01T10:00:06|2026-12-01T10:05:01|{WORK}/
12_2|14|chain|alice|CANCELLED by 0|None assigned|2026-12-01T10:00:00|Unknown|2026-12-01T10:05:00|{WORK}
13_0|16|chain|alice|RUNNING|node4|2026-12-01T10:00:00|2026-12-01T10:05:03|Unknown|{WORK}
13_[1-3%2]|15|chain|alice|PENDING|None assigned|2026-12-01T10:00:00|Unknown|Unknown|{WORK}
14_[0-3%2]|17|chain|alice|PENDING|None assigned|2026-12-01T10:00:00|Unknown|Unknown|{WORK}
20_0|21|chain|alice|RUNNING|node9|2026-12-01T10:00:00|2026-12-01T10:05:03|Unknown|/elsewhere
"""


def test_sacct_rows_become_what_each_task_held_and_the_generations_still_queued():
    held, queued = gather.allocations(sacct_rows(SACCT, ALLOCATIONS), WORK)
    assert [(a.generation, a.task, a.nodes) for a in held] == [
        ("12", 0, ("node1",)), ("12", 1, ("node2", "node3")), ("13", 0, ("node4",)),
    ]  # fmt: skip
    assert held[0].submit == at("2026-12-01T10:00:00") and held[2].end is None
    assert queued == ("14",)  # 13 has started; its pending spares do not make it queued


def _chain(tmp_path: Path) -> Path:
    """A chain's work dir as the cluster leaves it: run.json, cycle-info files, the
    progress log, the ledger (the goodput unit tests' chain)."""
    spec = ChainSpec(work_dir=str(tmp_path), workload="cpu", runtime="bare", job_name="chain")
    built = run_manifest.build(spec, created="2026-12-01T09:00:00Z", user="alice")
    run_manifest.save(built)
    inputs = chain_inputs()
    for generation, cycles in inputs.cycles.items():
        folder = built.layout.cycle_infos(generation)
        folder.mkdir(parents=True)
        for c in cycles:
            doc = {"job_id": generation, "cycle_number": c.number, "attempt_index": 0,
                   "cycle_start_time": _iso(c.start), "cycle_end_time": _iso(c.end),
                   "active_nodes": c.active_nodes}  # fmt: skip
            (folder / f"cycle_info.{generation}.0.{c.number}").write_text(json.dumps(doc))
    events = [
        *training("10", 0, 15, 0, 70, saves=(50,), fault=0.3),
        *training("10", 1, 47, 50, 130, saves=(100,)),
        *training("11", 0, 115, 100, 930, saves=(150,), setup=False),
    ]
    built.layout.logs.mkdir()
    built.layout.progress_log.write_text("".join(json.dumps(e) + "\n" for e in events))
    built.layout.ledger.write_text(json.dumps({"array_job_id": "10", "action": "fenced"}) + "\n")
    return tmp_path


def _iso(epoch: float | None) -> str | None:
    import datetime

    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc).isoformat()


def _local(offset: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(T0 + offset).strftime("%Y-%m-%dT%H:%M:%S")


def _sacct_standin(tmp_path: Path, work: Path) -> dict[str, str]:
    """A sacct on PATH that prints the chain's accounting (the real one is exercised by
    tests/integration/test_chain_goodput.py): what `report` runs as people run it."""
    rows = [("10_0", "node1", 0, 100, "CANCELLED by 0"), ("10_1", "node2", 1, 101, "COMPLETED"),
            ("10_2", "node3", 60, 61, "COMPLETED"), ("11_0", "node2", 102, 200, "TIMEOUT"),
            ("11_1", "node1", 103, 200, "TIMEOUT")]  # fmt: skip
    text = "".join(
        f"{job}|{n}|chain|alice|{state}|{node}|{_local(0)}|{_local(s)}|{_local(e)}|{work}\n"
        for n, (job, node, s, e, state) in enumerate(rows)
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "answer").write_text(text)
    sacct = bin_dir / "sacct"
    sacct.write_text(f'#!/bin/sh\necho "$@" >> {bin_dir}/calls\ncat {bin_dir}/answer\n')
    sacct.chmod(sacct.stat().st_mode | stat.S_IXUSR)
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_CONF": str(conf)}


def _report(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    tool = str(Path(sys.executable).parent / "nvrx-appliance")
    return subprocess.run([tool, "report", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_report_prints_the_account_and_writes_the_picture_where_it_is_run(tmp_path):
    work = _chain(tmp_path / "run")
    env = _sacct_standin(tmp_path, work)
    done = _report("chain", "--work-dir", str(work), env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == ("Goodput of chain chain: 3.8% of the allocation trained (15 of 396 node-s)")
    assert any(line.split()[:3] == ["training", "lost", "83"] for line in lines), done.stdout
    assert lines[-1] == "  picture: chain-goodput.svg"
    # The chain's own --save-interval (ChainSpec's default, 20) against the one its
    # history recommends (two interruptions, 0.5 s saves, 0.1 s a step).
    assert any(
        line.startswith("  save interval: 20 iterations (2.0 s of training) today, 96 iterations")
        for line in lines
    ), done.stdout
    assert "    apply it: --save-interval 96 (NVRX_SAVE_INTERVAL) on the next submit" in lines
    ET.parse(tmp_path / "chain-goodput.svg")  # a picture a browser opens: well-formed SVG
    asked = (tmp_path / "bin" / "calls").read_text()
    assert "--name chain" in asked and "Submit" in asked  # by name since the chain began


def test_report_json_has_its_schema_and_writes_no_picture_unless_asked(tmp_path):
    work = _chain(tmp_path / "run")
    env = _sacct_standin(tmp_path, work)
    done = _report("chain", "--work-dir", str(work), "--json", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["schema"], doc["schema_version"]) == ("nvrx-appliance/report", 1)
    assert doc["allocation_node_seconds"] == pytest.approx(396)
    assert doc["training_lost"]["iterations"] == 830 and doc["picture"] is None
    assert doc["save_interval"]["current_iterations"] == 20
    assert doc["save_interval"]["recommended_iterations"] == 96
    assert doc["save_interval"]["certainty"] == "low"
    assert not list(tmp_path.glob("*.svg"))
    svg = tmp_path / "elsewhere" / "g.svg"
    done = _report(
        "chain", "--work-dir", str(work), "--json", "--svg", str(svg), env=env, cwd=tmp_path
    )
    assert json.loads(done.stdout)["picture"] == str(svg) and svg.exists()


def test_report_without_slurm_says_so_in_one_line_and_fails(tmp_path):
    work = _chain(tmp_path / "run")
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "missing.conf")}
    done = _report("chain", "--work-dir", str(work), "--no-svg", env=env, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stdout.startswith("Goodput of chain chain: unknown (Slurm's accounting did")
    assert done.stderr.strip() == (
        f"nvrx-appliance report: sacct: SLURM_CONF={tmp_path}/missing.conf does not exist"
    )


def test_report_refuses_contradicting_picture_options_and_a_dir_without_a_chain(tmp_path):
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "missing.conf")}
    both = _report("x", "--work-dir", str(tmp_path), "--svg", "a.svg", "--no-svg", env=env,
                   cwd=tmp_path)  # fmt: skip
    assert both.returncode == 2 and "--svg and --no-svg" in both.stderr
    empty = _report("x", "--work-dir", str(tmp_path), env=env, cwd=tmp_path)
    assert empty.returncode == 2 and "holds no nvrx-appliance chain" in empty.stderr
    assert not list(tmp_path.glob("*.svg"))


def test_the_picture_draws_every_node_every_category_and_the_iterations():
    result = account(chain_inputs())
    root = ET.fromstring(picture.svg(result))
    svg = "{http://www.w3.org/2000/svg}"
    titles = [t.text or "" for t in root.iter(f"{svg}title")]
    for key, label in CATEGORIES.items():
        if result.categories[key]:
            assert any(t.startswith(label) for t in titles), label
    texts = [t.text or "" for t in root.iter(f"{svg}text")]
    assert "task 0 node1" in texts and "generation 11" in texts
    assert any(t.startswith("hand-off") for t in texts)
    assert any("hang fault on rank 0" in t for t in titles)
    assert len(list(root.iter(f"{svg}polyline"))) == 4  # a line per cycle, and the kept line


def test_a_thousand_node_chain_draws_alike_nodes_as_one_row():
    base = chain_inputs()
    spare = base.allocations[1]  # generation 10's hot spare, 1 s to 101 s
    many = tuple(
        dataclasses.replace(spare, task=100 + i, nodes=(f"spare{i}",)) for i in range(1000)
    )
    text = picture.svg(account(chain_inputs(allocations=(*base.allocations, *many))))
    assert "1001 node(s), task 1" in text  # the hot spare and the thousand alike
    assert text.count("<rect") < 200


def _gauges(text: str) -> dict[str, str]:
    return dict(ln.rsplit(" ", 1) for ln in text.splitlines() if ln.startswith("nvrx_watch_"))


def test_the_gauges_carry_the_account_and_keep_every_series_when_it_is_unknown():
    chain = {"chain": "chain", "owner": "alice"}
    known = _gauges(goodput_metrics.text(account(chain_inputs()), chain))
    labels = 'chain="chain",owner="alice"'
    assert float(known[f"nvrx_watch_goodput_ratio{{{labels}}}"]) == pytest.approx(15 / 396)
    assert known[f"nvrx_watch_allocation_node_seconds{{{labels}}}"] == "396"
    lost = f'nvrx_watch_goodput_node_seconds{{{labels},category="training_lost"}}'
    assert float(known[lost]) == pytest.approx(83.0)
    assert known[f"nvrx_watch_training_lost_iterations{{{labels}}}"] == "830"
    # The save interval its history recommends: two interruptions, 0.5 s saves.
    recommended = f'nvrx_watch_save_interval_iterations{{{labels},interval="recommended"}}'
    assert known[recommended] == "96"
    assert known[f"nvrx_watch_interruptions{{{labels}}}"] == "2"
    assert float(known[f"nvrx_watch_save_blocking_seconds{{{labels}}}"]) == pytest.approx(0.5)
    unknown = _gauges(goodput_metrics.text(None, chain))
    blind = _gauges(goodput_metrics.text(account(chain_inputs(allocations=None)), chain))
    assert unknown.keys() == known.keys() == blind.keys()
    assert set(unknown.values()) == set(blind.values()) == {"NaN"}


def test_nvrx_watch_writes_the_goodput_gauges_beside_its_own(tmp_path):
    work = _chain(tmp_path / "run")
    settings = Settings(
        state_file=str(tmp_path / "state" / "state.json"),
        metrics_file=str(tmp_path / "nvrx.prom"),
    )
    request = target.Request(platform="none", work_dir=str(work))
    watch_shell.build(request, settings, Thresholds(), watch_shell.make_logger("")).pass_once()
    gauges = _gauges(Path(settings.metrics_file).read_text())
    owner = watch_shell.caller_name()
    # --platform none: no accounting to read, so no allocation: NaN, not 0.
    assert gauges[f'nvrx_watch_goodput_ratio{{chain="chain",owner="{owner}"}}'] == "NaN"
    assert f'nvrx_watch_cycles{{chain="chain",owner="{owner}"}}' in gauges


def _megatron_chain(tmp_path: Path) -> Path:
    """A Megatron chain's work dir with one cycle-info file; its cycle's log path."""
    spec = ChainSpec(work_dir=str(tmp_path), workload="megatron", runtime="bare", job_name="mg")
    built = run_manifest.build(spec, created="2026-12-01T09:00:00Z", user="alice")
    run_manifest.save(built)
    folder = built.layout.cycle_infos("4242")
    folder.mkdir(parents=True)
    doc = {"job_id": "4242", "cycle_number": 1, "attempt_index": 0, "active_nodes": "node1",
           "cycle_start_time": "2026-12-01T09:59:50Z"}  # fmt: skip
    (folder / "cycle_info.4242.0.1").write_text(json.dumps(doc))
    built.layout.logs.mkdir()
    return built.layout.app_log("mg", "4242", 1)


def test_a_megatron_chain_is_read_from_each_cycles_own_log(tmp_path):
    log = _megatron_chain(tmp_path)
    log.write_text(MEGATRON)
    memo = gather.LogMemo()
    inputs = gather.read(tmp_path, lambda query: [], now=T0, memo=memo)
    assert inputs.work_source == MEGATRON_LOG
    assert inputs.work[("4242", 1)].start_iteration == 200
    again = gather.read(tmp_path, lambda query: [], now=T0, memo=memo)
    assert again.work[("4242", 1)] is inputs.work[("4242", 1)]  # unchanged: not parsed again
    log.write_text("0: the log of a run that died at once\n")
    later = gather.read(tmp_path, lambda query: [], now=T0, memo=memo)
    assert later.work == {} and later.work_source.startswith("no Megatron iteration lines")


def test_a_progress_log_past_64_mib_still_gives_its_newest_generations(tmp_path):
    # A long chain's progress log: older generations' events (padded here to reach the
    # size fast) and, past the first 64 MiB, the generation training now.
    work = _chain(tmp_path / "run")
    log = Layout(work).progress_log
    newest = log.read_text()
    pad = "p" * 100_000
    with log.open("w") as out:
        old = {"event": "step", "slurm_array_job_id": "9", "cycle": 0, "iteration": 1, "pad": pad}
        for n in range(700):
            out.write(json.dumps({**old, "time": T0 + n / 1000}) + "\n")
        out.write(newest)
    assert log.stat().st_size > 64 << 20
    inputs = gather.read(work, lambda query: [], now=T0 + 1000)
    assert ("11", 0) in inputs.work and inputs.work[("11", 0)].last_iteration == 930


def test_a_growing_megatron_log_is_read_only_where_it_grew(tmp_path, monkeypatch):
    path = _megatron_chain(tmp_path)
    lines = MEGATRON.splitlines(keepends=True)
    head, rest = "\n".join(MEGATRON.splitlines()[:6]) + "\n", MEGATRON.splitlines()[6:]
    path.write_text(head + rest[0][:30])  # the next line is being written
    fed: list[str] = []
    feed = MegatronRecord.feed
    monkeypatch.setattr(
        MegatronRecord, "feed", lambda self, line: (fed.append(line), feed(self, line))[1]
    )
    memo = gather.LogMemo()
    first = gather.read(tmp_path, lambda query: [], now=T0, memo=memo).work[("4242", 1)]
    assert [i for _, i in first.steps] == [210] and len(fed) == 6
    with path.open("a") as out:
        out.write(rest[0][30:] + "\n" + "\n".join(rest[1:]) + "\n")
    fed.clear()
    grown = gather.read(tmp_path, lambda query: [], now=T0, memo=memo).work[("4242", 1)]
    assert len(fed) == len(lines) - 6  # only the lines it gained, the torn one whole
    whole = from_megatron_log(MEGATRON.splitlines(), "4242", 1)
    assert grown == whole and [i for _, i in grown.steps] == [210, 230]
    assert [i for _, i in first.steps] == [210]  # what a pass got is not changed later
