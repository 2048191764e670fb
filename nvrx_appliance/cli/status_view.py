"""The status of a chain as a person reads it: rich tables, times in UTC."""

from __future__ import annotations

import datetime

from rich.console import Group
from rich.table import Table
from rich.text import Text

from nvrx_appliance.observe.times import age_text
from nvrx_appliance.slurm.status import (
    BARE_METAL,
    ChainView,
    GenerationView,
    ImageView,
    QualifyRunView,
)

_ACTIONS = {
    "released_spares": "released spares",
    "saved_at_time_limit": "saved at the time limit",
    "completed": "training completed",
    "cancelled_chain": "cancelled chain",
    "burn_guard": "burn guard",
    # A peer closed the generation for a task 0 whose lease went stale (issue 11).
    "fenced": "fenced dead task 0",
    "none": "nothing cancelled",
}


def _clock(epoch: float | None, form: str = "%H:%M:%S") -> str:
    if epoch is None:
        return "-"
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc).strftime(form)


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)


def _duration(seconds: float | None) -> str:
    return "-" if seconds is None else age_text(seconds)


def _state(g: GenerationView) -> str:
    if g.state == "queued" and g.pending_reason:
        return f"queued ({g.pending_reason})"  # squeue's reason: Dependency, Resources, ...
    if g.state != "ended":
        return g.state
    return g.task0_state.lower() if g.task0_state else "ended"


def generations_table(view: ChainView) -> Table:
    notes = any(g.admission for g in view.generations)
    table = Table(
        title="generations",
        title_justify="left",
        caption="tasks: running/pending/done; from/to: checkpoint iteration at start / at hand-off",
        caption_justify="left",
    )
    columns = ("array", "state", "tasks", "task 0", "started (UTC)", "elapsed", "left", "exit")
    for column in (*columns, "from", "to", "teardown"):
        table.add_column(column, no_wrap=column in ("array", "tasks"))
    if notes:
        table.add_column("note")
    for g in view.generations:
        row = [
            g.array_job_id,
            _state(g),
            f"{g.running}/{g.pending}/{g.done}",
            g.task0_node or "-",
            _clock(g.started, "%m-%d %H:%M"),
            _duration(g.elapsed_s),
            _duration(g.time_left_s),
            _num(g.exit_code),
            _num(g.checkpoint_start),
            _num(g.checkpoint_end),
            _ACTIONS.get(g.action, g.action or "-"),
        ]
        table.add_row(*row, *([g.admission] if notes else []))
    return table


def cycles_table(view: ChainView) -> Table:
    table = Table(title="NVRx cycles (UTC)", title_justify="left")
    for column in ("array", "cycle", "start", "end", "active nodes", "standby nodes"):
        table.add_column(column)
    for g in view.generations:
        for c in g.cycles:
            end = _clock(c.end) if c.end else "running"
            row = (g.array_job_id, str(c.number), _clock(c.start), end)
            table.add_row(*row, c.active_nodes or "-", c.standby_nodes or "-")
    return table


def _applied(node: str, view: ChainView) -> str:
    applied = view.applied
    if applied is not None and node in applied.nodes:
        return f"in the ExcNodeList of {', '.join(applied.jobs)} since {applied.time}"
    if applied is not None and node in applied.capped:
        return (
            f"NOT applied: the cap keeps {applied.need} usable nodes in the partition "
            "for the array; it stays eligible"
        )
    return "at the end of the running generation"


def exclusions_table(view: ChainView) -> Table:
    table = Table(
        title="nodes kept out of the queued generations (the exclusion record)",
        title_justify="left",
        caption="never drained by the appliance: draining is the administrator's",
        caption_justify="left",
    )
    for column in ("node", "why", "since", "until", "by", "applied"):
        table.add_column(column)
    for e in view.excluded:
        table.add_row(e.node, e.reason, e.since, e.until, e.by, _applied(e.node, view))
    return table


def drained_lines(view: ChainView) -> list[Text]:
    return [
        Text(
            f"generation {g.array_job_id}: Slurm drained {', '.join(g.drained)}; "
            "a drained node left at a rendezvous",
            style="yellow",
        )
        for g in view.generations
        if g.drained
    ]


_VERSIONS_SHOWN = ("NVRx", "Megatron-LM", "PyTorch")
_CHECK_MARKS = {True: "ok", False: "FAIL", None: "pending"}


def _qualification(image: ImageView) -> tuple[str, str]:
    """(text, style): quiet when a record vouches for the image, loud otherwise."""
    if image.qualification == "passed":
        return f"passed on {image.qualified_on} on cluster {image.qualified_cluster}", "green"
    if image.qualification == "failed":
        failed = f"FAILED on {image.qualified_on} on cluster {image.qualified_cluster}"
        return f"{failed} ({image.why})", "bold red"
    return f"not qualified ({image.why})", "bold yellow"


def image_line(image: ImageView) -> Text:
    if image.kind == BARE_METAL:
        return Text("image: bare metal (no image)")
    versions = ", ".join(f"{k} {image.versions[k]}" for k in _VERSIONS_SHOWN if k in image.versions)
    text, style = _qualification(image)
    return Text.assemble(
        f"image: {image.name}" + (f" ({versions})" if versions else ""),
        "   qualification at submit: ",
        (text, style),
    )


def qualify_run_table(run: QualifyRunView) -> Table:
    title = (
        f"this chain's qualification run: {run.result}, "
        f"finished {run.finished or '-'} on cluster {run.cluster}"
    )
    table = Table(title=title, title_justify="left")
    for column in ("check", "result", "detail"):
        table.add_column(column)
    for check in run.checks:
        table.add_row(check.name, _CHECK_MARKS.get(check.passed, "?"), check.detail)
    return table


def render(view: ChainView) -> Group:
    head = Text.assemble(
        (f"chain {view.job_name}", "bold"),
        f"  user {view.user}  array {view.array_spec}  work dir {view.work_dir}\n",
        f"mode: {view.mode}{'' if view.mode == 'train' else ' (demo)'}   ",
        f"workload: {view.workload}\n",
        f"shape: {view.parallelism}\n" if view.parallelism else "",
        f"W&B run: {view.wandb_run_id} (every generation logs to it)\n"
        if view.wandb_run_id
        else "",
        f"checkpoint iteration now: {_num(view.checkpoint_now)}   ",
        f"queued generations: {', '.join(view.queued) or 'none'}   ",
        f"chain marker: {'present' if view.chain_marker else 'absent'}",
    )
    if view.completed_at is not None:
        head.append(f"\ntraining completed at iteration {view.completed_at}", style="bold green")
    parts: list = [head, image_line(view.image), generations_table(view)]
    if not view.slurm_reachable:
        parts.insert(
            0,
            Text(
                "Slurm could not be reached: below is the work dir's record only", style="bold red"
            ),
        )
    if view.qualify_run is not None:
        parts.append(qualify_run_table(view.qualify_run))
    if any(g.cycles for g in view.generations):
        parts.append(cycles_table(view))
    parts += drained_lines(view)
    if view.excluded:
        parts.append(exclusions_table(view))
    for source in view.blind:
        parts.append(Text(f"could not read {source}", style="yellow"))
    return Group(*parts)
