"""9. Completion: what a chain does once its training is done.

A sample is one chain of three generations whose training (examples/train_script.py,
50 iterations) ends in the first: how many later generations start anyway, and how long
the chain holds the queue after the first generation ends. The seeds' design, side by
side in the same run: the same script with its training-done marker sent where nothing
reads it (bench/seeds_script.py), so the chain goes on as it would there: every queued
generation starts, loads the final checkpoint and stops.
"""

from __future__ import annotations

from pathlib import Path

from bench import chains, endings
from bench.extract import Incomplete
from bench.harness import Harness
from bench.report import Result

NAME = "completion"
TITLE = "9 completion"
EXAMPLE = Path(__file__).parents[1] / "examples" / "train_script.py"
SEEDS_SCRIPT = Path(__file__).with_name("seeds_script.py")
DEPTH = 3
CHAIN_TIMEOUT_S = 600


def one(h: Harness, scenario: str, script: Path) -> dict:
    work, name = h.workdir(scenario), h.job_name(scenario)
    args = work / "script.args"
    args.write_text("--iterations 50\n--step-seconds 0.05\n")
    ids = h.submit(
        work, name, *chains.FAST, "--workload", "script", "--script", str(script),
        "--script-args", str(args), "--gpus-per-node", str(chains.WORKERS_PER_NODE),
        "--train-tasks", "1",
        "--hot-spares", "0", "--cold-spares", "0", "--depth", str(DEPTH),
    )  # fmt: skip
    try:
        h.wait(lambda: not h.squeue_ids(name), CHAIN_TIMEOUT_S, f"chain {name} to end")
        tasks = h.wait_final(ids, 120, array_size=1)
    finally:
        h.drain(name)
    return endings.completion_sample(tasks, ids, ids[0])


def collect(h: Harness, repeat: int, result: Result) -> None:
    for (design, _), scenario, script in zip(
        endings.DESIGNS, (NAME, f"{NAME}-seeds"), (EXAMPLE, SEEDS_SCRIPT), strict=True
    ):
        for _ in range(repeat):
            try:
                result.samples.append({**one(h, scenario, script), "design": design})
            except Incomplete as exc:
                result.notes.append(f"{design} sample dropped: {exc}")
            h.say(f"{scenario}: {sum(s['design'] == design for s in result.samples)}/{repeat}")


def finish(result: Result, floor: float | None) -> None:
    result.metrics += endings.side_by_side(
        result.samples,
        [
            (
                "generations_started_after",
                "generations started after training ended",
                "generations",
            ),
            ("queue_held_s", "its end -> the chain's last task ended", "s"),
        ],
    )
