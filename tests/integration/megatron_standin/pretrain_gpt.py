"""A stand-in for Megatron-LM's pretrain_gpt.py on the local cluster, which has no GPU
to run Megatron: only its checkpoint writing, in Megatron's order (the files of a save
into iter_NNNNNNN/, then rank 0 rewrites latest_checkpointed_iteration.txt in place), at
a save every GAP_S seconds, which Megatron's pace does not adjust to anyone's deletes.
Not Megatron, and not a test module: `--workload megatron --megatron-path` names this
directory. It reads --save and --save-interval and ignores the rest of Megatron's argv.

Rank 0 saves SAVES checkpoints and exits 0 (training done); the other ranks exit 0 at once.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

SAVES = 6
GAP_S = 2.0
FILES = ("common.pt", "metadata.json", "__0_0.distcp", "__1_0.distcp")
TRACKER = "latest_checkpointed_iteration.txt"


def main() -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--save", type=Path, required=True)
    parser.add_argument("--save-interval", type=int, required=True)
    args, _ = parser.parse_known_args()
    if os.environ.get("RANK", "0") != "0":
        return 0
    args.save.mkdir(parents=True, exist_ok=True)
    for n in range(1, SAVES + 1):
        iteration = n * args.save_interval
        directory = args.save / f"iter_{iteration:07d}"
        directory.mkdir(exist_ok=True)
        for name in FILES:
            (directory / name).write_bytes(b"x" * 4096)
        (args.save / TRACKER).write_text(str(iteration))
        print(f"saved checkpoint at iteration {iteration}", flush=True)
        time.sleep(GAP_S)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
