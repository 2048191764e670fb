"""What `plan` assumed is in what it prints and in --json: the checkpoint and the
storage (given or assumed), what a save blocks, the load apart, the failure model, the
rates per GPU where the cause is a GPU, a total rate, a chain's rates as ranges, and
the cautions where the model stops holding."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from nvrx_appliance.cli.main import cli
from nvrx_appliance.goodput.account import account
from nvrx_appliance.plan import assumptions, history, model, rates, request, view
from tests.unit.test_goodput_interval import recorded_chain


def plan(*args: str):
    result = CliRunner().invoke(cli, ["plan", "--days", "10", "--seeds", "2", *args])
    assert result.exit_code == 0, result.output
    return result.output


def section(out: str, title: str) -> list[str]:
    """The lines of one part of the plan: from its title to the blank line after it."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    end = next((i for i in range(start, len(lines)) if not lines[i]), len(lines))
    return lines[start:end]


def plan_json(*args: str) -> dict:
    return json.loads(plan(*args, "--json"))["assumptions"]


def test_an_assumed_checkpoint_and_storage_say_so_and_a_given_one_says_given():
    out = plan("--nodes", "2048")
    assert (
        "  checkpoint 65,536 GB (assumed: 4 GB per GPU), storage 2,000 GB/s (assumed: Llama 3's "
        "2 TB/s)"
    ) in out
    assert (
        "  a save blocks 32.8 s: the whole write (an async save's staging copy: --save-seconds)"
        in out
    )
    doc = plan_json("--nodes", "2048", "--checkpoint-gb", "30000", "--storage-gbps", "800")
    assert doc["checkpoint_gb"] == {
        "value": 30000.0,
        "given": True,
        "basis": "given",
        "source": "--checkpoint-gb",
    }
    assert doc["storage_gbps"]["value"] == 800.0 and doc["storage_gbps"]["basis"] == "given"
    assert doc["save"] == {
        "seconds": 37.5,
        "given": False,
        "blocks": "the whole write (synchronous)",
        "basis": "size / rate",
    }
    assumed = plan_json("--nodes", "2048")
    assert assumed["checkpoint_gb"]["given"] is False
    assert assumed["checkpoint_gb"]["basis"] == "assumed"
    assert "4 GB per GPU, Llama 3's largest" in assumed["checkpoint_gb"]["source"]
    assert "2 TB/s sustained" in assumed["storage_gbps"]["source"]


def test_a_load_is_priced_apart_from_the_save():
    out = plan("--nodes", "2048", "--save-seconds", "3", "--load-seconds", "5")
    assert "  a save blocks 3 s (given (--save-seconds))" in out
    assert "  a load takes 5 s (given (--load-seconds))" in out
    doc = plan_json("--nodes", "2048", "--save-seconds", "3", "--load-seconds", "5")
    assert doc["save"]["blocks"] == "as given"
    assert doc["load"] == {"seconds": 5.0, "given": True, "basis": "given"}
    default = plan("--nodes", "2048")
    assert "a load takes 32.8 s (the whole read; a local restore: --load-seconds)" in default


def test_the_failure_model_is_printed_and_carried():
    out = plan("--nodes", "64")
    at = next(i for i, x in enumerate(out.splitlines()) if x.startswith("  failures: "))
    said = " ".join(" ".join(out.splitlines()[at : at + 3]).split())
    assert said == " ".join(" ".join(assumptions.FAILURE_MODEL_SAID).split())
    assert "Poisson in wall time" in said and "one in a recovery restarts it" in said
    assert "idle spares never fail" in said
    assert plan_json("--nodes", "64")["failure_model"] == list(assumptions.FAILURE_MODEL)


def test_gpu_faults_scale_per_gpu_so_4_gpu_nodes_see_fewer_each_and_more_in_all():
    eight = request.scenario(request.Request(nodes=2048, gpus_per_node=8))
    four = request.scenario(request.Request(nodes=4096, gpus_per_node=4))
    # 268 of Llama 3's 419 were the GPU's own faults: per GPU, not per node.
    assert rates.Rates().gpu_fault_at(4) == pytest.approx(rates.Rates().gpu_fault / 2)
    assert rates.Rates().gpu_fault_at(4) == pytest.approx(268 / 2 * 1000 / (2048 * 54))
    # The same 16,384 GPUs on twice the nodes: more interruptions in all.
    assert model.interrupting_rate(four) > 1.2 * model.interrupting_rate(eight)
    out = plan("--nodes", "4096", "--gpus-per-node", "4")
    assert "of 4-GPU nodes: node death 0.796, GPU fault 1.21," in out
    assert "GPU faults 0.303 per 1,000 GPU-days (counted on 8-GPU nodes): per GPU" in out
    # A GPU fault rate given is per node of the planned shape: nothing of it rescaled.
    given = plan("--nodes", "4096", "--gpus-per-node", "4", "--gpu-fault", "4")
    assert "of 4-GPU nodes: node death 0.796, GPU fault 4," in given
    assert "per 1,000 GPU-days" not in given


def test_a_total_rate_in_the_form_meta_publishes_gives_the_rates_mttf():
    # 6.5 per 1,000 node-days on 16,384 nodes: 106.5 a day, one every 0.225 h.
    out = plan("--nodes", "16384", "--total-rate", "6.5")
    assert "one interruption every 0.225 h over the 16,384 training nodes" in out
    text = " ".join(out.split())  # wrapped at 100 characters
    assert "split as Llama 3's 88 node deaths : 268 GPU faults : 56 rank crashes : 7 hangs" in text
    assert plan_json("--nodes", "16384", "--total-rate", "6.5")["mttf_hours"] == pytest.approx(
        24 / (16.384 * 6.5)
    )
    refused = CliRunner().invoke(cli, ["plan", "--total-rate", "6.5", "--hang", "1"])
    assert refused.exit_code == 2
    assert "--total-rate: give it or --hang, not both" in refused.output


def test_a_chains_counts_are_ranges_and_the_closed_form_is_given_over_them():
    seen = history.read(account(recorded_chain([17, 23, 9], [20.0, 30.0, 25.0])), 1)
    req = request.with_history(request.Request(nodes=64, days=10, seeds=2), seen)
    sc = request.scenario(req, seen)
    found = model.plan(sc, req.today, seeds=2, grace=3.0, storage_stall_s=40.0)
    (name, low, high, count, _), _ = assumptions.ranges(sc.rates)
    assert (name, count) == ("rank_crash", 3)
    assert low < sc.rates.rank_crash / 2 and high > sc.rates.rank_crash * 2  # three events
    text = "\n".join(view.lines(found))
    assert "    rank crash: 3 in " in text and "(90% Poisson interval)" in text
    worst, best = assumptions.range_ettr(found)
    assert worst < found.closed_form < best
    assert f"over the counted rates' 90% range: closed form {worst:.1%} to {best:.1%}" in text


def test_cautions_where_recovery_is_long_or_the_interval_long_for_a_generation():
    big = plan("--nodes", "16384", "--total-rate", "6.5")
    assert re.search(r"Caution: recovery takes \d+% of the wall time \(over 10%\)", big)
    short = " ".join(plan("--nodes", "2048", "--max-time", "00:10:00", "--time", "0:10:00").split())
    assert "is over half a generation (10.0 min)" in short
    assert "Caution" not in plan("--nodes", "64")


# --- cost profiles -------------------------------------------------------------------------


def test_each_local_cost_says_whether_it_holds_on_real_hardware():
    out = plan("--nodes", "2048", "--profile", "local")
    line = {x.split()[0]: x for x in section(out, "What each step costs")[2:]}
    assert line["nvrx_waits"].endswith("measured, holds: NVRx's constants")
    assert "CPU stand-in: a CPU trainer's, no CUDA or NCCL" in line["worker_start"]
    assert line["worker_start"].endswith("; --profile cluster")
    assert line["time_limit_end"].endswith(
        "CPU stand-in: the CPU trainer's shutdown; --cost time_limit_end=S"
    )
    doc = json.loads(plan("--nodes", "2048", "--profile", "local", "--json"))["costs"]
    assert doc["profile"] == "local"
    assert doc["worker_start"]["holds_on_real_hardware"] is False
    assert doc["store_wait"]["holds_on_real_hardware"] is True


def test_the_cluster_profile_cites_its_figures_and_says_which_are_assumed():
    out = plan("--nodes", "2048", "--profile", "cluster")
    assert "What each step costs, cluster profile" in out
    line = {x.split()[0]: x for x in section(out, "What each step costs")[2:]}
    assert line["detect_node_death"].endswith(
        "11.12  measured, holds: the appliance's own timeout, not Slurm's"
    )
    for assumed in ("worker_start", "start_gate"):
        assert "300.00  assumed, none published: " in line[assumed]
    doc = json.loads(plan("--nodes", "2048", "--profile", "cluster", "--json"))["costs"]
    assert doc["profile"] == "cluster" and doc["worker_start"]["holds_on_real_hardware"] is None


def test_at_16k_gpus_the_cluster_profile_advises_a_hot_spare_where_the_local_one_does_not():
    # A cold spare admitted in 3.8 s (local) costs little more than a hot one; one that
    # takes 300 s to start its container and 300 s its ranks (cluster) does.
    def hot(*args: str) -> int:
        doc = json.loads(plan("--nodes", "2048", "--seeds", "4", *args, "--json"))
        return doc["recommended"]["hot_spares"]

    assert hot("--profile", "local") == 0
    assert hot("--profile", "cluster") >= 1


# --- what was never said (issue 54, item 6) --------------------------------------------------


def test_the_waits_nobody_measured_are_said_as_assumptions_and_a_given_one_as_given():
    out = plan("--nodes", "2048")
    assert (
        "  queue wait 0 s (assumed: a reservation, the next generation at once; --queue-wait)"
        in out
    )
    assert "  a stopped chain waits 60 min for a person (assumed: a person on call;" in out
    doc = plan_json("--nodes", "2048")
    assert doc["queue_wait"]["basis"] == "assumed" and doc["response"]["basis"] == "assumed"
    given = plan_json("--nodes", "2048", "--queue-wait", "0", "--response-minutes", "15")
    assert given["queue_wait"] == {"seconds": 0.0, "basis": "given", "source": "--queue-wait"}
    assert given["response"]["seconds"] == 900.0 and given["response"]["basis"] == "given"


def test_a_cold_spares_start_is_printed_as_such():
    cluster = plan("--nodes", "2048")
    assert "  a cold spare starts in 300.5 s (scheduler 0.54 + start gate 300: assumed)" in cluster
    local = plan("--nodes", "2048", "--profile", "local")
    assert "  a cold spare starts in 3.8 s (scheduler 0.54 + start gate 3.22: measured)" in local
    assert plan_json("--nodes", "2048")["cold_spare_start_seconds"] == pytest.approx(300.535)


def test_json_says_where_the_checkpoint_the_storage_and_the_gpu_share_come_from():
    doc = plan_json("--nodes", "2048")
    assert doc["gpu_share"]["per_gpu"] is True and doc["gpu_share"]["basis"] == "published"
    assert "Table 5: 268 GPU faults of 419" in doc["gpu_share"]["source"]
    costs = json.loads(plan("--nodes", "2048", "--json"))["costs"]
    assert {costs[name]["basis"] for name in ("worker_start", "start_gate")} == {"assumed"}
    assert costs["detect_hang"]["basis"] == "setting"
    assert costs["nvrx_waits"]["basis"] == "measured"
    assert costs["worker_start"]["published"] is False
    given = plan_json("--nodes", "2048", "--gpu-fault", "1")
    assert given["gpu_share"] == {
        "per_gpu": False,
        "basis": "given",
        "source": "per node of the planned shape, as given",
    }
