"""What the ordinary ends of a generation cost, from what a run left behind. Pure.

The time-limit boundary (timelimit.py): how much training a generation did that its
successor does not resume from, and how long the hand-off takes. Completion
(completion.py): how many generations start after training has ended, and how long the
chain holds the queue after that.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.extract import Incomplete
from bench.report import Metric
from bench.timing import Task, task0

# Both designs run in the same benchmark run; each sample says which it measured.
DESIGNS = (("appliance", "the appliance"), ("seeds", "the seeds' design"))

TRAINED = ("step", "checkpoint", "saved_at_time_limit")


def _of(events: Sequence[dict], generation: str) -> list[dict]:
    return [e for e in events if e.get("slurm_array_job_id") == generation]


def boundary_sample(
    events: Sequence[dict], generation: str, successor: str, ended: float | None = None
) -> dict:
    """One time-limit boundary from the cpu trainer's progress log: the last iteration
    the generation trained, the checkpoint its successor resumed from, and when the
    successor's first step came. Steps are logged every few iterations, so where the
    generation was killed the last one logged can precede the last one trained: the
    loss is then under-counted by less than the log interval. `ended`: when Slurm saw the
    generation's last task end, which splits the hand-off in two."""
    ours, theirs = _of(events, generation), _of(events, successor)
    trained = [e for e in ours if e["event"] in TRAINED]
    resumed = next((e for e in theirs if e["event"] == "start"), None)
    if not trained:
        raise Incomplete(f"missing: the steps of {generation}")
    if resumed is None:
        raise Incomplete(f"missing: the resume of {successor}")
    last = max(trained, key=lambda e: (e["iteration"], e["time"]))
    steps = [e for e in ours if e["event"] == "step"]
    first_step = next(
        (e for e in theirs if e["event"] == "step" and e["time"] > resumed["time"]), None
    )
    saves = [
        e for e in ours if e["event"] == "checkpoint" and e["iteration"] == resumed["iteration"]
    ]
    if first_step is None or not saves:
        raise Incomplete(f"missing: the first step of {successor} or the checkpoint it read")
    saved = saves[-1]
    return {
        "generation": generation,
        "successor": successor,
        "last_trained": last["iteration"],
        "resumed_at": resumed["iteration"],
        "saved_at_limit": any(e["event"] == "saved_at_time_limit" for e in ours),
        "iterations_lost": last["iteration"] - resumed["iteration"],
        # Training time after the checkpoint the successor read: from that checkpoint to
        # the last step logged (none when the checkpoint came after the last step).
        "seconds_lost": max(0.0, max(e["time"] for e in steps) - saved["time"]) if steps else 0.0,
        "handoff_s": first_step["time"] - last["time"],
        "last_step_to_end_s": None if ended is None else ended - last["time"],
        "end_to_first_step_s": None if ended is None else first_step["time"] - ended,
    }


def completion_sample(tasks: Sequence[Task], generations: Sequence[str], done_in: str) -> dict:
    """A chain whose training ended in generation `done_in`: how many later generations
    started anyway, and seconds from that generation's end to the chain's last task end."""
    later = list(generations[generations.index(done_in) + 1 :])
    by_gen = {g: [t for t in tasks if t.array_job_id == g] for g in generations}
    ended = task0(by_gen[done_in])
    if ended is None or ended.end is None:
        raise Incomplete(f"missing: the end of {done_in}_0")
    ends = [t.end for g in generations for t in by_gen[g] if t.end is not None]
    started = [g for g in later if any(t.start is not None for t in by_gen[g])]
    return {
        "done_in": done_in,
        "later": later,
        "later_started": started,
        "generations_started_after": len(started),
        "queue_held_s": max(ends) - ended.end,
    }


def side_by_side(samples: Sequence[dict], measures: Sequence[tuple[str, str, str]]) -> list[Metric]:
    """For each design, one metric per (sample key, label, unit): the first unindented,
    the rest as its parts."""
    metrics = []
    for design, who in DESIGNS:
        ours = [s for s in samples if s["design"] == design]
        for i, (key, label, unit) in enumerate(measures):
            values = [s[key] for s in ours if s.get(key) is not None]
            metrics.append(Metric(f"{who}: {label}", values, unit=unit, indent=i > 0))
    return metrics
