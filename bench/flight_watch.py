"""What the flight-recorder watch costs a training step (issue 45): the thread every
rank's workload runs (rank/flight_site/sitecustomize.py) polls the recorder's status ten
times a second to measure the rank's time inside collectives.

    python -m bench.flight_watch --repeat 5       # no cluster needed

Two gloo ranks train a small DDP model (a forward, a backward, its gradient
all-reduce, an optimizer step) for STEPS steps, with the watch on (the guard's
PYTHONPATH and variables, figures written every second) and off, in turn. Figures:
each run's median step time, the medians over --repeat runs of each, and the median
seconds one status poll takes inside a rank. A JSON document to --out (default
bench/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from nvrx_appliance.rank import flight
from nvrx_appliance.rank.flight_site import sitecustomize as site

RESULTS = Path(__file__).parent / "results"
STEPS = 1500

RANK = r"""
import json, statistics, sys, time, torch, torch.distributed as dist
rank, port, steps = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
batch = torch.randn(32, 256)
times = []
for _ in range(steps):
    started = time.perf_counter()
    opt.zero_grad()
    model(batch).sum().backward()
    opt.step()
    times.append(time.perf_counter() - started)
c10d = sys.modules["torch._C._distributed_c10d"]
polls = []
for _ in range(1000):
    started = time.perf_counter()
    json.loads(c10d._dump_fr_trace_json(includeCollectives=False, onlyActive=True))
    polls.append(time.perf_counter() - started)
if rank == 0:
    print(json.dumps({"step": statistics.median(times[100:]), "poll": statistics.median(polls)}))
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(watched: bool, scratch: Path) -> dict[str, float]:
    env = {**os.environ, flight.BUFFER_ENV: flight.BUFFER_ENTRIES}
    if watched:
        env.update(
            {
                "PYTHONPATH": flight.SITE_DIR,
                site.DIR_ENV: str(scratch / "flight"),
                site.STALL_ENV: "10",
                site.WHO_ENV: json.dumps({"generation": "bench/1/1", "cycle": 0}),
                site.WAITS_ENV: json.dumps(
                    {"dir": str(scratch / "waits"), "period": 1.0, "generation": "1"}
                ),
            }
        )
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(r), port, str(STEPS)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    out = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a rank failed: {[p.returncode for p in procs]}")
    if watched and not list((scratch / "waits").glob("*.json")):
        raise RuntimeError("the watch wrote no figures: it did not run")
    return json.loads(out[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "flight_watch.json")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    for i in range(args.repeat):
        for label in ("off", "on") if i % 2 == 0 else ("on", "off"):
            with tempfile.TemporaryDirectory(prefix="bench-flight-") as scratch:
                runs[label].append(one_run(label == "on", Path(scratch)))
    step = {k: statistics.median(r["step"] for r in v) for k, v in runs.items()}
    doc = {
        "steps_per_run": STEPS,
        "repeat": args.repeat,
        "median_step_s": step,
        "overhead_per_step_s": step["on"] - step["off"],
        "overhead_share": step["on"] / step["off"] - 1,
        "median_poll_s": statistics.median(r["poll"] for r in runs["on"] + runs["off"]),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k != "runs"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
