"""Failure rates per class, and where the defaults come from. Pure.

A rate is interruptions per 1,000 node-days of the nodes that train. The defaults are
Llama 3's pre-training snapshot (Meta, "The Llama 3 Herd of Models", arXiv 2407.21783,
section 3.3.4 and its table of root causes): 419 unexpected interruptions in 54 days on
16,384 H100 GPUs, 8 to a server (2,048 nodes, 110,592 node-days). Each root cause of
that table is put in the class whose recovery it needs here (docs/plan.md lists them).
"""

from __future__ import annotations

from dataclasses import dataclass

LLAMA3_NODES = 16_384 // 8
LLAMA3_DAYS = 54
LLAMA3_NODE_DAYS = LLAMA3_NODES * LLAMA3_DAYS
# The 419 unexpected interruptions of the table, by the recovery each one needs.
# A hang: NCCL watchdog timeouts (7): every rank waits until a timeout ends it.
LLAMA3_HANGS = 7
# A rank's crash on a node that stays usable: software bugs (54) and dependencies (2).
LLAMA3_RANK_CRASHES = 54 + 2
# The rest takes a node out of the job: GPU, HBM3, SRAM, GPU system processor, silent
# data corruption, thermal, network switch and cable, NIC, host hardware and unplanned
# host maintenance (356).
LLAMA3_NODE_DEATHS = 419 - LLAMA3_HANGS - LLAMA3_RANK_CRASHES
# Of the node deaths, the GPU's own (faulty GPU 148, HBM3 72, SRAM 19, GPU system
# processor 17, silent data corruption 6, thermal interface and sensor 6: 268, 64% of the
# 419): they come per GPU, so a node of 4 GPUs sees half as many of them as one of 8.
LLAMA3_GPU_DEATHS = 148 + 72 + 19 + 17 + 6 + 6
LLAMA3_GPUS_PER_NODE = 8
# The 47 planned interruptions (automated maintenance) of the same 54 days.
LLAMA3_PLANNED = 466 - 419
SOURCE = "Llama 3 (arXiv 2407.21783): 419 unexpected interruptions in 54 days on 2,048 nodes"


def per_thousand_node_days(count: int) -> float:
    return count * 1000.0 / LLAMA3_NODE_DAYS


@dataclass(frozen=True)
class Rates:
    """Per 1,000 node-days of the training nodes; `unloadable` is the fraction of
    checkpoint loads that fail (a checkpoint written but unreadable)."""

    node_death: float = per_thousand_node_days(LLAMA3_NODE_DEATHS)
    rank_crash: float = per_thousand_node_days(LLAMA3_RANK_CRASHES)
    hang: float = per_thousand_node_days(LLAMA3_HANGS)
    # Losses of task 0 beyond the node deaths that strike its nodes (those are drawn
    # from node_death already): a health check that fails only on task 0, say.
    task0_loss: float = 0.0
    # No publication gives it; the appliance's fall-back exists because it happens.
    unloadable: float = 0.0
    source: str = SOURCE
    # The share of node_death that is the GPU's own, on nodes of `gpus_per_node` GPUs:
    # that share scales with a planned node's GPUs (0: node_death is per node, as given).
    gpu_share: float = LLAMA3_GPU_DEATHS / LLAMA3_NODE_DEATHS
    gpus_per_node: int = LLAMA3_GPUS_PER_NODE
    # Rates a chain counted: (class, interruptions, node-days), so the plan gives each as a
    # range (a Poisson interval), not a point from a handful of events.
    counted: tuple[tuple[str, int, float], ...] = ()

    def node_death_at(self, gpus_per_node: int) -> float:
        """Node deaths per 1,000 node-days of nodes of `gpus_per_node` GPUs."""
        scale = gpus_per_node / self.gpus_per_node
        return self.node_death * (1 - self.gpu_share + self.gpu_share * scale)

    def gpu_deaths_per_thousand_gpu_days(self) -> float | None:
        """The GPU's own deaths per 1,000 GPU-days; None where not known apart."""
        if not self.gpu_share:
            return None
        return self.node_death * self.gpu_share / self.gpus_per_node

    def interrupting(self) -> float:
        """The rate of everything that stops training at random, per 1,000 node-days."""
        return self.node_death + self.rank_crash + self.hang + self.task0_loss


RATE_FIELDS = ("node_death", "rank_crash", "hang", "task0_loss")


def from_total(total: float) -> Rates:
    """A total rate, all causes (per 1,000 node-days, as arXiv 2410.21680 states a
    cluster's), split among the classes in Llama 3's proportions (356 : 56 : 7)."""
    share = total / (LLAMA3_NODE_DEATHS + LLAMA3_RANK_CRASHES + LLAMA3_HANGS)
    return Rates(
        node_death=LLAMA3_NODE_DEATHS * share,
        rank_crash=LLAMA3_RANK_CRASHES * share,
        hang=LLAMA3_HANGS * share,
        gpu_share=0.0,  # a total given is per node of the planned shape
        source=f"given as a total, {total:g} per 1,000 node-days of every cause "
        "(--total-rate), split as Llama 3's 356 node deaths : 56 rank crashes : 7 hangs",
    )
