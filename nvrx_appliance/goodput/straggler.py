"""A slow node (a straggler): which node the others wait for, by how much, what it has
cost, and whether replacing it pays. Pure.

In data-parallel training every rank waits for the slowest at each step's collective,
so one slow node sets the pace of all, and a step's wall time names nobody. The
evidence is each node's own step time, its compute without the wait for its peers: the
cpu trainer measures it on every rank and logs it per node (workloads/own_step.py);
Megatron's `--log-straggler` report gives only its fastest and slowest rank.

The rule (docs/stragglers.md): over the last WINDOW_STEPS steps of a cycle, cut into
PARTS consecutive parts, a node is a straggler when in every part its mean own step
time is at least FACTOR times the median of its peers'. Its slowdown is that ratio
over the whole window. A node late for any other reason is named by the second measure,
who the others wait for inside the collectives (goodput/late_node.py): a node is named
on either, and its words say which. A one-off slow step, or a slow spell, lifts one part and not the
others; jitter between healthy nodes stays under FACTOR; a run of one node has no peers
and names nobody.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from nvrx_appliance.goodput import late_node
from nvrx_appliance.observe.training_log import CycleWork, OwnSteps

# At 1.2 the run trains at five sixths of its speed. A healthy node's own step time
# differs from its peers' by a few per cent on a GPU cluster; on the two shared cores of
# the local test cluster a tenth of a second's part still swung from 0.5x to 1.8x, so
# one part over FACTOR means nothing, every part of the window over it does.
FACTOR = 1.2
PARTS = 3
# The window the verdict is about: the recent past, so a node that recovers is let go.
# 120 steps: 12 of the cpu trainer's logged intervals, 6 of Megatron's (20 iterations).
WINDOW_STEPS = 120
OWN_STEP = "own step"  # the measures that can name a node (Straggler.measure)
WAITS = "collective waits"


@dataclass(frozen=True)
class Straggler:
    """One node (or, from Megatron's report, one rank) the rest of the run waited for."""

    generation: str
    cycle: int
    node: str  # Slurm's node name; "rank N" where the evidence names only a rank
    slowdown: float  # its mean own step time over its peers' median, in the window
    own_s: float  # its mean own step time in the window
    peers_s: float  # its peers' (median of their means) in the window
    steps: int  # steps in the window
    lost_s: float  # the cycle's wall seconds spent waiting for it, all of it
    at: float  # the end of the window judged (the last logged interval)
    nodes: int = 0  # the nodes that trained (and waited) in the window
    wall_step_s: float = 0.0  # the run's wall time per step in the window (0: unknown)
    by_rank: bool = False  # the evidence names a rank, not a node: nobody acts on it
    # OWN_STEP: own_s and peers_s are step times; WAITS: shares of time inside
    # collectives, and steps is the window in seconds
    measure: str = OWN_STEP
    also: str = ""  # the other measure's words, where it names the node too

    @property
    def who(self) -> str:
        if self.by_rank:
            return f"{self.node} (Megatron's report names ranks, not nodes)"
        return self.node

    @property
    def pace(self) -> str:
        """Its slowdown and the measure that found it, in a few words."""
        if self.measure == WAITS:
            return f"{self.slowdown:.2f}x, late to its peers' collectives"
        return f"{self.slowdown:.2f}x its peers' step"

    @property
    def words(self) -> str:
        """One line a person reads: who, how slow, over what, what it cost."""
        if self.measure == WAITS:
            return (
                f"{self.who} is a straggler in cycle {self.cycle} of generation "
                f"{self.generation}: its peers wait inside collectives {self.peers_s:.0%} of "
                f"the time against {self.own_s:.0%} on its ranks, late to each one "
                f"({self.slowdown:.2f}x over the last {self.steps} s); the run has lost "
                f"{self.lost_s:.0f} s waiting for it"
            )
        return (
            f"{self.who} is a straggler in cycle {self.cycle} of generation "
            f"{self.generation}: its own step takes {_s(self.own_s)} against {_s(self.peers_s)} "
            f"on its peers ({self.slowdown:.2f}x over the last {self.steps} steps); the run "
            f"has lost {self.lost_s:.0f} s waiting for it" + (f"; {self.also}" if self.also else "")
        )


def _s(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _window(intervals: Sequence[OwnSteps]) -> list[OwnSteps]:
    """The trailing intervals that hold WINDOW_STEPS steps; [] while fewer were logged."""
    out: list[OwnSteps] = []
    steps = 0
    for interval in reversed(intervals):
        if steps >= WINDOW_STEPS:
            return out[::-1]
        out.append(interval)
        steps += interval.steps
    return out[::-1] if steps >= WINDOW_STEPS else []


def _parts(window: list[OwnSteps]) -> list[list[OwnSteps]]:
    size = len(window) / PARTS
    return [window[round(p * size) : round((p + 1) * size)] for p in range(PARTS)]


def _means(intervals: Sequence[OwnSteps]) -> dict[str, float]:
    """Each node's mean own step time over the intervals (weighted by their steps)."""
    total: dict[str, float] = {}
    steps: dict[str, int] = {}
    for interval in intervals:
        for node, seconds in interval.seconds.items():
            total[node] = total.get(node, 0.0) + seconds * interval.steps
            steps[node] = steps.get(node, 0) + interval.steps
    return {node: total[node] / steps[node] for node in total}


def _against_peers(means: dict[str, float], node: str) -> tuple[float, float] | None:
    """(its time, its peers' median); None without peers or without it."""
    others = [s for n, s in means.items() if n != node]
    if node not in means or not others:
        return None
    return means[node], statistics.median(others)


def _lost(intervals: Sequence[OwnSteps], node: str) -> float:
    """Wall seconds the run waited for `node`: each interval's steps times its excess
    over its peers' median (jitter both ways cancels out in the sum)."""
    lost = 0.0
    for interval in intervals:
        pair = _against_peers(interval.seconds, node)
        if pair is not None:
            lost += interval.steps * (pair[0] - pair[1])
    return max(0.0, lost)


def _wall_step(window: list[OwnSteps]) -> float:
    """The run's wall seconds per step over the window (from its first interval's end)."""
    steps = sum(i.steps for i in window[1:])
    return (window[-1].time - window[0].time) / steps if steps else 0.0


def judge(work: CycleWork) -> list[Straggler]:
    """The stragglers of one cycle in its last window, slowest first."""
    found = _by_own_step(work)
    late = {n.node: n for n in late_node.judge(work.waits)}
    # named by both: by its own step (the finer figure), its words saying the second too
    found = [dataclasses.replace(s, also=_also(late.pop(s.node))) if s.node in late else s
             for s in found]  # fmt: skip
    found += [_late(work, n) for n in late.values()]
    return sorted(found, key=lambda s: -s.slowdown)


def withheld(work: CycleWork) -> list[str]:
    """Why the cycle's figures name nobody where a node lagged: no verdict, with what was
    seen (goodput/late_node.py: the lag followed some ranks' own work, one long wait, or
    the figures are NCCL's)."""
    return [
        f"no straggler named in cycle {work.cycle} of generation {work.generation}: {why}"
        for why in late_node.withheld(work.waits)
    ]


def _also(late: late_node.LateNode) -> str:
    return (
        f"its peers also wait inside collectives {late.peers:.0%} of the time against "
        f"{late.own:.0%} on its ranks"
    )


def _by_own_step(work: CycleWork) -> list[Straggler]:
    window = _window(work.own_steps)
    if len(window) < PARTS:
        return []
    parts = [_means(part) for part in _parts(window)]
    whole = _means(window)
    found = []
    for node in sorted(whole):
        pairs = [_against_peers(part, node) for part in parts]
        if not all(p is not None and p[1] > 0 and p[0] >= FACTOR * p[1] for p in pairs):
            continue
        own, peers = _against_peers(whole, node) or (0.0, 0.0)
        found.append(
            Straggler(
                generation=work.generation,
                cycle=work.cycle,
                node=node,
                slowdown=own / peers,
                own_s=own,
                peers_s=peers,
                steps=sum(i.steps for i in window),
                lost_s=_lost(work.own_steps, node),
                at=window[-1].time,
                nodes=len(whole),
                wall_step_s=_wall_step(window),
                by_rank=work.own_steps_by_rank,
            )
        )
    return found


def _late(work: CycleWork, late: late_node.LateNode) -> Straggler:
    return Straggler(
        generation=work.generation, cycle=work.cycle, node=late.node,
        slowdown=late.slowdown, own_s=late.own, peers_s=late.peers,
        steps=round(late.window_s), lost_s=late.lost_s, at=late.at, nodes=late.nodes,
        wall_step_s=1.0, measure=WAITS,
    )  # fmt: skip


def cost_words(found: Straggler) -> str:
    """What it cost the allocation: every node that trained waited with the run."""
    lost = f"the run lost {found.lost_s:.0f} s waiting for it"
    if found.by_rank:
        return lost
    return f"{lost} ({found.lost_s * found.nodes:.0f} node-seconds on its {found.nodes} nodes)"


def in_chain(work: Sequence[CycleWork]) -> list[Straggler]:
    """Every cycle's stragglers, as judged at its last logged interval."""
    return [s for w in work for s in judge(w)]


def cost_ahead(straggler: Straggler, seconds_left: float, steps_left: int | None) -> float:
    """What keeping it costs until the generation ends: its excess per step (the measure
    of what the run lost so far, too) times the steps the time left holds at the run's
    wall pace, or the steps left to train when training ends first."""
    if straggler.measure == WAITS:  # the share of the run's time spent waiting for it
        return max(0.0, straggler.peers_s - straggler.own_s) * max(0.0, seconds_left)
    if straggler.wall_step_s <= 0:
        return 0.0
    steps = max(0.0, seconds_left) / straggler.wall_step_s
    if steps_left is not None:
        steps = min(steps, max(0, steps_left))
    return max(0.0, straggler.own_s - straggler.peers_s) * steps


def restart_cost(work: Sequence[CycleWork], current: CycleWork) -> tuple[float | None, str]:
    """(seconds, how measured) a restart costs this chain: the median, over its in-job
    restarts so far, of the time from a cycle's last sign of training to the next
    cycle's first step; with none yet, the current cycle's own start-up (its workers'
    launch to its first step), the part of a restart that is certain: a lower bound."""
    by_generation: dict[str, list[CycleWork]] = {}
    for w in work:
        by_generation.setdefault(w.generation, []).append(w)
    gaps = []
    for cycles in by_generation.values():
        cycles.sort(key=lambda w: w.cycle)
        for before, after in itertools.pairwise(cycles):
            if before.last_sign is not None and after.steps:
                gaps.append(after.steps[0][0] - before.last_sign)
    if gaps:
        return statistics.median(gaps), f"the median of this chain's {len(gaps)} in-job restart(s)"
    launched = next((at for _, at in current.setup), None)
    if launched is None or not current.steps:
        return None, "not measured yet"
    return current.steps[0][0] - launched, "this cycle's own start-up (a lower bound)"


def worth_replacing(
    straggler: Straggler,
    seconds_left: float,
    steps_left: int | None,
    restart: tuple[float | None, str],
) -> tuple[bool, str]:
    """Replace it only when what it costs until the generation ends exceeds what a
    restart costs this chain (measured, never assumed); the reason, in words."""
    if straggler.by_rank:
        return False, "the evidence names a rank, not a node: kept"
    ahead = cost_ahead(straggler, seconds_left, steps_left)
    restart_s, how = restart
    if restart_s is None:
        return False, (
            f"kept: it would cost {ahead:.0f} s more until the generation ends, but this "
            "chain's restart cost is not measured yet"
        )
    replace = ahead > restart_s
    return replace, (
        f"{'replaced' if replace else 'kept'}: it costs {ahead:.0f} s until the generation "
        f"ends, {'more' if replace else 'no more'} than a restart ({restart_s:.0f} s, {how})"
    )
