"""What a plan assumed, in words a person reads and in --json, and where its model stops
holding. Pure.

Every figure a plan rests on is either given (an option, a chain's history) or assumed
(a default, with where it comes from); each says which. The cautions name the inputs
past which the model's simplifications move the answer.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from nvrx_appliance.goodput import save_interval as interval
from nvrx_appliance.goodput.save_interval import CONFIDENCE
from nvrx_appliance.plan.costs import Checkpoint, Costs
from nvrx_appliance.plan.model import Plan, closed_form, interrupting_rate
from nvrx_appliance.plan.rates import GPU_FAULT, LLAMA3_UNEXPECTED, Rates, llama3_count
from nvrx_appliance.plan.simulate import APPLIANCE, Scenario, per_second

# Over this share of the wall time in recovery, a second failure strikes a recovery
# often (1 - e^(-lambda R) of them): the model restarts it, which no recovery here was
# measured doing, and the closed form's one mean recovery stands for every class.
RECOVERY_SHARE = 0.10
# A save interval over this share of a generation: the time-limit save ends most
# segments, which the renewal model's optimum (an endless run) does not see.
GENERATION_SHARE = 0.5
# The simulation and the closed form agree within this (docs/plan.md, tests); past it a
# caution says so, and why.
AGREE = 0.005
RECOVERING = ("hangs_until_detected", "in_job_restarts", "hand_offs", "start_up")

FAILURE_MODEL = (
    "interruptions come as a Poisson process in wall time at constant rates (no burn-in, "
    "no wear-out, no correlated failures)",
    "one that strikes a recovery restarts it; one that strikes a generation's end goes "
    "with that generation",
    "hot and cold spares never fail while idle; a replaced node is not repaired within the run",
)
# The same, short, as the text prints it.
FAILURE_MODEL_SAID = (
    "failures: Poisson in wall time, constant rates (no burn-in, wear-out or correlation);",
    "  one in a recovery restarts it, one at a generation's end goes with it; idle spares",
    "  never fail; a replaced node is not repaired within the run",
)
# What the plan takes for the waits nobody measured, unless given.
QUEUE_WAIT_ASSUMED = "a reservation, the next generation at once"
RESPONSE_ASSUMED = "a person on call"
CHECKPOINT_ASSUMED = "4 GB per GPU, Llama 3's largest (arXiv 2407.21783)"
STORAGE_ASSUMED = "Llama 3's 2 TB/s sustained (arXiv 2407.21783)"


def mttf_s(scenario: Scenario) -> float:
    """The mean time between interruptions of the training nodes, from the rates."""
    rate = interrupting_rate(scenario)
    return 1.0 / rate if rate else math.inf


def _given(given: bool, assumed: str) -> str:
    return "given" if given else f"assumed: {assumed}"


def cold_spare_start_s(costs: Costs) -> float:
    """A cold spare's admission to training: the scheduler, then its start gate."""
    return costs.s("scheduler") + costs.s("start_gate")


def checkpoint_lines(costs: Costs) -> list[str]:
    c = costs.checkpoint
    save, load = costs.save, costs.load
    if c is None:
        return [f"a save blocks training {save.seconds:.3g} s; a load takes {load.seconds:.3g} s"]
    size = _given(c.gb_given, "4 GB per GPU")
    rate = _given(c.storage_given, "Llama 3's 2 TB/s")
    out = [f"checkpoint {c.gb:,.0f} GB ({size}), storage {c.storage_gbps:,.0f} GB/s ({rate})"]
    if c.save_given:
        out.append(f"a save blocks {save.seconds:.3g} s ({save.source})")
        if costs.write_behind:
            out.append(
                f"  its whole write follows it, {costs.write_behind.seconds:.3g} s: a failure "
                "before it ends takes that segment too"
            )
    else:
        out.append(
            f"a save blocks {save.seconds:.3g} s: the whole write (an async save's staging "
            "copy: --save-seconds)"
        )
    how = load.source if c.load_given else "the whole read; a local restore: --load-seconds"
    out.append(f"a load takes {load.seconds:.3g} s ({how})")
    return out


def wait_lines(scenario: Scenario) -> list[str]:
    """The waits nobody measured, and a cold spare's start, as the plan takes them."""
    c = scenario.costs
    start_gate = c.steps["start_gate"]
    gate = "assumed" if start_gate.basis == "assumed" else start_gate.basis
    queue = _given("queue_wait" in scenario.given, QUEUE_WAIT_ASSUMED)
    person = _given("response" in scenario.given, RESPONSE_ASSUMED)
    return [
        f"a cold spare starts in {cold_spare_start_s(c):.1f} s (scheduler "
        f"{c.s('scheduler'):.2f} + start gate {c.s('start_gate'):.3g}: {gate})",
        f"queue wait {c.queue_wait:g} s ({queue}; --queue-wait)",
        f"a stopped chain waits {scenario.response_s / 60:g} min for a person ({person}; "
        "--response-minutes)",
    ]


def _checkpoint_json(c: Checkpoint | None, costs: Costs) -> dict[str, Any]:
    if c is None:
        return {}
    return {
        "checkpoint_gb": {
            "value": c.gb,
            "given": c.gb_given,
            "basis": "given" if c.gb_given else "assumed",
            "source": "--checkpoint-gb" if c.gb_given else CHECKPOINT_ASSUMED,
        },
        "storage_gbps": {
            "value": c.storage_gbps,
            "given": c.storage_given,
            "basis": "given" if c.storage_given else "assumed",
            "source": "--storage-gbps" if c.storage_given else STORAGE_ASSUMED,
        },
        "save": {
            "seconds": costs.save.seconds,
            "given": c.save_given,
            "blocks": "as given" if c.save_given else "the whole write (synchronous)",
            "basis": costs.save.basis,
        },
        "load": {"seconds": costs.load.seconds, "given": c.load_given, "basis": costs.load.basis},
        # An async save's write after its staging copy: the segment is at risk until then.
        "write_behind_seconds": costs.write_behind.seconds if costs.write_behind else None,
    }


def rate_lines(scenario: Scenario) -> list[str]:
    r, shape = scenario.rates, scenario.shape
    gpu = r.gpu_faults_per_thousand_gpu_days()
    out = [
        f"rates per 1,000 node-days of {shape.gpus_per_node}-GPU nodes: node death "
        f"{r.node_death:.3g}, GPU fault {r.gpu_fault_at(shape.gpus_per_node):.3g},",
        f"  rank crash {r.rank_crash:.3g}, hang {r.hang:.3g}, task 0 loss {r.task0_loss:.3g}; "
        f"unloadable checkpoints {r.unloadable:.1%} of loads",
        f"  from {r.source}",
    ]
    if gpu is not None:
        out.append(
            f"  GPU faults {gpu:.3g} per 1,000 GPU-days (counted on {r.gpus_per_node}-GPU "
            "nodes): per GPU; the rest per node"
        )
    for name, low, high, count, node_days in ranges(r):
        out.append(
            f"  {name.replace('_', ' ').replace('task0', 'task 0')}: {count} in "
            f"{node_days * 24:.3g} node-hours, {low:.3g} to {high:.3g} per 1,000 node-days "
            f"({CONFIDENCE:.0%} Poisson interval)"
        )
    hours = mttf_s(scenario) / 3600
    out.append(
        f"one interruption every {hours:.3g} h over the {shape.nodes:,} training nodes "
        f"({sum(per_second(scenario).values()) * 86400:.3g} a day)"
    )
    return out


def ranges(rates: Rates) -> list[tuple[str, float, float, int, float]]:
    """Each counted rate's exact Poisson interval, per 1,000 node-days."""
    out = []
    for name, count, node_days in rates.counted:
        if node_days > 0:
            low, high = interval.rate_interval(count, node_days / 1000.0)
            out.append((name, low, high, count, node_days))
    return out


def range_ettr(plan: Plan) -> tuple[float, float] | None:
    """The closed form at the counted rates' high and low ends (the ETTR's range)."""
    sc = plan.scenario
    found = ranges(sc.rates)
    if not found:
        return None

    def at(end: int) -> float:
        ends: dict[str, Any] = {name: (low, high)[end] for name, low, high, _, _ in found}
        rates = replace(sc.rates, **ends)
        return closed_form(replace(sc, rates=rates), plan.recommended, APPLIANCE)

    return at(1), at(0)


def cautions(plan: Plan) -> list[str]:
    """Where the plan's model stops holding, each with what to read instead."""
    sc, out = plan.scenario, []
    recovering = sum(plan.appliance.seconds.get(k, 0.0) for k in RECOVERING) / sc.horizon_s
    if recovering > RECOVERY_SHARE:
        out.append(
            f"recovery takes {recovering:.0%} of the wall time (over {RECOVERY_SHARE:.0%}): "
            "many recoveries are struck by another failure and start over, as modelled; no "
            "recovery was measured doing so, so the figures are a model's, not a chain's"
        )
    a, closed = plan.appliance, plan.closed_form
    if abs(a.ettr - closed) > AGREE:
        why = (
            f"the mean of {a.seeds} seeds is itself uncertain by +/-{a.ettr_se * 100:.1f} points: "
            "more --seeds tell them apart"
            if abs(a.ettr - closed) <= 2 * a.ettr_se
            else "the closed form's steady state and one mean recovery do not follow this run; "
            "read the simulation"
        )
        out.append(
            f"the simulation ({a.ettr:.1%}) and the closed form ({closed:.1%}) differ by "
            f"{abs(a.ettr - closed) * 100:.1f} points, over the {AGREE * 100:.1f} promised: {why}"
        )
    if plan.depth_needed > plan.recommended.depth:
        out.append(
            f"the run needs {plan.depth_needed:,} generations, more than a chain queues "
            f"({plan.recommended.depth:,}): it stops for a person every "
            f"{plan.recommended.depth:,}; a longer --time needs fewer (--max-time: your "
            "partition's MaxTime)"
        )
    tau, limit = plan.recommended.save_interval_s, sc.time_limit_s
    if not math.isinf(limit) and tau > GENERATION_SHARE * limit:
        out.append(
            f"the save interval ({tau / 60:.1f} min) is over half a generation "
            f"({limit / 60:.1f} min): the time-limit save ends most segments, which the "
            "closed form's optimum does not see; read the simulation, or a longer --time"
        )
    return out


def simulated(plan: Plan) -> list[str]:
    """Fewer seeds or a shorter window than asked, within the simulation's budget."""
    b, horizon = plan.budget, plan.scenario.horizon_s
    if b.seeds >= plan.seeds_asked and b.window_s >= horizon:
        return []
    return [
        f"simulated {b.seeds} seed(s) of {b.window_s / 86400:.3g} of the {horizon / 86400:.3g} "
        f"days (asked: {plan.seeds_asked} seeds): about {b.events_per_seed:,.0f} events a run,",
        "  each seed steady at that size; counts are scaled to the whole run",
    ]


def to_json(plan: Plan) -> dict[str, Any]:
    sc = plan.scenario
    r = sc.rates
    gpu = r.gpu_faults_per_thousand_gpu_days()
    c = sc.costs
    return {
        **_checkpoint_json(c.checkpoint, c),
        "gpu_fault_per_1000_node_days_at_this_shape": r.gpu_fault_at(sc.shape.gpus_per_node),
        "gpu_faults_per_1000_gpu_days": gpu,
        # Whether the GPU's own share is scaled per GPU, and where that share comes from.
        "gpu_share": {
            "per_gpu": gpu is not None,
            "basis": "published" if gpu is not None else "given",
            "source": (
                f"Llama 3's Table 5: {llama3_count(GPU_FAULT)} GPU faults of "
                f"{LLAMA3_UNEXPECTED}, counted on {r.gpus_per_node}-GPU nodes"
                if gpu is not None
                else "per node of the planned shape, as given"
            ),
        },
        "cold_spare_start_seconds": cold_spare_start_s(c),
        "queue_wait": {
            "seconds": c.queue_wait,
            "basis": "given" if "queue_wait" in sc.given else "assumed",
            "source": "--queue-wait" if "queue_wait" in sc.given else QUEUE_WAIT_ASSUMED,
        },
        "response": {
            "seconds": sc.response_s,
            "basis": "given" if "response" in sc.given else "assumed",
            "source": "--response-minutes" if "response" in sc.given else RESPONSE_ASSUMED,
        },
        "mttf_hours": mttf_s(sc) / 3600 if not math.isinf(mttf_s(sc)) else None,
        "failure_model": list(FAILURE_MODEL),
        "simulated": {
            "seeds": plan.budget.seeds,
            "seeds_asked": plan.seeds_asked,
            "days_per_seed": plan.budget.window_s / 86400,
        },
        "counted_rates_per_1000_node_days": {
            name: {"count": count, "node_days": days, "low": low, "high": high}
            for name, low, high, count, days in ranges(r)
        },
        "closed_form_ettr_over_the_rates_range": range_ettr(plan),
        "cautions": cautions(plan),
    }
