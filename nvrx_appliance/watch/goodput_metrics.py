"""The goodput account as Prometheus gauges, beside the pass's own in the metrics
textfile, so a dashboard can trend what the chain spends its allocation on. Pure.

The same series on every pass, whatever the chain has done so far: a category with
nothing in it is 0, a figure that cannot be known (no run.json, Slurm's accounting
blind) is NaN, never left out; no label holds a job id.
"""

from __future__ import annotations

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
    return "\n".join(out) + "\n"
