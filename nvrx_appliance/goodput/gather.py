"""The goodput account's inputs, read: Slurm's accounting of every task of the chain,
and from the work dir the ledger, the cycle-info files and the training record (the
progress log, or Megatron's lines in the per-cycle logs).

The one Slurm question is asked by the caller (api.report with its Slurm, the watcher
through its platform), so each keeps its own rate limit and its own idea of blindness:
`sacct` is a function of the query workdir.accounting_query builds.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nvrx_appliance.goodput.account import Allocation, Inputs
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe import training_log, workdir
from nvrx_appliance.observe.slurm_output import AcctRow, ParseError, expand_nodelist
from nvrx_appliance.observe.slurmcli import SlurmUnavailable
from nvrx_appliance.observe.times import parse_time
from nvrx_appliance.observe.training_log import CycleWork, Key
from nvrx_appliance.observe.types import PENDING_STATES, Cycle

Sacct = Callable[[dict[str, Any]], list[AcctRow]]


@dataclass
class LogMemo:
    """Per-cycle logs already parsed, by path, size and mtime: a watcher that runs as a
    daemon re-reads only the log that is still growing."""

    parsed: dict[str, tuple[tuple[int, int], CycleWork | None]] = field(default_factory=dict)


def allocations(
    rows: list[AcctRow], work_dir: str
) -> tuple[tuple[Allocation, ...], tuple[str, ...]]:
    """sacct rows -> (what each started task held, the generations still queued). A
    task that never got a node (cancelled while pending) held nothing."""
    ours = [r for r in rows if not r.work_dir or r.work_dir.rstrip("/") == work_dir.rstrip("/")]
    held, queued = [], set()
    for row in ours:
        start, nodes = parse_time(row.start), tuple(expand_nodelist(row.nodes))
        if row.state in PENDING_STATES:
            queued.add(row.array_job_id)
        if start is None or not nodes:
            continue
        held.append(
            Allocation(
                generation=row.array_job_id,
                task=row.task_ids[0] if len(row.task_ids) == 1 else None,
                nodes=nodes,
                state=row.state,
                start=start,
                end=parse_time(row.end),
                submit=parse_time(row.submit),
            )
        )
    started = {a.generation for a in held}
    return tuple(held), tuple(sorted(queued - started))


def read(
    work_dir: Path,
    sacct: Sacct,
    *,
    now: float,
    memo: LogMemo | None = None,
    cycles: Mapping[str, Sequence[Cycle]] | None = None,
) -> Inputs:
    """Everything the account needs. Raises workdir.NotFound for a work dir without a
    run manifest; a Slurm that does not answer leaves the allocation unknown (blind).
    `cycles`: the cycle-info files already read (the watcher's cache), by generation."""
    manifest = workdir.load_manifest(work_dir)
    layout, spec = Layout(work_dir), manifest["spec"]
    blind: tuple[str, ...] = ()
    held: tuple[Allocation, ...] | None = None
    queued: tuple[str, ...] = ()
    try:
        held, queued = allocations(
            sacct(workdir.accounting_query(layout, manifest)), spec["work_dir"]
        )
    except (SlurmUnavailable, ParseError) as exc:
        blind = (f"sacct: {exc}",)
    ledger = workdir.ledger(layout)
    if cycles is None:
        ids = {a.generation for a in held or ()} | {str(e["array_job_id"]) for e in ledger}
        cycles = workdir.cycles(layout, sorted(ids | _generation_dirs(layout)))
    work, source = _training_record(layout, spec, cycles, memo or LogMemo())
    return Inputs(
        published=_published(layout, cycles),
        job_name=spec["job_name"],
        work_dir=spec["work_dir"],
        now=now,
        allocations=held,
        queued=queued,
        cycles=cycles,
        work=work,
        ledger=ledger,
        work_source=source,
        blind=blind,
        save_interval=_positive(spec.get("save_interval")),
    )


def _positive(value: Any) -> int | None:
    """A run.json number as the account takes it: a positive int, else unknown."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else None


def _published(layout: Layout, cycles: Mapping[str, Sequence[Cycle]]) -> dict[str, float]:
    """When each generation's task 0 published its rendezvous record (its mtime)."""
    found = {}
    for generation in cycles:
        try:
            found[generation] = os.stat(layout.control_files(generation).record).st_mtime
        except OSError:
            continue
    return found


def _generation_dirs(layout: Layout) -> set[str]:
    """The generations that left files in the work dir, whatever Slurm remembers."""
    try:
        return {p.name for p in layout.generations_root.iterdir() if p.name.isdigit()}
    except OSError:
        return set()


def _training_record(
    layout: Layout, spec: dict[str, Any], cycles: Mapping[str, Sequence[Cycle]], memo: LogMemo
) -> tuple[dict[Key, CycleWork], str]:
    """(the record, where it came from) or ({}, why there is none)."""
    if spec.get("workload") == "megatron":
        work = {}
        for generation, found in cycles.items():
            for cycle in found:
                path = (
                    Path(cycle.log_file)
                    if cycle.log_file
                    else layout.app_log(spec["job_name"], generation, cycle.number)
                )
                parsed = _megatron(path, generation, cycle.number, memo)
                if parsed is not None:
                    work[(generation, cycle.number)] = parsed
        if work:
            return work, training_log.MEGATRON_LOG
        return {}, "no Megatron iteration lines in the per-cycle logs"
    events = workdir.json_lines(layout.progress_log)
    work = training_log.from_progress_log(events)
    if work:
        return work, training_log.PROGRESS_LOG
    if spec.get("workload") == "script":
        return {}, "the script writes no progress log (docs/workload-contract.md)"
    return {}, "no progress log"


def _megatron(path: Path, generation: str, cycle: int, memo: LogMemo) -> CycleWork | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    stamp = (info.st_size, info.st_mtime_ns)
    known = memo.parsed.get(str(path))
    if known is not None and known[0] == stamp:
        return known[1]
    lines = workdir.lines_with(path, training_log.megatron_line)
    parsed = training_log.from_megatron_log(lines, generation, cycle)
    memo.parsed[str(path)] = (stamp, parsed)
    return parsed
