"""The status of a chain, and the list of chains, as a person reads them: rich tables,
times in UTC, every value whole on a terminal and through a pipe alike."""

from __future__ import annotations

import datetime
import os

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from nvrx_appliance.chain.chains import Listing
from nvrx_appliance.chain.status import (
    BARE_METAL,
    ChainView,
    GenerationView,
    Headline,
    ImageView,
    QualifyRunView,
    action_words,
)
from nvrx_appliance.observe.times import age_text

# Decisions whose reason a person must read in full: what the workload did.
_TOLD = ("stopped_by_workload", "resume_elsewhere", "cancelled_chain", "burn_guard")
# Without a terminal (`| less`, a ticket, a CI log) nothing is gained by cutting lines at
# 80 columns: a line is as long as what it holds, unless COLUMNS says otherwise.
PIPE_WIDTH = 1000


def console() -> Console:
    """Where status prints: the terminal's width on one; through a pipe, COLUMNS if set,
    else lines as long as they need."""
    found = Console()
    if found.is_terminal or os.environ.get("COLUMNS"):
        return found
    return Console(width=PIPE_WIDTH)


def add_column(table: Table, header: str) -> None:
    """A column that shows its values whole: too narrow a terminal folds a value onto
    the next line instead of cutting it to an ellipsis ("12-…", "nod…"); a job id, a
    node or a time cut short is a wrong one. (No column is given a minimum width: the
    table would then outgrow the terminal, which crops its right-hand columns.)"""
    table.add_column(header, overflow="fold")


def _clock(epoch: float | None, form: str = "%H:%M:%S") -> str:
    if epoch is None:
        return "-"
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc).strftime(form)


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)


def _duration(seconds: float | None) -> str:
    return "-" if seconds is None else age_text(seconds)


def _state(g: GenerationView) -> str:
    if g.state == "queued" and g.pending_reason not in ("", "None"):
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
    columns = ["array", "state", "tasks", "task 0", "started (UTC)", "elapsed", "left", "exit"]
    columns += ["from", "to", "teardown", *(["note"] if notes else [])]
    rows = [
        [
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
            action_words(g.action),
            *([g.admission] if notes else []),
        ]
        for g in view.generations
    ]
    for column in columns:
        add_column(table, column)
    for row in rows:
        table.add_row(*row)
    return table


def cycles_table(view: ChainView) -> Table:
    table = Table(title="NVRx cycles (UTC)", title_justify="left")
    for column in ("array", "cycle", "start", "end", "active nodes", "standby nodes"):
        add_column(table, column)
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
        add_column(table, column)
    for e in view.excluded:
        table.add_row(e.node, e.reason, e.since, e.until, e.by, _applied(e.node, view))
    return table


def decision_lines(view: ChainView) -> list[Text]:
    """The teardown's reason, whole, for the generations that ended the chain or moved
    it: the verdict's code, iteration and log line are in it."""
    return [
        Text(f"generation {g.array_job_id}: {g.reason}", style="bold")
        for g in view.generations
        if g.action in _TOLD and g.reason
    ]


def hang_lines(view: ChainView) -> list[Text]:
    """Each hung cycle's judgement: the node named, or why none was (docs/hangs.md)."""
    return [
        Text(f"generation {g.array_job_id}: {words}", style="yellow")
        for g in view.generations
        for words in g.hangs
    ]


def death_lines(view: ChainView) -> list[Text]:
    """Each node task 0 found dead, in words (docs/liveness.md)."""
    return [
        Text(f"generation {g.array_job_id}: {words}", style="red")
        for g in view.generations
        for words in g.deaths
    ]


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
        add_column(table, column)
    for check in run.checks:
        table.add_row(check.name, _CHECK_MARKS.get(check.passed, "?"), check.detail)
    return table


_HEADLINE_STYLES = {"running": "bold green", "queued": "bold cyan", "unknown": "bold red"}


def headline(lead: Headline) -> Text:
    """The opening line: where the chain stands (and why it ended), then what to run."""
    style = _HEADLINE_STYLES.get(lead.state, "bold yellow")
    if lead.why == "completed":
        style = "bold green"
    return Text.assemble((lead.text, style), "\nnext: ", (lead.next_command, "bold"))


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
    parts: list = [headline(view.headline), head, image_line(view.image), generations_table(view)]
    if view.qualify_run is not None:
        parts.append(qualify_run_table(view.qualify_run))
    if any(g.cycles for g in view.generations):
        parts.append(cycles_table(view))
    parts += decision_lines(view)
    parts += drained_lines(view)
    parts += death_lines(view)
    parts += hang_lines(view)
    parts += straggler_lines(view)
    if view.excluded:
        parts.append(exclusions_table(view))
    for source in view.blind:
        parts.append(Text(f"could not read {source}", style="yellow"))
    return Group(*parts)


def straggler_lines(view: ChainView) -> list[Text]:
    """A slow node the running generation waits for, and those an ended generation's
    ledger names with what was done about them, in words (docs/stragglers.md)."""
    ended = [
        Text(f"generation {g.array_job_id}: {words}", style="yellow")
        for g in view.generations
        for words in g.stragglers
    ]
    named = [Text(f"straggler: {s.words}", style="bold yellow") for s in view.stragglers]
    return ended + named + [Text(f"straggler: {why}", style="dim") for why in view.unnamed]


def _percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.0%}"


def listing(found: Listing, all_users: bool = False) -> Group:
    """One line per chain, in columns as wide as their widest value; then what was left
    out or could not be read."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    rows = [
        [
            row.job_name,
            *([row.owner] if all_users else []),
            row.words,
            row.generation or "-",
            _num(row.checkpoint),
            _percent(row.goodput),
            row.work_dir,
        ]
        for row in found.chains
    ]
    headers = ["chain", *(["user"] if all_users else []), "state", "generation"]
    headers += ["checkpoint", "goodput", "work dir"]
    for header in headers:
        add_column(table, header)
    for values in rows:
        table.add_row(*values)
    whose = "any user" if all_users else "yours"
    parts: list = []
    if found.chains:
        parts.append(table)
    elif found.slurm_reachable:
        parts.append(
            Text(
                f"no chains of {whose} in squeue or in sacct's last 30 days; "
                "`nvrx-appliance status --work-dir DIR` reads an older one"
            )
        )
    for row in found.chains:
        if row.problem:
            parts.append(Text(f"{row.job_name}: {row.problem}", style="yellow"))
    if found.others:
        parts.append(
            Text(
                f"{found.others} other job(s) left out: their work dir holds no run.json "
                "you can read"
            )
        )
    for source in found.blind:
        parts.append(Text(f"could not read {source}", style="yellow"))
    return Group(*parts)
