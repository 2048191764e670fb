"""docs/plan.md's figures are what the command prints: every row of its tables and each
figure its text quotes, recomputed here from `plan --json` (the simulation is seeded,
the closed form exact), so a change to the model fails until the page says it too."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from nvrx_appliance.cli.main import cli
from nvrx_appliance.plan import costs, profiles, rates
from nvrx_appliance.plan.view import LABELS

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "plan.md").read_text()
TEXT = " ".join(PAGE.split())  # the page's words, however wrapped


@functools.cache
def plan(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def table(header: str) -> list[list[str]]:
    """The rows of the markdown table whose header line starts with `header`."""
    lines = PAGE.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _pct(x: float) -> str:
    return f"{x * 100:.1f}"


def size_row(gpus: str, profile_rates: str) -> list[str]:
    """One row of "The table", as the command gives it."""
    profile = "cluster" if "cluster" in profile_rates else "local"
    total = re.search(r"--total-rate ([0-9.]+)", profile_rates)
    args = ["--nodes", str(int(gpus.replace(",", "")) // 8), "--seeds", "20"]
    args += ["--profile", profile, *(["--total-rate", total.group(1)] if total else [])]
    d = plan(*args)
    a, said, rec = d["appliance"], d["assumptions"], d["recommended"]
    low, high = a["ettr_range"]
    loss = a["dominant_loss"]
    return [
        gpus,
        profile_rates,
        f"{said['mttf_hours']:.3g} h",
        f"{said['save']['seconds']:.3g} s",
        f"{_pct(a['ettr'])}% ({_pct(low)}-{_pct(high)}, {a['seeds']})",
        f"{a['closed_form_ettr']:.1%}",
        f"{d['appliance_today']['ettr']:.1%}",
        f"{d['seeds_design']['ettr']:.1%}",
        f"{LABELS[loss]} ({a['breakdown'][loss]:.1%})",
        f"{rec['save_interval_seconds'] / 60:.1f} min",
        f"{rec['hot_spares']} / {rec['cold_spares']}",
        str(rec["depth"]),
    ]


SIZES = table("| GPUs | profile, rates |")


@pytest.mark.parametrize("row", SIZES, ids=[f"{r[0]}-{r[1]}" for r in SIZES])
def test_each_row_of_the_table_is_what_the_command_prints(row):
    assert row == size_row(row[0], row[1])


def test_the_131072_gpu_rows_carry_the_recovery_caution_the_page_quotes():
    found = []
    for gpus, profile_rates, *_ in SIZES:
        if gpus != "131,072":
            continue
        args = ["--nodes", "16384", "--seeds", "20"]
        args += ["--profile", "cluster" if "cluster" in profile_rates else "local"]
        args += ["--total-rate", "6.5"] if "6.5" in profile_rates else []
        caution = plan(*args)["assumptions"]["cautions"][0]
        found.append(int(re.match(r"recovery takes (\d+)% of the wall time", caution).group(1)))
    assert f"recovery takes {min(found)}% to {max(found)}% of the wall time" in TEXT


def test_the_road_to_98_is_what_the_command_prints_at_16384_gpus():
    d = plan("--nodes", "2048", "--seeds", "20")
    road = {row[0]: row for row in table("| lever | the plan |")}
    everything = road.pop("all of them")
    closed = d["road"]["plan_allocation_goodput_closed_form"]
    together = d["road"]["all_levers_allocation_goodput"]
    assert everything[1:4] == [
        f"{closed:.1%} (closed form)",
        f"{together:.1%}",
        f"{(together - closed) * 100:+.2f}",
    ]
    out = CliRunner().invoke(cli, ["plan", "--nodes", "2048", "--seeds", "20"]).output
    out = out.split("The road to 98%")[1].split("\n\n")[0]
    for lever in d["road"]["levers"]:
        name, now, to, worth, appliance = road.pop(lever["lever"])
        assert f"{lever['worth_allocation_goodput'] * 100:+.2f}" == worth
        assert appliance == lever["the_appliance"]
        printed = next(x for x in out.splitlines() if x.startswith(f"  {name} "))
        assert f"{now} -> {to}" in printed and worth in printed and appliance in printed
    assert not road


def test_the_simulation_of_every_lever_pulled_is_what_the_page_quotes():
    d = plan("--nodes", "2048", "--save-seconds", "1", "--load-seconds", "5", "--cost",
             "worker_start=60", "--step-timeout", "60", "--node-silence-timeout", "5",
             "--max-time", "7-00:00:00", "--seeds", "20")  # fmt: skip
    shares = d["appliance"]["breakdown"]
    quoted = (
        f"gives {d['appliance']['ettr']:.1%}, the rest being the saves "
        f"({shares['checkpoint_saves']:.1%}), the work lost since the last one "
        f"({shares['training_lost']:.1%}) and the restarts ({shares['in_job_restarts']:.1%})"
    )
    assert quoted in TEXT


def test_the_causes_table_is_the_one_the_plan_uses():
    rows = table("| component (Table 5) |")
    said = {"gpu_fault": "GPU fault", "node_death": "node death", "rank_crash": "rank crash",
            "hang": "hang"}  # fmt: skip
    assert rows == [
        [c.component, c.category, str(c.count), said[c.shows_as], c.why] for c in rates.CAUSES
    ]
    classes = {row[0]: row for row in table("| class | how it is found")}
    defaults = rates.Rates()
    for name in ("gpu_fault", "node_death", "rank_crash", "hang"):
        row = classes[said[name]]
        assert row[2] == str(rates.llama3_count(name))
        assert row[3] == f"{getattr(defaults, name):.3g}"
    assert f"({rates.PROPORTIONS})" in TEXT
    assert f"{defaults.gpu_faults_per_thousand_gpu_days():.3g} per 1,000 GPU-days" in TEXT
    assert f"GPU fault {defaults.gpu_fault_at(4):.3g} per 1,000 node-days" in TEXT


def test_the_costs_table_is_the_measured_figures_and_the_profiles():
    local = plan("--nodes", "16", "--days", "1", "--seeds", "1", "--profile", "local")
    cluster = plan("--nodes", "16", "--days", "1", "--seeds", "1")
    for row in table("| step | seconds (local) |"):
        name, seconds, *_, cluster_cell = row
        assert float(seconds) == pytest.approx(local["costs"][name]["seconds"], abs=0.006)
        figure = float(cluster_cell.split(",")[0].split()[0])
        assert figure == pytest.approx(cluster["costs"][name]["seconds"], abs=0.006)
        assert ("**assumed**" in cluster_cell) == (name in profiles.CLUSTER_FIGURES)
    assert "death to NVRx's failure detected, median of five" in PAGE
    assert f": {costs.SILENT_DEATH_DETECTED_S:.2f} s from the" in PAGE
    for profile, start in (("local", "3.8"), ("cluster", "300.5")):
        spare = plan("--nodes", "16", "--days", "1", "--seeds", "1", "--profile", profile)
        assert f"{spare['assumptions']['cold_spare_start_seconds']:.1f}" == start
        assert start in TEXT


def test_llama3s_shape_and_byterobust_are_what_the_command_prints():
    rows = {row[0]: row[1] for row in table("| | ETTR |")}
    shape = ["--nodes", "2048", "--days", "54", "--time", "1654", "--seeds", "40"]

    def quoted(summary: dict) -> str:
        low, high = summary["ettr_range"]
        return f"{summary['ettr']:.1%} ({_pct(low)}-{_pct(high)})"

    local = plan(*shape, "--profile", "local")
    assert rows["the appliance, recovery costs as measured here (`--profile local`)"] == quoted(
        local["appliance"]
    )
    assert rows["the seeds' design, same"] == quoted(local["seeds_design"])
    worker = plan(*shape, "--profile", "local", "--cost", "worker_start=300")
    assert (
        quoted(worker["appliance"])
        in rows["the appliance, worker start 300 s (`--profile local --cost worker_start=300`)"]
    )
    cluster = plan(*shape)
    assert any(v == quoted(cluster["appliance"]) for k, v in rows.items() if "real-hardware" in k)
    drawn = local["appliance"]["interruptions"]
    assert (
        f"about {drawn['gpu_fault']:.0f} GPU faults, {drawn['node_death']:.0f} node deaths, "
        f"{drawn['rank_crash']:.0f} rank crashes and {drawn['hang']:.0f} hangs a run"
    ) in TEXT
    byte = plan("--nodes", "1200")["appliance"]["ettr"]
    byte_local = plan("--nodes", "1200", "--profile", "local")["appliance"]["ettr"]
    assert f"gives {byte:.1%} under the real-hardware profile ({byte_local:.1%} with" in TEXT


def test_every_example_at_the_top_of_the_page_runs():
    block = PAGE.split("\n\n")[2]
    for line in block.splitlines():
        args = line.split("#")[0].split()[2:]
        if "--from-chain" in args:
            continue  # needs a chain of that name
        result = CliRunner().invoke(cli, ["plan", *args, "--days", "1", "--seeds", "1"])
        assert result.exit_code == 0, (line, result.output)


def test_what_the_table_says_about_hot_spares_is_its_rows():
    hot = {}
    for row in SIZES:
        if row[1] == "**cluster**, Llama 3":
            hot[row[0]] = int(row[10].split(" / ")[0])
    assert hot["4,096"] == hot["16,384"] == 1
    assert {hot["65,536"], hot["131,072"]} <= {3, 4}
    assert "one at 4,096 and 16,384 GPUs, three or four at 65,536 and 131,072" in TEXT


def test_the_papers_totals_are_quoted_from_its_table():
    column = {c.component: c.published_share for c in rates.CAUSES}
    gpu = sum(c.count for c in rates.CAUSES if c.category == "GPU")
    hardware = sum(c.count for c in rates.CAUSES if c.shows_as in ("gpu_fault", "node_death"))
    assert f"give {gpu} GPU ({gpu / 419:.0%}) and {hardware} hardware" in TEXT
    assert f"host and unplanned maintenance: {hardware / 419:.0%})" in TEXT
    assert (
        f"faulty GPUs {column['Faulty GPU']}%, which is {round(column['Faulty GPU'] * 4.19)}"
        in TEXT
    )
    assert f"the column sums to {sum(column.values()):.1f}%" in TEXT
    shares = [c.published_share for c in rates.CAUSES if c.category == "GPU"]
    assert f"the GPU rows sum to {sum(shares):.1f}%" in TEXT
    both = [c.published_share for c in rates.CAUSES if c.shows_as in ("gpu_fault", "node_death")]
    assert f"the column {sum(both):.1f}%" in TEXT


def test_llama3s_time_limit_is_kept_past_the_partitions_default():
    shape = plan("--nodes", "2048", "--days", "54", "--time", "1654", "--seeds", "40")
    assert shape["time_limit_seconds"] == 1654 * 60 > 86400
    assert "1,654 minutes, longer than `--max-time`'s default day, so kept" in TEXT
