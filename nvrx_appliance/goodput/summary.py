"""The goodput account as a person reads it, and as `--json` and the watcher's gauges
carry it. Pure."""

from __future__ import annotations

import math
from typing import Any

from nvrx_appliance.clock import iso_utc
from nvrx_appliance.goodput import save_interval, straggler
from nvrx_appliance.goodput.account import CATEGORIES, LOST, UNKNOWN, Account
from nvrx_appliance.goodput.save_interval import Recommendation


def amount(node_seconds: float, unit: str) -> str:
    if unit == "node-h":
        return f"{node_seconds / 3600:,.2f}"
    return f"{node_seconds:,.0f}"


def unit_for(total: float | None) -> str:
    """Node-hours once there are a few of them; node-seconds for a short demo chain."""
    return "node-h" if total and total >= 2 * 3600 else "node-s"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def headline(account: Account) -> str:
    ratio, total = account.goodput_ratio, account.allocation_node_s
    if total is None:
        return f"Goodput of chain {account.job_name}: unknown (Slurm's accounting did not answer)"
    if ratio is None:
        return f"Goodput of chain {account.job_name}: nothing allocated yet"
    unit = unit_for(total)
    return (
        f"Goodput of chain {account.job_name}: {ratio:.1%} of the allocation trained "
        f"({amount(account.productive_node_s, unit)} of {amount(total, unit)} {unit})"
    )


def lines(account: Account) -> list[str]:
    """The report: the headline, the categories with their share, what each figure
    rests on, and one line per generation."""
    out = [headline(account)]
    total = account.allocation_node_s
    if not total:
        out += [f"  blind: {b}" for b in account.blind]
        return out
    unit = unit_for(total)
    width = max(len(label) for label in CATEGORIES.values())
    out.append(f"  {'allocation (sacct)':<{width}}  {amount(total, unit):>10} {unit}  100.0%")
    for key, label in CATEGORIES.items():
        value = account.categories[key]
        # Rows that would read "0 ... 0.0%" say nothing, but lost work is always said, and
        # anything unknown however small.
        if key != LOST and not (key == UNKNOWN and value) and value < max(0.5, total * 5e-4):
            continue
        note = ""
        if key == LOST:
            note = f"  {account.lost_iterations} iteration(s)"
        out.append(
            f"  {label:<{width}}  {amount(value, unit):>10} {unit}  {value / total:6.1%}{note}"
        )
    for reason, value in sorted(account.parts.get(UNKNOWN, {}).items()):
        out.append(f"    unknown, {amount(value, unit)} {unit}: {reason}")
    out.append(
        f"  wall time {duration(account.wall_s)}; queue wait between generations "
        f"{duration(account.queue_wait_s)} (no nodes held)"
        + (f"; before the first {duration(account.first_queue_s)}" if account.first_queue_s else "")
    )
    out.append("  " + _basis(account))
    for g in account.generations:
        share = g.categories.get("productive", 0.0) / g.node_seconds if g.node_seconds else 0.0
        resumed = (
            f"; the next generation trained {duration(g.successor_resumed_s)} later"
            if g.successor_resumed_s is not None
            else ""
        )
        begun, ended = g.tracker
        kept = f", checkpoint {begun or 0} -> {ended}" if ended is not None else ""
        out.append(
            f"  generation {g.array_job_id}: {duration(g.node_seconds)} of node time, "
            f"{share:.0%} productive, {len(g.cycles)} cycle(s){kept}, ended: {g.ending}{resumed}"
        )
    for lost in account.lost:
        if lost.iterations:
            out.append(
                f"    lost in generation {lost.generation}, cycle {lost.cycle}: iterations "
                f"{lost.kept + 1}-{lost.last} ({lost.iterations}) after the checkpoint at "
                f"{lost.kept}"
            )
    for found in straggler.in_chain(account.work):
        action = _straggler_action(account, found)
        out.append(
            f"    straggler in generation {found.generation}, cycle {found.cycle}: {found.who}, "
            f"{found.pace}; {straggler.cost_words(found)}" + (f"; {action}" if action else "")
        )
    return out + save_interval_lines(save_interval.recommend(account))


def _straggler_action(account: Account, found: straggler.Straggler) -> str:
    """What task 0 did about it, as its generation's ledger entry says; "" unknown."""
    for g in account.generations:
        if g.array_job_id == found.generation:
            return g.straggler_actions.get(found.node, "")
    return ""


def _iterations(count: int | None, step_s: float | None) -> str:
    spent = save_interval.seconds(count, step_s)
    if not spent:
        return f"{count} iterations"
    # A demo's steps take milliseconds: "0.0 s" would say nothing.
    took = f"{spent * 1000:.0f} ms" if spent < 1 else duration(spent)
    return f"{count} iterations ({took} of training)"


def save_interval_lines(rec: Recommendation) -> list[str]:
    """The save interval today, the one that maximises expected goodput, what it rests on
    and how sure it is."""
    today = _iterations(rec.current_iterations, rec.step_s) if rec.current_iterations else "?"
    if rec.recommended_iterations is None:
        out = [f"  save interval: {today} today; no recommendation: {rec.reason}"]
        shortest = rec.range_iterations[0]
        if rec.rate is not None and shortest is not None:
            out.append(
                f"    {rec.rate.node_hours:.3g} node-h without one put the rate below "
                f"{rec.rate.high:.3g} per node-h ({save_interval.CONFIDENCE:.0%}): even at that rate "
                f"the best interval would be {shortest} iterations, so a shorter one only adds "
                "saves"
            )
        return out + _basis_lines(rec)
    low, high = rec.range_iterations
    out = [
        f"  save interval: {today} today, {_iterations(rec.recommended_iterations, rec.step_s)} "
        f"recommended ({low}-{high if high is not None else 'no limit'} at the rate's "
        f"{save_interval.CONFIDENCE:.0%} bounds; Young's first-order sqrt(2 C MTBF): "
        f"{rec.young_iterations})"
    ]
    if rec.recommended_goodput is not None:
        now = f"{rec.current_goodput:.1%} today, " if rec.current_goodput is not None else ""
        out.append(
            f"    expected goodput of the training time (saves, lost work, restarts): {now}"
            f"{rec.recommended_goodput:.1%} at {rec.recommended_iterations}"
        )
    out += _basis_lines(rec)
    if rec.certainty == "low" and rec.rate is not None:
        spread = rec.rate.high / rec.rate.low if rec.rate.low else math.inf
        out.append(
            f"    only {rec.rate.interruptions} interruption(s): the rate is known to a factor "
            f"of {spread:.0f} (its {save_interval.CONFIDENCE:.0%} bounds); the recommendation moves "
            "as the chain goes on"
        )
    out.append(
        f"    apply it: --save-interval {rec.recommended_iterations} (NVRX_SAVE_INTERVAL) "
        "on the next submit"
    )
    return out


def _basis_lines(rec: Recommendation) -> list[str]:
    save = f"{rec.save_s:.2f} s (median of {rec.saves})" if rec.save_s is not None else "unmeasured"
    restart = (
        f"a restart costs {rec.restart_s:.1f} s (median of {rec.restarts})"
        if rec.restart_s is not None
        else "no restart measured (its cost does not move the interval)"
    )
    out = [f"    from the chain's history: a save blocks training {save}; {restart}"]
    if rec.rate is not None:
        rate = rec.rate
        mtbf = f"; one every {duration(rec.mtbf_s)} on {rec.nodes} node(s)" if rec.mtbf_s else ""
        out.append(
            f"    {rate.interruptions} interruption(s) in {rate.node_hours:.3g} node-h of the "
            f"training nodes: {rate.per_node_hour:.3g} per node-h "
            f"({save_interval.CONFIDENCE:.0%}: {rate.low:.3g}-{rate.high:.3g}){mtbf}"
        )
    return out


def save_interval_json(rec: Recommendation) -> dict[str, Any]:
    rate = rec.rate
    return {
        "current_iterations": rec.current_iterations,
        "current_seconds": save_interval.seconds(rec.current_iterations, rec.step_s),
        "recommended_iterations": rec.recommended_iterations,
        "recommended_seconds": save_interval.seconds(rec.recommended_iterations, rec.step_s),
        "range_iterations": list(rec.range_iterations),
        "young_iterations": rec.young_iterations,
        "expected_goodput": {
            "current": rec.current_goodput,
            "recommended": rec.recommended_goodput,
        },
        "save_seconds": rec.save_s,
        "saves_measured": rec.saves,
        "restart_seconds": rec.restart_s,
        "restarts_measured": rec.restarts,
        "interruptions": rate.interruptions if rate else None,
        "training_node_hours": rate.node_hours if rate else None,
        "interruptions_per_node_hour": rate.per_node_hour if rate else None,
        "rate_bounds": [rate.low, rate.high] if rate else None,
        "confidence": save_interval.CONFIDENCE,
        "nodes": rec.nodes,
        "mtbf_seconds": rec.mtbf_s,
        "certainty": rec.certainty,
        "reason": rec.reason or None,
        "setting": "--save-interval",
    }


def _basis(account: Account) -> str:
    if not account.work:
        return (
            f"no training record ({account.work_source or 'none'}): progress is the tracker's "
            "alone (each generation's checkpoint below); the time inside cycles is unknown"
        )
    if account.step_s is None:
        return f"training record: {account.work_source}; no measured step time"
    seen = (
        f"; iterations logged every {account.log_interval}: up to {account.log_interval - 1} "
        "more per failure may have trained unseen"
        if account.log_interval and account.log_interval > 1
        else ""
    )
    return (
        f"step time {account.step_s * 1000:.1f} ms (median of {account.step_samples}, "
        f"{account.work_source}){seen}"
    )


def to_json(account: Account) -> dict[str, Any]:
    """The `report --json` body (jsondoc adds `schema`)."""
    total = account.allocation_node_s
    return {
        "job_name": account.job_name,
        "work_dir": account.work_dir,
        "observed": iso_utc(account.observed),
        "allocation_node_seconds": total,
        "productive_node_seconds": account.productive_node_s if total is not None else None,
        "goodput_ratio": account.goodput_ratio,
        "categories": [
            {
                "name": key,
                "label": label,
                "node_seconds": account.categories[key],
                "share": account.categories[key] / total if total else None,
                "parts": account.parts.get(key, {}),
            }
            for key, label in CATEGORIES.items()
        ],
        "training_lost": {
            "iterations": account.lost_iterations,
            "per_cycle": [
                {
                    "generation": lost.generation,
                    "cycle": lost.cycle,
                    "iterations": lost.iterations,
                    "resumes_from": lost.kept,
                    "last_trained": lost.last,
                    "node_seconds": lost.node_seconds,
                }
                for lost in account.lost
            ],
            "log_interval": account.log_interval,
        },
        "not_yet_saved_iterations": account.not_yet_saved_iterations,
        "step_seconds": account.step_s,
        "step_samples": account.step_samples,
        "training_record": account.work_source,
        "wall_seconds": account.wall_s,
        "queue_wait_seconds": account.queue_wait_s,
        "first_queue_seconds": account.first_queue_s,
        "generations": [
            {
                "array_job_id": g.array_job_id,
                "start": iso_utc(g.start),
                "end": iso_utc(g.end),
                "ending": g.ending,
                "node_seconds": g.node_seconds,
                "categories": g.categories,
                "cycles": len(g.cycles),
                "training_started": iso_utc(g.training_started),
                "training_stopped": iso_utc(g.training_stopped),
                "next_generation_trained_after_s": g.successor_resumed_s,
                "checkpoint_at_start": g.tracker[0],
                "checkpoint_at_end": g.tracker[1],
            }
            for g in account.generations
        ],
        "save_interval": save_interval_json(save_interval.recommend(account)),
        "stragglers": [
            {
                "generation": s.generation,
                "cycle": s.cycle,
                "node": s.node,
                "by_rank": s.by_rank,
                "slowdown": s.slowdown,
                "own_step_seconds": s.own_s,
                "peers_step_seconds": s.peers_s,
                "lost_seconds": s.lost_s,
                "lost_node_seconds": None if s.by_rank else s.lost_s * s.nodes,
                "action": _straggler_action(account, s) or None,
            }
            for s in straggler.in_chain(account.work)
        ],
        "blind": list(account.blind),
    }
