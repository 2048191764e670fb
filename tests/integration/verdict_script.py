"""examples/train_script.py, unchanged, with a verdict of its own for the cluster tests:
`--verdict-at N:CODE` makes every rank exit CODE once the checkpoint at iteration N is
saved (as Megatron's rerun state machine saves one before its 16 and 17), and
`--verdict-once PATH` does it only in a process started while PATH did not exist."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

EXAMPLE = Path(__file__).parents[2] / "examples" / "train_script.py"


def main() -> None:
    argv, at, once = [], "", ""
    words = iter(sys.argv[1:])
    for word in words:
        if word == "--verdict-at":
            at = next(words)
        elif word == "--verdict-once":
            once = next(words)
        else:
            argv.append(word)
    iteration, code = (int(part) for part in at.split(":")) if at else (-1, 0)
    armed = bool(at) and not (once and os.path.exists(once))
    spec = importlib.util.spec_from_file_location("train_script", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    said = example.log

    def log(rank: int, line: str) -> None:
        said(rank, line)
        if armed and line == f"saved checkpoint at iteration {iteration}":
            if once and rank == 0:
                Path(once).touch()
            print(f"rank {rank}: the verdict at iteration {iteration}: exit {code}", flush=True)
            os._exit(code)

    example.log = log
    sys.argv = [str(EXAMPLE), *argv]
    example.main()


if __name__ == "__main__":
    main()
