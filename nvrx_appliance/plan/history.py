"""A chain's own history as a plan's inputs: its interruption rates and costs, from the
goodput account `report` builds. Pure.

What the account can tell: in-job restarts (cycles after a generation's first) and the
generations a failure ended that a successor took over from (task 0 lost, a node
failure); the last generation's end is the chain's own, whatever its exit said. What it cannot:
whether an in-job restart followed a rank's crash or a node's death (either is one more
cycle), so they are counted as rank crashes and said to be; hangs show as their own
category of time, not as a count. What it can tell is what each interruption led to:
a restart on the same nodes, one with a spare in a node's place (the next cycle's nodes
differ), or a hand-off; each has its own mean cost.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from nvrx_appliance.goodput import save_interval as interval
from nvrx_appliance.goodput.account import IDLE_SPARES, Account


@dataclass(frozen=True)
class ChainHistory:
    name: str
    in_job_restarts: int
    hand_offs: int  # generations a failure ended
    training_node_days: float
    task0_node_days: float
    save_s: float | None
    # Means, not medians: the ETTR is an expectation, and a few slow restarts count. Each
    # is from the failed cycle's last progress to training again, detection included, by
    # what the interruption led to (the account cannot tell its cause).
    restart_s: float | None  # an in-job restart on the same nodes
    restarts_measured: int
    replaced_s: float | None  # an in-job restart with a spare in a node's place
    replaced_measured: int
    hand_off_s: float | None  # a generation a failure ended -> its successor trains
    hand_offs_measured: int
    first_start_s: float | None  # the first generation's start -> its training start
    step_s: float | None
    nodes: int
    goodput: float | None  # what `report` measured: productive over the allocation
    wall_days: float

    def per_thousand(self, count: int, node_days: float) -> float:
        return count * 1000.0 / node_days if node_days > 0 else 0.0

    @property
    def rank_crash(self) -> float:
        return self.per_thousand(self.in_job_restarts, self.training_node_days)

    @property
    def task0_loss(self) -> float:
        return self.per_thousand(self.hand_offs, self.task0_node_days)

    @property
    def source(self) -> str:
        return (
            f"chain {self.name}'s history: {self.in_job_restarts} in-job restart(s) (counted "
            f"as rank crashes) in {self.training_node_days * 24:.3g} training node-hours, "
            f"{self.hand_offs} generation(s) ended by a failure"
        )


def _mean(costs: list[float]) -> float | None:
    return statistics.fmean(costs) if costs else None


def _first_start(account: Account) -> float | None:
    first = account.generations[0] if account.generations else None
    if first is None or first.training_started is None:
        return None
    return max(0.0, first.training_started - first.start)


def read(account: Account, nodes_per_task: int) -> ChainHistory:
    """The counts and costs of a chain, from its account."""
    found = interval.interruptions(account)
    count = len(found)

    def costs(outcome: str) -> list[float]:
        return [i.cost_s for i in found if i.outcome == outcome and i.cost_s is not None]

    # A hand-off is a generation a failure ended and a successor took over from; the
    # last generation's end is the chain's (a cancel reads as a failed task 0's exit).
    ended = [g.interrupted for g in account.generations]
    hand_offs = sum(ended[:-1])
    count -= sum(ended[-1:])
    trained = (account.allocation_node_s or 0.0) - account.categories.get(IDLE_SPARES, 0.0)
    saves = [s.ended - s.began for w in account.work for s in w.saves if s.ended >= s.began]
    rec = interval.recommend(account)
    return ChainHistory(
        name=account.job_name,
        in_job_restarts=count - hand_offs,
        hand_offs=hand_offs,
        training_node_days=max(0.0, trained) / 86400.0,
        task0_node_days=account.wall_s * nodes_per_task / 86400.0,
        save_s=statistics.fmean(saves) if saves else None,
        restart_s=_mean(costs(interval.IN_PLACE)),
        restarts_measured=len(costs(interval.IN_PLACE)),
        replaced_s=_mean(costs(interval.REPLACED)),
        replaced_measured=len(costs(interval.REPLACED)),
        hand_off_s=_mean(costs(interval.HAND_OFF)),
        hand_offs_measured=len(costs(interval.HAND_OFF)),
        first_start_s=_first_start(account),
        step_s=account.step_s,
        nodes=rec.nodes,
        goodput=account.goodput_ratio,
        wall_days=account.wall_s / 86400.0,
    )
