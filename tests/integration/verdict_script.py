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
  reaches iteration N, every time (a truncated data shard).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

EXAMPLE = Path(__file__).parents[2] / "examples" / "train_script.py"
QUIET_RANK0_LAG_S = 2.0


def main() -> None:
    argv, at, once, again, quiet, data_error = [], "", "", False, False, ""
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
        else:
            argv.append(word)
    iteration, code = (int(part) for part in at.split(":")) if at else (-1, 0)
    bad_iteration, bad_rank = (
        (int(part) for part in data_error.split(":")) if data_error else (-1, -1)
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

    def log(rank: int, line: str) -> None:
        said(rank, line)
        if rank == bad_rank and line.startswith(f"iteration {bad_iteration} "):
            raise EOFError("Ran out of input")
        if armed and line in triggers:
            if once and rank == 0:
                Path(once).touch()
            if rank == 0 or not quiet:
                print(f"rank {rank}: the verdict at iteration {iteration}: exit {code}", flush=True)
            if quiet and rank == 0:
                time.sleep(QUIET_RANK0_LAG_S)
            os._exit(code)

    example.log = log
    sys.argv = [str(EXAMPLE), *argv]
    example.main()


if __name__ == "__main__":
    main()
