"""The goodput account's inputs, read: Slurm's accounting of every task of the chain,
and from the work dir the ledger, the cycle-info files and the training record (the
progress log, or Megatron's lines in the per-cycle logs).

The one Slurm question is asked by the caller (api.report with its Slurm, the watcher
through its platform), so each keeps its own rate limit and its own idea of blindness:
`sacct` is a function of the query workdir.accounting_query builds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nvrx_appliance.goodput import wait_record
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
class _Followed:
    """One log read as it grows: how far, the record built from it, and that record as
    last returned (the same object while the log has not grown)."""

    tail: workdir.Tail
    record: Any  # training_log.ProgressRecord or MegatronRecord
    made: Any = None
    grown: bool = True


@dataclass
class LogMemo:
    """The training record's logs read so far, by path: a watcher that runs as a daemon
    reads only what each log gained since its last pass, and keeps what it parsed, never
    the lines. A fresh memo (report) reads every log whole, as a stream."""

    followed: dict[str, _Followed] = field(default_factory=dict)

    def read(self, path: Path, new: Callable[[], Any], parse: Callable[[str], Any]) -> Any:
        """The record of `path` (new() makes an empty one; parse turns a line into what
        its feed takes, None to skip), fed what the log gained."""
        known = self.followed.get(str(path))
        if known is None:
            known = self.followed[str(path)] = _Followed(workdir.Tail(), new())
        lines = workdir.appended_lines(path, known.tail)
        if known.tail.fresh:
            known.record, known.grown = new(), True
        for line in lines:
            item = parse(line)
            if item is not None:
                known.record.feed(item)
                known.grown = True
        if known.grown:
            known.made, known.grown = known.record.record(), False
        return known.made


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


def held_from_files(inputs: Inputs) -> tuple[Allocation, ...]:
    """What each generation held, from the work dir alone (no Slurm accounting): its nodes
    from its cycle-info files (active and standby) and task 0's ledger line, its times
    from that line (start, end) or else from its cycles and training record. Every node
    is taken as held for the whole generation: a late node's wait counts as held time."""
    ledger = {str(e.get("array_job_id")): e for e in inputs.ledger}
    out = []
    for generation in sorted(set(ledger) | set(inputs.cycles), key=lambda g: (len(g), g)):
        entry, cycles = ledger.get(generation, {}), inputs.cycles.get(generation, ())
        work = [w for key, w in inputs.work.items() if key[0] == generation]
        signs = [t for w in work for t in (w.started, w.last_sign) if t is not None]
        start = parse_time(entry.get("start")) or min((c.start for c in cycles), default=None)
        end = parse_time(entry.get("end")) or max(
            [t for c in cycles for t in (c.start, c.end) if t is not None] + signs, default=None
        )
        task0 = str(entry.get("task0_node") or "")
        nodes = {task0} if task0 else set()
        for cycle in cycles:
            nodes.update(expand_nodelist(cycle.active_nodes), expand_nodelist(cycle.standby_nodes))
        if start is None or not nodes:
            continue
        ordered = sorted(nodes, key=lambda n: (n != task0, n))
        out += [
            Allocation(generation, task, (node,), "", start, max(start, end or start))
            for task, node in enumerate(ordered)
        ]
    return tuple(out)


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
    wait_record.attach(layout, work, cycles, create=False)
    set_aside(work, workdir.json_lines(layout.fallbacks))
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


def set_aside(work: Mapping[Key, CycleWork], fallbacks: Sequence[dict[str, Any]]) -> None:
    """A checkpoint set aside as unloadable (checkpoints/fallback.py) was never kept: the
    cycle that saved it kept only the one before, and the iterations after that one are
    lost training (the next cycle trains them again). Drops such saves, in place."""
    aside = [
        (entry["from"], when)
        for entry in fallbacks
        if isinstance(entry.get("from"), int) and (when := parse_time(entry.get("time")))
    ]
    for cycle_work in work.values():
        unloadable = [
            save
            for save in cycle_work.saves
            if any(save.iteration == bad and save.began <= when for bad, when in aside)
        ]
        # Trained, then lost: the iterations stay in the record as steps, not as a save.
        cycle_work.steps += [(save.ended, save.iteration) for save in unloadable]
        cycle_work.saves[:] = [save for save in cycle_work.saves if save not in unloadable]


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


def training_record(
    work_dir: Path, cycles: Mapping[str, Sequence[Cycle]], memo: LogMemo
) -> dict[Key, CycleWork]:
    """The chain's training record alone (the watcher's straggler detector). Raises
    workdir.NotFound for a work dir without a manifest."""
    manifest = workdir.load_manifest(work_dir)
    layout = Layout(work_dir)
    work = _training_record(layout, manifest["spec"], cycles, memo)[0]
    wait_record.attach(layout, work, cycles)
    return work


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
    work = memo.read(layout.progress_log, training_log.ProgressRecord, _event)
    if work:
        return work, training_log.PROGRESS_LOG
    if spec.get("workload") == "script":
        return {}, "the script writes no progress log (docs/workload-contract.md)"
    return {}, "no progress log"


def _event(line: str) -> dict[str, Any] | None:
    """A progress log line as its event; None for a torn or foreign line."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def _megatron(path: Path, generation: str, cycle: int, memo: LogMemo) -> CycleWork | None:
    return memo.read(path, lambda: training_log.MegatronRecord(generation, cycle), str)
