"""The save interval that maximises expected goodput, from the chain's own history. Pure.

The model (docs/goodput.md has the arithmetic): training runs in segments of `tau`
seconds of work, each closed by a save that stands it still for `C` seconds.
Interruptions strike the training nodes as a Poisson process of rate `lambda` (the
measured rate per node-hour times the nodes that train). An interruption loses the
segment under way (the work since the last kept save, the save itself if one was under
way) and then costs `R` seconds (detection, the restart or the hand-off, start-up)
before training resumes; an interruption may strike during `R` too. The expected time
to get one segment kept is then exactly

    E[T](tau) = exp(lambda R) (exp(lambda (tau + C)) - 1) / lambda

and the expected goodput, work over time, is G(tau) = tau / E[T](tau). Its maximum is
where d/dtau (tau / (exp(lambda (tau + C)) - 1)) = 0, that is x = lambda tau solves

    (1 - x) exp(x) = exp(-lambda C),     0 < x < 1

which does not depend on R. For small lambda C it is Young's sqrt(2 C / lambda)
(sqrt(2 x save cost x mean time between interruptions)); the exact root is found by
bisection, since (1 - x) exp(x) falls strictly from 1 to 0 on (0, 1).
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, replace

from nvrx_appliance.goodput.account import IDLE_SPARES, Account
from nvrx_appliance.observe.slurm_output import expand_nodelist
from nvrx_appliance.observe.training_log import CycleWork

# A two-sided 90% interval on the interruption rate: what "how sure" means below.
CONFIDENCE = 0.90
# Fewer interruptions than this leave the rate known only to a factor of about 4 or
# worse (at 5 the 90% interval spans 0.39x to 2.1x the estimate): the report says so.
FEW_INTERRUPTIONS = 5


@dataclass(frozen=True)
class Rate:
    """Interruptions per node-hour of the training nodes: the estimate and its bounds."""

    interruptions: int
    node_hours: float
    per_node_hour: float
    low: float
    high: float


@dataclass(frozen=True)
class Recommendation:
    """What the chain's history says about its save interval. `reason` is set (and the
    figures that need it are None) when something the model needs was not measured."""

    save_s: float | None  # blocking cost of a save (median)
    saves: int  # saves measured
    restart_s: float | None  # cost of an interruption beyond the lost work (median)
    restarts: int  # interruptions whose cost was measured
    rate: Rate | None
    nodes: int  # the nodes that train: interruptions strike any of them
    step_s: float | None
    current_iterations: int | None
    recommended_iterations: int | None
    # The interval that the rate's bounds would recommend (high rate: shorter interval).
    range_iterations: tuple[int | None, int | None]
    young_iterations: int | None  # first-order sqrt(2 C MTBF), for comparison
    current_goodput: float | None  # expected, of the model's training time
    recommended_goodput: float | None
    certainty: str  # "none", "low", "fair"
    reason: str = ""

    @property
    def mtbf_s(self) -> float | None:
        """Mean time between interruptions of the whole set of training nodes."""
        if self.rate is None or not self.rate.per_node_hour or not self.nodes:
            return None
        return 3600.0 / (self.rate.per_node_hour * self.nodes)


# --- the model ----------------------------------------------------------------------------


def expected_goodput(tau: float, save_s: float, restart_s: float, rate: float) -> float:
    """Work over expected time, per kept segment of `tau` seconds (rate per second)."""
    if tau <= 0:
        return 0.0
    if rate <= 0:
        return tau / (tau + save_s)
    exposed = rate * (tau + save_s)
    # Divided through by e^exposed: expm1 overflows past ~709 where the answer is ~0.
    return rate * tau * math.exp(-rate * restart_s - exposed) / -math.expm1(-exposed)


def optimal_tau(save_s: float, rate: float) -> float:
    """The segment length that maximises expected_goodput: inf with no interruptions
    (nothing to lose, so never pay for a save), 0 for a save that costs nothing."""
    if rate <= 0:
        return math.inf
    if save_s <= 0:
        return 0.0
    target = math.exp(-rate * save_s)
    low, high = 0.0, 1.0
    for _ in range(200):  # (1 - x) e^x is strictly decreasing on (0, 1)
        mid = (low + high) / 2
        if (1 - mid) * math.exp(mid) > target:
            low = mid
        else:
            high = mid
    return (low + high) / 2 / rate


def young_tau(save_s: float, rate: float) -> float:
    return math.sqrt(2 * save_s / rate) if rate > 0 else math.inf


# --- the rate and how sure it is ---------------------------------------------------------


def _poisson_cdf(k: int, mean: float) -> float:
    """P(N <= k) for N ~ Poisson(mean)."""
    if k < 0:
        return 0.0
    if mean <= 0:
        return 1.0
    log_mean = math.log(mean)
    return min(1.0, sum(math.exp(i * log_mean - mean - math.lgamma(i + 1)) for i in range(k + 1)))


def _solve_mean(k: int, tail: float) -> float:
    """The Poisson mean at which P(N <= k) = tail (it falls as the mean grows)."""
    low, high = 0.0, max(10.0, 4.0 * (k + 10))
    for _ in range(200):
        mid = (low + high) / 2
        if _poisson_cdf(k, mid) > tail:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def rate_interval(interruptions: int, exposure: float) -> tuple[float, float]:
    """The exact (Garwood) two-sided bounds on a Poisson rate, k events in `exposure`."""
    tail = (1 - CONFIDENCE) / 2
    low = 0.0 if interruptions == 0 else _solve_mean(interruptions - 1, 1 - tail) / exposure
    return low, _solve_mean(interruptions, tail) / exposure


# --- the chain's history -------------------------------------------------------------------


def _last_progress(work: CycleWork) -> float | None:
    """The last moment the cycle is known to have made progress: a logged step or a save."""
    marks = [t for t, _ in work.steps] + [s.ended for s in work.saves]
    if work.started is not None:
        marks.append(work.started)
    return max(marks, default=None)


def _nodes(account: Account) -> int:
    """The nodes that train: the active set of the newest cycle that names one."""
    for generation in reversed(account.generations):
        for cycle in reversed(generation.cycles):
            if cycle.active_nodes:
                return len(expand_nodelist(cycle.active_nodes))
    return 0


# What an interruption led to, as the account can tell it (not its cause: a rank's
# crash and a hang on every rank both restart in place; a node's death and a hang that
# named its node both bring a spare in).
IN_PLACE, REPLACED, HAND_OFF = "in_place", "replaced", "hand_off"


@dataclass(frozen=True)
class Interruption:
    generation: str
    outcome: str  # IN_PLACE, REPLACED (the cycle after it trained on other nodes), HAND_OFF
    cost_s: float | None  # None: not measured (no progress before it, no successor start)


def interruptions(account: Account) -> list[Interruption]:
    """Every in-job restart (a cycle after the first of a generation) and every
    generation ended by a failure, in the order they came, with what each cost: the held
    time from the last progress before it to the next training start, queue waits between
    generations left out (no node's time, as the account leaves them out). Interruptions
    that strike before training is back (a cycle or a generation that never trained) share
    that stretch equally, so the costs add up to the time the chain spent recovering
    (its mean is what each interruption cost on average, as a plan needs it)."""
    work = {(w.generation, w.cycle): w for w in account.work}
    generations = list(account.generations)
    spans: list[tuple[float, float]] = []  # (training start, last progress), in order
    pending: list[tuple[float, str, str]] = []  # (when, generation, outcome)
    for generation in generations:
        gen = generation.array_job_id
        nodes = {c.number: frozenset(expand_nodelist(c.active_nodes)) for c in generation.cycles}
        for index, cycle in enumerate(generation.cycles):
            if index:
                previous = nodes.get(cycle.number - 1)
                here = nodes[cycle.number]
                moved = bool(previous) and bool(here) and previous != here
                pending.append((cycle.start, gen, REPLACED if moved else IN_PLACE))
            w = work.get((gen, cycle.number))
            last = _last_progress(w) if w is not None else None
            if w is not None and w.started is not None and last is not None:
                spans.append((w.started, last))
        if generation.interrupted and generation.end is not None:
            pending.append((generation.end, gen, HAND_OFF))
    spans.sort()
    pending.sort(key=lambda p: p[0])
    # Each interruption belongs to the gap before the first training start after it.
    gaps: dict[int, list[tuple[str, str]]] = {}
    for when, gen, outcome in pending:
        after = next((i for i, (started, _) in enumerate(spans) if started >= when), None)
        gaps.setdefault(-1 if after is None else after, []).append((gen, outcome))
    found: list[Interruption] = []
    for after, members in sorted(gaps.items()):
        cost = None
        if after > 0:
            begin, end = spans[after - 1][1], spans[after][0]
            cost = max(0.0, end - begin - _no_nodes(generations, begin, end)) / len(members)
        found += [Interruption(gen, outcome, cost) for gen, outcome in members]
    return found


def _no_nodes(generations: list, begin: float, end: float) -> float:
    """Wall time between `begin` and `end` when the chain held no node: a generation had
    ended and its successor had not started."""
    idle = 0.0
    for before, after in itertools.pairwise(generations):
        if before.end is None:
            continue
        gap_begin, gap_end = max(begin, before.end), min(end, after.start)
        idle += max(0.0, gap_end - gap_begin)
    return idle


def history(account: Account) -> tuple[int, list[float]]:
    """(interruptions, the cost of each one whose cost was measured)."""
    found = interruptions(account)
    return len(found), [i.cost_s for i in found if i.cost_s is not None]


def _save_costs(account: Account) -> list[float]:
    return [s.ended - s.began for w in account.work for s in w.saves if s.ended >= s.began]


def _current_iterations(account: Account) -> int | None:
    """The chain's setting, else the most common gap between a cycle's saves."""
    if account.save_interval:
        return account.save_interval
    gaps = [
        b.iteration - a.iteration
        for w in account.work
        for a, b in itertools.pairwise(w.saves)
        if b.iteration > a.iteration
    ]
    return statistics.mode(gaps) if gaps else None


def _iterations(tau: float, step_s: float) -> int | None:
    return None if math.isinf(tau) else max(1, round(tau / step_s))


def recommend(account: Account) -> Recommendation:
    """The save interval maximising expected goodput at the measured save cost, restart
    cost and interruption rate, with the expected goodput today and at it."""
    saves, (count, costs) = _save_costs(account), history(account)
    nodes, step_s = _nodes(account), account.step_s
    save_s = statistics.median(saves) if saves else None
    restart_s = statistics.median(costs) if costs else None
    current = _current_iterations(account)
    rate = None
    trained_node_s = (account.allocation_node_s or 0.0) - account.categories.get(IDLE_SPARES, 0.0)
    if trained_node_s > 0:
        low, high = rate_interval(count, trained_node_s / 3600.0)
        rate = Rate(count, trained_node_s / 3600.0, count / (trained_node_s / 3600.0), low, high)
    certainty = "none" if count == 0 else "low" if count < FEW_INTERRUPTIONS else "fair"
    empty = Recommendation(
        save_s, len(saves), restart_s, len(costs), rate, nodes, step_s, current,
        None, (None, None), None, None, None, certainty,
    )  # fmt: skip
    missing = [
        what
        for what, known in (
            ("no save was measured", save_s is not None),
            ("no step time was measured", step_s is not None),
            ("no training node time was allocated", rate is not None and nodes > 0),
        )
        if not known
    ]
    if missing:
        return replace(empty, reason="; ".join(missing))
    assert save_s is not None and step_s is not None and rate is not None
    per_s = rate.per_node_hour * nodes / 3600.0
    cost = restart_s or 0.0

    def tau(per_node_hour: float) -> float:
        return optimal_tau(save_s, per_node_hour * nodes / 3600.0)

    best = tau(rate.per_node_hour)
    recommended = _iterations(best, step_s)
    result = replace(
        empty,
        recommended_iterations=recommended,
        range_iterations=(_iterations(tau(rate.high), step_s), _iterations(tau(rate.low), step_s)),
        young_iterations=_iterations(young_tau(save_s, per_s), step_s),
        current_goodput=(
            expected_goodput(current * step_s, save_s, cost, per_s) if current else None
        ),
        recommended_goodput=(
            expected_goodput(recommended * step_s, save_s, cost, per_s) if recommended else None
        ),
    )
    if count == 0:
        return replace(result, reason="no interruption yet: nothing to trade the save cost against")
    return result


def seconds(iterations: int | None, step_s: float | None) -> float | None:
    return None if iterations is None or step_s is None else iterations * step_s
