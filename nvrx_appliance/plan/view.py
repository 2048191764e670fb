"""The plan as a person reads it, and as `--json` carries it. Pure."""

from __future__ import annotations

import math
from typing import Any

from nvrx_appliance.goodput.account import CATEGORIES, PRODUCTIVE
from nvrx_appliance.plan import assumptions as assumed
from nvrx_appliance.plan import profiles
from nvrx_appliance.plan.costs import MEASURED, Costs, Step
from nvrx_appliance.plan.model import Plan
from nvrx_appliance.plan.simulate import DURING_RECOVERY, QUEUE_WAIT, STOPPED, Summary

# report's categories, then what only a plan has: time no node trains and none is held.
LABELS = {
    **{k: v for k, v in CATEGORIES.items() if k not in ("idle_spares", "unknown")},
    QUEUE_WAIT: "queue wait",
    STOPPED: "waiting for a person",
}
CLASS_LABELS = {
    "node_death": "node death",
    "gpu_fault": "GPU fault",
    "rank_crash": "rank crash",
    "hang": "hang",
    "task0_loss": "task 0 loss",
}


def _minutes(seconds: float) -> str:
    if math.isinf(seconds):
        return "never"
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    hours = seconds / 3600
    return f"{hours:,.1f} h" if hours < 1e6 else f"{hours:.3g} h"


def shares(summary: Summary, horizon: float) -> dict[str, float]:
    return {k: summary.seconds.get(k, 0.0) / horizon for k in LABELS}


def dominant_loss(summary: Summary, horizon: float) -> str:
    losses = {k: v for k, v in shares(summary, horizon).items() if k != PRODUCTIVE}
    return max(losses, key=lambda k: losses[k])


def _setting(name: str, value: float) -> str:
    if name.startswith("save interval"):
        return _minutes(value)
    if name.startswith("lease"):
        return f"{value:.0f} s"
    return f"{value:.0f}"


def lines(plan: Plan, step_s: float | None = None) -> list[str]:
    sc, shape, rec = plan.scenario, plan.scenario.shape, plan.recommended
    horizon = sc.horizon_s
    c = sc.costs
    out = [
        f"Plan for {shape.gpus:,} GPUs ({shape.nodes:,} node{'s' if shape.nodes != 1 else ''} "
        f"x {shape.gpus_per_node}, "
        f"{shape.nodes_per_task} node(s) per task"
        + (f", segment {shape.segment}" if shape.segment else "")
        + f"), {horizon / 86400:.0f} days, "
        + (
            "no time limit (--time 0)"
            if math.isinf(sc.time_limit_s)
            else f"generations of {_minutes(sc.time_limit_s)}"
        ),
    ]
    out += [f"  {line}" for line in assumed.rate_lines(sc)]
    seen = plan.appliance.interruptions
    total = sum(seen.get(k, 0.0) for k in CLASS_LABELS)
    if total:
        kinds = ", ".join(
            f"{CLASS_LABELS[k]} {seen.get(k, 0.0):.0f}" for k in CLASS_LABELS if seen.get(k)
        )
        out.append(
            f"    simulated: {total:.0f} in the run ({kinds}; on task 0's nodes: "
            f"{seen.get('node_death_on_task0', 0.0):.1f} node deaths, "
            f"{seen.get('gpu_fault_on_task0', 0.0):.1f} GPU faults, "
            f"{seen.get('hang_on_task0', 0.0):.1f} hangs; during a recovery, restarting it: "
            f"{seen.get(DURING_RECOVERY, 0.0):.0f})"
        )
    out += [f"  {line}" for line in assumed.checkpoint_lines(c)]
    out.append("  failure model: " + "; ".join(assumed.FAILURE_MODEL))
    a = plan.appliance
    cautions = assumed.cautions(plan)
    if cautions:
        out += ["", *(f"Caution: {line}" for line in cautions)]
    budget = assumed.simulated(plan)
    spread = assumed.range_ettr(plan)
    out += [
        "",
        f"Predicted ETTR: {a.ettr:.1%} with {profiles.SAID[c.profile]}",
        f"  {a.seeds} seeds: {a.ettr_low:.1%}-{a.ettr_high:.1%}; "
        f"closed form {plan.closed_form:.1%}; goodput of the allocation "
        f"{plan.allocation_goodput(a, rec):.1%} (hot spares' idle nodes count)",
    ]
    if spread:
        out.append(
            f"  over the counted rates' {assumed.CONFIDENCE:.0%} range: closed form "
            f"{spread[0]:.1%} to {spread[1]:.1%}"
        )
    if budget:
        out.append(f"  {budget}")
    for key, share in shares(a, horizon).items():
        if share >= 5e-4 or key == PRODUCTIVE:
            out.append(f"  {LABELS[key]:<22} {share:6.1%}")
    out.append(f"  dominant loss: {LABELS[dominant_loss(a, horizon)]}")
    out += ["", "Settings that maximise it (today -> recommended: ETTR points it is worth)"]
    for choice in plan.choices:
        out.append(
            f"  {choice.setting.split(' (')[0]:<14} {_setting(choice.setting, choice.today):>9} -> "
            f"{_setting(choice.setting, choice.recommended):<9} {choice.worth * 100:+6.2f}  "
            f"({choice.why})"
        )
    tau = rec.save_interval_s
    apply = f"--save-interval {max(1, round(tau / step_s))}" if step_s else None
    out.append(
        f"  save interval: Young's first order {_minutes(plan.young_interval_s)}; "
        + (
            f"apply it: {apply} (iterations of {step_s:g} s)"
            if apply
            else "pass --step-seconds to have it in iterations for submit's --save-interval"
        )
    )
    out.append(
        f"  submit with: --hot-spares {rec.hot_spares} --cold-spares {rec.cold_spares} "
        f"--lease-stale-after {rec.lease_s:.0f} --depth {rec.depth}"
    )
    out.append(
        f"  spares run out in {a.spares_out:.1%} of generations (closed form "
        f"{plan.spares_out_closed_form:.1%}); today's settings: ETTR "
        f"{plan.appliance_today.ettr:.1%}"
    )
    s = plan.seeds
    gap = (a.ettr - s.ettr) * 100
    out += [
        "",
        f"The seeds' design at the same settings: ETTR {s.ettr:.1%} (closed form "
        f"{plan.seeds_closed_form:.1%}); the appliance is worth {gap:+.2f} points here",
        f"  its fixed waits: {c.s('store_wait'):.0f} s store wait on each task-0 loss (no "
        f"fencing; the appliance's lease: {rec.lease_s:.0f} s), no save at the time limit "
        f"(training lost {shares(s, horizon)['training_lost']:.1%} against "
        f"{shares(a, horizon)['training_lost']:.1%}), an unloadable checkpoint stops the chain",
        "",
        f"What each step costs here, the {c.profile} profile (source; how it grows; whether "
        "a figure measured here holds on real hardware):",
    ]
    for name, step in c.steps.items():
        note = f" [{step.extrapolated}]" if step.extrapolated else ""
        held = holds(c, name)
        if held is not None:
            why = profiles.HOLDS[name][1]
            note += (
                f" [holds on real hardware: {why}]"
                if held
                else f" [CPU stand-in, not real hardware: {why}; {_instead(name)}]"
            )
        out.append(f"  {name:<17} {step.seconds:8.2f} s  {step.source}; {step.growth}{note}")
    for label, whole in _wholes(c).items():
        if whole is not None:
            out.append(
                f"  {label:<17} {whole.seconds:8.2f} s  {whole.source}; {whole.growth} "
                "(used whole, in place of the steps above)"
            )
    if c.queue_wait:
        out.append(f"  {'queue wait':<17} {c.queue_wait:8.2f} s  given (--queue-wait)")
    return out


def _instead(name: str) -> str:
    if name in profiles.CLUSTER_FIGURES:
        return "--profile cluster"
    return f"no published figure: pass yours, --cost {name}=SECONDS"


def holds(c: Costs, name: str) -> bool | None:
    """Whether a step as measured here holds on real hardware; None: not measured here
    (a profile's figure, or given)."""
    if c.steps[name].source != MEASURED[name][1]:
        return None
    return profiles.HOLDS[name][0]


def _wholes(c: Costs) -> dict[str, Step | None]:
    """A chain's own costs, by what the interruption led to."""
    return {
        "in-job restart": c.restart_whole,
        "spare replaces": c.replaced_whole,
        "hand-off": c.hand_off_whole,
        "first start-up": c.first_start_whole,
    }


def _finite(value: float) -> float | None:
    """None where a figure is endless (no interruptions: no interval to take)."""
    return value if math.isfinite(value) else None


def _summary(summary: Summary, horizon: float) -> dict[str, Any]:
    return {
        "ettr": summary.ettr,
        "ettr_range": [summary.ettr_low, summary.ettr_high],
        "seeds": summary.seeds,
        "breakdown": shares(summary, horizon),
        "dominant_loss": dominant_loss(summary, horizon),
        "interruptions": dict(summary.interruptions),
        "generations": summary.generations,
        "spares_out_share_of_generations": summary.spares_out,
        "resubmits": summary.resubmits,
    }


def _settings(settings) -> dict[str, Any]:
    tau = settings.save_interval_s
    return {
        "save_interval_seconds": None if math.isinf(tau) else tau,
        "hot_spares": settings.hot_spares,
        "cold_spares": settings.cold_spares,
        "lease_stale_after": settings.lease_s,
        "depth": settings.depth,
    }


def to_json(plan: Plan) -> dict[str, Any]:
    sc, shape = plan.scenario, plan.scenario.shape
    horizon = sc.horizon_s
    return {
        "shape": {
            "gpus": shape.gpus,
            "nodes": shape.nodes,
            "gpus_per_node": shape.gpus_per_node,
            "nodes_per_task": shape.nodes_per_task,
            "segment": shape.segment or None,
        },
        "run_days": horizon / 86400,
        "time_limit_seconds": None if math.isinf(sc.time_limit_s) else sc.time_limit_s,
        "rates_per_1000_node_days": {
            "node_death": sc.rates.node_death,
            "gpu_fault": sc.rates.gpu_fault,
            "rank_crash": sc.rates.rank_crash,
            "hang": sc.rates.hang,
            "task0_loss": sc.rates.task0_loss,
        },
        "unloadable_share_of_loads": sc.rates.unloadable,
        "rates_source": sc.rates.source,
        "appliance": {
            **_summary(plan.appliance, horizon),
            "closed_form_ettr": plan.closed_form,
            "allocation_goodput": plan.allocation_goodput(plan.appliance, plan.recommended),
            "spares_out_closed_form": plan.spares_out_closed_form,
        },
        "appliance_today": _summary(plan.appliance_today, horizon),
        "seeds_design": {
            **_summary(plan.seeds, horizon),
            "closed_form_ettr": plan.seeds_closed_form,
        },
        "today": _settings(plan.today),
        "recommended": _settings(plan.recommended),
        "young_interval_seconds": _finite(plan.young_interval_s),
        "choices": [
            {
                "setting": c.setting,
                "today": c.today,
                "recommended": c.recommended,
                "worth_ettr": c.worth,
                "why": c.why,
            }
            for c in plan.choices
        ],
        "costs": {
            **{
                name: {
                    "seconds": step.seconds,
                    "source": step.source,
                    "growth": step.growth,
                    "extrapolated": step.extrapolated or None,
                    "holds_on_real_hardware": holds(sc.costs, name),
                }
                for name, step in sc.costs.steps.items()
            },
            "save": {"seconds": sc.costs.save.seconds, "source": sc.costs.save.source},
            "load": {"seconds": sc.costs.load.seconds, "source": sc.costs.load.source},
            "queue_wait": {"seconds": sc.costs.queue_wait},
            "profile": sc.costs.profile,
            **{
                key: {"seconds": whole.seconds, "source": whole.source} if whole else None
                for key, whole in zip(
                    (
                        "in_job_restart_whole",
                        "spare_replaces_whole",
                        "hand_off_whole",
                        "first_start_whole",
                    ),
                    _wholes(sc.costs).values(),
                    strict=True,
                )
            },
        },
        "assumptions": assumed.to_json(plan),
        "response_seconds": sc.response_s,
        "storage_stall_seconds": plan.storage_stall_s,
    }
