"""4. No-restart: ft_launcher exits 93 -> every queued generation cancelled, queue empty.

A fresh chain of three generations per sample, in the seeds' no-restart demo mode: a
workload fault with a progress file that never moves, so NVRx gives up and exits 93;
task 0's trap writes the closed flag and cancels the chain. The harness polls squeue
from the fault on and notes the first poll that finds nothing of the chain.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench import chains, extract
from bench.extract import NoRestartSeen
from bench.harness import POLL_S, Harness
from bench.report import Metric, Result, phase_metrics
from nvrx_appliance.layout import Layout

NAME = "norestart"
TITLE = "4 no-restart"
TARGET_S = 1.0  # exit 93 -> no job of the chain left in the queue (issue 11, was 2 s in issue 7)
DEPTH = 3
EMPTY_TIMEOUT_S = 180


def _first_empty_poll(h: Harness, name: str) -> float:
    """When the first squeue that found nothing of the chain answered: the queue was
    empty by then (an upper bound, by one squeue's latency at most)."""
    deadline = time.monotonic() + EMPTY_TIMEOUT_S
    while time.monotonic() < deadline:
        ids = h.squeue_ids(name)
        if not ids:
            return time.time()
        time.sleep(POLL_S)
    raise TimeoutError(f"chain {name} still queued {EMPTY_TIMEOUT_S} s after its fault")


def _last_cycle_end(h: Harness, work, gen: str) -> float | None:
    ends = []
    for number in range(64):
        found = h.cycle(work, gen, number)
        if found is None:
            break
        ends.append(found.end)
    return ends[-1] if ends and ends[-1] is not None else None


def exit93_chain(h: Harness, scenario: str, depth: int) -> tuple[Path, list[str], float]:
    """Submit a chain that ends in exit 93 and wait until nothing of it is queued.
    Returns its work dir, its generations, and when the queue was first seen empty."""
    work, name = h.workdir(scenario), h.job_name(scenario)
    ids = h.submit(
        work, name, *chains.FAST, *chains.SHAPE, "--mode", "no-restart",
        "--depth", str(depth), "--fault-delay", "1",
    )  # fmt: skip
    try:
        h.wait_event(work, f"the fault of {ids[0]}", chains.START_TIMEOUT_S, "fault")
        empty = _first_empty_poll(h, name)
    finally:
        h.drain(name)
    return work, ids, empty


def one(h: Harness) -> dict:
    work, (first, *queued), empty = exit93_chain(h, NAME, DEPTH)
    layout = Layout(work)
    files = layout.control_files(first)
    seen = NoRestartSeen(
        decided=_last_cycle_end(h, work, first),
        exited_93=h.mtime(files.no_restart),
        closed=h.mtime(files.closed),
        teardown_done=h.mtime(layout.ledger),
        generation=h.wait_final([first], 60),
        step_ends=h.step_ends(),
        queued=queued,
        queued_tasks=h.wait_final(queued, 60),
        kills=h.ctld_events(),
        queue_empty=empty,
        nvrx=h.nvrx_events(work, first),
    )
    return extract.norestart_sample(seen)


def collect(h: Harness, repeat: int, result: Result) -> None:
    for _ in range(repeat):
        try:
            result.samples.append(one(h))
        except extract.Incomplete as exc:
            result.notes.append(f"sample dropped: {exc}")
        h.say(f"norestart: {len(result.samples)}/{repeat} samples")


def finish(result: Result, floor: float | None) -> None:
    s = result.samples
    given_up = [x["total_s"] for x in s if x["marks"][0]["name"] == "NVRx gave up"]
    batch = [x["last_task_srun_end_to_job_end_s"] for x in s]
    result.metrics = [
        Metric("exit 93 -> queue empty for the chain", [x["exit93_to_empty_s"] for x in s],
               target_s=TARGET_S),
        Metric("exit 93 -> queued generations cancelled", [x["exit93_to_cancelled_s"] for x in s]),
        Metric("NVRx gave up -> queue empty", given_up),
        *phase_metrics(s),
        Metric("within: last task's srun ended -> its job ended", [b for b in batch if b is not None],
               indent=True),
    ]  # fmt: skip
