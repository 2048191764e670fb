"""10. As the run grows: the start gate, an in-job restart, a hand-off and a watcher pass
at 4, 8 and 16 nodes of the local cluster (issue 30).

The sizes are NVRX_BENCH_SIZES's (default 4,8,16: even numbers of nodes, each at least
4). At each size the cluster is rebuilt with that many nodes in two-node NVLink domains and
runs one chain of two-node tasks in segment mode (the seeds' shape): every domain but
one trains, the last is a hot spare domain. The built-in trainer sleeps after each step
(--cpu-step-pause), so that sixteen nodes on a small machine are idle between steps and
what is measured is the recovery, not the contention of training. Each generation of
the chain (handoff mode, repeat+1 of them) gives one sample of each:

- start gate: task 0's job starts (Slurm) -> its record is published (rdzv.json) -> the
  last node's ft_launcher is in the round (NVRx) -> the round closes (cycle-info) -> the
  trainer's start-up marks -> the first step;
- in-job restart: the trainer's injected exception on the last rank (its "fault" event)
  -> the first step of cycle 1, in the marks of scenario 5;
- hand-off: the harness SIGKILLs the last rank's process in cycle 1; at the next round
  NVRx's injected GPU failure fails task 0's node (`--gpu-failure 2:0`), so task 0 must
  go: NVRx's decision -> the successor's first step, in the marks of scenario 2d.

Then, with the last generation running, `nvrx-watch --once --dry-run` as cron runs it,
cold (no state) and warm. Beside the figures, what the machine needed: the most memory
in use and how busy the CPUs were while the size ran (/proc).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import re
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from bench import extract, healthcheck
from bench.extract import Incomplete, RestartSeen
from bench.harness import CLI, Harness
from bench.report import Metric, Result, phase_metrics
from bench.segment import quick_flags
from bench.timing import Mark, nvrx_event, segments, task0
from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.devcluster.poll import Timeout
from nvrx_appliance.layout import Layout
from nvrx_appliance.observe.slurm_output import expand_nodelist

NAME = "scale"
TITLE = "10 as the run grows"
# NVRX_BENCH_SIZES=4,8,16,32 repeats it elsewhere (a larger machine: see the memory row).
SIZES = tuple(int(n) for n in os.environ.get("NVRX_BENCH_SIZES", "4,8,16").split(","))
DOMAIN = 2
STEP_PAUSE_S = 0.5
FAULT_DELAY_S = 10  # after training starts: a checkpoint (every 5 iterations) is there
START_TIMEOUT_S = 400  # sixteen nodes starting Python and torch at once on two cores
WATCH = str(Path(CLI).with_name("nvrx-watch"))
KINDS = ("start", "restart", "handoff")


def chain_flags(nodes: int, depth: int) -> list[str]:
    tasks = nodes // DOMAIN
    last_rank = (tasks - 1) * DOMAIN - 1  # one worker per node; the spare domain idles
    return [
        *quick_flags("--segment", "--save-interval", "--time"), "--time", "00:20:00",
        "--save-interval", "5", "--cpu-step-pause", str(STEP_PAUSE_S),
        "--nodes-per-task", str(DOMAIN), "--gpus-per-node", "1", "--segment", str(DOMAIN),
        "--train-tasks", str(tasks - 1), "--hot-spares", "1", "--cold-spares", "0",
        "--mode", "handoff", "--gpu-failure", "2:0", "--fault-types", "exception",
        "--fault-ranks", str(last_rank), "--fault-delay", str(FAULT_DELAY_S),
        "--depth", str(depth), "--max-restarts", "5",
    ]  # fmt: skip


# --- what the machine needed ------------------------------------------------------------------


def _meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        out[key] = int(rest.split()[0]) * 1024
    return out


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


@contextlib.contextmanager
def machine_use(into: dict) -> Iterator[None]:
    """While the block runs: the most memory in use, and the CPUs' mean busy share."""
    stop = threading.Event()
    peak = [0]

    def sample() -> None:
        while not stop.wait(1.0):
            info = _meminfo()
            peak[0] = max(peak[0], info["MemTotal"] - info["MemAvailable"])

    busy0, total0 = _cpu_times()
    base = _meminfo()
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        busy1, total1 = _cpu_times()
        into["memory_peak_gib"] = round(peak[0] / 2**30, 2)
        into["memory_before_gib"] = round((base["MemTotal"] - base["MemAvailable"]) / 2**30, 2)
        into["cpu_busy_pct"] = round(100 * (busy1 - busy0) / max(total1 - total0, 1), 1)
        into["cpus"] = os.cpu_count()


# --- one generation ---------------------------------------------------------------------------


def real_name(listed: str, nodes: Sequence[str]) -> str:
    """The node a name from NVRx's cycle-info lists means: the one whose name differs
    from it only by zeros NVRx padded its number with."""
    if listed in nodes:
        return listed
    found = re.fullmatch(r"(.*?)(\d+)", listed)
    if found is None:
        return listed
    unpadded = f"{found[1]}{int(found[2])}"
    return unpadded if unpadded in nodes else listed


def start_sample(h: Harness, work: Path, gen: str) -> dict:
    """The start gate of one generation."""
    started, step = h.wait_resumed(work, f"generation {gen}", START_TIMEOUT_S,
                                   slurm_array_job_id=gen, cycle=0)  # fmt: skip
    zero = task0(h.wait_started(gen))
    cycle0 = h.wait(lambda: h.cycle(work, gen, 0), 30, f"{gen}'s cycle 0")
    # NVRx 0.7.0 pads every number of a cycle-info list to the widest one (node1..node14
    # become node[01-14]), names no node has: Slurm's names come from the launchers' own.
    hosts = [real_name(n, h.nodes) for n in expand_nodelist(cycle0.active_nodes)]
    nvrx = h.nvrx_events_with(work, gen, [("rendezvous_started", 0, n) for n in hosts])
    # At 16 nodes a launcher's line may still be queued in NVRx's log server after the
    # wait (nvrx_events_with): the last one logged stands in, and the sample says so.
    seen = {n: t for n in hosts if (t := nvrx_event(nvrx, "rendezvous_started", 0, n))}
    joined = list(seen.values()) or [None]
    record = h.mtime(Layout(work).control_files(gen).record)
    setup = started.get("setup") or {}
    needed = {"task 0's start": zero and zero.start, "the record": record,
              "a launcher's rendezvous_started": None if None in joined else joined,
              "cycle 0's start": cycle0.start, "the trainer's setup marks": setup or None}  # fmt: skip
    missing = [k for k, v in needed.items() if v is None]
    if missing:
        raise Incomplete("missing: " + ", ".join(missing))
    assert zero is not None and zero.start is not None and record is not None
    assert cycle0.start is not None
    marks = [
        Mark("task 0 started", zero.start, "Slurm"),
        Mark("record published", record, "rdzv.json mtime",
             "task 0: entrypoint start, detection, publication"),
        Mark("last launcher in the round", max(j for j in joined if j is not None),
             f"NVRx log: rendezvous_started, the last of {len(seen)}/{len(hosts)} logged",
             "peers: entrypoint, gate, ft_launcher start (the last node)"),
        Mark("round closed", cycle0.start, "cycle-info cycle 0 start", "rendezvous"),
        Mark("trainer began", setup["launched"], "progress log: start.setup.launched",
             "spawn + interpreter"),
        Mark("torch imported", setup["imported"], "start.setup.imported", "import torch"),
        Mark("joined", setup["joined"], "start.setup.joined", "join the process group"),
        Mark("built", setup["built"], "start.setup.built", "build the model"),
        Mark("training", started["time"], "progress log: start", "checkpoint restore"),
        Mark("first step", step["time"], "progress log: step", "first step"),
    ]  # fmt: skip
    if sorted(marks, key=lambda m: m.time) != marks:
        raise Incomplete("start marks out of order: " + ", ".join(
            f"{m.name} {m.time - marks[0].time:+.2f}" for m in marks))  # fmt: skip
    return {
        "generation": gen, "total_s": marks[-1].time - marks[0].time,
        "gate_s": cycle0.start - zero.start, "phases": dict(segments(marks)),
        "resumed_iteration": started.get("iteration"),
        "launchers_unlogged": sorted(set(hosts) - set(seen)),
    }  # fmt: skip


def restart_sample(h: Harness, work: Path, gen: str) -> dict:
    fault = h.wait_event(work, f"{gen}'s injected fault", 120, "fault",
                         slurm_array_job_id=gen, cycle=0)  # fmt: skip
    resumed, step = h.wait_resumed(work, f"{gen}'s cycle 1", START_TIMEOUT_S,
                                   slurm_array_job_id=gen, cycle=1)  # fmt: skip
    host = resumed["host"]
    return extract.restart_sample(
        RestartSeen(
            fault_at=fault["time"], rank=fault.get("rank", -1), next=h.cycle(work, gen, 1),
            checkpoint=h.restored(work, resumed), resumed=resumed, first_step=step,
            # rank 0's host may have been a standby that detected nothing (restart_host)
            nvrx=h.nvrx_events_with(work, gen, [("rendezvous_started", 1, host)]),
            fault=f"progress log: the trainer's injected exception on rank {fault.get('rank')}",
        )
    )  # fmt: skip


def array_size_of(work: Path) -> int:
    """The array's task count, from run.json."""
    return run_manifest.load(Layout(work).run_json).shape.array_size


def handoff_sample(h: Harness, work: Path, gen: str, successor: str, rank: int) -> dict:
    h.wait_checkpointed(work, f"{gen}'s cycle 1", slurm_array_job_id=gen, cycle=1)
    pid = h.wait(lambda: h.worker_pid(Layout(work).run_json, rank), 30, f"rank {rank}")
    killed = h.kill_process(pid)
    sample = healthcheck.one(h, work, gen, successor, array_size_of(work), START_TIMEOUT_S)
    sample["kill_to_decision_s"] = sample["decided_at"] - killed
    return sample


def watcher_passes(h: Harness, name: str, repeat: int) -> dict[str, list[float]]:
    """`nvrx-watch NAME --once --dry-run` as cron runs it: a new process each pass."""
    out: dict[str, list[float]] = {"cold": [], "warm": []}

    def one(state: str) -> float:
        began = time.perf_counter()
        done = subprocess.run(
            [WATCH, name, "--once", "--dry-run", "--state-dir", state],
            env=h.env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        took = time.perf_counter() - began
        if "Traceback" in done.stderr or done.returncode not in (0, 1, 2):
            raise Incomplete(f"nvrx-watch exited {done.returncode}: {done.stderr[-500:]}")
        return took

    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="bench-watch-") as state:
            out["cold"].append(one(state))
            out["warm"].append(one(state))
    return out


def one_size(h: Harness, nodes: int, repeat: int, result: Result) -> None:
    h.reshape("--nodes", str(nodes), "--nvlink-domain-size", str(DOMAIN))
    work, name = h.workdir(f"{NAME}{nodes}"), h.job_name(f"{NAME}{nodes}")
    flags = chain_flags(nodes, repeat + 1)
    rank = int(flags[flags.index("--fault-ranks") + 1])
    use: dict = {"nodes": nodes, "kind": "machine"}
    with machine_use(use):
        ids = h.submit(work, name, *flags)
        result.notes.append(f"{nodes} nodes: generations {', '.join(ids)}")
        try:
            for gen, successor in itertools.pairwise([*ids, None]):

                def attempt(kind: str, measure, gen=gen) -> None:
                    try:
                        result.samples.append({"nodes": nodes, "kind": kind, **measure()})
                    except (Incomplete, Timeout) as exc:
                        result.notes.append(f"{nodes} nodes, {gen}: {kind} dropped: {exc}")

                attempt("start", lambda gen=gen: start_sample(h, work, gen))
                attempt("restart", lambda gen=gen: restart_sample(h, work, gen))
                if successor is not None:
                    attempt("handoff", lambda gen=gen, successor=successor: handoff_sample(
                        h, work, gen, successor, rank))  # fmt: skip
                h.say(f"{NAME}: {nodes} nodes, generation {gen} measured")
            passes = watcher_passes(h, name, repeat)
            result.samples.append({"nodes": nodes, "kind": "watch", **passes})
        finally:
            h.drain(name)
    result.samples.append(use)


def collect(h: Harness, repeat: int, result: Result) -> None:
    for nodes in SIZES:
        one_size(h, nodes, repeat, result)


# --- the figures ---------------------------------------------------------------------------

HEADLINES = {
    "start": ("start gate: task 0 starts -> the round closes", "gate_s"),
    "restart": ("in-job restart: rank fault -> first step of the next cycle", "total_s"),
    "handoff": ("hand-off: NVRx's decision -> the successor's first step", "total_s"),
}


def _of(samples: Sequence[dict], nodes: int, kind: str) -> list[dict]:
    return [s for s in samples if s["nodes"] == nodes and s["kind"] == kind]


def finish(result: Result, floor: float | None) -> None:
    metrics: list[Metric] = []
    for nodes in sorted({s["nodes"] for s in result.samples}):
        for kind, (label, key) in HEADLINES.items():
            picked = _of(result.samples, nodes, kind)
            metrics.append(Metric(f"{nodes} nodes: {label}", [s[key] for s in picked]))
            if kind == "start":
                metrics.append(
                    Metric(
                        "task 0 starts -> first step", [s["total_s"] for s in picked], indent=True
                    )
                )
            metrics += phase_metrics(picked)
            if kind == "handoff":
                metrics.append(
                    Metric(
                        "dying path: decision -> the generation's last task ends",
                        [s["dying_s"] for s in picked],
                        indent=True,
                    )
                )
                metrics.append(
                    Metric(
                        "before it: the rank's SIGKILL -> NVRx's decision",
                        [s["kill_to_decision_s"] for s in picked],
                        indent=True,
                    )
                )
        for watch in _of(result.samples, nodes, "watch"):
            metrics.append(
                Metric(f"{nodes} nodes: watcher pass, cold (nvrx-watch --once)", watch["cold"])
            )
            metrics.append(Metric(f"{nodes} nodes: watcher pass, warm", watch["warm"]))
    result.metrics = metrics  # fmt: skip


# --- the growth table (docs/benchmarks.md) -----------------------------------------------------

# Rows of the table: (label, kind, key into the sample or its phases).
GROWTH_ROWS = (
    ("start gate: task 0 starts -> the round closes", "start", "gate_s"),
    ("- task 0's entrypoint publishes", "start", "task 0: entrypoint start, detection, publication"),
    ("- the last node's gate and ft_launcher start", "start", "peers: entrypoint, gate, ft_launcher start (the last node)"),
    ("- NVRx's rendezvous", "start", "rendezvous"),
    ("task 0 starts -> first step", "start", "total_s"),
    ("- import torch (every worker at once)", "start", "import torch"),
    ("in-job restart: fault -> first step", "restart", "total_s"),
    ("- detection", "restart", "detection"),
    ("- stop the workers + next round + rendezvous", "restart", ("stop the surviving workers", "wait for the next round", "rendezvous")),
    ("- import torch", "restart", "import torch"),
    ("hand-off: NVRx's decision -> successor's first step", "handoff", "total_s"),
    ("- dying path: decision -> last task ends", "handoff", "dying_s"),
    ("- successor's start-up and restore", "handoff", "successor's start-up and checkpoint restore"),
    ("watcher pass, cold (a new process, as cron runs it)", "watch", "cold"),
    ("watcher pass, warm", "watch", "warm"),
)  # fmt: skip


def _value(sample: dict, key) -> float | None:
    if isinstance(key, tuple):
        parts = [_value(sample, k) for k in key]
        return None if None in parts else sum(p for p in parts if p is not None)
    if key in sample and not isinstance(sample[key], list):
        return sample[key]
    return sample.get("phases", {}).get(key)


def _median(samples: Sequence[dict], kind: str, key) -> float | None:
    if kind == "watch":
        values = [v for s in samples for v in s.get(key, [])]
    else:
        values = [v for s in samples if (v := _value(s, key)) is not None]
    return statistics.median(values) if values else None


def growth_table(samples: Sequence[dict]) -> str:
    """Medians at each size, and how each grows per doubling of the nodes (the
    geometric mean of the ratios between neighbouring sizes)."""
    sizes = sorted({s["nodes"] for s in samples})
    head = " | ".join(f"{n} nodes" for n in sizes)
    lines = [f"| measure (median s) | {head} | per doubling |",
             "|---|" + "---:|" * (len(sizes) + 1)]  # fmt: skip
    for label, kind, key in GROWTH_ROWS:
        medians = [_median(_of(samples, n, kind), kind, key) for n in sizes]
        lines.append(
            f"| {label} | "
            + " | ".join("-" if m is None else f"{m:.2f}" for m in medians)
            + f" | {_growth(sizes, medians)} |"
        )
    counts = [min((len(_of(samples, n, k)) for k in KINDS), default=0) for n in sizes]
    lines.append("| samples (fewest of the three kinds) | " + " | ".join(map(str, counts)) + " | |")
    for label, key, unit in (
        ("memory in use, most (GiB)", "memory_peak_gib", ""),
        ("CPUs busy while it ran (%)", "cpu_busy_pct", ""),
    ):
        values = [next((s[key] for s in _of(samples, n, "machine")), None) for n in sizes]
        lines.append(
            f"| {label} | "
            + " | ".join("-" if v is None else f"{v:g}{unit}" for v in values)
            + " | |"
        )
    return "\n".join(lines)


def _growth(sizes: Sequence[int], medians: Sequence[float | None]) -> str:
    ratios = [
        (b / a) ** (1 / math.log2(m / n))
        for (n, a), (m, b) in itertools.pairwise(zip(sizes, medians, strict=True))
        if a and b
    ]
    if not ratios:
        return "-"
    return f"x{math.prod(ratios) ** (1 / len(ratios)):.2f}"
