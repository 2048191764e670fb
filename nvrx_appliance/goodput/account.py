"""The goodput account: every node-second of a chain's allocation, attributed to one
cause. Pure: Inputs in, an Account out.

Each array task's allocation (sacct: its nodes, from start to end) is cut into pieces,
and each piece gets one category, so the categories add up to the allocation exactly.
A generation's timeline is the same for all the nodes that train in it: start-up until
training began, then per NVRx cycle its training (productive up to the last checkpoint
that was kept, the saves, the iterations after it that were lost, the time until the
failure was detected), the in-job restart to the next cycle, and after the last sign of
training the generation's end (a hand-off when the chain goes on). A node that is not in
the cycle's active set at that moment is an idle spare. What the inputs cannot tell is
`unknown`, with the reason, never a zero. docs/goodput.md has the method for each.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from nvrx_appliance.observe.slurm_output import expand_nodelist
from nvrx_appliance.observe.training_log import CycleWork, Key, Save
from nvrx_appliance.observe.types import Cycle

PRODUCTIVE = "productive"
SAVES = "checkpoint_saves"
LOST = "training_lost"
HANGS = "hangs_until_detected"
NOT_YET_SAVED = "not_yet_saved"
START_UP = "start_up"
RESTARTS = "in_job_restarts"
HAND_OFFS = "hand_offs"
CHAIN_END = "chain_end"
IDLE_SPARES = "idle_spares"
UNKNOWN = "unknown"
# In the order a person reads them: what trained, what training cost, what recovery cost.
CATEGORIES = {
    PRODUCTIVE: "productive training",
    SAVES: "checkpoint saves",
    NOT_YET_SAVED: "not yet saved",
    LOST: "training lost",
    HANGS: "hangs until detected",
    START_UP: "start-up",
    RESTARTS: "in-job restarts",
    HAND_OFFS: "hand-offs",
    CHAIN_END: "chain end",
    IDLE_SPARES: "idle spares",
    UNKNOWN: "unknown",
}
INF = math.inf


@dataclass(frozen=True)
class Allocation:
    """One array task's allocation, as sacct recorded it."""

    generation: str  # the array job id
    task: int | None
    nodes: tuple[str, ...]
    state: str
    start: float
    end: float | None  # None: still running
    submit: float | None = None


@dataclass(frozen=True)
class Inputs:
    job_name: str
    work_dir: str
    now: float
    # None: Slurm's accounting did not answer, so there is no allocation to account for.
    allocations: tuple[Allocation, ...] | None
    queued: tuple[str, ...] = ()  # generations accepted but not started
    cycles: Mapping[str, Sequence[Cycle]] = field(default_factory=dict)
    work: Mapping[Key, CycleWork] = field(default_factory=dict)
    ledger: Sequence[Mapping] = ()
    # When each generation's task 0 published its rendezvous record (its mtime): the
    # entrypoint is up, ft_launcher starts next.
    published: Mapping[str, float] = field(default_factory=dict)
    # Where the training record came from, or why there is none.
    work_source: str = ""
    blind: tuple[str, ...] = ()
    save_interval: int | None = None  # the chain's setting, iterations between saves


@dataclass(frozen=True)
class Piece:
    start: float
    end: float
    category: str
    part: str = ""  # a finer cause inside the category (start-up's steps, unknown's reason)


@dataclass(frozen=True)
class NodeTime:
    """One node of one array task, from its allocation's start to its end."""

    generation: str
    task: int | None
    node: str
    pieces: tuple[Piece, ...]


@dataclass(frozen=True)
class Lost:
    """The iterations one cycle trained after its last kept checkpoint."""

    generation: str
    cycle: int
    iterations: int
    kept: int  # the iteration the next start resumes from
    last: int  # the last iteration known to have trained
    node_seconds: float = 0.0


@dataclass(frozen=True)
class GenerationAccount:
    array_job_id: str
    start: float
    end: float | None
    ending: str  # how it ended, in words
    node_seconds: float
    categories: dict[str, float]
    cycles: tuple[Cycle, ...]
    training_started: float | None
    training_stopped: float | None
    successor_resumed_s: float | None  # its training's stop -> the next one's training start
    # The tracker when it began and when it ended (the ledger): the progress it kept, the
    # one measure of progress a script without a training record still has.
    tracker: tuple[int | None, int | None] = (None, None)
    # Ended by a failure (task 0 lost or exiting non-zero, a node failure): not training
    # done, a time limit, a cancel, or the workload's own "do not restart" (93).
    interrupted: bool = False
    # What task 0 did about each straggler it named (the ledger): node -> words.
    straggler_actions: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Account:
    job_name: str
    work_dir: str
    observed: float
    allocation_node_s: float | None
    categories: dict[str, float]  # node-seconds, every category, summing to the allocation
    parts: dict[str, dict[str, float]]  # category -> part -> node-seconds
    generations: tuple[GenerationAccount, ...]
    nodes: tuple[NodeTime, ...]
    lost: tuple[Lost, ...]
    not_yet_saved_iterations: int
    step_s: float | None
    step_samples: int
    log_interval: int | None
    work_source: str
    first_queue_s: float | None
    queue_wait_s: float  # between generations, wall time with no node held
    wall_s: float
    work: tuple[CycleWork, ...] = ()
    blind: tuple[str, ...] = ()
    save_interval: int | None = None

    @property
    def productive_node_s(self) -> float:
        return self.categories.get(PRODUCTIVE, 0.0)

    @property
    def goodput_ratio(self) -> float | None:
        if not self.allocation_node_s:
            return None
        return self.productive_node_s / self.allocation_node_s

    @property
    def lost_iterations(self) -> int:
        return sum(lost.iterations for lost in self.lost)


# --- one generation's timeline ----------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    """From the previous phase's end to `end`, the nodes in `active` spend their time on
    `category`; any other node of the generation is an idle spare. None: every node."""

    end: float
    category: str
    part: str
    active: frozenset[str] | None


class Timeline:
    """Phases laid end to end from the beginning of time: each starts where the last
    ended, so the pieces cut from them cover an allocation without gap or overlap."""

    def __init__(self) -> None:
        self.phases: list[Phase] = []
        self.reached = -INF

    def add(self, end: float, category: str, part: str, active: frozenset[str] | None) -> None:
        end = max(end, self.reached)
        if end > self.reached:
            self.phases.append(Phase(end, category, part, active))
            self.reached = end

    def steps(self, marks: Sequence[tuple[str, float]], category: str, end: float, active) -> None:
        """A phase cut at the workload's own marks (start-up's steps), ending at `end`."""
        for part, at in marks:
            self.add(min(at, end), category, part, active)
        self.add(end, category, "", active)


def _short(node: str) -> str:
    return node.split(".", 1)[0]


def _active(cycle: Cycle) -> frozenset[str] | None:
    names = frozenset(_short(n) for n in expand_nodelist(cycle.active_nodes))
    return names or None


@dataclass
class _Facts:
    """What a generation's timeline found out besides its phases."""

    lost: list[Lost] = field(default_factory=list)
    not_yet_saved: int = 0
    training_started: float | None = None
    training_stopped: float | None = None


def _generation_timeline(
    generation: str,
    cycles: Sequence[Cycle],
    work: Mapping[Key, CycleWork],
    *,
    has_record: bool,
    why_no_record: str,
    step_s: float | None,
    running: bool,
    now: float,
    tail: str,
    published: float | None,
) -> tuple[Timeline, _Facts]:
    line, facts = Timeline(), _Facts()
    ordered = sorted(cycles, key=lambda c: (c.attempt, c.number))
    if not ordered:
        if any(key[0] == generation for key in work):
            reason = (
                f"generation {generation} left no cycle-info files: its training nodes "
                "cannot be told from its spares"
            )
            line.add(INF, UNKNOWN, reason, None)
        else:
            line.add(INF, START_UP, "never reached an NVRx cycle", None)
        return line, facts
    if not has_record:
        _without_record(line, ordered, why_no_record, tail, published)
        return line, facts
    trained = [
        (c, w)
        for c in ordered
        if (w := work.get((generation, c.number))) is not None and w.started is not None
    ]
    if not trained:
        everyone = frozenset().union(*(_active(c) or frozenset() for c in ordered)) or None
        line.add(INF, START_UP, "" if running else "never began training", everyone)
        return line, facts
    first_cycle, first_work = trained[0]
    marks = _launch(ordered[0], published)
    if first_cycle is not ordered[0]:
        marks.append(("cycles that never trained", first_cycle.start))
    assert first_work.started is not None
    line.steps([*marks, *first_work.setup], START_UP, first_work.started, _active(first_cycle))
    facts.training_started = first_work.started
    # A running generation whose newest cycle has not begun training is restarting.
    restarting = running and trained[-1][0] is not ordered[-1]
    for index, (cycle, cycle_work) in enumerate(trained):
        last = index == len(trained) - 1
        ended = not last or restarting
        if ended:
            later = [
                c.start for c in ordered if (c.attempt, c.number) > (cycle.attempt, cycle.number)
            ]
            stop = cycle.end if cycle.end is not None else min(later)
        else:
            stop = now if running else max(cycle_work.last_sign or 0.0, cycle_work.started or 0.0)
        _training(line, facts, cycle, cycle_work, max(stop, line.reached), last=not ended,
                  running=running, step_s=step_s, tail=tail)  # fmt: skip
        if restarting and last:
            line.add(
                ordered[-1].start, RESTARTS, "NVRx restart and rendezvous", _active(ordered[-1])
            )
            line.add(INF, RESTARTS, "", _active(ordered[-1]))
        elif last:
            facts.training_stopped = line.reached
            line.add(INF, tail, "", _active(cycle))
        else:
            next_cycle, next_work = trained[index + 1]
            assert next_work.started is not None
            marks = [("NVRx restart and rendezvous", next_cycle.start), *next_work.setup]
            line.steps(marks, RESTARTS, next_work.started, _active(next_cycle))
    return line, facts


def _launch(first: Cycle, published: float | None) -> list[tuple[str, float]]:
    """Start-up until the first cycle, cut where task 0 published its record, if known."""
    if published is None or published > first.start:
        return [("launch and rendezvous", first.start)]
    return [("container and entrypoint", published), ("ft_launcher and rendezvous", first.start)]


def _without_record(
    line: Timeline, ordered: Sequence[Cycle], why: str, tail: str, published: float | None
) -> None:
    """The cycles alone (a script without a progress log): start-up until the first
    cycle, restarts between cycles; what happened inside a cycle is unknown."""
    line.steps(_launch(ordered[0], published), START_UP, ordered[0].start, _active(ordered[0]))
    for index, cycle in enumerate(ordered):
        end = cycle.end if cycle.end is not None else INF
        line.add(end, UNKNOWN, why, _active(cycle))
        if index + 1 < len(ordered):
            line.add(ordered[index + 1].start, RESTARTS, "", _active(ordered[index + 1]))
    line.add(INF, tail, "", _active(ordered[-1]))


def _kept(saves: Sequence[Save]) -> Save | None:
    """The cycle's last checkpoint the tracker named: where the next start resumes. A
    rank may finish a save a moment after NVRx has ended the cycle; it counts."""
    committed = [s for s in saves if s.committed is not None]
    return max(committed, key=lambda s: s.iteration, default=None)


def _training(
    line: Timeline,
    facts: _Facts,
    cycle: Cycle,
    work: CycleWork,
    stop: float,
    *,
    last: bool,
    running: bool,
    step_s: float | None,
    tail: str,
) -> None:
    """One cycle from its training start to `stop`: productive up to the iteration the
    last kept checkpoint holds, the saves, then what came after it."""
    active = _active(cycle)
    kept = _kept(work.saves)
    if kept is not None:
        for save in sorted(work.saves, key=lambda s: s.began):
            if save.iteration > kept.iteration:
                continue
            line.add(save.began, PRODUCTIVE, "", active)
            line.add(save.ended, SAVES, "", active)
    base = kept.iteration if kept is not None else (work.start_iteration or 0)
    trained = [i for t, i in work.steps if t <= stop] + [s.iteration for s in work.saves]
    iterations = max(0, max(trained, default=base) - base)
    if running and last:
        facts.not_yet_saved = iterations
        line.add(stop, NOT_YET_SAVED, "", active)
        return
    after_failure = tail if last else HANGS
    if iterations and step_s is None:
        line.add(stop, UNKNOWN, "no measured step time to convert lost iterations", active)
    else:
        began = line.reached
        line.add(min(stop, began + iterations * (step_s or 0.0)), LOST, "", active)
        lost_s = line.reached - began
        facts.lost.append(
            Lost(work.generation, work.cycle, iterations, base, base + iterations, lost_s)
        )
    line.add(stop, after_failure, "after the last logged iteration" if last else "", active)


# --- the allocation, cut into pieces ---------------------------------------------------------


class _Cutter:
    """Cuts allocations along one generation's timeline. Nodes that sit in the same
    active sets see the same pieces, but for where their own allocation starts and
    ends: those pieces are made once per kind of node, and each node gets a slice (a
    thousand-node generation costs a thousand slices, not a thousand walks)."""

    def __init__(self, line: Timeline) -> None:
        self.line = line
        self.sets = list({p.active for p in line.phases if p.active is not None})
        self.kinds: dict[tuple[bool, ...], tuple[list[Piece], list[float], list[float]]] = {}

    def pieces(self, node: str, start: float, end: float) -> tuple[Piece, ...]:
        name = _short(node)
        kind = tuple(name in s for s in self.sets)
        if kind not in self.kinds:
            self.kinds[kind] = self._whole(name)
        whole, starts, ends = self.kinds[kind]
        cut = whole[bisect.bisect_right(ends, start) : bisect.bisect_left(starts, end)]
        if not cut:
            return ()
        cut[0] = dataclasses.replace(cut[0], start=max(start, cut[0].start))
        cut[-1] = dataclasses.replace(cut[-1], end=min(end, cut[-1].end))
        return tuple(p for p in cut if p.end > p.start)

    def _whole(self, name: str) -> tuple[list[Piece], list[float], list[float]]:
        """The timeline as this kind of node spends it, from the beginning of time."""
        out: list[Piece] = []
        began = -INF
        for phase in self.line.phases:
            trains = phase.active is None or name in phase.active
            category, part = (phase.category, phase.part) if trains else (IDLE_SPARES, "")
            if out and (out[-1].category, out[-1].part) == (category, part):
                out[-1] = Piece(out[-1].start, phase.end, category, part)
            else:
                out.append(Piece(began, phase.end, category, part))
            began = phase.end
        return out, [p.start for p in out], [p.end for p in out]


def _median_step(work: Mapping[Key, CycleWork]) -> tuple[float | None, int]:
    samples = [s for w in work.values() for s in w.step_seconds if s > 0]
    return (statistics.median(samples) if samples else None), len(samples)


# sacct's states for a task that a failure ended, when the teardown left no word.
_FAILED_STATES = frozenset({"FAILED", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY"})


def _ending(
    generation: str,
    allocs: Sequence[Allocation],
    entry: Mapping,
    work: Mapping[Key, CycleWork],
) -> tuple[str, bool]:
    """(how the generation ended in words, whether a failure ended it)."""
    task0 = next((a for a in allocs if a.task in (0, None)), None)
    if task0 is not None and task0.end is None:
        return "running", False
    action = entry.get("action")
    if action == "completed" or any(
        w.finished is not None for k, w in work.items() if k[0] == generation
    ):
        return "training done", False
    verdict = entry.get("verdict") if isinstance(entry.get("verdict"), dict) else None
    if verdict is not None and action in ("stopped_by_workload", "resume_elsewhere"):
        # The workload's own verdict: its code and iteration, as the teardown recorded them.
        # Not an interruption of the save-interval model: no machine failed at random, and
        # Megatron saves before it asks to resume elsewhere.
        where = (
            f" at iteration {verdict['iteration']}" if verdict.get("iteration") is not None else ""
        )
        what = (
            "stopped the chain" if action == "stopped_by_workload" else "asked to resume elsewhere"
        )
        return f"the workload {what}: exit {verdict.get('code')}{where}", False
    # The teardown's word for a generation that saved and ended before its time limit.
    if action == "saved_at_time_limit":
        return "time limit (saved first)", False
    state = task0.state if task0 else ""
    if state == "TIMEOUT":
        return "time limit", False
    if action == "fenced":
        return "task 0 lost (fenced by a peer)", True
    code = entry.get("exit_code")
    if code == 93 and entry.get("workload"):
        # NVRx's no-progress rule answering the workload: say what the workload did.
        return f"NVRx: do not restart (93) after the workload {entry['workload']}", False
    if code == 93:
        return "NVRx: do not restart (93)", False
    if code is not None:
        return f"task 0 exited {code}", code != 0 and action != "cancelled_chain"
    return state.lower() or "ended", state in _FAILED_STATES


def account(inputs: Inputs) -> Account:
    allocs = inputs.allocations or ()
    step_s, step_samples = _median_step(inputs.work)
    has_record = bool(inputs.work)
    by_generation: dict[str, list[Allocation]] = {}
    for alloc in allocs:
        by_generation.setdefault(alloc.generation, []).append(alloc)
    order = sorted(by_generation, key=lambda g: (len(g), g))
    ledger = {str(e.get("array_job_id")): e for e in inputs.ledger}
    nodes: list[NodeTime] = []
    generations: list[GenerationAccount] = []
    lost: list[Lost] = []
    not_yet_saved = 0
    for index, generation in enumerate(order):
        members = by_generation[generation]
        running = any(a.end is None for a in members)
        successor = index + 1 < len(order) or any(
            (len(q), q) > (len(generation), generation) for q in inputs.queued
        )
        line, facts = _generation_timeline(
            generation, inputs.cycles.get(generation, ()), inputs.work,
            has_record=has_record, why_no_record=inputs.work_source, step_s=step_s,
            running=running, now=inputs.now, tail=HAND_OFFS if successor else CHAIN_END,
            published=inputs.published.get(generation),
        )  # fmt: skip
        lost += facts.lost
        not_yet_saved += facts.not_yet_saved
        cutter = _Cutter(line)
        mine = [
            NodeTime(generation, a.task, node,
                     cutter.pieces(node, a.start, a.end if a.end is not None else inputs.now))
            for a in sorted(members, key=lambda a: (a.task is None, a.task or 0))
            for node in a.nodes
        ]  # fmt: skip
        nodes += mine
        ending, interrupted = _ending(generation, members, ledger.get(generation, {}), inputs.work)
        generations.append(
            GenerationAccount(
                array_job_id=generation,
                start=min(a.start for a in members),
                end=None if running else max(a.end or a.start for a in members),
                ending=ending,
                node_seconds=sum(p.end - p.start for n in mine for p in n.pieces),
                categories=_totals(mine),
                cycles=tuple(
                    sorted(inputs.cycles.get(generation, ()), key=lambda c: (c.attempt, c.number))
                ),
                training_started=facts.training_started,
                training_stopped=facts.training_stopped,
                successor_resumed_s=None,
                tracker=_tracker(ledger.get(generation, {})),
                interrupted=interrupted,
                straggler_actions=_straggler_actions(ledger.get(generation, {})),
            )
        )
    generations = _hand_offs(generations)
    return Account(
        job_name=inputs.job_name,
        work_dir=inputs.work_dir,
        observed=inputs.now,
        allocation_node_s=(
            None
            if inputs.allocations is None
            else sum(((a.end or inputs.now) - a.start) * len(a.nodes) for a in allocs)
        ),
        categories=_totals(nodes),
        parts=_parts(nodes),
        generations=tuple(generations),
        nodes=tuple(nodes),
        lost=tuple(lost),
        not_yet_saved_iterations=not_yet_saved,
        step_s=step_s,
        step_samples=step_samples,
        log_interval=max((i for w in inputs.work.values() if (i := w.log_interval)), default=None),
        work_source=inputs.work_source,
        first_queue_s=_first_queue(allocs),
        queue_wait_s=sum(_gaps(generations)),
        wall_s=_wall(generations, inputs.now),
        work=tuple(sorted(inputs.work.values(), key=lambda w: (w.started or 0, w.cycle))),
        blind=inputs.blind,
        save_interval=inputs.save_interval,
    )


def _straggler_actions(entry: Mapping) -> dict[str, str]:
    named = entry.get("stragglers")
    return {
        str(s["node"]): str(s.get("action") or "")
        for s in (named if isinstance(named, list) else [])
        if isinstance(s, dict) and s.get("node")
    }


def _tracker(entry: Mapping) -> tuple[int | None, int | None]:
    def number(value: object) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    return number(entry.get("checkpoint_iteration_start")), number(
        entry.get("checkpoint_iteration")
    )


def _totals(nodes: Sequence[NodeTime]) -> dict[str, float]:
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for node in nodes:
        for piece in node.pieces:
            totals[piece.category] += piece.end - piece.start
    return totals


def _parts(nodes: Sequence[NodeTime]) -> dict[str, dict[str, float]]:
    parts: dict[str, dict[str, float]] = {}
    for node in nodes:
        for piece in node.pieces:
            if piece.part:
                into = parts.setdefault(piece.category, {})
                into[piece.part] = into.get(piece.part, 0.0) + piece.end - piece.start
    return parts


def _hand_offs(generations: list[GenerationAccount]) -> list[GenerationAccount]:
    """How long after each generation's training stopped the next one's began."""
    out = list(generations)
    for index, (before, after) in enumerate(itertools.pairwise(generations)):
        if before.training_stopped and after.training_started:
            wait = after.training_started - before.training_stopped
            out[index] = dataclasses.replace(before, successor_resumed_s=wait)
    return out


def _gaps(generations: Sequence[GenerationAccount]) -> list[float]:
    return [
        max(0.0, after.start - before.end)
        for before, after in itertools.pairwise(generations)
        if before.end is not None
    ]


def _first_queue(allocs: Sequence[Allocation]) -> float | None:
    first = min(allocs, key=lambda a: a.start, default=None)
    if first is None or first.submit is None:
        return None
    return max(0.0, first.start - first.submit)


def _wall(generations: Sequence[GenerationAccount], now: float) -> float:
    if not generations:
        return 0.0
    end = max((g.end if g.end is not None else now) for g in generations)
    return end - min(g.start for g in generations)
