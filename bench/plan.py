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

import random
import time

from bench import chains
from bench.harness import Harness
from bench.report import Metric, Result
from nvrx_appliance import api
from nvrx_appliance.goodput.account import CATEGORIES
from nvrx_appliance.layout import Layout
from nvrx_appliance.plan.simulate import Settings

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


def one(h: Harness, seed: int) -> dict:
    work, landed = _crash_chain(h, seed)
    account = api.report(None, work_dir=work)
    step_s = account.step_s or STEP_PAUSE_S
    request = api.PlanRequest(
        nodes=chains.TRAIN_TASKS,
        gpus_per_node=chains.WORKERS_PER_NODE,
        days=account.wall_s / 86400.0,
        time_limit_s=1800.0,
        today=Settings(SAVE_INTERVAL * step_s, chains.HOT_SPARES, chains.COLD_SPARES, 10.0, 1),
        seeds=50,
    )
    plan = api.plan(request, work_dir=work)
    predicted = plan.allocation_goodput(plan.appliance_today, plan.today)
    measured = account.goodput_ratio or 0.0
    total = account.allocation_node_s or 1.0
    horizon = plan.scenario.horizon_s
    return {
        "crashes": landed,
        "wall_s": account.wall_s,
        "measured": measured,
        "predicted": predicted,
        "difference": predicted - measured,
        "miss": abs(predicted - measured),
        "measured_breakdown": {k: account.categories[k] / total for k in CATEGORIES},
        "predicted_breakdown": {k: v / horizon for k, v in plan.appliance_today.seconds.items()},
        "rank_crash_per_1000_node_days": plan.scenario.rates.rank_crash,
        "restart_s": plan.scenario.costs.restart_whole.seconds
        if plan.scenario.costs.restart_whole
        else None,
        "save_s": plan.scenario.costs.save.seconds,
    }


def collect(h: Harness, repeat: int, result: Result) -> None:
    for seed in range(repeat):
        sample = one(h, seed)
        result.samples.append(sample)
        verdict = "within" if abs(sample["difference"]) <= TOLERANCE else "MISS: outside"
        result.notes.append(
            f"seed {seed}: {sample['crashes']} crashes in {sample['wall_s']:.0f} s; report "
            f"{sample['measured']:.3f}, plan {sample['predicted']:.3f} ({verdict} "
            f"{TOLERANCE:.2f}); restart {sample['restart_s']}, save {sample['save_s']:.3f} s"
        )


def finish(result: Result, floor: float | None) -> None:
    samples = result.samples
    result.metrics = [
        Metric("report's goodput of the chain", [s["measured"] for s in samples], unit=UNIT),
        Metric("plan's prediction (--from-chain)", [s["predicted"] for s in samples],
               unit=UNIT),
        Metric("plan - report", [s["difference"] for s in samples], unit=UNIT),
        Metric("|plan - report|", [s["miss"] for s in samples], TOLERANCE, unit=UNIT),
    ]  # fmt: skip
