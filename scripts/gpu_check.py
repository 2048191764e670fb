"""The Megatron hand-off on a real GPU machine, in one command: `make gpu-check`.

No Slurm there, so the two generations of a chain run one after the other on the one
node, each the way the entrypoint runs it (the same run.json, the same ft_launcher
argv, the same environment plan):
  1. generation 1, `--mode handoff`: pretrain_gpt.py (the small preset on mock data)
     checkpoints, Megatron's fault injector raises in a rank (cycle 0 -> 1, an in-job
     restart that resumes from the checkpoint), then NVRx's GPU-failure injector fails
     the node at cycle 1 and the generation ends;
  2. generation 2, `--mode train`: resumes from exactly the iteration the tracker named
     when generation 1 ended, and trains on.
It passes when Megatron's own log says so. Everything it needs must already be there:
  GPU_CHECK_MEGATRON  a Megatron-LM checkout at the pinned commit (pins.toml)
  GPU_CHECK_WHEELS    optional: wheels to install first (NVRx 0.7.0, megatron-core 0.19.0
                      and whatever that machine lacks), installed with --no-index
`--dry-run` prints the plan without a GPU. Not yet run on a GPU (no machine was lent).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# Run from a checkout (`make gpu-check`), the package is the checkout's, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RUN_S = 300  # one generation's bound: start, a few hundred steps, a fault, a restart


def install_wheels(directory: str) -> None:
    wheels = sorted(str(p) for p in Path(directory).glob("*.whl"))
    if wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", *wheels],
            check=True,
        )


def plan(work: Path, megatron: str, mode: str, gpus: int):
    """(ft_launcher argv, environment) of one generation, as the entrypoint builds them."""
    from nvrx_appliance import manifest, workloads
    from nvrx_appliance.node import control, env, launch
    from nvrx_appliance.node.identity import Node
    from nvrx_appliance.rank import guard
    from nvrx_appliance.settings.chain import ChainSpec, check

    transformer = [] if _has("transformer_engine") else ["--transformer-impl", "local"]
    spec = ChainSpec(
        work_dir=str(work), workload="megatron", profile="small", mode=mode,
        megatron_path=megatron, megatron_args=transformer, train_tasks=1, hot_spares=0,
        gpus_per_node=gpus, save_interval=10, fault_ranks="0", fault_delay=45.0,
        gpu_failure="1:0", segment="off", step_timeout=120, max_restarts=2,
        exit_duration_min=3,  # generation 2 saves and ends by itself
    )  # fmt: skip
    problems = check(spec)
    if problems:
        raise SystemExit(f"gpu-check: {problems[0]}")
    m = manifest.build(spec, created="gpu-check", user="root")  # its argv complete
    manifest.save(m)
    node = Node(array_job_id=mode, task_id=0, node_id=0, job_id=mode, hostname="localhost")
    token = control.generation(m.chain_id, mode)
    record = control.Record(
        host="localhost", port=29500, segment=None, cluster_uuid=None, started="",
        array_job_id=mode, task_id=0, job_id=mode, generation=token,
    )  # fmt: skip
    layout = m.layout
    # Each rank under its guard, as the entrypoint runs it (node/lifecycle.py): the
    # guard samples the stacks the hang check below reads.
    guarded = guard.argv(
        layout.control(mode), layout.exit_records(mode), token,
        workloads.workload_argv(m.workload),
    )  # fmt: skip
    argv = launch.command(
        m, record, guarded, hosts_rendezvous=True,
        launcher=[shutil.which("ft_launcher") or "ft_launcher"],
    )  # fmt: skip
    return argv, env.plan(m, node, os.environ).apply(os.environ), m


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def tracker(m) -> int:
    text = m.layout.tracker.read_text().strip() if m.layout.tracker.exists() else "0"
    return int(text) if text.isdigit() else 0


def generation(work: Path, megatron: str, mode: str, gpus: int, dry_run: bool) -> str:
    argv, environment, m = plan(work, megatron, mode, gpus)
    print(f"gpu-check: generation ({mode}):\n  " + " ".join(argv), flush=True)
    if dry_run:
        return ""
    done = subprocess.run(
        argv, env=environment, capture_output=True, text=True, timeout=RUN_S, check=False
    )
    logs = "".join(p.read_text(errors="replace") for p in sorted(m.layout.logs.glob("*cycle*")))
    print(f"gpu-check: {mode} exited {done.returncode}, tracker at {tracker(m)}", flush=True)
    return done.stdout + done.stderr + logs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default="/tmp/nvrx-gpu-check", type=Path)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    megatron = os.environ.get("GPU_CHECK_MEGATRON", "")
    if not args.dry_run and not Path(megatron, "pretrain_gpt.py").is_file():
        raise SystemExit("gpu-check: set GPU_CHECK_MEGATRON to a Megatron-LM checkout")
    if os.environ.get("GPU_CHECK_WHEELS") and not args.dry_run:
        install_wheels(os.environ["GPU_CHECK_WHEELS"])
    gpus = 1
    if not args.dry_run:
        import torch

        gpus = torch.cuda.device_count()
        if not gpus:
            raise SystemExit("gpu-check: no GPU visible to PyTorch")
    shutil.rmtree(args.work, ignore_errors=True)
    first = generation(
        args.work, megatron or "/workspace/megatron-lm", "handoff", gpus, args.dry_run
    )
    if args.dry_run:
        generation(args.work, megatron or "/workspace/megatron-lm", "train", gpus, True)
        return 0
    restarted = "cycle 1" in first or "_cycle1" in first
    left = int((args.work / "checkpoints" / "latest_checkpointed_iteration.txt").read_text())
    second = generation(args.work, megatron, "train", gpus, False)
    loaded = re.findall(r"loaded checkpoint .* at iteration (\d+)", second)
    print(f"gpu-check: in-job restart seen: {restarted}; tracker left at {left}; "
          f"generation 2 loaded iteration {loaded[:1]}")  # fmt: skip
    return 0 if restarted and loaded and int(loaded[0]) == left > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
