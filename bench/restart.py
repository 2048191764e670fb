"""5. In-job restart: a rank fails -> training resumed in the next cycle.

One generation. For each sample: wait for a checkpoint in the current cycle (so NVRx
sees progress and keeps restarting), SIGKILL rank 1's training process (a crash, as
the trainer's 'exit' fault would be, but at a moment the harness knows), and wait for
the next cycle's first step after its restore. The timeline comes from the cycle-info
files, the checkpoint's access times and the progress log.
"""

from __future__ import annotations

from bench import chains, extract
from bench.extract import RestartSeen
from bench.harness import Harness
from bench.report import Metric, Result, phase_metrics
from nvrx_appliance.layout import Layout

NAME = "restart"
TITLE = "5 in-job restart"
RANK = 1  # not rank 0: the fault must not take the progress log's writer with it
RESTART_TIMEOUT_S = 120
# NVRx's own events the timeline needs from the restarted node's launcher.
NVRX_MARKS = ("failure_detected", "worker_terminated", "rendezvous_started")


def one(h: Harness, work, gen: str, cycle: int) -> dict:
    run_json = Layout(work).run_json
    h.wait_checkpointed(work, f"cycle {cycle}", slurm_array_job_id=gen, cycle=cycle)
    pid = h.wait(lambda: h.worker_pid(run_json, RANK), 30, f"rank {RANK}'s process")
    fault_at = h.kill_process(pid)
    resumed, step = h.wait_resumed(
        work, f"cycle {cycle + 1}", RESTART_TIMEOUT_S, slurm_array_job_id=gen, cycle=cycle + 1
    )
    seen = RestartSeen(
        fault_at=fault_at,
        rank=RANK,
        next=h.cycle(work, gen, cycle + 1),
        checkpoint=h.restored(work, resumed),
        resumed=resumed,
        first_step=step,
        nvrx=h.nvrx_events_with(work, gen, [(e, cycle + 1, resumed["host"]) for e in NVRX_MARKS]),
    )
    return extract.restart_sample(seen)


def collect(h: Harness, repeat: int, result: Result) -> None:
    work, name = h.workdir(NAME), h.job_name(NAME)
    [gen] = h.submit(work, name, *chains.FAST, *chains.SHAPE, "--mode", "train", "--depth", "1",
                     "--max-restarts", str(repeat + 2))  # fmt: skip
    result.notes.append(f"generation: {gen}")
    try:
        for cycle in range(repeat):
            try:
                result.samples.append(one(h, work, gen, cycle))
            except extract.Incomplete as exc:
                result.notes.append(f"sample of cycle {cycle} dropped: {exc}")
            h.say(f"restart: {len(result.samples)}/{repeat} samples")
    finally:
        h.drain(name)


def finish(result: Result, floor: float | None) -> None:
    samples = result.samples
    result.metrics = [
        Metric("rank fault -> first step of the next cycle", [s["total_s"] for s in samples]),
        *phase_metrics(samples),
    ]
