"""The goodput account as Prometheus gauges, beside the pass's own in the metrics
textfile, so a dashboard can trend what the chain spends its allocation on. Pure.

The same series on every pass, whatever the chain has done so far: a category with
nothing in it is 0, a figure that cannot be known (no run.json, Slurm's accounting
blind) is NaN, never left out; no label holds a job id.
"""

from __future__ import annotations

from nvrx_appliance.goodput import save_interval
from nvrx_appliance.goodput.account import CATEGORIES, Account
from nvrx_appliance.watch.sinks import Samples, gauge


def text(account: Account | None, chain: dict[str, str]) -> str:
    out: list[str] = []

    def metric(name: str, help_text: str, samples: Samples) -> None:
        out.extend(gauge(name, help_text, samples, chain))

    known = account if account is not None and account.allocation_node_s is not None else None
    metric(
        "nvrx_watch_goodput_ratio",
        "Productive training over the allocation so far (NaN: nothing allocated or unknown).",
        [({}, known.goodput_ratio if known else None)],
    )
    metric(
        "nvrx_watch_allocation_node_seconds",
        "Node-seconds the chain's tasks held, from sacct (NaN: accounting not read).",
        [({}, known.allocation_node_s if known else None)],
    )
    metric(
        "nvrx_watch_goodput_node_seconds",
        "Node-seconds of the allocation by category (docs/goodput.md); they sum to the allocation.",
        [({"category": key}, known.categories[key] if known else None) for key in CATEGORIES],
    )
    metric(
        "nvrx_watch_training_lost_iterations",
        "Iterations trained after the last kept checkpoint before a failure or an end.",
        [({}, known.lost_iterations if known else None)],
    )
    metric(
        "nvrx_watch_queue_wait_seconds",
        "Wall time between generations with no node held.",
        [({}, known.queue_wait_s if known else None)],
    )
    metric(
        "nvrx_watch_step_seconds",
        "Median measured time per training iteration (NaN: not measured).",
        [({}, known.step_s if known else None)],
    )
    rec = save_interval.recommend(known) if known else None
    metric(
        "nvrx_watch_save_interval_iterations",
        "Iterations between saves: the chain's setting, and the one that maximises expected "
        "goodput from the chain's history (docs/goodput.md; NaN: not derivable yet).",
        [
            ({"interval": "current"}, rec.current_iterations if rec else None),
            ({"interval": "recommended"}, rec.recommended_iterations if rec else None),
        ],
    )
    metric(
        "nvrx_watch_expected_goodput_ratio",
        "The model's expected goodput of the training time at each save save_interval.",
        [
            ({"interval": "current"}, rec.current_goodput if rec else None),
            ({"interval": "recommended"}, rec.recommended_goodput if rec else None),
        ],
    )
    metric(
        "nvrx_watch_interruptions_per_node_hour",
        "In-job restarts and failed generations per node-hour of the training nodes.",
        [({}, rec.rate.per_node_hour if rec and rec.rate else None)],
    )
    metric(
        "nvrx_watch_interruptions",
        "Interruptions counted so far: few of them leave the rate, and the interval, unsure.",
        [({}, rec.rate.interruptions if rec and rec.rate else None)],
    )
    metric(
        "nvrx_watch_save_blocking_seconds",
        "Median seconds a save stands training still.",
        [({}, rec.save_s if rec else None)],
    )
    metric(
        "nvrx_watch_restart_cost_seconds",
        "Median seconds from an interruption's last progress to training again (no queue).",
        [({}, rec.restart_s if rec else None)],
    )
    return "\n".join(out) + "\n"
