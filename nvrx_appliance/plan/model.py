"""The closed forms beside the simulation, and the search for the settings that
maximise the run's effective training time. Pure.

Closed forms (exact only in the cases docs/plan.md names, shown as a check, and used for
the road past the recommended plan, where a lever is worth what they gain with it):
- the save interval: the renewal model `report` uses (goodput/save_interval.py): segments of
  tau seconds closed by a save of C, Poisson interruptions at rate lambda, each costing
  R; its optimum solves (1 - x) e^x = e^(-lambda C), Young's sqrt(2 C / lambda) to first
  order; the ETTR adds what the simulation plays on top (a cold spare's admission, a
  failed load, the write behind an async save) inside the time the limits leave;
- the spares: the nodes outside task 0 that leave one generation are Poisson; the spares
  run out when more of them leave than hot and cold spares together.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from statistics import NormalDist

from nvrx_appliance import lease
from nvrx_appliance.goodput import save_interval as interval
from nvrx_appliance.plan import costs as priced
from nvrx_appliance.plan.costs import Costs
from nvrx_appliance.plan.simulate import (
    APPLIANCE,
    DETECTS,
    SEEDS,
    Design,
    Scenario,
    Settings,
    Summary,
    per_second,
    run_seeds,
    task0_detection,
)

# A setting is recommended where the chance of what it guards against is below this.
RISK = 0.01
# A save that costs nothing is best taken at every step; the simulation needs a segment.
SHORTEST_INTERVAL_S = 1.0
# Hot spares tried: each one is a task of idle nodes for the whole run.
MOST_HOT_SPARES = 4
# Events (interruptions and generations) one simulated run plays, its seeds together: a
# plan plays about a dozen such runs, each event a few microseconds here, so the answer
# comes within a second or two at any size. Past it the seeds are fewer (at least
# FEWEST_SEEDS: a large run's seed is already steady, its spread shrinking as one over the
# root of its interruptions), then one seed plays a window of the run and its counts are
# scaled to the whole (ETTR and the shares are ratios; the window is said).
EVENTS_PER_RUN = 20_000
FEWEST_SEEDS = 2


def interrupting_rate(scenario: Scenario) -> float:
    """Interruptions per second of wall time, every class together."""
    return sum(per_second(scenario).values())


def _task0_share(scenario: Scenario) -> float:
    shape = scenario.shape
    return min(shape.nodes_per_task, shape.nodes) / shape.nodes


def mean_recovery(scenario: Scenario, settings: Settings, design: Design) -> float:
    """The rate-weighted mean seconds from an interruption to training again, a spare
    at hand (the closed form's R)."""
    rates, c = per_second(scenario), scenario.costs
    total = sum(rates.values())
    if not total:
        return 0.0
    measured = design.fences_task0  # a chain's own hand-off cost is the appliance's
    share = _task0_share(scenario)

    def hand_off(kind: str) -> float:
        detection = task0_detection(c, kind, design, settings.lease_s)
        return sum(priced.hand_off(c, detection, measured).values())

    def in_place(kind: str) -> float:
        return sum(priced.in_job_restart(c, DETECTS[kind]).values())

    def leaves(kind: str) -> float:
        """A node leaves: a spare's restart, or task 0's: a hand-off."""
        spare = sum(priced.in_job_restart(c, DETECTS[kind], replaced=True).values())
        return (1 - share) * spare + share * hand_off(kind)

    cost = {
        "node_death": leaves("node_death"),
        "gpu_fault": leaves("gpu_fault"),
        "rank_crash": in_place("rank_crash"),
        "hang": leaves("hang") if design.names_hung_node else in_place("hang"),
        "task0_loss": hand_off("task0_loss"),
    }
    return sum(rates[k] * cost[k] for k in rates) / total


def _extra_per_interruption(
    scenario: Scenario, settings: Settings, design: Design
) -> tuple[float, float]:
    """What an interruption costs on top of the mean recovery with a spare at hand, as the
    simulation plays it: (more time to recover, saved work lost). More time: the wait for
    a cold spare where no hot one is left, a restart after a load that fails. Work lost:
    the segment whose checkpoint cannot be loaded, and an async save's segment whose
    write was still behind it."""
    rates, c = per_second(scenario), scenario.costs
    total = sum(rates.values())
    if not total:
        return 0.0, 0.0
    tau = settings.save_interval_s
    # Nodes of other tasks that leave take a hot spare; with none, the next admission.
    admit = c.s("scheduler") + c.s("start_gate")
    leaving = _leaving(scenario) * (1 - _task0_share(scenario))
    hot = settings.hot_spares
    if not settings.cold_spares:
        waits = 0.0  # nothing is admitted; where the hot ones run out the generation ends
    elif hot == 0:
        waits = admit
    else:  # the admissions under way outnumber the hot spares (Poisson), half a one left
        waits = poisson_tail(hot - 1, leaving * admit) * admit / 2
    slower, lost = leaving / total * waits, 0.0
    q = scenario.rates.unloadable
    if q:
        again = c.s("worker_start") + c.load.seconds
        if not design.falls_back:  # the chain stops for a person, who resubmits
            again = scenario.response_s + sum(priced.successor_start(c).values())
        slower += q * again
        lost += q * min(tau, scenario.horizon_s)
    behind = priced.write_behind_s(c)
    if behind and math.isfinite(tau):
        # The chance that a failure strikes within `behind` of a save's end, in a segment
        # after the first since training resumed (the first has no save behind it).
        cycle = tau + priced.blocking_save_s(c, tau)
        at_risk = -math.expm1(-total * min(behind, cycle))
        lost += tau * at_risk * math.exp(-total * cycle) / -math.expm1(-total * cycle)
    return slower, lost


def _training_time(
    scenario: Scenario, settings: Settings, design: Design, kept: float
) -> tuple[float, float]:
    """(the wall time inside generations after their start-ups, the saved-by-nobody work
    killed at their ends) over the whole run, as the time limits cut it: the first
    generation's start-up once, then every end (the last save, the end, the queue)
    outside the next limit and the successor's start-up inside it; a chain `depth` deep
    stops for a person every `depth` generations."""
    c, horizon, limit = scenario.costs, scenario.horizon_s, scenario.time_limit_s
    lam = interrupting_rate(scenario)
    first = c.first_start_whole
    first_s = first.seconds if first else c.s("start_gate") + c.s("worker_start")
    if math.isinf(limit) or horizon <= limit:
        return max(0.0, min(horizon, limit) - first_s), 0.0
    parts = (priced.boundary_appliance if design.saves_at_time_limit else priced.boundary_seeds)(c)
    start_up = parts.get("start_up", 0.0)
    outside = sum(parts.values()) - start_up
    stops = (horizon / (limit + outside)) // settings.depth
    rest = horizon - limit - stops * scenario.response_s
    ends, tail = divmod(max(0.0, rest), limit + outside)
    tail_trains = max(0.0, tail - outside - start_up)
    trains = max(0.0, limit - first_s + ends * (limit - start_up) + tail_trains)
    if design.saves_at_time_limit:
        return trains, 0.0
    # Slurm's limit kills the work since the last save: where the limit falls in a segment
    # is fixed by the generation's length until a failure moves it, then anywhere (half a
    # segment of work, of which `kept` was training, the rest recovering).
    tau = settings.save_interval_s
    span = limit - start_up
    fixed = min(tau, span % (tau + priced.blocking_save_s(c, tau)))
    moved = -math.expm1(-lam * span)
    return trains, (ends + (tail > 0)) * ((1 - moved) * fixed + moved * kept * min(tau, span) / 2)


def closed_form(scenario: Scenario, settings: Settings, design: Design) -> float:
    """The renewal model's ETTR inside the generations' training time: segments of tau
    closed by a save, Poisson interruptions each costing the mean recovery and what
    `_extra_per_interruption` adds."""
    lam = interrupting_rate(scenario)
    tau = settings.save_interval_s
    save = priced.blocking_save_s(scenario.costs, tau)
    slower, lost = _extra_per_interruption(scenario, settings, design)
    recovery = mean_recovery(scenario, settings, design) + slower
    kept = interval.expected_goodput(tau, save, recovery, lam)
    # Work once kept and then lost comes off it, for each interruption that strikes the
    # segments rather than a recovery (about 1 - lambda R of them).
    kept = max(0.0, kept - lam * lost * max(0.0, 1.0 - lam * recovery))
    trains, killed = _training_time(scenario, settings, design, kept)
    return max(0.0, kept * trains - killed) / scenario.horizon_s


def best_interval(scenario: Scenario) -> float:
    return interval.optimal_tau(scenario.costs.save.seconds, interrupting_rate(scenario))


def young_interval(scenario: Scenario) -> float:
    return interval.young_tau(scenario.costs.save.seconds, interrupting_rate(scenario))


def _log_pmf(i: int, mean: float) -> float:
    return i * math.log(mean) - mean - math.lgamma(i + 1)


# Terms below this share of the sum so far change no digit a plan prints.
_NEGLIGIBLE = 1e-17
# Past this mean the tail is the normal one (continuity-corrected): its skew, one over
# the root of the mean, moves a quantile by under a count, and the exact sum would take
# tens of thousands of terms a tail.
NORMAL_PAST = 1e6


def poisson_tail(k: int, mean: float) -> float:
    """P(N > k) for N ~ Poisson(mean), summed from k outward in log space: exp(-mean)
    underflows past a mean of ~745, and a sum from 0 would take `mean` terms; from k the
    terms fall off within a few dozen standard deviations (sqrt(mean))."""
    if mean <= 0:
        return 0.0
    if k < 0:
        return 1.0
    if mean > NORMAL_PAST:
        return 1.0 - NormalDist(mean, math.sqrt(mean)).cdf(k + 0.5)
    if k >= mean:  # the upper tail itself, from k + 1 up
        i, term, total = k + 1, 1.0, 0.0
        while term > _NEGLIGIBLE * total or not total:
            total += term
            i += 1
            term *= mean / i
        return min(1.0, math.exp(_log_pmf(k + 1, mean)) * total)
    i, term, total = k, 1.0, 0.0  # one less the lower tail, from k down
    while i >= 0 and (term > _NEGLIGIBLE * total or not total):
        total += term
        term *= i / mean
        i -= 1
    return max(0.0, 1.0 - math.exp(_log_pmf(k, mean)) * total)


def poisson_quantile(mean: float, risk: float) -> int:
    """The fewest k with P(N > k) <= risk: a bisection, so a mean of millions answers in
    a few dozen tails rather than one tail per count."""
    if poisson_tail(0, mean) <= risk:
        return 0
    low, high = 0, math.ceil(mean + 12 * math.sqrt(mean) + 12)  # tail(high) is far below
    while high - low > 1:  # tail(low) > risk >= tail(high)
        mid = (low + high) // 2
        if poisson_tail(mid, mean) > risk:
            low = mid
        else:
            high = mid
    return high


def _leaving(scenario: Scenario) -> float:
    """Nodes that leave a generation per second: deaths, GPU faults (the node fails the
    health check), and hangs that name their node (the appliance's stacks)."""
    rates = per_second(scenario)
    return rates["node_death"] + rates["gpu_fault"] + rates["hang"]


def spare_deaths_per_generation(scenario: Scenario) -> float:
    """Nodes outside task 0 that leave one generation (its wall time): deaths and named
    hangs (a hung node's task ends as a dead one's does, so a cold spare replaces either)."""
    rate = _leaving(scenario) * (1 - _task0_share(scenario))
    limit = scenario.time_limit_s if not math.isinf(scenario.time_limit_s) else scenario.horizon_s
    return rate * limit


def spares_out_chance(scenario: Scenario, settings: Settings) -> float:
    """The chance that one generation loses more nodes than it has spares."""
    spares = settings.hot_spares + settings.cold_spares
    return poisson_tail(spares, spare_deaths_per_generation(scenario))


def cold_spares_for(scenario: Scenario, hot: int) -> int:
    """The fewest cold spares that keep the chance of running out below RISK."""
    return max(0, poisson_quantile(spare_deaths_per_generation(scenario), RISK) - hot)


def shortest_lease(storage_stall_s: float, grace: float) -> int:
    """The shortest lease a live task 0 rides out a `storage_stall_s` stall of the shared
    file system with (it stops itself only after that long), nesting with the grace."""
    e = lease.CLOCK_RATE_ERROR
    # self_fence_after grows linearly with the lease: start at its inverse, not at 1 s.
    inverse = ((storage_stall_s + lease.POLL_S + grace) / (1 - e) + lease.SAFETY_S) * (1 + e)
    stale = max(lease.shortest(grace), math.floor(inverse) - 2)
    while lease.self_fence_after(stale, grace) < storage_stall_s or lease.problem(stale, grace):
        stale += 1
    return stale


def depth_for(scenario: Scenario, settings: Settings, design: Design) -> int:
    """Generations the run uses, at the 1 - RISK quantile: the time limits, plus the
    hand-offs (task 0's losses, spares run out), which are Poisson."""
    horizon, limit = scenario.horizon_s, scenario.time_limit_s
    boundaries = 0 if math.isinf(limit) else math.ceil(horizon / limit)
    rates = per_second(scenario)
    ends = rates["task0_loss"] + _leaving(scenario) * _task0_share(scenario)
    mean = ends * horizon + spares_out_chance(scenario, settings) * max(boundaries, 1)
    return boundaries + poisson_quantile(mean, RISK) + 1


@dataclass(frozen=True)
class Budget:
    seeds: int
    window_s: float  # the wall time each seed plays (the horizon, or less)
    events_per_seed: float  # expected in the whole run


def budget(scenario: Scenario, asked: int) -> Budget:
    """The seeds and window a plan simulates, within EVENTS_PER_RUN."""
    horizon, limit = scenario.horizon_s, scenario.time_limit_s
    events = interrupting_rate(scenario) * horizon + (0 if math.isinf(limit) else horizon / limit)
    seeds = min(asked, max(FEWEST_SEEDS, math.floor(EVENTS_PER_RUN / max(events, 1.0))))
    window = min(horizon, horizon * EVENTS_PER_RUN / seeds / max(events, 1.0))
    return Budget(seeds, window, events)


def _scaled(summary: Summary, factor: float) -> Summary:
    """A window's counts and seconds as the whole run's."""
    if factor == 1.0:
        return summary
    return replace(
        summary,
        seconds={k: v * factor for k, v in summary.seconds.items()},
        interruptions={k: v * factor for k, v in summary.interruptions.items()},
        generations=summary.generations * factor,
        resubmits=summary.resubmits * factor,
    )


# --- the search ------------------------------------------------------------------------------

# A chain queues at most this many generations (plan's own --depth bound); a run that
# needs more stops for a person every MOST_DEPTH, and a longer --time needs fewer.
MOST_DEPTH = 100_000


@dataclass(frozen=True)
class Choice:
    """One setting: today's value, the recommended one, and what the change is worth
    (points of the allocation's goodput, given the changes listed before it: the worths
    add up to the gap between today's settings and the recommended ones)."""

    setting: str
    today: float
    recommended: float
    worth: float
    why: str


@dataclass(frozen=True)
class Lever:
    """One way past the recommended plan (docs/plan.md, "The road to 98%"): a cost moved
    from the plan's figure to a stated one, and what it is worth alone (points of the
    allocation's goodput, closed form). `now` and `to` are seconds, or hot spares."""

    name: str
    now: float
    to: float
    worth: float


@dataclass(frozen=True)
class Plan:
    scenario: Scenario  # at the recommended time limit
    today: Settings
    today_time_limit_s: float
    recommended: Settings
    appliance: Summary  # at the recommended settings
    appliance_today: Summary
    seeds: Summary  # the seeds' design at the recommended settings (its lease: none)
    closed_form: float  # the renewal model at the recommended settings
    seeds_closed_form: float
    young_interval_s: float
    spares_out_closed_form: float
    choices: tuple[Choice, ...]
    storage_stall_s: float
    budget: Budget
    seeds_asked: int
    depth_needed: int  # the generations the run needs; the recommended depth is at most MOST_DEPTH
    levers: tuple[Lever, ...] = ()
    all_levers: float = 0.0  # the allocation's goodput with every lever pulled (closed form)
    closed_goodput: float = 0.0  # the allocation's goodput of the plan, closed form
    step_s: float | None = None  # a training step, for the interval in iterations

    def allocation_goodput(self, summary: Summary, settings: Settings) -> float:
        """ETTR over the whole allocation: hot spares hold nodes that never train."""
        return _goodput(self.scenario, settings, summary.ettr)


def _goodput(scenario: Scenario, settings: Settings, ettr: float) -> float:
    nodes = scenario.shape.nodes
    return ettr * nodes / (nodes + settings.hot_spares * scenario.shape.nodes_per_task)


def _interval(scenario: Scenario) -> float:
    """The save interval to recommend: the renewal model's optimum, no longer than a
    generation (its time-limit save comes first) or the run; with no interruptions, or
    next to none, that is the best there is."""
    tau = min(best_interval(scenario), scenario.time_limit_s, scenario.horizon_s)
    return max(tau, SHORTEST_INTERVAL_S)


def interval_why(scenario: Scenario, tau: float) -> str:
    if not interrupting_rate(scenario):
        return "no interruptions: nothing to lose between the time-limit saves"
    if tau < best_interval(scenario):
        return "the optimum is past the generation: its time-limit save"
    return "the renewal model's optimum"


def longest_limit(today_s: float, most_s: float) -> float:
    """The time limit to recommend: the longest the partition allows (a generation's end
    costs its save, the end and the successor's start-up; a longer one has fewer), or
    today's where that is longer (a person who runs it knows it is allowed)."""
    return max(today_s, most_s)


def plan(
    scenario: Scenario,
    today: Settings,
    *,
    seeds: int,
    grace: float,
    storage_stall_s: float,
    most_time_s: float | None = None,
) -> Plan:
    """Each setting in turn at the value that maximises the allocation's goodput, then
    what each change from today is worth, given the changes before it. `scenario`
    carries today's time limit; `most_time_s` is the longest the partition allows."""
    today_scenario = scenario
    limit = longest_limit(scenario.time_limit_s, most_time_s or scenario.time_limit_s)
    scenario = replace(scenario, time_limit_s=limit)
    sized = budget(scenario, seeds)

    def run(settings: Settings, design: Design = APPLIANCE, at: Scenario = scenario) -> Summary:
        size = sized if at is scenario else budget(at, seeds)
        window = replace(at, horizon_s=size.window_s)
        summary = run_seeds(window, settings, design, size.seeds)
        return _scaled(summary, at.horizon_s / size.window_s)

    tau = _interval(scenario)
    best = replace(
        today, save_interval_s=tau, lease_s=float(shortest_lease(storage_stall_s, grace))
    )
    by_hot = {}
    for hot in range(MOST_HOT_SPARES + 1):
        settings = replace(best, hot_spares=hot, cold_spares=cold_spares_for(scenario, hot))
        by_hot[hot] = (_goodput(scenario, settings, run(settings).ettr), settings)
    best = max(by_hot.values(), key=lambda pair: pair[0])[1]
    needed = depth_for(scenario, best, APPLIANCE)
    best = replace(best, depth=min(needed, MOST_DEPTH))
    appliance = run(best)
    appliance_today = run(today, at=today_scenario)
    choices = _choices(
        run,
        (today_scenario, today, appliance_today),
        (scenario, best, appliance),
        interval_why(scenario, tau),
        storage_stall_s,
    )
    levers = _levers(scenario, best)
    return Plan(
        scenario=scenario,
        today=today,
        today_time_limit_s=today_scenario.time_limit_s,
        recommended=best,
        appliance=appliance,
        appliance_today=appliance_today,
        seeds=run(best, SEEDS),
        closed_form=closed_form(scenario, best, APPLIANCE),
        seeds_closed_form=closed_form(scenario, best, SEEDS),
        young_interval_s=young_interval(scenario),
        spares_out_closed_form=spares_out_chance(scenario, best),
        choices=tuple(choices),
        storage_stall_s=storage_stall_s,
        budget=sized,
        seeds_asked=seeds,
        depth_needed=needed,
        levers=levers,
        all_levers=_all_levers(scenario, best),
        closed_goodput=_goodput(scenario, best, closed_form(scenario, best, APPLIANCE)),
    )


def _choices(
    run: Callable[..., Summary],
    today: tuple[Scenario, Settings, Summary],
    best: tuple[Scenario, Settings, Summary],
    interval_reason: str,
    storage_stall_s: float,
) -> list[Choice]:
    """From today's settings to the recommended ones, one setting at a time in this
    order, each worth what it adds to the allocation's goodput given those before it."""
    (sc, settings, summary), (best_sc, best_settings, best_summary) = today, best
    before = _goodput(sc, settings, summary.ettr)
    steps = (
        ("time limit (s)", "", "the longest --max-time allows"),
        ("save interval (s)", "save_interval_s", interval_reason),
        ("hot spares", "hot_spares", "the most goodput, idle spares counted"),
        ("cold spares", "cold_spares", f"spares run out in under {RISK:.0%} of generations"),
        (
            "lease (s)",
            "lease_s",
            f"the shortest that rides out a {storage_stall_s:g} s storage stall",
        ),
        ("depth", "depth", f"no resubmit, with {1 - RISK:.0%} chance"),
    )
    out = []
    for index, (name, field, why) in enumerate(steps):
        if field:
            was, now = getattr(settings, field), getattr(best_settings, field)
            settings = replace(settings, **{field: now})
        else:
            was, now = sc.time_limit_s, best_sc.time_limit_s
            sc = best_sc
        worth = 0.0
        if was != now:
            after = best_summary if index == len(steps) - 1 else run(settings, at=sc)
            worth = _goodput(sc, settings, after.ettr) - before
            before += worth
        out.append(Choice(name, float(was), float(now), worth, why))
    # After the last change the settings are the recommended ones, played on the same
    # seeds: the worths add up to the whole gap. Whatever rounding leaves goes to the last.
    gap = _goodput(best_sc, best_settings, best_summary.ettr) - before
    landing = max(i for i, c in enumerate(out) if c.today != c.recommended or i == 0)
    out[landing] = replace(out[landing], worth=out[landing].worth + gap)
    return out


# --- the road past the recommended plan ----------------------------------------------------

# Where each lever is moved to (docs/plan.md, "The road to 98%"): stated figures, not
# measurements; a plan whose figure is already as good shows the lever worth nothing.
ASYNC_STAGING_S = 1.0  # an async save's staging copy to host memory, assumed
FAST_LOAD_S = 5.0  # a restore from a local or in-memory copy, assumed
STEP_TIMEOUT_TO_S = 60.0  # a step timeout of a minute, well past a large model's step
NODE_SILENCE_TO_S = 5.0  # a silence timeout of five beats
WORKER_START_TO_S = 60.0  # a worker start of a minute: CUDA, NCCL and the model, assumed
WEEK_S = 7 * 86400.0


Move = Callable[[Scenario, Settings], tuple[Scenario, Settings]]


def _levers(scenario: Scenario, best: Settings) -> tuple[Lever, ...]:
    """Each lever alone, from the recommended plan, in the closed form."""
    base = _goodput(scenario, best, closed_form(scenario, best, APPLIANCE))
    out = []
    for name, now, to, move in _moves(scenario, best):
        worth = 0.0
        if to != now:
            moved, settings = move(scenario, best)
            worth = _goodput(moved, settings, closed_form(moved, settings, APPLIANCE)) - base
        out.append(Lever(name, now, to, worth))
    return tuple(out)


def _all_levers(scenario: Scenario, best: Settings) -> float:
    """Every lever pulled at once; one more hot spare left out (it holds idle nodes)."""
    moved, settings = scenario, best
    for name, _, _, move in _moves(scenario, best):
        if name != "hot spares":
            moved, settings = move(moved, settings)
    return _goodput(moved, settings, closed_form(moved, settings, APPLIANCE))


def _moves(scenario: Scenario, best: Settings) -> list[tuple[str, float, float, Move]]:
    """Each lever: its name, the plan's figure, the stated one, and the move itself."""
    c = scenario.costs
    staging = min(c.save.seconds, ASYNC_STAGING_S)
    load = min(c.load.seconds, FAST_LOAD_S)
    hang = min(c.s("detect_hang"), STEP_TIMEOUT_TO_S)
    death = c.s("detect_node_death") - max(0.0, c.node_silence_s - NODE_SILENCE_TO_S)
    start = min(c.s("worker_start"), WORKER_START_TO_S)
    limit = scenario.time_limit_s
    longer = max(limit, min(WEEK_S, scenario.horizon_s))

    def async_save(sc: Scenario, st: Settings) -> tuple[Scenario, Settings]:
        transfer = _transfer_s(sc.costs)
        behind = replace(sc.costs.save, seconds=transfer, source="the whole write behind it")
        costs = replace(
            sc.costs,
            save=replace(sc.costs.save, seconds=staging, source=LEVER),
            write_behind=behind if transfer > staging else None,
        )
        sc = replace(sc, costs=costs)
        return sc, replace(st, save_interval_s=_interval(sc))

    def fast_load(sc: Scenario, st: Settings) -> tuple[Scenario, Settings]:
        costs = replace(sc.costs, load=replace(sc.costs.load, seconds=load, source=LEVER))
        return replace(sc, costs=costs), st

    def step(name: str, seconds: float) -> Move:
        def move(sc: Scenario, st: Settings) -> tuple[Scenario, Settings]:
            moved = replace(sc.costs.steps[name], seconds=seconds, source=LEVER)
            return replace(sc, costs=replace(sc.costs, steps={**sc.costs.steps, name: moved})), st

        return move

    return [
        ("async save", c.save.seconds, staging, async_save),
        ("load", c.load.seconds, load, fast_load),
        ("hang detection", c.s("detect_hang"), hang, step("detect_hang", hang)),
        ("node-death detection", c.s("detect_node_death"), death, step("detect_node_death", death)),
        ("worker start", c.s("worker_start"), start, step("worker_start", start)),
        (
            "hot spares",
            float(best.hot_spares),
            float(best.hot_spares + 1),
            lambda sc, st: (sc, replace(st, hot_spares=st.hot_spares + 1)),
        ),
        (
            "generation length",
            limit,
            longer,
            lambda sc, st: (replace(sc, time_limit_s=longer), st),
        ),
    ]


LEVER = "a lever's stated figure (docs/plan.md, The road to 98%)"


def _transfer_s(c: Costs) -> float:
    """The whole checkpoint at the storage's rate (what a synchronous save blocks)."""
    if c.checkpoint is None:
        return c.save.seconds
    return c.checkpoint.gb / c.checkpoint.storage_gbps
