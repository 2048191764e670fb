"""What each step of a recovery costs at a run's size, where each figure comes from, and
how it grows with the node count. Pure.

The figures are the committed benchmark results (docs/benchmarks.md: the recovery table
of the run of 2026-12-03, and "As the run grows", 4, 8 and 16 nodes) or a chain's own
history. Each step has a growth rule, said where it is used:

- NVRx's fixed waits (stop the surviving workers, the one-second poll for the next
  round) are constants in NVRx's code: flat at any size. In segment mode the store host
  checks the segment constraint at most every max(1 s, nodes / 2000 s) (NVRx's
  ft_rendezvous_barrier.py, as docs/benchmarks.md reads it): that rule, not a fit.
- Process start (interpreter, torch, the process group, the model) grows with the ranks
  that start at once on one node's cores, not with the node count: on the local
  cluster 2, 6 and 14 ranks shared two cores (0.75, 0.91, 1.26 s per rank). A GPU node
  starts its own ranks on its own cores, so the one-node figure is held at any size.
- Slurm's part (the scheduler's floor, the start of a generation's tasks) is held at
  the measured figure; a large or busy controller adds what --queue-wait says.
- Detection and the appliance's dying path grew 1.6x and 1.2x per doubling here, with
  the two cores 35% to 85% busy; they are held at the 4-node figure.

Nothing is extrapolated silently: a figure used beyond the 16 nodes measured says so
(`Step.extrapolated`), and from what.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from nvrx_appliance.plan import profiles
from nvrx_appliance.settings.chain import ChainSpec

BENCH = "docs/benchmarks.md, run of 2026-12-03"
MEASURED_NODES = 16  # the largest size the growth table measured

# A silent death of a node that is not task 0's, found by the appliance itself: every node
# beats to task 0 once a second, and one silent for --node-silence-timeout leaves the cycle
# (issue 52). Measured on the local cluster at that setting's default: bench row 15
# (silentdeath), the death -> NVRx's failure detected on task 0's launcher, median of five,
# run of 2026-12-06 (11.01-12.03 s; the bound is 12.5 s).
SILENT_DEATH_DETECTED_S = 11.12
SILENT_DEATH_SOURCE = (
    "docs/benchmarks.md, row silentdeath (15) of 2026-12-06: a training node that is not "
    "task 0's goes silent -> NVRx's failure detected, at --node-silence-timeout 10"
)
_SUBMIT = ChainSpec()  # submit's defaults: what a chain runs with unless told otherwise
DEFAULT_NODE_SILENCE_S = float(_SUBMIT.node_silence_timeout)
DEFAULT_STEP_TIMEOUT_S = float(_SUBMIT.step_timeout)


@dataclass(frozen=True)
class Step:
    """One step of a recovery at the planned size."""

    seconds: float
    source: str
    growth: str
    extrapolated: str = ""  # why a figure measured at <= 16 nodes is used beyond them
    # What the figure rests on: measured (here), setting (a timeout the chain sets),
    # published, assumed (no published figure found), given (--cost and the like), chain
    # (a chain's own history), or size / rate (the checkpoint at the storage's rate).
    basis: str = "measured"


@dataclass(frozen=True)
class Shape:
    nodes: int  # nodes that train
    gpus_per_node: int = 8
    nodes_per_task: int = 1
    segment: int = 0  # 0: not segment mode; else the NVLink domain's nodes

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def tasks(self) -> int:
        return math.ceil(self.nodes / self.nodes_per_task)


# name: (seconds, source, growth) as measured; docs/benchmarks.md has each row.
MEASURED = {
    "detect_crash": (
        1.04,
        f"{BENCH}, growth table: detection at 4 nodes",
        "flat: NVRx's monitor loop; 1.0-2.8 s over 4-16 nodes on ever busier cores",
    ),
    "detect_node_death": (
        SILENT_DEATH_DETECTED_S,
        SILENT_DEATH_SOURCE,
        "flat: the appliance's own timeout; moves with --node-silence-timeout",
    ),
    "detect_hang": (
        DEFAULT_STEP_TIMEOUT_S,
        "the chain's --step-timeout (the appliance's default; NVRx sets no step timeout "
        "of its own)",
        "flat: a timeout",
    ),
    "nvrx_waits": (
        2.32,
        f"{BENCH}, growth table: stop the workers + next round + rendezvous at 4 nodes",
        "flat: NVRx's constants (2.3-3.0 s over 4-16 nodes)",
    ),
    "worker_start": (
        2.57,
        f"{BENCH}, row 5: spawn, import torch, process group, model (CPU trainer)",
        "grows with ranks per node, not nodes: held at the one-node figure",
    ),
    "dying_path": (
        4.32,
        f"{BENCH}, row 2d: NVRx's decision -> the generation's last task ends",
        "flat: NVRx's 3 s store-host wait and the teardown (5.6-8.3 s over 4-16 nodes, busy cores)",
    ),
    "scheduler": (
        0.535,
        f"{BENCH}, row 1: the scheduler floor",
        "flat: Slurm's part; a busy controller adds --queue-wait",
    ),
    "start_gate": (
        3.22,
        f"{BENCH}, growth table: task 0 starts -> the round closes, 4 nodes",
        "grows with process start per node: held at the 4-node figure",
    ),
    "time_limit_end": (
        5.57,
        f"{BENCH}, row 8: the appliance's last step -> its last task ended",
        "flat: ft_launcher's clean shutdown",
    ),
    "store_wait": (
        300.0,
        "NVRx's store_connect_wait in the seeds' deployment (bench/seeds.py; row 2c: 304.7 s)",
        "flat: a timeout",
    ),
}
STEPS = tuple(MEASURED)
# The steps that are timeouts a chain sets, not measurements.
SETTINGS = ("detect_hang", "store_wait")


@dataclass(frozen=True)
class Checkpoint:
    """The checkpoint a save writes and a load reads, and which figure was given."""

    gb: float
    gb_given: bool
    storage_gbps: float
    storage_given: bool
    save_given: bool  # --save-seconds (an async save's staging copy, say), not size / rate
    load_given: bool  # --load-seconds (a local or in-memory restore, say)


@dataclass(frozen=True)
class Costs:
    """Every step a recovery is made of, at one shape, plus the checkpoint's save and
    load and the settings that act as costs (the lease, the queue wait)."""

    steps: dict[str, Step]
    save: Step
    load: Step
    queue_wait: float = 0.0
    # An async save blocks only for its staging copy; the whole write follows, and the
    # segment is durable only once it ends (None: the save is the whole write).
    write_behind: Step | None = None
    # A chain's own mean interruption costs, detection to training again, used whole in
    # place of the steps (the account does not split them): an in-job restart on the
    # same nodes, one with a spare in a node's place, a hand-off to the next generation.
    restart_whole: Step | None = None
    replaced_whole: Step | None = None
    hand_off_whole: Step | None = None
    first_start_whole: Step | None = None  # the run's first start-up, to training
    checkpoint: Checkpoint | None = None
    profile: str = profiles.LOCAL
    node_silence_s: float = DEFAULT_NODE_SILENCE_S  # behind detect_node_death

    def s(self, name: str) -> float:
        return self.steps[name].seconds


def _segment_poll(shape: Shape) -> float:
    """Seconds NVRx's segment-mode round close adds beyond the 1 s the 4-16 node
    figures hold: it checks at most every max(1 s, nodes / 2000 s)."""
    return max(0.0, shape.nodes / 2000.0 - 1.0) if shape.segment else 0.0


def measured(
    shape: Shape,
    *,
    checkpoint_gb: float,
    storage_gbps: float,
    save_s: float | None = None,
    load_s: float | None = None,
    overrides: dict[str, float] | None = None,
    queue_wait: float = 0.0,
    profile: str = profiles.LOCAL,
    save_source: str = "given (--save-seconds)",
    step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
    node_silence_s: float = DEFAULT_NODE_SILENCE_S,
) -> Costs:
    """The committed figures at this shape; `overrides` (a person's own figures or a
    chain's) replace a step and say so. The two detections follow the chain's settings:
    a hang costs its --step-timeout, a silent death what was measured at the default
    --node-silence-timeout, moved by the difference."""
    beyond = shape.nodes > MEASURED_NODES
    steps = {}
    for name, (seconds, source, growth) in MEASURED.items():
        note = f"measured at 4-{MEASURED_NODES} nodes, held at {shape.nodes:,}" if beyond else ""
        if "timeout" in growth or "NVRx's constants" in growth:
            note = ""  # a setting or a constant in code: no sample to extrapolate
        basis = "setting" if name in SETTINGS else "measured"
        steps[name] = Step(seconds, source, growth, note, basis)
    if step_timeout_s != DEFAULT_STEP_TIMEOUT_S:
        steps["detect_hang"] = replace(
            steps["detect_hang"], seconds=step_timeout_s, source="the chain's --step-timeout"
        )
    if node_silence_s != DEFAULT_NODE_SILENCE_S:
        death = steps["detect_node_death"]
        steps["detect_node_death"] = replace(
            death,
            seconds=death.seconds + node_silence_s - DEFAULT_NODE_SILENCE_S,
            source=f"{death.source}, moved to --node-silence-timeout {node_silence_s:g}",
        )
    poll = _segment_poll(shape)
    if poll:
        wait = steps["nvrx_waits"]
        steps["nvrx_waits"] = replace(
            wait,
            seconds=wait.seconds + poll,
            growth=wait.growth + f"; + {poll:.1f} s segment poll (nodes / 2000, NVRx's rule)",
        )
    for name, figure in profiles.figures(profile).items():
        basis = "published" if figure.published else "assumed"
        steps[name] = Step(
            figure.seconds, f"{profile} profile: {figure.source}", "as the profile", basis=basis
        )
    for name, seconds in (overrides or {}).items():
        steps[name] = Step(seconds, "given", "as given", basis="given")
    transfer = Step(
        checkpoint_gb / storage_gbps,
        "the whole checkpoint at the storage's rate (size / rate)",
        "grows with the checkpoint",
        basis="size / rate",
    )
    chain = save_source.startswith("chain")
    save = transfer
    if save_s is not None:
        save = Step(save_s, save_source, "as given", basis="chain" if chain else "given")
    load = transfer
    if load_s is not None:
        load = Step(load_s, "given (--load-seconds)", "as given", basis="given")
    behind = None
    if save_s is not None and save_s < transfer.seconds:
        # A save that blocks less than the whole write is an async save's staging copy:
        # the write to storage follows it, from host memory, at the storage's rate.
        behind = replace(transfer, source="the whole write behind an async save (size / rate)")
    return Costs(
        steps,
        save,
        load,
        queue_wait,
        write_behind=behind,
        profile=profile,
        node_silence_s=node_silence_s,
    )


def write_behind_s(costs: Costs) -> float:
    return costs.write_behind.seconds if costs.write_behind else 0.0


def blocking_save_s(costs: Costs, tau: float) -> float:
    """What a save blocks when segments are `tau` long: its own block, and the rest of the
    last save's write when that write outlasts the segment (one write in flight at once)."""
    wait = write_behind_s(costs) - tau if math.isfinite(tau) else 0.0
    return costs.save.seconds + max(0.0, wait)


# --- what one recovery costs, split as `report` splits it -----------------------------------


def in_job_restart(costs: Costs, detect: str, replaced: bool = False) -> dict[str, float]:
    """A rank's crash, a hang or a node death with a spare at hand (`replaced`: a spare
    takes a node's place): NVRx restarts the workers inside the generation. Categories of
    goodput.account. A chain's own cost of the same outcome is used whole; its in-place
    cost stands in for a replacement it never measured, with the class's detection on
    top (a crash's detection is already in it)."""
    if replaced and costs.replaced_whole is not None:
        return {"in_job_restarts": costs.replaced_whole.seconds}
    if costs.restart_whole is not None:
        parts = {"in_job_restarts": costs.restart_whole.seconds}
    else:
        restart = costs.s("nvrx_waits") + costs.s("worker_start") + costs.load.seconds
        parts = {"in_job_restarts": restart}
    if detect == "detect_hang":
        parts["hangs_until_detected"] = costs.s(detect)
    elif costs.restart_whole is None or detect != "detect_crash":
        parts["in_job_restarts"] += costs.s(detect)
    return parts


def successor_start(costs: Costs) -> dict[str, float]:
    """The next generation, from Slurm's scheduler to its first step."""
    return {
        "hand_offs": costs.s("scheduler"),
        "queue_wait": costs.queue_wait,
        "start_up": costs.s("start_gate") + costs.s("worker_start") + costs.load.seconds,
    }


def _plus(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in {*a, *b}}


def hand_off(costs: Costs, detection: float, measured: bool = False) -> dict[str, float]:
    """The generation ends (task 0 lost, or no spare left): `detection` until it is known,
    the dying path, then the successor's start. `measured`: the chain's own hand-off
    cost, used whole (its detection is in it)."""
    if measured and costs.hand_off_whole is not None:
        return {"hand_offs": costs.hand_off_whole.seconds}
    return _plus({"hand_offs": detection + costs.s("dying_path")}, successor_start(costs))


def boundary_appliance(costs: Costs) -> dict[str, float]:
    """The time limit: the appliance saves first (an async save's write included: the
    generation ends once it is durable), ends cleanly, the successor starts."""
    last_save = costs.save.seconds + write_behind_s(costs)
    return _plus(
        {"checkpoint_saves": last_save, "hand_offs": costs.s("time_limit_end")},
        successor_start(costs),
    )


def boundary_seeds(costs: Costs) -> dict[str, float]:
    """The time limit in the seeds' design: Slurm kills the generation (what trained
    since the last save is lost: the simulation counts it), the successor starts."""
    return successor_start(costs)
