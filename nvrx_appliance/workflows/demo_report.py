"""What the demo says while it follows a chain, and the recovery report at its end. Pure.

Inputs are what the demo read: the cpu trainer's progress events, the ledger, the
status view (Slurm, cycle-info files) and the goodput account. Outputs are lines for a
person.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from nvrx_appliance.chain.status import ChainView
from nvrx_appliance.goodput import summary
from nvrx_appliance.goodput.account import Account


def clock(epoch: float | None) -> str:
    if epoch is None:
        return "--:--:--"
    moment = datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc)
    return moment.strftime("%H:%M:%S")


def epoch(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def event_line(event: dict[str, Any]) -> str | None:
    """One progress event as the demo prints it; None for the ones it does not."""
    kind, at = event.get("event"), clock(event.get("time"))
    generation = event.get("slurm_array_job_id", "?")
    if kind == "start":
        where = (
            "from scratch" if not event.get("iteration") else f"at iteration {event['iteration']}"
        )
        return (
            f"{at}  generation {generation}, cycle {event.get('cycle', 0)}: training started "
            f"{where} on {event.get('host', '?')} ({event.get('world_size', '?')} ranks)"
        )
    if kind == "fault":
        return (
            f"{at}  injected {event.get('kind', 'a')} fault on rank {event.get('rank', '?')} "
            f"in cycle {event.get('cycle', '?')}: NVRx restarts the workers in place"
        )
    if kind == "done":
        return f"{at}  training finished at iteration {event.get('iteration')}"
    return None


def ledger_line(entry: dict[str, Any]) -> str:
    return (
        f"{clock(epoch(entry.get('end')))}  generation {entry.get('array_job_id')} ended: task 0 "
        f"on {entry.get('task0_node') or '?'} exited {entry.get('exit_code')}, checkpoint "
        f"iteration {entry.get('checkpoint_iteration')}; teardown: {entry.get('reason')}"
    )


_RESTART = "will restart worker group"
_INJECTED = re.compile(r"INJECTING FAILURE: node=(\S+), infra_rank=(\d+), cycle=(\d+)")


@dataclass(frozen=True)
class NvrxLog:
    """What NVRx 0.7.0's own log says about one generation's cycles."""

    restarts: int  # "Worker group UNHEALTHY ... will restart worker group"
    injected: tuple[tuple[str, int], ...]  # (node, cycle) failed by the health-check injector


def nvrx_log(text: str) -> NvrxLog:
    injected = tuple((m.group(1), int(m.group(3))) for m in _INJECTED.finditer(text))
    return NvrxLog(restarts=text.count(_RESTART), injected=injected)


@dataclass(frozen=True)
class Report:
    lines: list[str]
    resumed_ok: bool  # the successor resumed at its predecessor's last checkpoint


def _first_start(events: Sequence[dict[str, Any]], generation: str) -> dict[str, Any] | None:
    return next(
        (
            e
            for e in events
            if e.get("event") == "start" and e.get("slurm_array_job_id") == generation
        ),
        None,
    )


def report(
    view: ChainView,
    events: Sequence[dict[str, Any]],
    ledger: Sequence[dict],
    logs: dict[str, NvrxLog] | None = None,
    goodput: Account | None = None,
) -> Report:
    lines = [f"Recovery report: chain {view.job_name} ({view.work_dir})", "", "Generation timeline"]
    by_array = {str(e.get("array_job_id")): e for e in ledger}
    for g in view.generations:
        entry = by_array.get(g.array_job_id, {})
        span = f"{clock(epoch(entry.get('start')))} -> {clock(epoch(entry.get('end')))}"
        lines.append(
            f"  generation {g.array_job_id}: task 0 on {g.task0_node or '-'}, {span}, "
            f"exit {g.exit_code if g.exit_code is not None else '-'}, "
            f"checkpoint {g.checkpoint_start if g.checkpoint_start is not None else 'none'} -> "
            f"{g.checkpoint_end if g.checkpoint_end is not None else '-'}"
        )
        for c in g.cycles:
            lines.append(
                f"    cycle {c.number}: {clock(c.start)} -> {clock(c.end)} on {c.active_nodes}"
                + (f" (standby {c.standby_nodes})" if c.standby_nodes else "")
            )
    lines += ["", "In-job restarts"]
    for g in view.generations:
        faults = [
            f"{e.get('kind')} on rank {e.get('rank')} in cycle {e.get('cycle')}"
            for e in events
            if e.get("event") == "fault" and _generation_of(events, e) == g.array_job_id
        ]
        log = (logs or {}).get(g.array_job_id, NvrxLog(0, ()))
        if not faults and not log.restarts and not log.injected:
            continue
        lines.append(
            f"  generation {g.array_job_id}: {log.restarts} in-job restart(s) by NVRx; "
            f"workload faults: {', '.join(faults) or 'none'}"
        )
        for node, cycle in log.injected:
            lines.append(
                f"    cycle {cycle}: the GPU-failure injector failed {node}'s health check"
                + (" (task 0's node: the generation cannot go on)" if node == g.task0_node else "")
            )
    lines += ["", "Hand-off"]
    resumed_ok = False
    for before, after in pairwise(view.generations):
        start = _first_start(events, after.array_job_id)
        left = by_array.get(before.array_job_id, {}).get("checkpoint_iteration")
        if start is None:
            continue
        ended = epoch(by_array.get(before.array_job_id, {}).get("end"))
        gap = f" {start['time'] - ended:.0f} s later" if ended else ""
        lines.append(
            f"  generation {before.array_job_id}'s task 0 ({before.task0_node}) ended; generation "
            f"{after.array_job_id} started training{gap} on {start.get('host')}"
        )
        if left is not None and start.get("iteration") == left and left > 0:
            resumed_ok = True
            lines.append(
                f"  resumed at iteration {left} = last completed checkpoint of the previous "
                "generation"
            )
        else:
            lines.append(
                f"  MISMATCH: resumed at iteration {start.get('iteration')}, but the previous "
                f"generation's last completed checkpoint was {left}"
            )
    if len(lines) and lines[-1] == "Hand-off":
        lines.append("  none: no generation followed another")
    if goodput is not None:
        lines += ["", *summary.lines(goodput)]
    return Report(lines=lines, resumed_ok=resumed_ok)


def _generation_of(events: Sequence[dict[str, Any]], event: dict[str, Any]) -> str | None:
    """A fault belongs to the generation whose training start precedes it most closely."""
    starts = [
        e for e in events if e.get("event") == "start" and e.get("time", 0) <= event.get("time", 0)
    ]
    return starts[-1].get("slurm_array_job_id") if starts else None
