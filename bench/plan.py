"""11. The plan against this machine: a chain on the local cluster with rank crashes
injected at random times the harness knows, its goodput as `report` measures it, and
what `plan --from-chain` predicts for the same shape, wall time and settings from that
chain's own rates and costs (docs/plan.md, "Checked against this machine").

One chain per sample (`--repeat`): one generation of one training task (two ranks), a
hot and a cold spare, steps paced at 0.1 s and a save every 50 iterations (5 s of
training). Crashes come as a Poisson process, a SIGKILL of rank 1's training process
MEAN_GAP_S apart on average (seeded, so a run is repeatable), CRASHES of them; then the
chain is cancelled and read. The plan is asked at the chain's today's settings, and its
goodput of the allocation (the hot spare's node counts, as report counts it) is held
against report's. Tolerance: TOLERANCE points; a sample outside it is a MISS, with both
breakdowns in the notes.
"""

from __future__ import annotations

import json
import random
import time

from bench import chains
from bench.harness import BenchError, Harness
from bench.report import Metric, Result
from nvrx_appliance.layout import Layout

NAME = "plan"
TITLE = "11 plan against a chain"
CRASHES = 12
MEAN_GAP_S = 20.0
STEP_PAUSE_S = 0.1
SAVE_INTERVAL = 50
TOLERANCE = 0.05  # of goodput, absolute: what a 12-crash chain's own spread allows
RANK = 1
UNIT = "share"


def _crash_chain(h: Harness, seed: int) -> tuple[str, int]:
    """Run one chain through CRASHES crashes; its work dir and the crashes that landed."""
    work, name = h.workdir(NAME), h.job_name(NAME)
    flags = [*chains.FAST, *chains.SHAPE]
    at = flags.index("--time")
    flags[at + 1] = "00:30:00"
    at = flags.index("--save-interval")
    flags[at + 1] = str(SAVE_INTERVAL)
    h.submit(work, name, *flags, "--mode", "train", "--depth", "1",
             "--max-restarts", str(CRASHES + 5), "--cpu-step-pause", str(STEP_PAUSE_S))  # fmt: skip
    rng, landed = random.Random(seed), 0
    run_json = Layout(work).run_json
    try:
        h.wait_checkpointed(work, "the first cycle")
        for _ in range(CRASHES):
            time.sleep(rng.expovariate(1.0 / MEAN_GAP_S))  # the injection's own clock
            pid = h.wait(lambda: h.worker_pid(run_json, RANK), 120, f"rank {RANK}'s process")
            h.kill_process(pid)
            landed += 1
            h.say(f"plan: crash {landed}/{CRASHES}")
        time.sleep(rng.expovariate(1.0 / MEAN_GAP_S))
    finally:
        h.drain(name)
    return str(work), landed


def _json(h: Harness, *args: str) -> dict:
    """A command's --json answer, run as a person runs it (the cluster's SLURM_CONF)."""
    done = h.appliance(*args, "--json")
    if done.returncode != 0:
        raise BenchError(f"nvrx-appliance {args[0]} exited {done.returncode}: {done.stderr}")
    return json.loads(done.stdout)


def one(h: Harness, seed: int) -> dict:
    work, landed = _crash_chain(h, seed)
    report = _json(h, "report", "--work-dir", work)
    step_s = report["step_seconds"] or STEP_PAUSE_S
    plan = _json(
        h, "plan", "--work-dir", work,
        "--nodes", str(chains.TRAIN_TASKS), "--gpus-per-node", str(chains.WORKERS_PER_NODE),
        "--days", repr(report["wall_seconds"] / 86400.0), "--time", "00:30:00",
        "--save-minutes", repr(SAVE_INTERVAL * step_s / 60.0),
        "--hot-spares", str(chains.HOT_SPARES), "--cold-spares", str(chains.COLD_SPARES),
        "--lease-stale-after", "10", "--depth", "1", "--seeds", "50",
    )  # fmt: skip
    # Goodput of the allocation at today's settings: the hot spare's node trains never.
    nodes = chains.TRAIN_TASKS
    predicted = plan["appliance_today"]["ettr"] * nodes / (nodes + chains.HOT_SPARES)
    measured = report["goodput_ratio"] or 0.0
    return {
        "crashes": landed,
        "wall_s": report["wall_seconds"],
        "measured": measured,
        "predicted": predicted,
        "difference": predicted - measured,
        "miss": abs(predicted - measured),
        "measured_breakdown": {c["name"]: c["share"] for c in report["categories"]},
        "predicted_breakdown": plan["appliance_today"]["breakdown"],
        "rank_crash_per_1000_node_days": plan["rates_per_1000_node_days"]["rank_crash"],
        "restart_s": (plan["costs"]["in_job_restart_whole"] or {}).get("seconds"),
        "save_s": plan["costs"]["save"]["seconds"],
    }


def collect(h: Harness, repeat: int, result: Result) -> None:
    for seed in range(repeat):
        sample = one(h, seed)
        result.samples.append(sample)
        verdict = "within" if abs(sample["difference"]) <= TOLERANCE else "MISS: outside"
        result.notes.append(
            f"seed {seed}: {sample['crashes']} crashes in {sample['wall_s']:.0f} s; report "
            f"{sample['measured']:.3f}, plan {sample['predicted']:.3f} ({verdict} "
            f"{TOLERANCE:.2f}); restart {sample['restart_s']}, save {sample['save_s']:.3f} s; "
            f"report {_shares(sample['measured_breakdown'])}; plan "
            f"{_shares(sample['predicted_breakdown'])}"
        )


def _shares(breakdown: dict) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in breakdown.items() if v and v >= 0.001)


def finish(result: Result, floor: float | None) -> None:
    samples = result.samples
    result.metrics = [
        Metric("report's goodput of the chain", [s["measured"] for s in samples], unit=UNIT),
        Metric("plan's prediction (--from-chain)", [s["predicted"] for s in samples],
               unit=UNIT),
        Metric("plan - report", [s["difference"] for s in samples], unit=UNIT),
        Metric("|plan - report|", [s["miss"] for s in samples], TOLERANCE, unit=UNIT),
    ]  # fmt: skip
