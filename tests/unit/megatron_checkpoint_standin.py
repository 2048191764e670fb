"""A stand-in for pretrain_gpt.py's checkpointing, which needs a GPU here: it lays out
checkpoints the way Megatron does at the pin (the files of a save into iter_NNNNNNN/,
then rank 0 rewrites latest_checkpointed_iteration.txt in place), and dies in the middle
of a save, so that tests can watch what task 0's retention keeps. Not a test module.

    python megatron_checkpoint_standin.py EVIDENCE_FILE

Cycle 0 saves iterations 10, 20, 30 and 40 (each once task 0's keeper has written the
one before into the tracked record: Megatron's saves are minutes apart), then starts 50, writes half of its files
and SIGKILLs itself: a save killed midway. ft_launcher restarts it (an in-job restart);
cycle 1 finds the tracker at 40 and iter_0000050 half-written, waits until retention
has removed what it should (keep 2: iterations 10 and 20), records what it saw, then
saves 50 in full, moves the tracker and waits until 30 is gone too, and exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

FILES = ("common.pt", "metadata.json", "__0_0.distcp", "__1_0.distcp")
TRACKER = "latest_checkpointed_iteration.txt"
WAIT_S = 60.0


def iteration_dir(save: Path, iteration: int) -> Path:
    return save / f"iter_{iteration:07d}"


def write_files(save: Path, iteration: int, files: tuple[str, ...]) -> None:
    directory = iteration_dir(save, iteration)
    directory.mkdir(parents=True, exist_ok=True)
    for name in files:
        (directory / name).write_bytes(b"x" * 4096)


def save_checkpoint(save: Path, iteration: int) -> None:
    write_files(save, iteration, FILES)
    with open(save / TRACKER, "w") as tracker:  # in place, as Megatron does
        tracker.write(str(iteration))


def wait_until_recorded(save: Path, iteration: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        record = save / "tracked.jsonl"
        if record.exists() and f'{{"tracked": {iteration}}}' in record.read_text():
            return
        time.sleep(0.05)
    raise SystemExit(f"the keeper never recorded iteration {iteration}")


def wait_until_gone(save: Path, *iterations: int) -> bool:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if not any(iteration_dir(save, i).exists() for i in iterations):
            return True
        time.sleep(0.2)
    return False


def listing(save: Path) -> list[str]:
    return sorted(p.name for p in save.iterdir())


def main() -> int:
    evidence = Path(sys.argv[1])
    save = Path(os.environ["NVRX_APPLIANCE_CHECKPOINT_DIR"])
    save.mkdir(parents=True, exist_ok=True)
    tracker = save / TRACKER
    if not tracker.exists():
        for iteration in (10, 20, 30, 40):
            save_checkpoint(save, iteration)
            wait_until_recorded(save, iteration)
        write_files(save, 50, FILES[:2])
        os.kill(os.getpid(), signal.SIGKILL)  # a save killed midway
    seen: dict = {"resumed_from": int(tracker.read_text())}
    seen["older_removed"] = wait_until_gone(save, 10, 20)
    partial = iteration_dir(save, 50)
    seen["partial_files"] = sorted(p.name for p in partial.iterdir()) if partial.exists() else None
    seen["after_first_sweeps"] = listing(save)
    save_checkpoint(save, 50)
    seen["thirty_removed"] = wait_until_gone(save, 30)
    seen["at_exit"] = listing(save)
    evidence.write_text(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
