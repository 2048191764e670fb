"""The run, event by event: a discrete-event simulation, seeded, that a three-month
run of 65,536 GPUs passes through in a few hundredths of a second.
Pure: the random source is its own `random.Random(seed)`.

What happens (docs/plan.md): training runs in segments of `save_interval_s` of work,
each closed by a save (an async save's segment is durable only once the write behind it
ends). Interruptions of every class arrive as one Poisson process in wall
time (the sum of the classes' rates over the training nodes, held or not by a recovery),
so the time to the next one is drawn afresh at any moment. An interruption loses the
work since the last completed save and starts its own recovery, made of the steps that
costs.py prices; one that strikes a recovery restarts it (its own recovery in place of
what was left of the other, the renewal model's rule); one that strikes a generation's
end (its last save, the dying path, the successor's scheduling) goes with that
generation. A node that leaves (a silent death, a GPU fault, a named hang) takes a hot
spare (and the array throttle admits a cold spare, which becomes a hot one after it
starts); with none left the restart waits for that admission, and with none coming the
generation ends. An interruption on task 0's nodes, or a task-0 loss, ends the
generation after the design's detection (task0_detection). The time limit ends each
generation; a chain that has run `depth` generations stops until a person resubmits.
The run's end is its training done: its last work is saved.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from nvrx_appliance.plan import costs as priced
from nvrx_appliance.plan.costs import Costs, Shape
from nvrx_appliance.plan.rates import Rates

DAY = 86400.0
# Plan-only categories beside goodput.account's: wall time with no node held between
# generations, and a chain stopped until a person acts.
QUEUE_WAIT = "queue_wait"
STOPPED = "waiting_for_a_person"
NO_NODES = (QUEUE_WAIT, STOPPED)
# Interruptions counted again by when they struck: a recovery (restarted), a generation's
# end (nothing more to recover).
DURING_RECOVERY = "during_a_recovery"
ENDING = "during_a_generations_end"


@dataclass(frozen=True)
class Design:
    """How a deployment answers the failures that differ between the appliance and the
    seeds' reference design (bench/seeds.py; docs/benchmarks.md rows 2c, 8)."""

    name: str
    fences_task0: bool  # a lease ends a dead task 0's generation; else the store wait does
    saves_at_time_limit: bool
    falls_back: bool  # an unloadable checkpoint: resume from the one before; else stop
    # A hang names its node (stacks), which leaves as a dead one does: a spare takes its
    # place, task 0's ends the generation. Else NVRx restarts in place on the same nodes.
    names_hung_node: bool


APPLIANCE = Design(
    "the appliance",
    fences_task0=True,
    saves_at_time_limit=True,
    falls_back=True,
    names_hung_node=True,
)
SEEDS = Design(
    "the seeds' design",
    fences_task0=False,
    saves_at_time_limit=False,
    falls_back=False,
    names_hung_node=False,
)


@dataclass(frozen=True)
class Settings:
    save_interval_s: float  # training seconds between two saves (math.inf: never)
    hot_spares: int  # tasks
    cold_spares: int  # tasks
    lease_s: float
    depth: int


@dataclass(frozen=True)
class Scenario:
    shape: Shape
    rates: Rates
    costs: Costs
    time_limit_s: float  # one generation's wall time (math.inf: none)
    horizon_s: float  # the run's wall time
    response_s: float  # a person's answer to a stopped chain
    given: frozenset[str] = frozenset()  # the waits given, not assumed (request.py)


@dataclass
class Outcome:
    horizon_s: float
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    interruptions: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    generations: int = 0
    generations_spares_out: int = 0  # generations a node death found no spare in
    resubmits: int = 0

    @property
    def ettr(self) -> float:
        return self.seconds["productive"] / self.horizon_s


def per_second(scenario: Scenario) -> dict[str, float]:
    """Each class's rate over the whole run, per second of wall time."""
    r, shape = scenario.rates, scenario.shape
    scale = shape.nodes / 1000.0 / DAY
    return {
        "node_death": r.node_death * scale,
        "gpu_fault": r.gpu_fault_at(shape.gpus_per_node) * scale,
        "rank_crash": r.rank_crash * scale,
        "hang": r.hang * scale,
        "task0_loss": r.task0_loss * min(shape.nodes_per_task, shape.nodes) / 1000.0 / DAY,
    }


# What finds each class of interruption (costs.py's steps), on a node that is not task 0's.
DETECTS = {
    "node_death": "detect_node_death",
    "gpu_fault": "detect_crash",
    "rank_crash": "detect_crash",
    "hang": "detect_hang",
}


def task0_detection(costs: Costs, kind: str, design: Design, lease_s: float) -> float:
    """Seconds until the generation is known to be over when `kind` strikes task 0's
    nodes. A hang: the step timeout. A GPU fault on the appliance: task 0's own launcher
    fails the health check and its trap ends the generation (docs/benchmarks.md row 2d).
    A dead or silent task 0: the lease, on the appliance; in the seeds' design nothing
    fences it, so every end of task 0 waits out the store."""
    if kind == "hang":
        return costs.s("detect_hang")
    if not design.fences_task0:
        return costs.s("store_wait")
    return costs.s("detect_crash") if kind == "gpu_fault" else lease_s


# Where an interruption that strikes a recovery restarts it: a recovery of the generation
# that runs (the step timeout of a hang, an in-job restart, a new generation's start-up).
# Anywhere else a generation is ending (its last save, the dying path, the successor's
# scheduling): the node that fails goes with it, and costs nothing more.
RESTARTED = ("hangs_until_detected", "in_job_restarts", "start_up")


class _Run:
    """One simulated run; `play` drives it to the horizon."""

    def __init__(self, scenario: Scenario, settings: Settings, design: Design, seed: int):
        self.sc, self.st, self.design = scenario, settings, design
        self.rng = random.Random(seed)
        self.rates = per_second(scenario)
        self.total_rate = sum(self.rates.values())
        self.out = Outcome(scenario.horizon_s)
        self.t = 0.0
        self.work = 0.0  # trained since the last completed save
        self.saving: float | None = None  # seconds into a save under way
        self.pending: list[tuple[str, float]] = []  # the recovery still to go, in order
        self.admissions: list[float] = []
        self.chain_used = 0  # generations of the current chain, of its depth
        self.next_failure = self._draw()
        c = scenario.costs
        self.admit_s = c.s("scheduler") + c.s("start_gate")
        self.tau = settings.save_interval_s
        self.save_s = priced.blocking_save_s(c, self.tau)
        # An async save's segment, saved but not yet durable: its write is still behind it.
        self.write_behind = priced.write_behind_s(c)
        self.unconfirmed, self.durable_at = 0.0, -math.inf
        first = c.first_start_whole
        start_up = first.seconds if first else c.s("start_gate") + c.s("worker_start")
        self._begin_generation([("start_up", start_up)], chained=False)

    def _draw(self) -> float:
        return self.t + (self.rng.expovariate(self.total_rate) if self.total_rate else math.inf)

    def _begin_generation(self, pending: list[tuple[str, float]], *, chained: bool = True):
        """A new generation: its time limit runs from its start (after the hand-off and
        the queue), its spares are whole again, and it uses up one of the chain's depth."""
        before_start = sum(s for cat, s in pending if cat != "start_up")
        self.out.generations += 1
        if chained:
            self.chain_used += 1
            if self.chain_used >= self.st.depth:
                self.out.resubmits += 1
                self.chain_used = 0
                pending = [(STOPPED, self.sc.response_s), *pending]
                before_start += self.sc.response_s
        else:
            self.chain_used = 0
        self.pending = pending
        self.gen_end = self.t + before_start + self.sc.time_limit_s
        self.hot, self.cold = self.st.hot_spares, self.st.cold_spares
        self.admissions = []

    # --- time passing ---------------------------------------------------------------------

    def _recover(self, until: float) -> None:
        while self.pending and self.t < until:
            category, left = self.pending[0]
            spent = min(left, until - self.t)
            self.out.seconds[category] += spent
            self.t += spent
            if spent < left:
                self.pending[0] = (category, left - spent)
            else:
                self.pending.pop(0)

    def _train(self, until: float) -> None:
        seconds, tau, save = self.out.seconds, self.tau, self.save_s
        while self.t < until:
            if self.saving is None:
                if self.work == 0.0 and not math.isinf(tau):
                    whole = math.floor((until - self.t) / (tau + save))
                    if whole:  # whole segments at once: the run's bulk
                        self.t += whole * (tau + save)
                        seconds["productive"] += whole * tau
                        seconds["checkpoint_saves"] += whole * save
                        self._saved(tau)
                        continue
                need = tau - self.work
                if self.t + need > until:
                    self.work += until - self.t
                    self.t = until
                    return
                self.t += need
                self.work, self.saving = tau, 0.0
            left = save - self.saving
            if self.t + left > until:
                self.saving += until - self.t
                seconds["checkpoint_saves"] += until - self.t
                self.t = until
                return
            seconds["checkpoint_saves"] += left
            self.t += left
            seconds["productive"] += self.work
            self._saved(self.work)
            self.work, self.saving = 0.0, None

    def _saved(self, work: float) -> None:
        """A save ended at `t`: its work counts, but until its write behind it is done a
        failure takes it too (the last durable checkpoint is the one before)."""
        if self.write_behind:
            self.unconfirmed, self.durable_at = work, self.t + self.write_behind

    def _lose_work(self) -> None:
        lost = self.work
        if self.t < self.durable_at:
            self.out.seconds["productive"] -= self.unconfirmed
            lost += self.unconfirmed
        self.out.seconds["training_lost"] += lost
        self.work, self.saving, self.unconfirmed = 0.0, None, 0.0

    # --- events ------------------------------------------------------------------------------

    def play(self) -> Outcome:
        horizon = self.sc.horizon_s
        while self.t < horizon:
            if self.pending and self.pending[0][0] in NO_NODES:
                self._without_nodes(horizon)
                continue
            stop = min(self.next_failure, self.gen_end, horizon, *self.admissions[:1])
            self._recover(stop)
            if not self.pending:
                self._train(stop)
            if self.t >= horizon:
                break
            if self.admissions and self.t >= self.admissions[0]:
                self.admissions.pop(0)
                self.hot += 1
            elif self.t >= self.next_failure:
                # Between a generation's end and the queue's: nothing trains or waits to.
                if not any(category in NO_NODES for category, _ in self.pending):
                    self._failure()
                self.next_failure = self._draw()
            elif self.t >= self.gen_end:
                self._time_limit()
        # The run's end is its training done: the last work is saved as it ends (Megatron
        # saves on its way out), in either design.
        self.out.seconds["productive"] += self.work
        return self.out

    def _without_nodes(self, horizon: float) -> None:
        """A wait with no node held (the queue, a stopped chain): nothing can fail in it,
        so the next interruption is drawn from its end (the process is memoryless)."""
        category, left = self.pending.pop(0)
        spent = min(left, horizon - self.t)
        self.out.seconds[category] += spent
        self.t += spent
        if self.next_failure < self.t:
            self.next_failure = self._draw()

    def _time_limit(self) -> None:
        c = self.sc.costs
        if self.design.saves_at_time_limit:
            self.out.seconds["productive"] += self.work
            self.work, self.saving, self.unconfirmed = 0.0, None, 0.0  # durable as it ends
            parts = priced.boundary_appliance(c)
        else:
            self._lose_work()
            parts = priced.boundary_seeds(c)
        self._begin_generation(_ordered(parts))

    def _failure(self) -> None:
        rng, c = self.rng, self.sc.costs
        kind = _choose(rng, self.rates, self.total_rate)
        self.out.interruptions[kind] += 1
        if self.pending:
            if self.pending[0][0] not in RESTARTED:
                self.out.interruptions[ENDING] += 1
                return
            self.out.interruptions[DURING_RECOVERY] += 1
        self._lose_work()
        if kind == "rank_crash" or (kind == "hang" and not self.design.names_hung_node):
            self._restart(_ordered(priced.in_job_restart(c, DETECTS[kind])))
            return
        task0_nodes = min(self.sc.shape.nodes_per_task, self.sc.shape.nodes)
        if kind == "task0_loss" or rng.random() < task0_nodes / self.sc.shape.nodes:
            if kind != "task0_loss":
                self.out.interruptions[f"{kind}_on_task0"] += 1
            self._hand_off(task0_detection(c, kind, self.design, self.st.lease_s))
            return
        # A node of another task died, its GPU failed or it was named hung: it leaves, and
        # its task ends (its ft_launcher exits 1 on the failed health check), so the
        # throttle admits a cold spare.
        detect = DETECTS[kind]
        if self.cold > 0:
            self.cold -= 1
            self.admissions.append(self.t + self.admit_s)
        restart = _ordered(priced.in_job_restart(c, detect, replaced=True))
        if self.hot > 0:
            self.hot -= 1
            self._restart(restart)
        elif self.admissions:
            wait = max(0.0, self.admissions.pop(0) - self.t)
            self._restart([("in_job_restarts", wait), *restart])
        else:
            self.out.generations_spares_out += 1  # it ends here: once per generation
            self._hand_off(c.s(detect))

    def _unloadable(self) -> bool:
        """Whether the load this recovery ends with fails: the newest checkpoint cannot
        be read. The work it held is lost with it."""
        q = self.sc.rates.unloadable
        if q <= 0 or self.rng.random() >= q or math.isinf(self.tau):
            return False
        moved = min(self.tau, self.out.seconds["productive"])
        self.out.seconds["productive"] -= moved
        self.out.seconds["training_lost"] += moved
        return True

    def _restart(self, parts: list[tuple[str, float]]) -> None:
        if self._unloadable():
            c = self.sc.costs
            if not self.design.falls_back:
                self._stop_for_a_person()
                return
            parts = [*parts, ("in_job_restarts", c.s("worker_start") + c.load.seconds)]
        self.pending = parts

    def _hand_off(self, detection: float) -> None:
        # A chain's own hand-off cost was measured under the appliance, not the seeds'.
        parts = _ordered(
            priced.hand_off(self.sc.costs, detection, measured=self.design.fences_task0)
        )
        if self._unloadable():
            if not self.design.falls_back:
                self._stop_for_a_person()
                return
            c = self.sc.costs
            parts = [*parts, ("start_up", c.s("worker_start") + c.load.seconds)]
        self._begin_generation(parts)

    def _stop_for_a_person(self) -> None:
        """The seeds' design on an unloadable checkpoint: every restart fails to load it,
        NVRx stops restarting (93) and the chain ends; a person moves the checkpoint
        aside and resubmits."""
        self.out.resubmits += 1
        self.chain_used = -1  # the person's new chain: this generation is its first
        parts = _ordered(priced.successor_start(self.sc.costs))
        self._begin_generation([(STOPPED, self.sc.response_s), *parts])


ORDER = (
    "hangs_until_detected",
    "in_job_restarts",
    "checkpoint_saves",
    "hand_offs",
    QUEUE_WAIT,
    "start_up",
)


def _ordered(parts: dict[str, float]) -> list[tuple[str, float]]:
    return [(k, parts[k]) for k in ORDER if parts.get(k)]


def _choose(rng: random.Random, rates: dict[str, float], total: float) -> str:
    x = rng.random() * total
    for kind, rate in rates.items():
        x -= rate
        if x < 0:
            return kind
    return next(k for k, r in reversed(rates.items()) if r > 0)


def simulate(scenario: Scenario, settings: Settings, design: Design, seed: int) -> Outcome:
    return _Run(scenario, settings, design, seed).play()


@dataclass(frozen=True)
class Summary:
    """Several seeds of one run: the mean ETTR, its spread, and the mean of the rest."""

    ettr: float
    ettr_low: float
    ettr_high: float
    seconds: dict[str, float]
    interruptions: dict[str, float]
    generations: float
    spares_out: float  # of generations, the share where a node death found no spare
    resubmits: float
    seeds: int
    ettr_se: float = 0.0  # the standard error of the mean ETTR over the seeds


def run_seeds(scenario: Scenario, settings: Settings, design: Design, seeds: int) -> Summary:
    outcomes = [simulate(scenario, settings, design, seed) for seed in range(seeds)]
    ettrs = sorted(o.ettr for o in outcomes)

    def mean(values) -> float:
        values = list(values)
        return sum(values) / len(values)

    keys = {k for o in outcomes for k in o.seconds}
    kinds = {k for o in outcomes for k in o.interruptions}
    generations = sum(o.generations for o in outcomes)
    return Summary(
        ettr=mean(ettrs),
        ettr_low=ettrs[0],
        ettr_high=ettrs[-1],
        seconds={k: mean(o.seconds.get(k, 0.0) for o in outcomes) for k in keys},
        interruptions={k: mean(o.interruptions.get(k, 0) for o in outcomes) for k in kinds},
        generations=generations / len(outcomes),
        spares_out=sum(o.generations_spares_out for o in outcomes) / generations,
        resubmits=mean(o.resubmits for o in outcomes),
        seeds=len(outcomes),
        ettr_se=statistics.stdev(ettrs) / math.sqrt(len(ettrs)) if len(ettrs) > 1 else 0.0,
    )
