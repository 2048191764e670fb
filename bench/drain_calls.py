"""The drain poller's cost to Slurm (issue 23): calls per interval, whatever the size.

    python -m bench.drain_calls --simulate 10000 --repeat 5   # no cluster needed
    python -m bench.drain_calls --cluster --repeat 5          # the local 4-node cluster

--cluster runs the real poller (jobhost/drain_poller.py, one pass at a time) against the
local cluster with a job array on every node and one node drained, and counts what the
controller itself says it served (sdiag's RPC counts, before and after each pass).

--simulate N runs the same poller against stand-ins for sinfo and squeue that print
what a cluster of N nodes would: N/16 running array tasks of 16 nodes each (an NVLink
domain per task; one node per task below 16 nodes), 0.4 % of the nodes drained (at
least one). The stand-ins count their calls; the
figures are the calls per pass, the pass's time, and the markers written on a first
pass and on a pass where nothing changed. No controller at that size exists here: the
point is that the count does not grow with N, and what the host pays per pass.

Medians of --repeat passes; a JSON document to --out (default bench/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from nvrx_appliance.jobhost import drain_poller

POLLER = drain_poller.__file__
RESULTS = Path(__file__).parent / "results"
NODES_PER_TASK = 16
DRAINED_FRACTION = 0.004


def _once(directory: Path, array: str, env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, POLLER, "--array-job-id", array, "--generation", f"bench/{array}/",
         "--dir", str(directory), "--interval", "1", "--timeout", "20", "--once"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the poller failed: {done.stderr}")
    return time.perf_counter() - started


def _written(directory: Path, since: float) -> int:
    return sum(1 for p in directory.glob("task_*") if p.stat().st_mtime_ns > since)


# --- simulation ----------------------------------------------------------------------------


def _compressed(first: int, count: int) -> str:
    return f"gpu[{first:05d}-{first + count - 1:05d}]"


def simulate(nodes: int, repeat: int) -> dict:
    # A task per NVLink domain of 16 nodes; a cluster smaller than one, a task per node.
    per_task = NODES_PER_TASK if nodes >= NODES_PER_TASK else 1
    tasks = nodes // per_task
    drained = max(1, int(nodes * DRAINED_FRACTION))
    with tempfile.TemporaryDirectory(prefix="bench-drain-") as scratch:
        root = Path(scratch)
        (root / "bin").mkdir()
        sinfo = "".join(f"gpu{1 + k * (nodes // drained):05d}|bench\n" for k in range(drained))
        squeue = "".join(
            f"{t}|{1000 + t}|{_compressed(1 + t * per_task, per_task)}\n" for t in range(tasks)
        )
        for name, out in (("sinfo", sinfo), ("squeue", squeue)):
            (root / f"{name}.out").write_text(out)
            (root / "bin" / name).write_text(
                f"#!/bin/sh\necho {name} >> {root}/calls\ncat {root}/{name}.out\n"
            )
            (root / "bin" / name).chmod(0o755)
        env = {**os.environ, "PATH": f"{root / 'bin'}:{os.environ['PATH']}"}
        directory = root / "drain"
        before = time.time_ns()
        first = _once(directory, "1000", env)
        first_written = _written(directory, before)
        passes, unchanged = [], []
        for _ in range(repeat):
            mark = time.time_ns()
            passes.append(_once(directory, "1000", env))
            unchanged.append(_written(directory, mark))
        calls = (root / "calls").read_text().split()
        marker_bytes = statistics.median(p.stat().st_size for p in directory.glob("task_*"))
    return {
        "nodes": nodes,
        "array_tasks": tasks,
        "nodes_per_task": per_task,
        "drained_nodes": drained,
        "passes": 1 + repeat,
        "slurm_commands_per_pass": len(calls) / (1 + repeat),
        "sinfo_per_pass": calls.count("sinfo") / (1 + repeat),
        "squeue_per_pass": calls.count("squeue") / (1 + repeat),
        "first_pass_s": round(first, 3),
        "pass_median_s": round(statistics.median(passes), 3),
        "markers_written_first_pass": first_written,
        "markers_written_unchanged_pass": statistics.median(unchanged),
        "marker_bytes_median": marker_bytes,
    }


# --- the local cluster -----------------------------------------------------------------------

# sdiag's "Remote Procedure Call statistics by message type" lines: "NAME ( id) count:N ..."
_RPC = re.compile(r"^\s*(REQUEST_[A-Z_]+)\s*\(\s*\d+\)\s*count:(\d+)", re.MULTILINE)


def _rpcs(env: dict[str, str]) -> dict[str, int]:
    out = subprocess.run(["sdiag"], env=env, capture_output=True, text=True, check=True).stdout
    return {name: int(count) for name, count in _RPC.findall(out)}


def _slurm(env: dict[str, str], *argv: str) -> str:
    return subprocess.run(list(argv), env=env, capture_output=True, text=True, check=True).stdout


def on_cluster(repeat: int) -> dict:
    from nvrx_appliance.devcluster.lock import cluster_lock
    from nvrx_appliance.devcluster.poll import wait_until

    cli = str(Path(sys.executable).parent / "nvrx-appliance")
    with cluster_lock(say=lambda line: print(line, file=sys.stderr)):
        subprocess.run([cli, "cluster", "up"], check=True, capture_output=True, text=True)
        status = json.loads(_slurm(dict(os.environ), cli, "cluster", "status", "--json"))
        env = {**os.environ, **status["env"]}
        nodes = [n["name"] for n in status["nodes"]]
        with tempfile.TemporaryDirectory(prefix="bench-drain-", dir=status["work_root"]) as work:
            array = _slurm(env, "sbatch", "--parsable", f"--array=0-{len(nodes) - 1}",
                           "--exclusive", "--job-name=bench-drain", f"--chdir={work}",
                           f"--output={work}/%a.out", "--wrap", "sleep 600").strip()  # fmt: skip
            drained = nodes[-1]
            try:
                running = ["squeue", "-h", "-r", "-j", array, "-t", "R", "-o", "%K"]
                wait_until(
                    lambda: len(_slurm(env, *running).split()) == len(nodes),
                    120,
                    "the bench array to run on every node",
                    0.5,
                )
                drain = ["scontrol", "update", f"nodename={drained}", "state=drain", "reason=bench"]
                _slurm(env, *drain)
                directory = Path(work) / "drain"
                samples, deltas = [], []
                for _ in range(repeat):
                    before = _rpcs(env)
                    samples.append(_once(directory, array, env))
                    after = _rpcs(env)
                    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
                    delta["REQUEST_STATS_INFO"] = delta.get("REQUEST_STATS_INFO", 0) - 1
                    deltas.append({k: v for k, v in delta.items() if v > 0})
            finally:
                subprocess.run(["scontrol", "update", f"nodename={drained}", "state=resume"],
                               env=env, capture_output=True)  # fmt: skip
                subprocess.run(["scancel", array], env=env, capture_output=True)
    kinds = sorted({k for d in deltas for k in d})
    return {
        "nodes": len(nodes),
        "passes": repeat,
        "pass_median_s": round(statistics.median(samples), 3),
        "controller_rpcs_per_pass_median": {
            k: statistics.median(d.get(k, 0) for d in deltas) for k in kinds
        },
        "controller_rpcs_per_pass_total_median": statistics.median(sum(d.values()) for d in deltas),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.drain_calls", description=__doc__)
    parser.add_argument("--simulate", type=int, action="append", default=[], metavar="NODES")
    parser.add_argument("--cluster", action="store_true")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "drain-calls.json")
    args = parser.parse_args(argv)
    if not args.simulate and not args.cluster:
        parser.error("say --simulate NODES (repeatable) and/or --cluster")
    found: dict = {"simulated": [simulate(n, args.repeat) for n in args.simulate]}
    if args.cluster:
        found["cluster"] = on_cluster(args.repeat)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(found, indent=2) + "\n")
    print(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
