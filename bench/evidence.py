"""20. The evidence path's cost (issue 53): what the hang and straggler evidence of one node
costs the shared file system per sampling period, in each state a run is in, and what
the recorder-status poll costs at 16,384-rank group shapes. No cluster: one node's real
parts on this host.

- **The evidence path.** RANKS gloo ranks, each under its real guard (rank/guard.py: the
  stack sampler, py-spy every period; the flight-recorder watch in the workload), and the
  node's real publisher (node/stack_publisher.py), in the three states a run is in:
  healthy (every rank trains), rank 0 saving alone (1 MB pieces, paced as slow shared
  storage is) while the others wait in the barrier after it, and a hang (the last rank
  held in its own code, the others wait in its all-reduce; not a SIGSTOP, which strace
  cannot detach from in time). Once the state stands (the waiting ranks'
  stall seen), every process of the node is traced with strace for WINDOW periods and
  the calls naming the shared evidence paths are counted (the generation's `stacks/` and
  `hangs/`, and the progress log, which the workload writes and the evidence path reads;
  the workload's own calls on its progress log are its own, not counted). Done at two
  node widths, so that what grows with the ranks would show.
- **The model** (bench/liveness.py's, at 16,384 ranks): a job of 16,384 ranks is
  16,384 / (ranks a node) nodes, each costing what one node costs per period; at the
  default 5 s period that is the whole job's calls a second.
- **The poll** each rank's watch makes: torch 2.13's status JSON (FlightRecorderDetail.hpp
  `dump_json`: sorted keys, every value a string, `pg_config` holding every group's ranks)
  built field by field for a 16,384-rank Megatron layout, parsed whole as before and as
  the watch now parses it (pg_status alone); the real `_dump_fr_trace_json` call on this
  host's gloo group; and the check that the groups stand settled.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench import metadata
from bench.harness import BenchError, Harness
from bench.report import Metric, Result
from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.rank import guard
from nvrx_appliance.settings.chain import ChainSpec

NAME = "evidence"
TITLE = "20 evidence path"
PERIOD_S = 1  # --stack-sampling here (the cost per period does not depend on its length)
DEFAULT_PERIOD_S = 5.0  # --stack-sampling's default, for the model
WINDOW_PERIODS = 10
WIDTHS = (4, 8)  # ranks a node: what grows with them would show
RANKS = 16_384
STATES = ("healthy", "rank 0 saving", "hung")
# O(1) a node and period, whatever its ranks and state: the publisher's one file (the
# temporary file's create, the rename), one look for the hang marker, one at the
# progress log and a read when it grew; one to spare.
TARGET_PER_NODE = 6.0
TARGET_POLL_US = 100.0  # ten polls a second: a thousandth of a core at most
GENERATION = "bench/77/t"
ARRAY = "77"

WORKLOAD = r"""
import json, os, sys, time, torch, torch.distributed as dist
mode, port, ckpt, log = sys.argv[1], sys.argv[2], sys.argv[3], os.environ["NVRX_APPLIANCE_PROGRESS_LOG"]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
t = torch.ones(64)
step = 0
def event(**e):
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, (json.dumps({**e, "time": time.time(), "slurm_array_job_id": "77", "cycle": 0}) + "\n").encode())
    os.close(fd)
while True:
    dist.all_reduce(t)
    step += 1
    if rank == 0 and step % 10 == 0:
        event(event="step", iteration=step)
    if mode == "hang" and step == 20 and rank == world - 1:
        time.sleep(10**6)  # the last rank holds the others, in its own code
    if mode == "save" and step == 20:
        if rank == 0:  # rank 0 saves alone, paced as slow shared storage is
            with open(os.path.join(ckpt, "iter_0000020.pt"), "wb") as out:
                while True:
                    out.write(os.urandom(1 << 20))
                    time.sleep(0.2)
        dist.barrier()
    time.sleep(0.05)
"""

PUBLISHER = r"""
import sys, time
from pathlib import Path
from nvrx_appliance.node import stack_publisher
stacks, hangs, progress, local = (Path(a) for a in sys.argv[1:5])
p = stack_publisher.Publisher(local, stacks, "node1", float(sys.argv[5]), print, hangs=hangs,
                              progress=progress, array_job_id="77")
p.prepare()
p.start()
time.sleep(10**6)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _wait_for(what: str, condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise BenchError(f"no {what} after {timeout:g} s")
        time.sleep(0.2)


def one_state(state: str, width: int, scratch: Path) -> dict:
    """Calls naming the shared evidence paths, per period, of one node of `width` ranks."""
    work, local = scratch / "work", scratch / "local"
    spec = ChainSpec(work_dir=str(work), workload="cpu", train_tasks=1, hot_spares=0,
                     gpus_per_node=width, stack_sampling=PERIOD_S, mode="train")  # fmt: skip
    m = run_manifest.build(spec, created="bench", user="bench")
    work.mkdir(parents=True)
    run_manifest.save(m)
    layout = m.layout
    stacks, hangs, progress = layout.stacks(ARRAY), layout.hangs(ARRAY), layout.progress_log
    for directory in (layout.control(ARRAY), layout.exit_records(ARRAY), local, scratch / "ckpt",
                      progress.parent):  # fmt: skip
        directory.mkdir(parents=True, exist_ok=True)
    port = str(_free_port())
    mode = {"rank 0 saving": "save", "hung": "hang"}.get(state, "train")
    env = {**os.environ, "NVRX_RUN_MANIFEST": str(layout.run_json), "SLURMD_NODENAME": "node1",
           "WORLD_SIZE": str(width), "TORCHELASTIC_RESTART_COUNT": "0",
           "SLURM_ARRAY_JOB_ID": ARRAY, "NVRX_APPLIANCE_LOCAL_STACKS": str(local),
           "NVRX_APPLIANCE_PROGRESS_LOG": str(progress)}  # fmt: skip
    workload = [sys.executable, "-c", WORKLOAD, mode, port, str(scratch / "ckpt")]
    argv = guard.argv(layout.control(ARRAY), layout.exit_records(ARRAY), GENERATION, workload)
    guards = [
        subprocess.Popen(
            argv,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for r in range(width)
    ]
    publisher = subprocess.Popen(
        [sys.executable, "-c", PUBLISHER, str(stacks), str(hangs), str(progress), str(local),
         str(PERIOD_S)], stdout=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    procs = [*guards, publisher]
    try:
        _wait_for("published node file", lambda: (stacks / "cycle0" / "node1.json").exists())
        _wait_for("training", lambda: progress.exists() and progress.stat().st_size > 0)
        if state != "healthy":  # the waiting ranks' stall seen: the state stands
            summaries = local / "cycle0" / "flight"
            _wait_for("stall summary", lambda: any(summaries.glob("*.json")))
        workloads = {c for g in guards for c in _children(g.pid)}
        pids = [p.pid for p in procs]
        seconds, texts = _trace(pids, scratch / "traces", WINDOW_PERIODS * PERIOD_S)
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    calls: Counter[str] = Counter()
    for pid, text in texts.items():
        for directory in (str(stacks), str(hangs)):
            calls.update({f"{n} {Path(directory).name}/": c
                          for n, c in metadata.calls(text, directory).items()})  # fmt: skip
        if pid not in workloads:  # the evidence path's reads of the workload's log
            calls.update(_naming_calls(text, str(progress)))
    periods = seconds / PERIOD_S
    per_rank_files = [p for p in stacks.rglob("*.rank*.json")] + list(stacks.rglob("flight/*"))
    return {"state": state, "ranks": width, "seconds": seconds,
            "per_node_per_period": sum(calls.values()) / periods,
            "calls_per_period": {k: v / periods for k, v in sorted(calls.items())},
            "per_rank_files": len(per_rank_files)}  # fmt: skip


def _naming_calls(trace: str, path: str) -> Counter[str]:
    """System calls by name among the lines that name exactly `path` (the progress log)."""
    found: Counter[str] = Counter()
    for line in trace.splitlines():
        if f'"{path}"' in line:
            name = line.split("(", 1)[0].split()[-1]
            found[f"{name} progress log"] += 1
    return found


def _trace(pids: list[int], out: Path, seconds: float) -> tuple[float, dict[int, str]]:
    """strace every process of the node (threads and children too) for `seconds`; the
    window's length and one trace per process id."""
    out.mkdir(parents=True)
    tracers = [
        subprocess.Popen(
            [
                "strace",
                "-f",
                "-ff",
                "-qq",
                "-e",
                "trace=%file,openat",
                "-o",
                str(out / f"t{pid}"),
                "-p",
                str(pid),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for pid in pids
    ]
    began = time.monotonic()
    time.sleep(seconds)  # the measurement window itself, not a wait for an event
    for tracer in tracers:
        tracer.send_signal(signal.SIGINT)
    elapsed = time.monotonic() - began
    for tracer in tracers:
        try:
            tracer.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # the kernel detaches a killed tracer's tracees
            tracer.kill()
            tracer.communicate()
    texts = {}
    for path in out.iterdir():
        pid = int(path.name.rsplit(".", 1)[1]) if "." in path.name else 0
        texts[pid] = texts.get(pid, "") + path.read_text(errors="replace")
    if not texts:
        raise BenchError("strace wrote nothing")
    return elapsed, texts


POLL = r"""
import json, statistics, sys, time
import torch, torch.distributed as dist
from nvrx_appliance.rank.flight_site import sitecustomize as site
RANKS, N = 16384, 300

def groups():
    # Megatron at 16,384 ranks, TP 8 within a node, PP 4, DP 512: each rank's groups
    return {"0": range(RANKS), "1": range(8), "2": range(0, RANKS, 4096), "3": range(0, 4096, 8),
            "4": range(0, 4096 * 4, 4096 // 8 * 8)}

def torch_status_json():
    # FlightRecorderDetail.hpp dump_json: sorted keys (nlohmann's map), strings, no spaces
    cfg = {n: {"desc": f"pg{n}", "name": n, "ranks": "[" + ", ".join(map(str, r)) + "]"}
           for n, r in groups().items()}
    status = {n: {"last_completed_collective": "41", "last_enqueued_collective": "42",
                  "last_started_collective": "-1"} for n in groups()}
    doc = {"comm_lib_version": "2.27.3", "nccl_comm_state": {}, "pg_config": cfg,
           "pg_status": status, "version": "2.10"}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

def timed(fn):
    out = []
    for _ in range(N):
        t = time.perf_counter(); fn(); out.append(time.perf_counter() - t)
    return statistics.median(out) * 1e6

raw = torch_status_json()
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
for ranks in ([0], [0], [0], [0]):
    dist.all_reduce(torch.ones(1), group=dist.new_group(ranks))
c10d = sys.modules["torch._C._distributed_c10d"]
g = site._Groups(); g.settled(dist)
print(json.dumps({
    "status_bytes": len(raw),
    "whole_us": timed(lambda: json.loads(raw)["pg_status"]),
    "pg_status_alone_us": timed(lambda: site.status(raw)),
    "torch_call_here_us": timed(lambda: site.status(c10d._dump_fr_trace_json(
        includeCollectives=False, onlyActive=True))),
    "settled_us": timed(lambda: g.settled(dist)),
}))
dist.destroy_process_group()
"""


def poll_costs() -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", POLL], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    if done.returncode != 0:
        raise BenchError(f"the poll measure failed: {done.stderr[-600:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def collect(h: Harness | None, repeat: int, result: Result) -> None:
    for run in range(repeat):
        for width in WIDTHS:
            for state in STATES:
                with tempfile.TemporaryDirectory(prefix="bench-evidence-") as scratch:
                    result.samples.append({"run": run, **one_state(state, width, Path(scratch))})
        result.samples.append({"run": run, "poll": poll_costs()})


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def finish(result: Result, floor: float | None) -> None:
    result.metrics = []
    unit = "calls/period"
    node_samples = [s for s in result.samples if "state" in s]
    for width in WIDTHS:
        for state in STATES:
            figures = [s["per_node_per_period"] for s in node_samples
                       if s["ranks"] == width and s["state"] == state]  # fmt: skip
            result.metrics.append(Metric(f"one node of {width} ranks, {state}: shared calls",
                                         figures, TARGET_PER_NODE, unit=unit))  # fmt: skip
    width = max(WIDTHS)
    for state in STATES:
        figures = [
            s["per_node_per_period"] * (RANKS / width) / DEFAULT_PERIOD_S
            for s in node_samples if s["ranks"] == width and s["state"] == state
        ]  # fmt: skip
        result.metrics.append(
            Metric(
                f"{RANKS:,} ranks ({RANKS // width:,} nodes of {width}), {state} (model)",
                figures,
                TARGET_PER_NODE * (RANKS / width) / DEFAULT_PERIOD_S,
                unit="calls/s",
            )
        )
    polls = [s["poll"] for s in result.samples if "poll" in s]
    for key, label in (
        ("whole_us", f"status at {RANKS:,}-rank group shapes, parsed whole (before)"),
        ("pg_status_alone_us", f"status at {RANKS:,}-rank group shapes, pg_status alone (now)"),
        ("torch_call_here_us", "torch's status call and parse, this host's gloo groups"),
        ("settled_us", "the groups-settled check (5 groups)"),
    ):
        result.metrics.append(Metric(label, [p[key] for p in polls], TARGET_POLL_US, unit="us"))
    if node_samples:
        files = sum(s["per_rank_files"] for s in node_samples)
        result.notes.append(
            f"{WINDOW_PERIODS} periods of {PERIOD_S} s traced a sample; per-rank files found "
            f"under the shared stacks directory over every sample: {files}; the model at the "
            f"default {DEFAULT_PERIOD_S:g} s period"
        )
    if polls:
        result.notes.append(f"the status JSON at {RANKS:,} ranks: {polls[0]['status_bytes']:,} B")
    for state in STATES:
        kinds = [s["calls_per_period"] for s in node_samples if s["state"] == state]
        names = sorted({k for c in kinds for k in c})
        said = ", ".join(f"{k} {_median([c.get(k, 0.0) for c in kinds]):.1f}" for k in names)
        if said:
            result.notes.append(f"{state}, calls a period by kind (medians): {said}")


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.evidence [--repeat N]`: this scenario alone, its table printed."""
    import argparse

    from bench import report

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    result = Result(NAME, TITLE)
    collect(None, args.repeat, result)
    finish(result, None)
    print(report.table([result]))
    for note in result.notes:
        print(f"- {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
