"""examples/train_script.py, unchanged, with verdicts and failures of its own for the
cluster tests:

- `--verdict-at N:CODE` makes every rank exit CODE once the checkpoint at iteration N is
  saved (as Megatron's rerun state machine saves one before its 16 and 17);
- `--verdict-once PATH` does it only in a process started while PATH did not exist;
- `--verdict-again` also when resumed from that checkpoint (Megatron's second 16, "Got
  rescheduled on the same GPU"-like: it saves nothing and exits at once);
- `--verdict-quiet`: only rank 0 says the verdict's iteration, and it ends a moment
  after the others (Megatron prints its training lines on one rank, and that rank may be
  the last to exit): the first guard to write the verdict names no iteration;
- `--data-error-at N:RANK` makes rank RANK raise `EOFError: Ran out of input` when it
  reaches iteration N, every time (a truncated data shard);
- `--no-sections`: the example without NVRx's optional sections (it never creates a
  `RankMonitorClient`), as a script written from the contract alone;
- `--stall-at N:RANK:SECONDS` makes rank RANK stand SECONDS in its own
  `upload_metrics` when it reaches iteration N, every time (Megatron's W&B writer on the
  last rank stuck in an upload: the workload's own stall);
- `--slow-save-at N:SECONDS` makes rank 0 alone write for SECONDS before the example's
  own save of iteration N (1 MB pieces to `slow_save.N.part` in the checkpoint
  directory, one a second, as slow shared storage paces them), while the other ranks
  wait in the save's barrier: the most common save of hand-written scripts (rank 0's
  evaluation, logging and uploads look the same);
- `--progress` keeps the contract's optional progress log (rank 0's start, step and
  checkpoint events, docs/workload-contract.md), which the hang tests' sick node
  (devcluster/sick_node.py) reads to know when a cycle trains.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

from nvrx_appliance.workloads.events import ProgressLog

EXAMPLE = Path(__file__).parents[2] / "examples" / "train_script.py"
QUIET_RANK0_LAG_S = 2.0
STEP_EVENT_EVERY = 10  # iterations, as the cpu trainer's log interval


def main() -> None:
    argv, at, once, again, quiet, data_error, progress = [], "", "", False, False, "", False
    stall = slow = ""
    words = iter(sys.argv[1:])
    for word in words:
        if word == "--verdict-at":
            at = next(words)
        elif word == "--verdict-once":
            once = next(words)
        elif word == "--verdict-again":
            again = True
        elif word == "--verdict-quiet":
            quiet = True
        elif word == "--data-error-at":
            data_error = next(words)
        elif word == "--stall-at":
            stall = next(words)
        elif word == "--slow-save-at":
            slow = next(words)
        elif word == "--progress":
            progress = True
        elif word == "--no-sections":
            os.environ.pop("FT_RANK_MONITOR_IPC_SOCKET", None)  # the example's test for them
        else:
            argv.append(word)
    iteration, code = (int(part) for part in at.split(":")) if at else (-1, 0)
    bad_iteration, bad_rank = (
        (int(part) for part in data_error.split(":")) if data_error else (-1, -1)
    )
    stall_iteration, stall_rank, stall_s = (
        (float(part) for part in stall.split(":")) if stall else (-1, -1, 0.0)
    )
    armed = bool(at) and not (once and os.path.exists(once))
    triggers = {f"saved checkpoint at iteration {iteration}"}
    if again:
        triggers.add(f"resumed from iteration {iteration}")
    spec = importlib.util.spec_from_file_location("train_script", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    said = example.log
    tell = _progress() if progress else lambda _rank, _line: None

    def log(rank: int, line: str) -> None:
        said(rank, line)
        tell(rank, line)
        if rank == bad_rank and line.startswith(f"iteration {bad_iteration} "):
            raise EOFError("Ran out of input")
        if rank == stall_rank and line.startswith(f"iteration {int(stall_iteration)} "):
            upload_metrics(stall_s)
        if armed and line in triggers:
            if once and rank == 0:
                Path(once).touch()
            if rank == 0 or not quiet:
                print(f"rank {rank}: the verdict at iteration {iteration}: exit {code}", flush=True)
            if quiet and rank == 0:
                time.sleep(QUIET_RANK0_LAG_S)
            os._exit(code)

    example.log = log
    if slow:
        example.save = _slowly(example.save, *(int(part) for part in slow.split(":")))
    sys.argv = [str(EXAMPLE), *argv]
    example.main()


def _slowly(save, at: int, seconds: int):
    """The example's save, with rank 0 writing alone for `seconds` first at iteration `at`."""

    def slow_save(directory: str, iteration: int, model, optimizer, rank: int) -> None:
        if rank == 0 and iteration == at:
            part = Path(directory) / f"slow_save.{iteration}.part"
            with part.open("wb") as out:
                for _ in range(seconds):
                    out.write(os.urandom(1 << 20))
                    out.flush()
                    time.sleep(1.0)  # slow shared storage's pace
            part.unlink()
        save(directory, iteration, model, optimizer, rank)

    return slow_save


def upload_metrics(seconds: float) -> None:
    """The workload's own code, stuck: an upload that does not return for `seconds`."""
    time.sleep(seconds)


def _progress():
    """Rank 0's progress events, from the example's own lines."""
    events = ProgressLog(
        Path(os.environ["NVRX_APPLIANCE_PROGRESS_LOG"]),
        slurm_array_job_id=os.environ.get("SLURM_ARRAY_JOB_ID"),
        cycle=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
    )
    began: list[float] = []  # when the last iteration ended; empty before the first

    def tell(rank: int, line: str) -> None:
        words = line.split()
        if rank != 0 or len(words) < 2 or not words[-1].isdigit():
            return
        if words[0] == "iteration":
            iteration = int(words[1])
            if not began:
                events.emit("start", iteration=iteration - 1)
            began[:] = [time.time()]
            if iteration % STEP_EVENT_EVERY == 0 or iteration == 1:
                events.emit("step", iteration=iteration)
        elif line.startswith("saved checkpoint at iteration"):
            events.emit("checkpoint", iteration=int(words[-1]),
                        seconds=round(time.time() - began[-1], 3) if began else 0.0)  # fmt: skip

    return tell


if __name__ == "__main__":
    main()
