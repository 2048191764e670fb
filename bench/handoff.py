"""2. Hand-off: task 0's node dies -> the next generation's first training step.

One chain of repeat+1 generations in train mode. For each sample: wait until the
generation trains and has written a checkpoint, crash task 0's node (kill-node: every
process in its namespace, link down, no trap), wait for the successor's first step
after its restore, revive the node. The timeline is read from Slurm, the control
directory, the cycle-info file, the checkpoint's access times and the progress log.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

from bench import chains, extract
from bench.extract import DETECTION, RESTORE, HandoffSeen
from bench.harness import Harness
from bench.report import Metric, Result, phase_metrics
from nvrx_appliance.layout import Layout

NAME = "handoff"
TITLE = "2 hand-off"
TARGET_OVERHEAD_S = 3.0  # beyond the floor and the workload's own restore (issue 7)
HANDOFF_TIMEOUT_S = 600  # the seeds' design waits out store_connect_wait (300 s) here


# The lease the benchmarks run with (chains.FAST): a dead task 0 is fenced about this
# long after its death.
LEASE_S = float(chains.FAST[chains.FAST.index("--lease-stale-after") + 1])
# Target (issue 11): death -> successor's first step within the lease, the floor and 6 s.
TARGET_BEYOND_LEASE_AND_FLOOR_S = 6.0


@contextlib.contextmanager
def node_death(h: Harness, gen: str, victim: str) -> Iterator[float]:
    """Crash task 0's node (kill-node: every process in its namespace, link down, no
    trap); revive it once the successor has been measured."""
    try:
        yield h.kill_node(victim)
    finally:
        h.revive_node(victim)


def one(h: Harness, work, gen: str, successor: str, fault=node_death) -> dict:
    layout = Layout(work)
    started = h.wait_checkpointed(work, f"generation {gen}", slurm_array_job_id=gen)
    # Rank 0 trains on task 0's node, whose host name is its Slurm node name; the
    # progress log has it at once, where accounting may still lag.
    victim = started["host"]
    with fault(h, gen, victim) as killed_at:
        resumed, step = h.wait_resumed(
            work, f"generation {successor}", HANDOFF_TIMEOUT_S, slurm_array_job_id=successor
        )
    seen = HandoffSeen(
        killed_at=killed_at,
        victim=victim,
        generation=h.wait_final([gen], 120),
        successor=h.wait_started(successor),
        record_written=h.mtime(layout.control_files(successor).record),
        cycle0=h.cycle(work, successor, 0),
        checkpoint=h.restored(work, resumed),
        resumed=resumed,
        first_step=step,
        first_cold=chains.TRAIN_TASKS + chains.HOT_SPARES,
        nvrx=h.nvrx_events_with(work, successor, [("rendezvous_started", 0, resumed["host"])]),
        dead_closed=h.mtime(layout.control_files(gen).closed),
    )
    return extract.handoff_sample(seen)


def collect(h: Harness, repeat: int, result: Result) -> None:
    run(h, repeat, result, NAME)


def run(h: Harness, repeat: int, result: Result, scenario: str, *flags: str, fault=node_death):
    """One chain of repeat+1 generations; each sample is one generation's task 0 lost
    (`fault`) and its successor's first step. `flags` come after the quick settings."""
    work, name = h.workdir(scenario), h.job_name(scenario)
    ids = h.submit(work, name, *chains.FAST, *chains.SHAPE, "--mode", "train",
                   "--depth", str(repeat + 1), *flags)  # fmt: skip
    result.notes.append(f"generations: {', '.join(ids)}")
    try:
        for gen, successor in itertools.pairwise(ids):
            try:
                result.samples.append(one(h, work, gen, successor, fault))
            except extract.Incomplete as exc:
                result.notes.append(f"sample {gen} -> {successor} dropped: {exc}")
            h.say(f"{scenario}: {len(result.samples)}/{repeat} samples")
    finally:
        h.drain(name)


def target(floor: float | None) -> float | None:
    return None if floor is None else LEASE_S + floor + TARGET_BEYOND_LEASE_AND_FLOOR_S


def finish(result: Result, floor: float | None) -> None:
    samples = result.samples
    result.metrics = metrics(samples, floor, "node death", target(floor))
    last = [s["ended_last"] for s in samples]
    trapped = sum(s["dead_generation_closed_s"] is not None for s in samples)
    result.notes.append(
        f"samples where the dead task 0's trap still wrote the closed flag: {trapped} "
        "(kill-node let its batch script outlive its srun)"
    )
    result.notes.append(
        "what ended the dead generation last: "
        + ", ".join(f"{k} x{last.count(k)}" for k in sorted(set(last)))
    )


def metrics(
    samples: list[dict], floor: float | None, fault: str, target_s: float | None
) -> list[Metric]:
    totals = [s["total_s"] for s in samples]
    out = [Metric(f"{fault} -> successor's first step", totals, target_s=target_s)]
    out += phase_metrics(samples)
    # Not phases: they overlap inside detection + teardown, and the later one ends it.
    for key, label in (
        ("kill_to_task0_end_s", "within detection: task 0's job ends (fence or Slurm)"),
        ("kill_to_peers_end_s", "within detection: the peers' jobs end"),
    ):
        values = [s[key] for s in samples if s.get(key) is not None]
        out.append(Metric(label, values, indent=True))
    spares = [held for s in samples for held in s["cold_spares_held_s"]]
    out.append(Metric("cold spare admitted after task 0 died: admitted -> its job ended", spares))
    if floor is not None:
        overhead = [s["total_s"] - s["phases"][RESTORE] - floor for s in samples]
        out.append(
            Metric("overhead beyond floor and restore", overhead, target_s=TARGET_OVERHEAD_S)
        )
        # Slurm alone can end a job on a dead node (SlurmdTimeout): what is left is ours.
        ours = [o - s["phases"][DETECTION] for o, s in zip(overhead, samples, strict=True)]
        out.append(Metric("of which not Slurm's node-failure detection", ours, indent=True))
    return out
