"""The benchmark's table, JSON, results-document block and command line."""

from __future__ import annotations

import pytest

from bench import readme, report
from bench.__main__ import _one, parse_args
from bench.report import FLOOR_LABEL, Metric, Result, versus


def results() -> list[Result]:
    return [
        Result("floor", "1 scheduler floor", [Metric(FLOOR_LABEL, [1.0, 2.0, 1.5])]),
        Result(
            "norestart",
            "4 no-restart",
            [
                Metric("exit 93 -> queue empty", [1.0, 3.0, 4.5], target_s=2.0),
                Metric("a phase", [0.25, 0.5, 0.75], indent=True),
            ],
        ),
        Result("spare", "3 escaped cold spare", error="Timeout: no spare escaped"),
    ]


def test_every_latency_is_reported_against_the_floor_of_the_same_run():
    lines = report.table(results()).splitlines()
    [row] = [line for line in lines if "exit 93" in line]
    assert "| 3.00 |" in row  # the median
    assert "| 2.0x |" in row  # 3.00 / floor median 1.5
    assert "<= 2 s: MISSED" in row


def test_the_table_shows_a_failed_scenario_and_indents_phases():
    text = report.table(results())
    assert "| 3 escaped cold spare | FAILED: Timeout: no spare escaped |" in text
    assert "| - a phase |" in text
    assert "| 0.500 |" in text  # sub-second figures keep milliseconds


def test_the_json_keeps_every_sample_and_the_verdicts():
    doc = report.document(results(), {"cores": 2}, {"repeat": 3})
    assert doc["floor_median_s"] == 1.5
    [norestart] = [s for s in doc["scenarios"] if s["scenario"] == "norestart"]
    metric = norestart["metrics"][0]
    assert metric["samples_s"] == [1.0, 3.0, 4.5]
    assert (metric["met"], metric["median_over_floor"]) == (False, 2.0)


def test_figures_measured_elsewhere_are_reported_as_given():
    given = {"n": 7, "median_s": 0.05, "min_s": 0.04, "max_s": 0.09}
    metric = Metric("warm pass", [], target_s=0.1, given=given)
    assert metric.figures() == given and metric.met() is True


def test_readme_block_is_appended_once_then_replaced_in_place():
    first = readme.with_results("# Project\n\nIntro.\n", readme.block("T1", "today", "m", "cmd"))
    assert first.count(readme.HEADING) == 1 and "T1" in first
    prose = first.replace(readme.BEGIN, "Hand-written prose.\n\n" + readme.BEGIN)
    second = readme.with_results(prose, readme.block("T2", "later", "m", "cmd"))
    assert "T2" in second and "T1" not in second
    assert "Hand-written prose." in second and second.startswith("# Project")


def test_readme_with_torn_markers_is_refused():
    torn = f"# P\n\n{readme.HEADING}\n\n{readme.BEGIN}\nold table\n"
    with pytest.raises(readme.ReadmeError, match="torn"):
        readme.with_results(torn, readme.block("T", "w", "m", "c"))


def test_cli_runs_the_floor_with_any_cluster_scenario_and_in_order():
    assert parse_args(["--only", "restart,handoff"]).chosen == ["floor", "handoff", "restart"]
    assert parse_args(["--only", "watcher"]).chosen == ["watcher"]
    everything = [
        "floor",
        "handoff",
        "sigkill",
        "seeds",
        "spare",
        "norestart",
        "restart",
        "liveness",
        "timelimit",
        "completion",
        "healthcheck",
        "segment",
        "segsilent",
        "scale",
        "sicknode",
        "watcher",
        "plan",
        "stacks",
        "planinputs",
        "silentdeath",
        "beats",
        "evidence",
    ]
    assert parse_args([]).chosen == everything
    assert parse_args(["--only", "stacks"]).chosen == ["stacks"]  # no cluster: no floor
    assert parse_args(["--only", "planinputs"]).chosen == ["planinputs"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--only", "handof"], "--only: unknown scenario 'handof'"),
        (["--repeat", "0"], "--repeat: at least 1"),
        (
            ["--publish", "--only", "scale,handoff"],
            "--publish: the growth table (scale) is published alone",
        ),
        (["--publish", "--only", "scale", "--repeat", "2"], "--publish: at least --repeat 5"),
    ],
)
def test_cli_refuses_bad_options_naming_them(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_the_growth_table_alone_may_be_published():
    assert parse_args(["--publish", "--only", "scale"]).chosen == ["floor", "scale"]


def test_a_partial_run_may_publish_its_rows_into_the_stored_full_run():
    assert parse_args(["--publish", "--only", "liveness"]).chosen == ["floor", "liveness"]


def test_a_partial_run_replaces_its_rows_of_the_full_run_and_the_block_says_when():
    # Issue 51: a row fixed by a partial re-run stayed MISSED in the published table until
    # the next full run; now the re-run's rows replace the full run's, dated.
    full = report.document(results(), {"cores": 2}, {"started": "2026-12-03T11:18:09+00:00",
                                                     "command": "python -m bench"})  # fmt: skip
    again = [
        Result("floor", "1 scheduler floor", [Metric(FLOOR_LABEL, [2.0, 2.0, 2.0])]),
        Result("norestart", "4 no-restart", [Metric("exit 93 -> queue empty", [1.0, 1.5, 1.0],
                                                    target_s=2.0)]),
    ]  # fmt: skip
    partial = report.document(
        again, {"cores": 2},
        {"started": "2026-12-06T21:00:00+00:00", "command": "python -m bench --only norestart",
         "scenarios": ["floor", "norestart"]},
    )  # fmt: skip
    both = report.merged(full, partial, ["floor", "spare", "norestart"])
    assert [s["scenario"] for s in both["scenarios"]] == ["floor", "spare", "norestart"]
    assert both["floor_median_s"] == 1.5  # the full run's floor: old rows keep their ratios
    text = report.table(report.results_of(both))
    [row] = [line for line in text.splitlines() if "exit 93" in line]
    assert "| 1.00 |" in row and "<= 2 s: met" in row and "| 0.7x |" in row
    assert "| - a phase |" not in text  # gone with the old row
    assert "| 3 escaped cold spare | FAILED" in text  # a scenario not re-run stays
    block = readme.block(text, "2026-12-03", "m", "python -m bench",
                         refreshed=["the rows of norestart on 2026-12-06 (`cmd`)"])  # fmt: skip
    assert "Re-run since: the rows of norestart on 2026-12-06 (`cmd`)." in block
    assert both["run"]["refreshed"][0]["scenarios"] == ["norestart"]
    assert both["run"]["refreshed"][0]["command"] == "python -m bench --only norestart"


def test_a_stored_run_reads_back_into_the_table_it_printed():
    doc = report.document(results(), {"cores": 2}, {"repeat": 3})
    assert report.table(report.results_of(doc)) == report.table(results())


def test_the_growth_block_is_its_own_and_leaves_the_recovery_table_alone():
    doc = readme.with_results("# P\n\nIntro.\n", readme.block("T1", "today", "m", "cmd"))
    doc = readme.with_results(doc, readme.block("G1", "today", "m", "c", "scale"), "scale")
    doc = readme.with_results(doc, readme.block("G2", "later", "m", "c", "scale"), "scale")
    assert "T1" in doc and "G2" in doc and "G1" not in doc
    assert doc.count(readme.markers("scale")[0]) == 1


def test_process_start_costs_come_from_the_machine_facts():
    machine = {
        "import_s": {"worker (torch)": [2.0, 3.0, 2.5], "python": [0.05]},
        "help_s": [0.07, 0.08, 0.06],
    }
    result = report.process_start(machine)
    assert [m.label for m in result.metrics] == [
        "fresh Python: import worker (torch)",
        "fresh Python: import python",
        "nvrx-appliance --help (host tool start)",
    ]
    assert result.metrics[0].figures()["median_s"] == 2.5
    assert result.metrics[2].figures()["median_s"] == 0.07
    assert result.metrics[2].met() is True


def test_a_scenario_that_fails_midway_keeps_what_it_measured():
    class Scenario:
        NAME, TITLE = "handoff", "2 hand-off"

        @staticmethod
        def collect(h, repeat, result):
            result.samples.append({"total_s": 21.0})
            raise TimeoutError("timed out after 240 s waiting for generation 12 to resume")

        @staticmethod
        def finish(result, floor):
            result.metrics = [Metric("total", [s["total_s"] for s in result.samples])]

    result = _one(Scenario, None, 5, None, say=lambda line: None)
    assert result.error == "TimeoutError: timed out after 240 s waiting for generation 12 to resume"
    text = report.table([result])
    assert "| 2 hand-off | FAILED: TimeoutError" in text
    assert "| total | 1 | 21.00 |" in text


def test_the_seeds_design_is_held_against_the_appliance_on_the_same_failure():
    ours = Result("handoff", "2", metrics=[Metric("node death -> first step", [17.0, 18.0, 19.0])])
    theirs = Result("seeds", "2c", metrics=[Metric("node death (seeds)", [300.0, 306.0, 340.0])])
    line = versus([ours, theirs], "handoff", "seeds")
    assert line.startswith("node death (seeds): 306.00 s, 17.0x the appliance's 18.00 s")
    assert versus([ours], "handoff", "seeds") is None


def test_a_measure_in_another_unit_names_it_and_is_not_held_against_the_floor():
    load = Metric("a whole generation", [150.0, 180.0], target_s=200, unit="calls/s")
    text = report.table([*results(), Result("liveness", "7 liveness load", [load])])
    [row] = [line for line in text.splitlines() if "a whole generation" in line]
    assert "a whole generation (calls/s) |" in row
    assert "| - |" in row and "<= 200 calls/s: met" in row
