"""The plan as a person reads it, and as `--json` carries it. Pure."""

from __future__ import annotations

import math
import textwrap
from typing import Any

from nvrx_appliance.goodput.account import CATEGORIES, PRODUCTIVE
from nvrx_appliance.plan import assumptions as assumed
from nvrx_appliance.plan import profiles
from nvrx_appliance.plan.costs import MEASURED, Costs, Step
from nvrx_appliance.plan.model import Plan
from nvrx_appliance.plan.rates import CAUSES, SOURCE
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
    if name.startswith(("save interval", "time limit")):
        return "none" if math.isinf(value) else _minutes(value)
    if name.startswith("lease"):
        return f"{value:.0f} s"
    return f"{value:.0f}"


def _slurm_time(seconds: float) -> str:
    """A time limit as submit's --time takes it."""
    if math.isinf(seconds):
        return "0"
    days, rest = divmod(round(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    clock = f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


WIDTH = 100  # no line longer: read at 3 a.m., in a terminal, on a phone


def lines(plan: Plan, step_s: float | None = None) -> list[str]:
    """The plan as a person reads it: the answer first, what it assumed, what to set,
    what more would be worth, and what each step costs."""
    out = [
        *_headline(plan),
        *[f"Caution: {line}" for line in assumed.cautions(plan)],
        "",
        *_assumed(plan),
        "",
        *_setting_lines(plan, step_s),
        "",
        *_road(plan),
        "",
        *_seeds_design(plan),
        "",
        *_costs(plan.scenario.costs),
    ]
    return [part for line in out for part in _fit(line)]


def _fit(line: str) -> list[str]:
    """A line of at most WIDTH, or its words on several, each after the first indented
    two more than the line itself."""
    if len(line) <= WIDTH:
        return [line]
    indent = " " * (len(line) - len(line.lstrip()) + 2)
    return textwrap.wrap(line, WIDTH, subsequent_indent=indent, break_on_hyphens=False)


def _headline(plan: Plan) -> list[str]:
    sc, shape, a = plan.scenario, plan.scenario.shape, plan.appliance
    horizon = sc.horizon_s
    limit = sc.time_limit_s
    out = [
        f"Plan for {shape.gpus:,} GPUs ({shape.nodes:,} node{'s' if shape.nodes != 1 else ''} "
        f"x {shape.gpus_per_node}, {shape.nodes_per_task} node(s) per task"
        + (f", segment {shape.segment}" if shape.segment else "")
        + f"), {horizon / 86400:.3g} days, "
        + ("no time limit" if math.isinf(limit) else f"generations of {_minutes(limit)}"),
        f"Predicted ETTR: {a.ettr:.1%} with {profiles.SAID[sc.costs.profile]}",
        f"  {a.seeds} seeds {a.ettr_low:.1%}-{a.ettr_high:.1%}; closed form "
        f"{plan.closed_form:.1%}; goodput of the allocation "
        f"{plan.allocation_goodput(a, plan.recommended):.1%} (idle hot spares count)",
    ]
    spread = assumed.range_ettr(plan)
    if spread:
        out.append(
            f"  over the counted rates' {assumed.CONFIDENCE:.0%} range: closed form "
            f"{spread[0]:.1%} to {spread[1]:.1%}"
        )
    budget = assumed.simulated(plan)
    if budget:
        out += [f"  {line}" for line in budget]
    parts = [
        f"{LABELS[key]} {share:.1%}"
        for key, share in shares(a, horizon).items()
        if share >= 5e-4 or key == PRODUCTIVE
    ]
    parts[-1] += f"; dominant loss: {LABELS[dominant_loss(a, horizon)]}"
    out += _wrapped(parts, "  ", ", ")
    return out


def _wrapped(parts: list[str], indent: str, sep: str) -> list[str]:
    """Parts joined by `sep` on lines of at most WIDTH, each line after the first
    indented once more."""
    out, line = [], indent
    for part in parts:
        candidate = part if line.strip() == "" else f"{line}{sep}{part}"
        if len(candidate if line.strip() else indent + part) > WIDTH and line.strip():
            out.append(line + sep.rstrip())
            line = indent + "  " + part
        else:
            line = candidate if line.strip() else indent + part
    out.append(line)
    return out


def _assumed(plan: Plan) -> list[str]:
    sc = plan.scenario
    out = ["What it assumed (docs/plan.md; --json gives every source):"]
    out += [f"  {line}" for line in assumed.rate_lines(sc)]
    seen = plan.appliance.interruptions
    total = sum(seen.get(k, 0.0) for k in CLASS_LABELS)
    if total:
        kinds = [f"{CLASS_LABELS[k]} {seen.get(k, 0.0):.0f}" for k in CLASS_LABELS if seen.get(k)]
        on_task0 = sum(seen.get(f"{k}_on_task0", 0.0) for k in CLASS_LABELS)
        kinds[-1] += (
            f"; {on_task0:.1f} on task 0's nodes; {seen.get(DURING_RECOVERY, 0.0):.0f} during a "
            "recovery, restarting it"
        )
        out += _wrapped([f"simulated {total:.0f} in the run: {kinds[0]}", *kinds[1:]], "    ", ", ")
    out += [f"  {line}" for line in assumed.checkpoint_lines(sc.costs)]
    out += [f"  {line}" for line in assumed.wait_lines(sc)]
    out += [f"  {line}" for line in assumed.FAILURE_MODEL_SAID]
    return out


def _setting_lines(plan: Plan, step_s: float | None) -> list[str]:
    rec = plan.recommended
    out = [
        "Settings (today -> recommended; points of the allocation's goodput, each given "
        "those above)"
    ]
    for choice in plan.choices:
        name = choice.setting.split(" (")[0]
        why = choice.why
        if name == "cold spares":
            why = (
                f"spares out in {plan.appliance.spares_out:.1%} of generations (closed form "
                f"{plan.spares_out_closed_form:.1%})"
            )
        if name == "save interval":
            why += f" (Young's: {_minutes(plan.young_interval_s)})"
        out.append(
            f"  {name:<14}{_setting(choice.setting, choice.today):>9} -> "
            f"{_setting(choice.setting, choice.recommended):<9}{choice.worth * 100:+7.2f}  {why}"
        )
    today = plan.allocation_goodput(plan.appliance_today, plan.today)
    now = plan.allocation_goodput(plan.appliance, rec)
    out.append(f"  {'all of them':<14}{today:>9.1%} -> {now:<9.1%}{(now - today) * 100:+7.2f}")
    tau = rec.save_interval_s
    interval = (
        f"--save-interval {max(1, round(tau / step_s))}"
        if step_s
        else f"--save-interval <{_minutes(tau)} in steps; --step-seconds counts them>"
    )
    out += [
        f"  submit with: --time {_slurm_time(plan.scenario.time_limit_s)} {interval}",
        f"    --hot-spares {rec.hot_spares} --cold-spares {rec.cold_spares} "
        f"--lease-stale-after {rec.lease_s:.0f} --depth {rec.depth}",
    ]
    return out


# Whether the appliance has each lever today, and with which setting, or whose it is.
def _whose(name: str, plan: Plan) -> str:
    c = plan.scenario.costs
    return {
        "async save": "has it: --async-save (its copy: --save-seconds)",
        "load": "the workload's: a local or in-memory restore",
        "hang detection": f"has it: --step-timeout {c.s('detect_hang'):g}",
        "node-death detection": f"has it: --node-silence-timeout {c.node_silence_s:g}",
        "worker start": "your GPU stack's: CUDA, NCCL, the model",
        "hot spares": f"has it: --hot-spares {plan.recommended.hot_spares}",
        "generation length": "has it: --time, up to the partition's MaxTime",
    }[name]


def _lever_value(name: str, value: float) -> str:
    if name == "hot spares":
        return f"{value:.0f}"
    return "none" if math.isinf(value) else _minutes(value)


def _road(plan: Plan) -> list[str]:
    out = [
        "The road to 98%: each lever alone from the plan above, closed form; does the "
        "appliance have it?",
        f"  {'all of them':<21}{'':<19}{(plan.all_levers - plan.closed_goodput) * 100:+6.2f}  "
        f"to {plan.all_levers:.1%} of the allocation",
    ]
    for lever in plan.levers:
        moved = f"{_lever_value(lever.name, lever.now)} -> {_lever_value(lever.name, lever.to)}"
        if lever.now == lever.to:
            moved = f"{_lever_value(lever.name, lever.now)}, as good"
        out.append(
            f"  {lever.name:<21}{moved:<19}{lever.worth * 100:+6.2f}  {_whose(lever.name, plan)}"
        )
    return out


def _seeds_design(plan: Plan) -> list[str]:
    s, a, sc = plan.seeds, plan.appliance, plan.scenario
    lost_s, lost_a = (shares(x, sc.horizon_s)["training_lost"] for x in (s, a))
    return [
        f"The seeds' design at the same settings: ETTR {s.ettr:.1%} (closed form "
        f"{plan.seeds_closed_form:.1%}); the appliance is worth {(a.ettr - s.ettr) * 100:+.2f}",
        f"  a {sc.costs.s('store_wait'):.0f} s store wait on each task-0 loss (not a "
        f"{plan.recommended.lease_s:.0f} s lease), no time-limit save (training lost "
        f"{lost_s:.1%},",
        f"  not {lost_a:.1%}), an unloadable checkpoint stops the chain",
    ]


def _costs(c: Costs) -> list[str]:
    out = [
        f"What each step costs, {c.profile} profile (seconds; what it rests on; holds: on real "
        "hardware too;",
        "  --cost NAME=SECONDS puts yours in; --json has each source and growth rule):",
    ]
    held = [name for name, step in c.steps.items() if step.extrapolated]
    for name, step in c.steps.items():
        out.append(f"  {name:<17} {step.seconds:8.2f}  {_rests_on(c, name)}")
    for label, whole in _wholes(c).items():
        if whole is not None:
            out.append(f"  {label:<17} {whole.seconds:8.2f}  {whole.source}, in place of the steps")
    if c.queue_wait:
        out.append(f"  {'queue wait':<17} {c.queue_wait:8.2f}  given (--queue-wait)")
    if held:
        note = next(c.steps[name].extrapolated for name in held)
        out += _wrapped([f"{note}: {held[0]}", *held[1:]], "  ", ", ")
    return out


def _rests_on(c: Costs, name: str) -> str:
    """What a step's figure rests on, in a few words."""
    step, held = c.steps[name], holds(c, name)
    if held is None:
        if step.basis == "assumed":
            return f"assumed, none published: {profiles.CLUSTER_FIGURES[name].said}"
        if step.basis == "published":
            return f"published: {profiles.CLUSTER_FIGURES[name].said}"
        return f"{step.basis}: {step.source}"
    why = profiles.HOLDS[name][1]
    if held:
        return f"{step.basis}, holds: {why}"
    return f"CPU stand-in: {why}; {_instead(name)}"


def _instead(name: str) -> str:
    if name in profiles.CLUSTER_FIGURES:
        return "--profile cluster"
    return f"--cost {name}=S"


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
        # The recommended time limit (the plan's generations), and today's.
        "time_limit_seconds": _finite(sc.time_limit_s),
        "today_time_limit_seconds": _finite(plan.today_time_limit_s),
        "rates_per_1000_node_days": {
            "node_death": sc.rates.node_death,
            "gpu_fault": sc.rates.gpu_fault,
            "rank_crash": sc.rates.rank_crash,
            "hang": sc.rates.hang,
            "task0_loss": sc.rates.task0_loss,
        },
        # Llama 3's causes, each with the class of how it shows itself (docs/plan.md).
        "rates_causes": [
            {
                "component": c.component,
                "category": c.category,
                "count": c.count,
                "shows_as": c.shows_as,
                "why": c.why,
            }
            for c in CAUSES
        ]
        if sc.rates.source == SOURCE
        else None,
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
        "depth_needed": plan.depth_needed,
        "young_interval_seconds": _finite(plan.young_interval_s),
        # Each change from today's settings, in order, worth what it adds to the
        # allocation's goodput given those before it: they add up to the whole gap.
        "choices": [
            {
                "setting": c.setting,
                "today": _finite(c.today),
                "recommended": _finite(c.recommended),
                "worth_allocation_goodput": c.worth,
                "why": c.why,
            }
            for c in plan.choices
        ],
        "road": {
            "all_levers_allocation_goodput": plan.all_levers,
            "plan_allocation_goodput_closed_form": plan.closed_goodput,
            "levers": [
                {
                    "lever": lever.name,
                    "now": _finite(lever.now),
                    "to": _finite(lever.to),
                    "worth_allocation_goodput": lever.worth,
                    "the_appliance": _whose(lever.name, plan),
                }
                for lever in plan.levers
            ],
        },
        "costs": {
            **{
                name: {
                    "seconds": step.seconds,
                    "source": step.source,
                    "growth": step.growth,
                    "extrapolated": step.extrapolated or None,
                    "holds_on_real_hardware": holds(sc.costs, name),
                    "basis": step.basis,
                    "published": step.basis == "published",
                }
                for name, step in sc.costs.steps.items()
            },
            "save": {
                "seconds": sc.costs.save.seconds,
                "source": sc.costs.save.source,
                "basis": sc.costs.save.basis,
            },
            "load": {
                "seconds": sc.costs.load.seconds,
                "source": sc.costs.load.source,
                "basis": sc.costs.load.basis,
            },
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
