"""Failure rates per class, and where the defaults come from. Pure.

A rate is interruptions per 1,000 node-days of the nodes that train. The defaults are
Llama 3's pre-training snapshot (Meta, "The Llama 3 Herd of Models", arXiv 2407.21783,
section 3.3.4, Table 5: the root causes of 419 unexpected interruptions in 54 days on
16,384 H100 GPUs, 8 to a server: 2,048 nodes, 110,592 node-days). Each cause is put in
the class of how it shows itself to a running job, which decides what finds it and what
recovers it here (CAUSES; docs/plan.md has the table and the reasons).
"""

from __future__ import annotations

from dataclasses import dataclass

LLAMA3_NODES = 16_384 // 8
LLAMA3_DAYS = 54
LLAMA3_NODE_DAYS = LLAMA3_NODES * LLAMA3_DAYS
LLAMA3_GPUS_PER_NODE = 8
# The 47 planned interruptions (automated maintenance) of the same 54 days.
LLAMA3_PLANNED = 466 - 419
SOURCE = "Llama 3 (arXiv 2407.21783, Table 5): 419 interruptions in 54 days on 2,048 nodes"

# The classes, by how an interruption shows itself:
# - a silent node death: the host, or its link, is gone; its peers hear nothing, so the
#   appliance finds it when the node's liveness beats stop (--node-silence-timeout), or
#   by task 0's lease where it is task 0's node. The node leaves; a spare takes its place.
NODE_DEATH = "node_death"
# - a GPU fault: the GPU errs (a CUDA error, an Xid) while its host lives: the rank
#   crashes and NVRx sees it within its monitor loop; the node then fails NVRx's GPU
#   health check at the next rendezvous and leaves, as a dead one does.
GPU_FAULT = "gpu_fault"
# - a rank crash: the software fails, the node is sound: an in-job restart in place.
RANK_CRASH = "rank_crash"
# - a hang: every rank waits until a timeout ends it (the chain's --step-timeout).
HANG = "hang"
RATE_FIELDS = (NODE_DEATH, GPU_FAULT, RANK_CRASH, HANG, "task0_loss")


@dataclass(frozen=True)
class Cause:
    """One row of Llama 3's Table 5, and the class it is put in here, with why."""

    component: str  # as the table names it
    category: str  # the table's own category
    count: int
    published_share: float  # the table's "% of interruptions" column, as printed
    shows_as: str  # a class above
    why: str


# Table 5's rows (read 2026-12-06 through a reproduction of the table, glennklockwood.com's
# component-reliability page, and datacenterdynamics.com's report of it; docs/plan.md).
# The table says what failed, not how each failure showed itself: the class is this
# project's reading of the component, said in `why`. Its percentage column is kept as
# printed: it does not follow the counts everywhere (docs/plan.md says where), and the
# counts are what the rates use.
CAUSES = (
    Cause("Faulty GPU", "GPU", 148, 30.1, GPU_FAULT,
          "a GPU error with the host up: the rank crashes (CUDA error, Xid)"),
    Cause("GPU HBM3 Memory", "GPU", 72, 17.2, GPU_FAULT,
          "an uncorrectable memory error on the GPU: the rank crashes, the host lives"),
    Cause("Software Bug", "Dependency", 54, 12.9, RANK_CRASH,
          "the program fails; the node is sound: a restart in place"),
    Cause("Network Switch/Cable", "Network", 35, 8.4, NODE_DEATH,
          "the node's link is gone: its peers hear nothing from it"),
    Cause("Host Maintenance", "Unplanned Maintenance", 32, 7.6, NODE_DEATH,
          "the host is taken away unplanned: the node is lost to the job"),
    Cause("GPU SRAM Memory", "GPU", 19, 4.5, GPU_FAULT,
          "an error in the GPU's on-chip memory: the rank crashes, the host lives"),
    Cause("GPU System Processor", "GPU", 17, 4.1, GPU_FAULT,
          "the GPU's own processor fails: the GPU errs, the host lives"),
    Cause("NIC", "Host", 7, 1.7, NODE_DEATH,
          "the node's network adapter fails: its peers hear nothing from it"),
    Cause("NCCL Watchdog Timeouts", "Unknown", 7, 1.7, HANG,
          "a collective waits until a timeout ends it: a hang"),
    Cause("Silent Data Corruption", "GPU", 6, 1.4, GPU_FAULT,
          "wrong numbers from a GPU, found by a check in the job that ends its ranks"),
    Cause("GPU Thermal Interface + Sensor", "GPU", 6, 1.4, GPU_FAULT,
          "the GPU overheats or misreads its heat and errs; the host lives"),
    Cause("SSD", "Host", 3, 0.7, NODE_DEATH, "the host's own disk fails: the host is lost"),
    Cause("Power Supply", "Host", 3, 0.7, NODE_DEATH, "the node loses power: it goes silent"),
    Cause("Server Chassis", "Host", 2, 0.5, NODE_DEATH, "the server fails: it goes silent"),
    Cause("IO Expansion Board", "Host", 2, 0.5, NODE_DEATH,
          "the server's IO fails: it goes silent"),
    Cause("Dependency", "Dependency", 2, 0.5, RANK_CRASH,
          "a service the program needs fails; the node is sound: a restart in place"),
    Cause("CPU", "Host", 2, 0.5, NODE_DEATH, "the host's processor fails: the host goes down"),
    Cause("System Memory", "Host", 2, 0.5, NODE_DEATH,
          "the host's memory fails: the host goes down"),
)  # fmt: skip
LLAMA3_UNEXPECTED = sum(c.count for c in CAUSES)  # 419


def llama3_count(shows_as: str) -> int:
    return sum(c.count for c in CAUSES if c.shows_as == shows_as)


def per_thousand_node_days(count: int) -> float:
    return count * 1000.0 / LLAMA3_NODE_DAYS


@dataclass(frozen=True)
class Rates:
    """Per 1,000 node-days of the training nodes; `unloadable` is the fraction of
    checkpoint loads that fail (a checkpoint written but unreadable)."""

    node_death: float = per_thousand_node_days(llama3_count(NODE_DEATH))
    # Per 1,000 node-days of nodes of `gpus_per_node` GPUs: a GPU's own fault comes per
    # GPU, so a node of 4 GPUs sees half as many as one of 8.
    gpu_fault: float = per_thousand_node_days(llama3_count(GPU_FAULT))
    rank_crash: float = per_thousand_node_days(llama3_count(RANK_CRASH))
    hang: float = per_thousand_node_days(llama3_count(HANG))
    # Losses of task 0 beyond the node deaths and GPU faults that strike its nodes (those
    # are drawn already): a health check that fails only on task 0, say.
    task0_loss: float = 0.0
    # No publication gives it; the appliance's fall-back exists because it happens.
    unloadable: float = 0.0
    source: str = SOURCE
    # The GPUs per node gpu_fault was counted on (None: per node of the planned shape, as
    # given, nothing rescaled).
    gpus_per_node: int | None = LLAMA3_GPUS_PER_NODE
    # Rates a chain counted: (class, interruptions, node-days), so the plan gives each as a
    # range (a Poisson interval), not a point from a handful of events.
    counted: tuple[tuple[str, int, float], ...] = ()

    def gpu_fault_at(self, gpus_per_node: int) -> float:
        """GPU faults per 1,000 node-days of nodes of `gpus_per_node` GPUs."""
        if self.gpus_per_node is None:
            return self.gpu_fault
        return self.gpu_fault * gpus_per_node / self.gpus_per_node

    def gpu_faults_per_thousand_gpu_days(self) -> float | None:
        """A GPU's own faults per 1,000 GPU-days; None where given per node."""
        if self.gpus_per_node is None:
            return None
        return self.gpu_fault / self.gpus_per_node

    def interrupting(self) -> float:
        """The rate of everything that stops training at random, per 1,000 node-days."""
        return self.node_death + self.gpu_fault + self.rank_crash + self.hang + self.task0_loss


def from_total(total: float) -> Rates:
    """A total rate, all causes (per 1,000 node-days, as arXiv 2410.21680 states a
    cluster's), split among the classes in Llama 3's proportions."""
    share = total / LLAMA3_UNEXPECTED
    return Rates(
        node_death=llama3_count(NODE_DEATH) * share,
        gpu_fault=llama3_count(GPU_FAULT) * share,
        rank_crash=llama3_count(RANK_CRASH) * share,
        hang=llama3_count(HANG) * share,
        gpus_per_node=None,  # a total given is per node of the planned shape
        source=f"given as a total, {total:g} per 1,000 node-days of every cause "
        f"(--total-rate), split as Llama 3's {PROPORTIONS}",
    )


PROPORTIONS = (
    f"{llama3_count(NODE_DEATH)} node deaths : {llama3_count(GPU_FAULT)} GPU faults : "
    f"{llama3_count(RANK_CRASH)} rank crashes : {llama3_count(HANG)} hangs"
)
