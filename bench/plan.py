"""11. The plan against this machine: a chain on the local cluster with failures of
three classes injected at seeded random times the harness knows (rank crashes, node
deaths, hangs), its goodput as `report` measures it, and what `plan` predicts for the
same shape, wall time and settings, given the injected rates and the chain's own
measured costs (`--from-chain`; docs/plan.md, "Checked against this machine").

One chain per sample (`--repeat`): two training tasks of two ranks, a hot and a cold
spare on the 4-node cluster, steps paced at 0.1 s, a save every 50 iterations (5 s of
training), the demo's timeouts (a 30 s step timeout: what a hang costs until NVRx sees
it), a deep chain (a task 0 lost or the spares run out: the next generation takes
over) and no node memory across generations (`--exclude-for 0`: the harness revives
what it killed, and a hang here is a one-off). FAILURES failures come as a Poisson
process MEAN_GAP_S apart on average, each of a class drawn by WEIGHTS and aimed at a node
drawn from those training at that moment, task 0's included (all seeded, so a sample is
repeatable):

- rank crash: SIGKILL of one training process on that node; NVRx restarts in place;
- node death: `cluster kill-node`; a spare takes its place (task 0's: the next
  generation), and the harness revives the node once training is back;
- hang: every training process on the node frozen (SIGSTOP) once, until training is
  back without it; the stacks name it, a spare takes its place (task 0's: a hand-off).

A failure waits for training to be back from the one before (a failure during a
recovery cannot be aimed at a training process). Then the chain is cancelled and read.
The plan is asked at the chain's own settings with the realised rates (each class's
count per 1,000 node-days of the two training nodes' held time) and the chain's own
costs; its ETTR is held against report's share of the training nodes' time that
trained (productive over the allocation less idle spares: a spare's node trains never,
in the plan as in report). Tolerance: TOLERANCE points; a sample outside is a MISS,
with both breakdowns in the notes.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path

from bench import chains
from bench.harness import BenchError, Harness
from bench.report import Metric, Result
from nvrx_appliance.devcluster import sick_node
from nvrx_appliance.devcluster.sick_node import Freezer
from nvrx_appliance.layout import Layout

NAME = "plan"
TITLE = "11 plan against a chain"
FAILURES = 16
MEAN_GAP_S = 25.0
WEIGHTS = {"rank_crash": 2, "node_death": 1, "hang": 1}
STEP_PAUSE_S = 0.1
SAVE_INTERVAL = 50
TRAIN_TASKS, WORKERS = 2, 2
DEPTH = 15
TOLERANCE = 0.05  # of ETTR, absolute: what one 16-failure chain's own spread allows
RECOVERY_TIMEOUT_S = 300.0  # a hang (30 s) and a hand-off on two busy cores, with room
UNIT = "share"
SHAPE = (
    "--train-tasks", str(TRAIN_TASKS), "--hot-spares", "1", "--cold-spares", "1",
    "--gpus-per-node", str(WORKERS),
)  # fmt: skip


def _flags() -> list[str]:
    flags = [*chains.FAST, *SHAPE]
    for name, value in (("--time", "00:30:00"), ("--save-interval", str(SAVE_INTERVAL))):
        flags[flags.index(name) + 1] = value
    return flags


def _training(h: Harness, work: Path) -> tuple[str, int] | None:
    """The (generation, cycle) training now: the newest step's."""
    for event in reversed(h.progress(work)):
        if event["event"] == "step":
            return str(event.get("slurm_array_job_id")), int(event.get("cycle", -1))
    return None


def _back(h: Harness, work: Path, hit: tuple[str, int], after: float) -> dict | None:
    """The first step of a later cycle or generation than `hit`, after the failure."""
    for event in h.progress(work):
        key = (str(event.get("slurm_array_job_id")), int(event.get("cycle", -1)))
        if event["event"] == "step" and event["time"] > after and key != hit:
            return event
    return None


def _nodes_training(work: Path, nodes: list[str]) -> list[str]:
    """The nodes that run a training process of this chain now."""
    return sorted(n for n in nodes if sick_node.workers(work, n))


def _task0_host(work: Path, generation: str) -> str:
    record = json.loads((Layout(work).control(generation) / "rdzv.json").read_text())
    return str(record["host"]).split(".", 1)[0]


def _inject(h: Harness, work: Path, kind: str, rng: random.Random) -> dict:
    """One failure of `kind` on a node training now: its class, node, moment, and
    whether the node was task 0's."""

    def aimed() -> tuple[str, list[int]] | None:
        nodes = _nodes_training(work, h.nodes)
        if len(nodes) < TRAIN_TASKS:
            return None
        node = rng.choice(nodes)
        pids = sick_node.workers(work, node)
        return (node, pids) if pids else None

    node, pids = h.wait(aimed, RECOVERY_TIMEOUT_S, "training on every node")
    hit = h.wait(lambda: _training(h, work), 60, "a step")
    task0 = node == _task0_host(work, hit[0])
    if kind == "rank_crash":
        at = h.kill_process(rng.choice(pids))
        h.wait(lambda: _back(h, work, hit, at), RECOVERY_TIMEOUT_S, "training after a crash")
    elif kind == "node_death":
        at = h.kill_node(node)
        try:
            h.wait(lambda: _back(h, work, hit, at), RECOVERY_TIMEOUT_S, "training after a death")
        finally:
            h.revive_node(node)
    else:
        with Freezer(work, {node}) as freezer:
            frozen = h.wait(freezer.first, 60, f"{node}'s workers frozen")
            at = frozen
            h.wait(lambda: _back(h, work, hit, at), RECOVERY_TIMEOUT_S, "training after a hang")
    return {"kind": kind, "node": node, "at": at, "task0": task0}


def _inject_chain(h: Harness, seed: int) -> dict:
    """Run one chain through FAILURES failures; what landed, where and when."""
    work, name = h.workdir(NAME), h.job_name(NAME)
    h.submit(work, name, *_flags(), "--mode", "train", "--depth", str(DEPTH),
             "--max-restarts", str(FAILURES + 5), "--cpu-step-pause", str(STEP_PAUSE_S),
             "--train-samples", "100000000", "--exclude-for", "0")  # fmt: skip
    rng = random.Random(seed)
    kinds, weights = list(WEIGHTS), list(WEIGHTS.values())
    landed: list[dict] = []
    try:
        h.wait_checkpointed(work, "the first cycle")
        last = time.time()
        for n in range(FAILURES):
            due = last + rng.expovariate(1.0 / MEAN_GAP_S)
            kind = rng.choices(kinds, weights)[0]
            time.sleep(max(0.0, due - time.time()))  # the injection's own clock
            landed.append(_inject(h, work, kind, rng))
            last = landed[-1]["at"]
            h.say(f"plan: {n + 1}/{FAILURES} {kind} on {landed[-1]['node']}")
        time.sleep(max(0.0, last + rng.expovariate(1.0 / MEAN_GAP_S) - time.time()))
    finally:
        h.drain(name)
    return {"work": str(work), "landed": landed}


def _json(h: Harness, *args: str) -> dict:
    """A command's --json answer, run as a person runs it (the cluster's SLURM_CONF)."""
    done = h.appliance(*args, "--json")
    if done.returncode != 0:
        raise BenchError(f"nvrx-appliance {args[0]} exited {done.returncode}: {done.stderr}")
    return json.loads(done.stdout)


def _rates(report: dict, landed: list[dict]) -> tuple[dict[str, float], float]:
    """Each class's realised rate per 1,000 node-days of the training nodes' held time,
    and that time in days (the allocation less its idle spares, per training node)."""
    idle = next(c["node_seconds"] for c in report["categories"] if c["name"] == "idle_spares")
    training_node_days = (report["allocation_node_seconds"] - idle) / 86400.0
    counts = Counter(f["kind"] for f in landed)
    rates = {k: counts[k] * 1000.0 / training_node_days for k in WEIGHTS}
    return rates, training_node_days / TRAIN_TASKS


def measured_ettr(report: dict) -> float:
    """What trained, over the training nodes' time: productive / (allocation - idle)."""
    idle = next(c["node_seconds"] for c in report["categories"] if c["name"] == "idle_spares")
    held = report["allocation_node_seconds"] - idle
    return report["productive_node_seconds"] / held if held else 0.0


def predict(h: Harness, work: str, landed: list[dict]) -> dict:
    """report's account of a finished chain and plan's prediction for it."""
    report = _json(h, "report", "--work-dir", work)
    rates, days = _rates(report, landed)
    step_s = report["step_seconds"] or STEP_PAUSE_S
    plan = _json(
        h, "plan", "--work-dir", work,
        "--nodes", str(TRAIN_TASKS), "--gpus-per-node", str(WORKERS),
        "--days", repr(days), "--time", "00:30:00",
        "--save-minutes", repr(SAVE_INTERVAL * step_s / 60.0),
        "--hot-spares", "1", "--cold-spares", "1", "--lease-stale-after", "10",
        "--depth", str(DEPTH), "--seeds", "100",
        *(a for k, v in rates.items() for a in (f"--{k.replace('_', '-')}", repr(v))),
    )  # fmt: skip
    measured, predicted = measured_ettr(report), plan["appliance_today"]["ettr"]
    counts = Counter(f["kind"] for f in landed)
    return {
        "work": work,
        "landed": landed,
        "failures": dict(counts),
        "on_task0": sum(f.get("task0", False) for f in landed),
        "generations": len(report["generations"]),
        "training_days": days,
        "measured": measured,
        "predicted": predicted,
        "difference": predicted - measured,
        "miss": abs(predicted - measured),
        "measured_breakdown": {
            c["name"]: c["node_seconds"] / (days * 86400.0 * TRAIN_TASKS)
            for c in report["categories"] if c["name"] != "idle_spares"
        },
        "predicted_breakdown": plan["appliance_today"]["breakdown"],
        "costs": {k: (v or {}).get("seconds") for k, v in plan["costs"].items()
                  if isinstance(v, dict)},
    }  # fmt: skip


def collect(h: Harness, repeat: int, result: Result) -> None:
    for seed in range(repeat):
        chain = _inject_chain(h, seed)
        h.say(f"{NAME}: chain {json.dumps(chain)}")  # kept in the log: a plan can be redone
        try:
            sample = predict(h, chain["work"], chain["landed"])
        except (BenchError, KeyError, StopIteration) as exc:
            result.notes.append(f"seed {seed}: no comparison ({exc}); chain {chain['work']}")
            continue
        result.samples.append(sample)
        verdict = "within" if abs(sample["difference"]) <= TOLERANCE else "MISS: outside"
        h.say(f"{NAME}: seed {seed}: report {sample['measured']:.3f}, plan "
              f"{sample['predicted']:.3f}")  # fmt: skip
        result.notes.append(
            f"seed {seed}: {sample['failures']} ({sample['on_task0']} on task 0's node) in "
            f"{sample['training_days'] * 86400:.0f} s, {sample['generations']} generations; "
            f"report {sample['measured']:.3f}, plan {sample['predicted']:.3f} ({verdict} "
            f"{TOLERANCE:.2f}); report {_shares(sample['measured_breakdown'])}; plan "
            f"{_shares(sample['predicted_breakdown'])}"
        )


def _shares(breakdown: dict) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in breakdown.items() if v and v >= 0.001)


def finish(result: Result, floor: float | None) -> None:
    samples = result.samples
    result.metrics = [
        Metric("report: trained share of the training nodes' time",
               [s["measured"] for s in samples], unit=UNIT),
        Metric("plan's prediction (injected rates, the chain's costs)",
               [s["predicted"] for s in samples], unit=UNIT),
        Metric("plan - report", [s["difference"] for s in samples], unit=UNIT),
        Metric("|plan - report|", [s["miss"] for s in samples], TOLERANCE, unit=UNIT),
    ]  # fmt: skip
