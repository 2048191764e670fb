"""A slow node, measured (issue 38): what the own step time sees of a node paused a share
of the time, and whether the rule names it.

    python -m bench.straggler --repeat 3          # no cluster needed

Two torchrun "nodes" on this machine (SLURMD_NODENAME node-a and node-b, one rank each)
train the cpu trainer; node-b's rank is stopped for `share` of every PERIOD_S (SIGSTOP,
SIGCONT), as the cluster test does. For each share, the figures are the run's wall
slowdown (its step rate against the run without a pause), the slowdown the rule
measures in its last window (goodput/straggler.py), and whether it named node-b (and
never node-a). Medians of --repeat runs; a JSON document to --out (default
bench/results/).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from nvrx_appliance.goodput import straggler
from nvrx_appliance.observe.training_log import CycleWork, OwnSteps
from nvrx_appliance.observe.workdir import json_lines

RESULTS = Path(__file__).parent / "results"
PERIOD_S = 0.2
ITERATIONS = 400
SHARES = (0.0, 0.3, 0.5, 0.7)


def _agent(node: str, port: int, log: Path) -> subprocess.Popen:
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "bench",
        "-m", "nvrx_appliance.workloads.cpu", "--train-iters", str(ITERATIONS),
        "--log-interval", "10", "--progress-log", str(log),
    ]  # fmt: skip
    env = {**os.environ, "SLURMD_NODENAME": node}
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _pause(agent: subprocess.Popen, share: float, done: threading.Event) -> None:
    import psutil

    while not done.is_set():
        try:
            ranks = [c.pid for c in psutil.Process(agent.pid).children()]
        except psutil.Error:
            return
        _signal(ranks, signal.SIGSTOP)
        done.wait(share * PERIOD_S)
        _signal(ranks, signal.SIGCONT)
        done.wait((1 - share) * PERIOD_S)


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # the rank ended since it was listed
            os.kill(pid, signum)


def run_once(share: float, port: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-straggler-") as scratch:
        log = Path(scratch) / "progress.jsonl"
        a, b = _agent("node-a", port, log), _agent("node-b", port, log)
        done = threading.Event()
        pauser = threading.Thread(target=_pause, args=(b, share, done), daemon=True)
        if share:
            pauser.start()
        try:
            a.wait(timeout=900)
            b.wait(timeout=60)
        finally:
            done.set()
            if share:
                pauser.join()
        steps = [e for e in json_lines(log) if e.get("event") == "step" and e.get("own_steps")]
    own = [OwnSteps(e["time"], e["iteration"], e["own_steps"], e["own_step_s"]) for e in steps]
    named = straggler.judge(CycleWork("bench", 0, "progress log", own_steps=own))
    wall = (steps[-1]["time"] - steps[1]["time"]) / (steps[-1]["iteration"] - steps[1]["iteration"])
    whole = straggler._means(own[1:])
    return {
        "share": share,
        "wall_step_s": wall,
        "own_b_over_a": whole["node-b"] / whole["node-a"],
        "named": [s.node for s in named],
        "named_slowdown": named[0].slowdown if named else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runs = []
    for k in range(args.repeat):
        for i, share in enumerate(SHARES):
            runs.append(run_once(share, 29600 + 10 * k + i))
            print(json.dumps(runs[-1]), flush=True)
    base = statistics.median(r["wall_step_s"] for r in runs if r["share"] == 0)
    rows = []
    for share in SHARES:
        mine = [r for r in runs if r["share"] == share]
        rows.append({
            "share": share,
            "wall_slowdown": statistics.median(r["wall_step_s"] for r in mine) / base,
            "own_b_over_a": statistics.median(r["own_b_over_a"] for r in mine),
            "named_b": sum(r["named"] == ["node-b"] for r in mine),
            "named_a": sum("node-a" in r["named"] for r in mine),
            "runs": len(mine),
        })  # fmt: skip
    doc = {"bench": "straggler", "period_s": PERIOD_S, "iterations": ITERATIONS,
           "load_average": os.getloadavg(), "rows": rows, "runs": runs}  # fmt: skip
    out = args.out or RESULTS / f"straggler-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    for row in rows:
        print(json.dumps(row))
    print(f"written: {out}")


if __name__ == "__main__":
    main()
