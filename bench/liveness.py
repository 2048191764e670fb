"""7. Liveness load: what task 0's lease and its watchers cost the shared file system.

One generation in train mode with the production lease (45 s): task 0, one watcher
(`--lease-watchers 1`) and one other node, so each role is there once. Once it trains,
every node's nvrx-entrypoint is traced with strace for a window (`trace=%file,openat`),
and the calls naming the control directory are counted: one sample per node per window.
The rates per role, times lease.py's model of who does what (docs/liveness.md), give a
whole generation's load at 1,000 and 10,000 nodes, with the default three watchers.
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import time
from pathlib import Path

from bench import chains, metadata
from bench.harness import BenchError, Harness
from bench.report import Metric, Result
from nvrx_appliance import lease
from nvrx_appliance.manifest import Layout

NAME = "liveness"
TITLE = "7 liveness load"
WINDOW_S = 30.0  # per sample, as the issue measured
SHAPE = ("--train-tasks", "1", "--hot-spares", "2", "--cold-spares", "0",
         "--gpus-per-node", str(chains.WORKERS_PER_NODE))  # fmt: skip
MEASURED_NODES = 3
MEASURED_WATCHERS = 1
PRODUCTION = ("--lease-stale-after", "45", "--lease-watchers", str(MEASURED_WATCHERS))
ROLES = ("task 0", "watcher", "other")
PROJECTED = (1_000, 10_000)
TARGET_CALLS_S = 200.0  # issue 24: a whole generation of 10,000 nodes
UNIT = "calls/s"


def role(task: int, node: int) -> str:
    if (task, node) == (0, 0):
        return "task 0"
    return "watcher" if lease.watches(task, node, MEASURED_WATCHERS) else "other"


def trace(pids: list[int], out: Path, seconds: float) -> tuple[float, dict[int, str]]:
    """strace every entrypoint at once for `seconds`: the window's length, and each
    trace's text by pid. strace detaches on SIGINT and leaves the process running."""
    out.mkdir(parents=True)
    tracers = {
        pid: subprocess.Popen(
            ["strace", "-f", "-qq", "-e", "trace=%file,openat", "-o", str(out / f"{pid}.trace"),
             "-p", str(pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        for pid in pids
    }  # fmt: skip
    began = time.monotonic()
    time.sleep(seconds)  # the measurement window itself, not a wait for an event
    for tracer in tracers.values():
        tracer.send_signal(signal.SIGINT)
    elapsed = time.monotonic() - began
    texts = {}
    for pid, tracer in tracers.items():
        _, err = tracer.communicate(timeout=30)
        path = out / f"{pid}.trace"
        if not path.exists():
            raise BenchError(f"strace of pid {pid} wrote nothing: {err.decode()[-300:]}")
        texts[pid] = path.read_text(errors="replace")
    return elapsed, texts


def collect(h: Harness, repeat: int, result: Result) -> None:
    work, name = h.workdir(NAME), h.job_name(NAME)
    [gen] = h.submit(work, name, *chains.FAST, *SHAPE, *PRODUCTION,
                     "--mode", "train", "--depth", "1")  # fmt: skip
    control = str(Layout(work).control(gen))
    traces = work / "traces"
    try:
        h.wait_checkpointed(work, f"generation {gen}", slurm_array_job_id=gen)
        pids = h.entrypoints(gen)
        roles = sorted(role(*where) for where in pids.values())
        if roles != sorted(ROLES):
            raise BenchError(f"expected one node of each role {ROLES}, found {roles}")
        for window in range(repeat):
            seconds, texts = trace(list(pids), traces / str(window), WINDOW_S)
            for pid, text in texts.items():
                counted = metadata.calls(text, control)
                # Every look lists the control directory once (node/looks.py).
                looks = metadata.naming(text, control)
                result.samples.append({
                    "window": window, "task": pids[pid][0], "node": pids[pid][1],
                    "role": role(*pids[pid]),
                    "seconds": seconds, "calls": dict(counted), "looks": looks,
                    "per_s": metadata.per_second(counted, seconds),
                })  # fmt: skip
            h.say(f"{NAME}: {len(result.samples) // len(pids)}/{repeat} windows")
    finally:
        h.drain(name)


def _rates(samples: list[dict], name: str) -> list[dict[str, float]]:
    return [s["per_s"] for s in samples if s["role"] == name]


def projections(samples: list[dict]) -> dict[int, list[float]]:
    """A whole generation's calls per second at each size of PROJECTED, one figure per
    window (the window's three nodes taken together)."""
    windows: dict[int, dict[str, dict]] = {}
    for s in samples:
        windows.setdefault(s["window"], {})[s["role"]] = s
    out: dict[int, list[float]] = {n: [] for n in PROJECTED}
    for seen in windows.values():
        if set(seen) != set(ROLES) or not seen["other"]["looks"]:
            continue
        other = seen["other"]
        measured = lease.Measured(
            task0=seen["task 0"]["per_s"]["total"],
            watcher=seen["watcher"]["per_s"]["total"],
            other_per_look=sum(other["calls"].values()) / other["looks"],
        )
        for n in PROJECTED:
            out[n].append(lease.generation_load(measured, n, lease.DEFAULT_WATCHERS))
    return out


def finish(result: Result, floor: float | None) -> None:
    result.metrics = []
    for name in ROLES:
        rates = _rates(result.samples, name)
        if not rates:
            continue
        totals = [r["total"] for r in rates]
        result.metrics.append(Metric(f"{name}: control-dir calls per node", totals, unit=UNIT))
        for call in sorted({c for r in rates for c in r if c != "total"}):
            result.metrics.append(
                Metric(call, [r.get(call, 0.0) for r in rates], indent=True, unit=UNIT)
            )
    for n, loads in projections(result.samples).items():
        target = TARGET_CALLS_S if n == 10_000 else None
        result.metrics.append(
            Metric(f"a whole generation of {n:,} nodes (model)", loads, target, unit=UNIT)
        )
    if result.samples:
        result.notes.append(
            f"{WINDOW_S:g} s windows; {MEASURED_NODES} nodes measured (one per role), "
            f"projected with {lease.DEFAULT_WATCHERS} watchers; backstop period "
            f"{lease.backstop_period(MEASURED_NODES):g} s here, "
            f"{lease.backstop_period(10_000):g} s at 10,000 nodes"
        )
        setattr_s = statistics.median(
            r.get("utimensat", 0.0) for name in ("watcher", "other")
            for r in _rates(result.samples, name)
        )  # fmt: skip
        result.notes.append(f"setattr (utimensat) per peer per second: {setattr_s:.2f}")
