"""12. Stack sampling (issue 38): what reading each rank's stack costs, and the step time
of the built-in trainer with and without it. No cluster: one real ft_launcher 0.7.0 on
this host, two ranks, each under its guard (rank/guard.py), as a node runs them.

- one `py-spy dump --nonblocking` of a rank blocked in gloo's all_reduce, and of a
  SIGSTOPped rank: wall time and the CPU py-spy used (as the guard, its parent, runs it);
- one `py-spy dump --native` of a rank blocked in DDP's backward (what the guard takes
  once of a rank that stands still);
- the trainer's step time (rank 0's step events) with sampling every 5 s and every 1 s
  against sampling off, 150 steps a run.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import BenchError, Harness
from bench.report import Metric, Result
from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.rank import guard, sampler
from nvrx_appliance.settings.chain import ChainSpec
from nvrx_appliance.workloads import workload_argv

NAME = "stacks"
TITLE = "12 stack sampling"
FT_LAUNCHER = Path(sys.executable).parent / "ft_launcher"
STEPS = 150
PERIODS = (0, 5, 1)  # off, the default, and five times as often

# Two gloo ranks: rank 0 never joins the collective (it is then stopped), rank 1 waits in
# all_reduce; with `ddp`, rank 1 waits in DDP's gradient all-reduce inside backward.
PAIR = r"""
import sys, datetime, torch, torch.distributed as dist
rank, port, ddp = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "ddp"
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=600))
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64)) if ddp else None
print("ready", flush=True)
if rank == 0:
    while True:
        pass
if ddp:
    model(torch.randn(8, 64)).sum().backward()
dist.all_reduce(torch.ones(4))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dump(pyspy: str, pid: int, *how: str) -> tuple[float, float]:
    """(wall s, CPU s of py-spy) for one dump; raises when it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run([pyspy, "dump", *how, "--pid", str(pid)], capture_output=True, text=True)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise BenchError(f"py-spy dump {' '.join(how)} failed: {done.stderr[-300:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _pair(ddp: bool) -> list[subprocess.Popen]:
    port = str(_free_port())
    argv = [sys.executable, "-c", PAIR]
    pair = [
        subprocess.Popen([*argv, str(r), port, "ddp" if ddp else "plain"], stdout=subprocess.PIPE, text=True)
        for r in (0, 1)
    ]  # fmt: skip
    for proc in pair:
        proc.stdout.readline()  # type: ignore[union-attr]
    return pair


def dump_costs(repeat: int) -> dict[str, list[tuple[float, float]]]:
    pyspy = sampler.pyspy()
    if pyspy is None:
        raise BenchError("py-spy is not installed (make python-deps)")
    found: dict[str, list[tuple[float, float]]] = {}
    for ddp in (False, True):
        pair = _pair(ddp)
        try:
            time.sleep(2)  # rank 1 into its collective: the state measured, not a sync
            os.kill(pair[0].pid, signal.SIGSTOP)
            if ddp:
                found["native"] = [_dump(pyspy, pair[1].pid, "--native") for _ in range(repeat)]
            else:
                for label, pid in (("waiting", pair[1].pid), ("stopped", pair[0].pid)):
                    found[label] = [_dump(pyspy, pid, "--nonblocking") for _ in range(4 * repeat)]
        finally:
            for proc in pair:
                proc.kill()
                proc.wait()
    return found


def step_times(period: int) -> list[float]:
    """Rank 0's seconds between consecutive steps over one run of STEPS steps."""
    with tempfile.TemporaryDirectory(prefix="bench-stacks-") as scratch:
        work = Path(scratch) / "w"
        spec = ChainSpec(work_dir=str(work), workload="cpu", train_tasks=1, hot_spares=0,
                         gpus_per_node=2, micro_batch=4, train_samples=STEPS * 8, mode="train",
                         save_interval=100_000, stack_sampling=period)  # fmt: skip
        m = run_manifest.build(spec, created="bench", user="bench")
        work.mkdir(parents=True)
        run_manifest.save(m)
        layout = m.layout
        for directory in (layout.control("1"), layout.exit_records("1")):
            directory.mkdir(parents=True)
        workload = workload_argv(list(m.workload), sys.executable)
        argv = [
            str(FT_LAUNCHER), "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--rdzv-id", "bench",
            "--max-restarts", "0", "--monitor-interval", "0.2",
            "--no-python", *guard.argv(layout.control("1"), layout.exit_records("1"), "bench/1/", workload),
        ]  # fmt: skip
        env = {**os.environ, "NVRX_RUN_MANIFEST": str(layout.run_json), "SLURMD_NODENAME": "bench"}
        done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise BenchError(
                f"ft_launcher exited {done.returncode}: {done.stdout[-800:]}{done.stderr[-800:]}"
            )
        events = [json.loads(line) for line in layout.progress_log.read_text().splitlines()]
        times = [e["time"] for e in events if e["event"] == "step"]
        return [b - a for a, b in itertools.pairwise(times)]


def collect(h: Harness | None, repeat: int, result: Result) -> None:
    costs = dump_costs(repeat)
    result.samples.append({"dumps": costs})
    for _ in range(repeat):
        result.samples.append(
            {"steps": {str(p): statistics.median(step_times(p)) for p in PERIODS}}
        )
    result.notes.append(
        f"{STEPS} steps of the cpu trainer, 2 ranks under their guards, one ft_launcher; "
        "a step's median over a run is one sample"
    )


def finish(result: Result, floor: float | None) -> None:
    dumps = next((s["dumps"] for s in result.samples if "dumps" in s), {})
    runs = [s["steps"] for s in result.samples if "steps" in s]

    def of(label: str, index: int) -> list[float]:
        return [pair[index] for pair in dumps.get(label, [])]

    result.metrics = [
        Metric("py-spy dump --nonblocking, rank waiting in all_reduce: wall", of("waiting", 0)),
        Metric("CPU of py-spy", of("waiting", 1), indent=True),
        Metric("py-spy dump --nonblocking, stopped rank: wall", of("stopped", 0)),
        Metric("CPU of py-spy", of("stopped", 1), indent=True),
        Metric("py-spy dump --native, rank waiting in DDP's backward: wall", of("native", 0)),
        Metric("CPU of py-spy", of("native", 1), indent=True),
        *(
            Metric(
                f"cpu trainer step, sampling {'off' if p == 0 else f'every {p} s'}",
                [run[str(p)] for run in runs],
            )
            for p in PERIODS
        ),
    ]
