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
It passes when Megatron's own log says so. Then, on a node with two GPUs or more:
  3. GPU ONLY, the hang check (docs/hangs.md, "On GPUs"): `--mode train` with stack
     sampling every 2 s; once it trains, one rank is frozen (SIGSTOP) inside its NCCL
     work, an induced NCCL hang for the others. It prints: py-spy's dump of a waiting
     rank in the bare runtime, and inside the container runtime when GPU_CHECK_IMAGE
     names an image apptainer can run; every rank's last sample (state, frames,
     native frames) and the hang record NVRx's step timeout led to; NCCL's own dumps
     (stacks/nccl_trace_rank_<R>); and the flight-recorder watch's dumps analysed as
     the hang judgement reads them (rank/flight.py, rank/flight_record.py), with the
     rank they say the others wait on beside the rank it froze.
Everything it needs must already be there:
  GPU_CHECK_MEGATRON  a Megatron-LM checkout at the pinned commit (pins.toml)
  GPU_CHECK_WHEELS    optional: wheels to install first (NVRx 0.7.0, megatron-core 0.19.0
                      and whatever that machine lacks), installed with --no-index
  GPU_CHECK_IMAGE     optional: an image for the container-runtime py-spy check
`--dry-run` prints the plans without a GPU (a unit test runs it). Not yet run on a GPU:
no machine with one was lent to the sessions that wrote it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
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


HANG_STEP_TIMEOUT_S = 60  # NVRx's step timeout in the hang check: it ends the hung cycle
HANG_RUN_S = 420  # the hang check's bound: start, train, freeze, the timeout, the record


def plan(work: Path, megatron: str, mode: str, gpus: int, hang: bool = False):
    """(ft_launcher argv, environment) of one generation, as the entrypoint builds them;
    `hang`: the hang check's run (no fault injected, stacks every 2 s, a short step
    timeout, no restart: the hung cycle is the one looked at)."""
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
    if hang:
        spec = dataclasses.replace(
            spec, mode="train", fault_ranks="", gpu_failure=None, stack_sampling=2,
            step_timeout=HANG_STEP_TIMEOUT_S, max_restarts=0,
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


def _ranks(m) -> dict[int, int]:
    """{global rank: pid} of the run's Megatron workers (children of the rank guards)."""
    import psutil

    found = {}
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "pretrain_gpt.py" not in " ".join(proc.info["cmdline"] or []):
                continue
            env = proc.environ()
            if env.get("NVRX_RUN_MANIFEST") == str(m.layout.run_json) and "RANK" in env:
                found[int(env["RANK"])] = proc.pid
        except (psutil.Error, ValueError):
            continue
    return found


def _pyspy_in_container(image: str) -> str:
    """py-spy dumping a sleeping Python inside the container runtime (apptainer)."""
    runner = shutil.which("apptainer") or shutil.which("singularity")
    if not runner or not image:
        return "skipped: set GPU_CHECK_IMAGE to an image and have apptainer on PATH"
    inner = ('python3 -c "import time; time.sleep(30)" & sleep 3; '
             'py-spy dump --nonblocking --pid $!; kill $!')  # fmt: skip
    done = subprocess.run([runner, "exec", image, "sh", "-c", inner], capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    return f"exit {done.returncode}: {(done.stdout + done.stderr).strip()[-2000:]}"


def hang_check(work: Path, megatron: str, gpus: int, dry_run: bool) -> bool:
    """GPU ONLY (step 3 above): an induced NCCL hang, its stacks, its flight recorder."""
    from nvrx_appliance.rank import flight, flight_record, sampler, stacks

    argv, environment, m = plan(work, megatron, "hang", gpus, hang=True)
    print("gpu-check: hang check (GPU only):\n  " + " ".join(argv), flush=True)
    if dry_run:
        return True
    if gpus < 2:
        print("gpu-check: hang check skipped: it needs two GPUs (one rank waits for another)")
        return True
    launcher = subprocess.Popen(argv, env=environment, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + HANG_RUN_S
    record_path = m.layout.hangs("hang") / "cycle0.json"
    try:
        while tracker(m) <= 0:  # it trains once it has saved a checkpoint
            if time.monotonic() > deadline or launcher.poll() is not None:
                print("gpu-check: hang check: the run never saved a checkpoint")
                return False
            time.sleep(2)
        ranks = _ranks(m)
        frozen = max(ranks)
        os.kill(ranks[frozen], signal.SIGSTOP)
        print(f"gpu-check: froze rank {frozen} (pid {ranks[frozen]}); waiting for NVRx's "
              f"step timeout ({HANG_STEP_TIMEOUT_S} s)", flush=True)  # fmt: skip
        time.sleep(10)  # the others reach their next NCCL wait
        spy = subprocess.run([sampler.pyspy() or "py-spy", "dump", "--nonblocking", "--pid",
                              str(ranks[0])], capture_output=True, text=True, timeout=60,
                             check=False)  # fmt: skip
        print(f"gpu-check: py-spy, bare runtime, rank 0:\n{spy.stdout}{spy.stderr}")
        print("gpu-check: py-spy, container runtime: "
              + _pyspy_in_container(os.environ.get("GPU_CHECK_IMAGE", "")))  # fmt: skip
        while not record_path.exists() and time.monotonic() < deadline:
            time.sleep(2)
    finally:
        launcher.terminate()
        launcher.wait(60)
    samples = stacks.read_samples(m.layout.stacks("hang") / "cycle0")
    for sample in sorted(samples, key=lambda s: int(s.get("rank", 0))):
        print(f"gpu-check: rank {sample.get('rank')} state {sample.get('state')} "
              f"frames {[f['name'] for f in sample.get('frames', [])][:6]} "
              f"native {sample.get('native', [])[:6]} {sample.get('unreadable', '')}")  # fmt: skip
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    print(f"gpu-check: hang record: {record.get('words', 'none written')}")
    nccl_dumps = sorted(m.layout.stacks("hang").glob("nccl_trace_rank_*"))
    print(f"gpu-check: NCCL's own dumps at its timeout: {[p.name for p in nccl_dumps]}")
    # The flight-recorder watch's dumps (rank/flight_site), analysed as the judgement does.
    where = flight.flight_dir(m.layout.stacks("hang") / "cycle0")
    dumps = flight.read_dumps(where, str(record.get("generation", "")), 0)
    found = flight_record.analyse(dumps, len(ranks))
    print(f"gpu-check: flight-recorder watch: {len(dumps)} dump(s); the hang waits on "
          f"rank(s) {list(found.held_by())} (expected {frozen}); "
          + "; ".join(s.words() for s in found.stalls))  # fmt: skip
    return bool(samples) and bool(record)


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
        hang_check(args.work, megatron or "/workspace/megatron-lm", gpus, True)
        return 0
    restarted = "cycle 1" in first or "_cycle1" in first
    left = int((args.work / "checkpoints" / "latest_checkpointed_iteration.txt").read_text())
    second = generation(args.work, megatron, "train", gpus, False)
    loaded = re.findall(r"loaded checkpoint .* at iteration (\d+)", second)
    print(f"gpu-check: in-job restart seen: {restarted}; tracker left at {left}; "
          f"generation 2 loaded iteration {loaded[:1]}")  # fmt: skip
    handed_off = bool(restarted and loaded and int(loaded[0]) == left > 0)
    hang = hang_check(args.work, megatron, gpus, False)
    return 0 if handed_off and hang else 1


if __name__ == "__main__":
    sys.exit(main())
