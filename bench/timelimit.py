"""8. The time-limit boundary: what a generation that reaches its Slurm time limit loses.

One chain of repeat+1 generations with a one-minute --time and checkpoints every 400
iterations (the issue's setting), each ended by its time limit; a sample is one
boundary: the iterations (and seconds) the generation trained that its successor does
not resume from, and the hand-off from its last step to the successor's first. The
seeds' design, side by side in the same run: the same chain with --time-limit-margin
off, which runs into the limit as the reference deployment does (its
--exit-duration-in-mins 110 never fires before a shorter --time).
"""

from __future__ import annotations

import itertools

from bench import chains, endings
from bench.extract import Incomplete
from bench.harness import Harness
from bench.report import Result
from bench.timing import Task
from bench.timing import generation_end as last_end

NAME = "timelimit"
TITLE = "8 time-limit boundary"
SEEDS_MARGIN = ("--time-limit-margin", "off")
# One minute: Slurm's timer then signals 15-45 s in (auto margin: a quarter of --time)
# and kills at 60-90 s. Checkpoints every 400 iterations, kept, one task, no spares.
SHORT = (
    "--time", "1", "--save-interval", "400", "--train-tasks", "1", "--hot-spares", "0",
    "--cold-spares", "0", "--gpus-per-node", str(chains.WORKERS_PER_NODE),
)  # fmt: skip
BOUNDARY_TIMEOUT_S = 300  # a generation runs into its limit (60-90 s) and the next starts


def generation_end(tasks: list[Task]) -> float | None:
    found = last_end(tasks)
    return None if found is None else found[0]


def chain(h: Harness, repeat: int, result: Result, scenario: str, *flags: str) -> list[dict]:
    work, name = h.workdir(scenario), h.job_name(scenario)
    ids = h.submit(work, name, *chains.FAST, *SHORT, "--mode", "train",
                   "--depth", str(repeat + 1), *flags)  # fmt: skip
    result.notes.append(f"{scenario} generations: {', '.join(ids)}")
    samples = []
    try:
        for gen, successor in itertools.pairwise(ids):
            h.wait_event(work, f"generation {successor} to step", BOUNDARY_TIMEOUT_S, "step",
                         slurm_array_job_id=successor)  # fmt: skip
            try:
                ended = generation_end(h.wait_final([gen], 120, array_size=1))
                samples.append(endings.boundary_sample(h.progress(work), gen, successor, ended))
            except Incomplete as exc:
                result.notes.append(f"{scenario} boundary {gen} -> {successor} dropped: {exc}")
            h.say(f"{scenario}: {len(samples)}/{repeat} boundaries")
    finally:
        h.drain(name)
    return samples


def collect(h: Harness, repeat: int, result: Result) -> None:
    for sample in chain(h, repeat, result, NAME):
        result.samples.append({**sample, "design": "appliance"})
    for sample in chain(h, repeat, result, f"{NAME}-seeds", *SEEDS_MARGIN):
        result.samples.append({**sample, "design": "seeds"})


def finish(result: Result, floor: float | None) -> None:
    result.metrics += endings.side_by_side(
        result.samples,
        [
            ("iterations_lost", "iterations trained and lost at the limit", "iterations"),
            ("seconds_lost", "seconds of training lost at the limit", "s"),
            ("handoff_s", "last step -> successor's first step", "s"),
            ("last_step_to_end_s", "of which: last step -> its last task ended (Slurm)", "s"),
            ("end_to_first_step_s", "of which: then -> successor's first step", "s"),
        ],
    )
    saved = sum(s["saved_at_limit"] for s in result.samples if s["design"] == "appliance")
    result.notes.append(f"appliance boundaries where the generation saved at the limit: {saved}")
