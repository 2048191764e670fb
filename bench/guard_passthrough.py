"""The workload guard's pass-through: microseconds per line of a rank's output.

Every line a rank writes goes through its guard (rank/guard.py): read from the
workload's pipe, written to ft_launcher's, and kept (the tail, and the lines about a
checkpoint). A rank that writes fast must not block on its own stdout, nor its guard
burn a core. This feeds a guard's copier (its _Tee, on its own thread, as in a run)
--lines lines of about 1 KB through a real pipe, to /dev/null (pass_through), and the
same lines to its keeping alone (keep), and reports the median of --runs runs of each;
no cluster. --module measures another version of the guard (an older checkout's).

    python bench/guard_passthrough.py [--runs 5] [--lines 200000] [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import statistics
import threading
import time

# A Megatron training line, padded to about 1 KB as a chatty rank's lines are.
LINE = (
    " iteration      201/    1000 | consumed samples:         1608 | elapsed time per "
    "iteration (ms): 412.3 | learning rate: 1.500000E-04 | global batch size:     8 | "
    "lm loss: 2.112345E+00 | loss scale: 1.0 | grad norm: 0.912 | "
)
LINE = (LINE * (1024 // len(LINE) + 1))[:1023] + "\n"


def _tee(module, source: int, sink: int):
    try:
        return module._Tee(source, sink, itertools.count())
    except TypeError:  # the guard before issue 40: no shared line order
        return module._Tee(source, sink)


def one_run(module, lines: int) -> float:
    """Seconds for `lines` lines through one copier: read, written on, kept."""
    read_fd, write_fd = os.pipe()
    sink = os.open(os.devnull, os.O_WRONLY)
    data = LINE.encode() * 64
    feeding = threading.Thread(target=_feed, args=(write_fd, data, lines // 64), daemon=True)
    start = time.perf_counter()
    feeding.start()
    tee = _tee(module, read_fd, sink)
    tee.thread.join()
    elapsed = time.perf_counter() - start
    feeding.join()
    os.close(sink)
    return elapsed


def keep_only(module, lines: int) -> float:
    """Seconds the copier spends keeping `lines` lines (no pipe, no thread): what the
    guard adds to a plain copy."""
    read_fd, write_fd = os.pipe()
    os.close(write_fd)  # its thread ends at once; the chunks are handed over here
    sink = os.open(os.devnull, os.O_WRONLY)
    tee = _tee(module, read_fd, sink)
    tee.thread.join()
    chunk = LINE.encode() * 64
    start = time.perf_counter()
    for _ in range(lines // 64):
        tee._keep(chunk)
    elapsed = time.perf_counter() - start
    os.close(sink)
    return elapsed


def _feed(fd: int, data: bytes, times: int) -> None:
    for _ in range(times):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    os.close(fd)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--lines", type=int, default=200_000)
    p.add_argument("--module", default="nvrx_appliance.rank.guard")
    p.add_argument("--out")
    args = p.parse_args()
    module = importlib.import_module(args.module)
    report = {"runs": args.runs, "lines": args.lines, "line_bytes": len(LINE)}
    for label, measure in (("keep", keep_only), ("pass_through", one_run)):
        per_line = [measure(module, args.lines) / args.lines * 1e6 for _ in range(args.runs)]
        report[label] = {
            "median_us_per_line": round(statistics.median(per_line), 3),
            "min_us_per_line": round(min(per_line), 3),
            "max_us_per_line": round(max(per_line), 3),
            "median_mb_per_s": round(len(LINE) / statistics.median(per_line), 1),
        }
    text = json.dumps(report, indent=2)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
