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
  4. GPU ONLY, the NCCL hang check (issue 53), twice: without TORCH_NCCL_ENABLE_TIMING
     and with it. Two ranks of a small NCCL script (NCCL_HANG below, no Megatron), each
     under its guard and standing in for a node of its own (SLURMD_NODENAME gpu0, gpu1),
     with the flight-recorder watch and stacks every 2 s; once they have all-reduced a
     while, rank 1's GPU is held by a kernel that spins (`torch.cuda._sleep`) ahead of
     its next all-reduce, its CPU alive and waiting on its GPU: the sick GPU of a live
     rank. NCCL's own watchdog (the group's timeout, NCCL_TIMEOUT_S) aborts the ranks
     (exit 134), and the guards judge that abort as a hang. It prints the hang record's
     words, every rank's last sample, and the recorder's states, beside what the rule
     (rank/stall_rule.py) expects from torch 2.13's sources: without timing, no verdict
     ("NCCL records no start without TORCH_NCCL_ENABLE_TIMING"); with timing, gpu1
     named (its all-reduce never started on its device while its stack stood still).
     It passes when both records were written; what they say is printed to be read.
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
NCCL_TIMEOUT_S = 40  # the NCCL hang check's group timeout: its watchdog ends the hang
NCCL_HANG_RUN_S = 240  # its bound: start, all-reduce, the held GPU, the watchdog, the record
# Two ranks all-reduce until the file HOLD names appears; then rank 1 queues a kernel
# that spins on its GPU ahead of its next all-reduce and waits on it (CPU alive).
NCCL_HANG = r"""
import datetime, os, sys, time, torch, torch.distributed as dist
rank, hold = int(os.environ["RANK"]), sys.argv[1]
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=int(sys.argv[2])))
t = torch.ones(1 << 20, device="cuda")
while True:
    if rank == 1 and os.path.exists(hold):
        torch.cuda._sleep(1 << 62)  # the GPU spins: the all-reduce below never starts
    dist.all_reduce(t)
    t.sum().item()  # the CPU waits on its GPU, as a training step's .item() does
    time.sleep(0.05)
"""


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
    # The flight-recorder watch's summaries (rank/flight_site), analysed as the judgement does.
    dumps = flight.read_dumps(
        m.layout.stacks("hang") / "cycle0", str(record.get("generation", "")), 0
    )
    found = flight_record.analyse(dumps, len(ranks))
    print(f"gpu-check: flight-recorder watch: {len(dumps)} dump(s); the hang waits on "
          f"rank(s) {list(found.held_by())} (expected {frozen}); "
          + "; ".join(s.words() for s in found.stalls))  # fmt: skip
    return bool(samples) and bool(record)


def nccl_hang_plan(work: Path, timing: bool) -> tuple[list[list[str]], list[dict], object]:
    """(each rank's guard argv, its environment, the manifest) of the NCCL hang check."""
    from nvrx_appliance import manifest
    from nvrx_appliance.rank import guard
    from nvrx_appliance.settings.chain import ChainSpec

    run = work / ("nccl-timing" if timing else "nccl")
    script = run / "nccl_hang.py"
    spec = ChainSpec(work_dir=str(run), workload="script", script=str(script), train_tasks=1,
                     hot_spares=0, gpus_per_node=2, stack_sampling=2, mode="train")  # fmt: skip
    m = manifest.build(spec, created="gpu-check", user="root")
    token = f"{m.chain_id}/nccl/0"
    argv = guard.argv(m.layout.control("nccl"), m.layout.exit_records("nccl"), token,
                      [sys.executable, str(script), str(run / "hold"), str(NCCL_TIMEOUT_S)])  # fmt: skip
    envs = []
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533",
               "NVRX_RUN_MANIFEST": str(m.layout.run_json), "SLURMD_NODENAME": f"gpu{rank}",
               "TORCHELASTIC_RESTART_COUNT": "0", "SLURM_ARRAY_JOB_ID": "nccl"}  # fmt: skip
        if timing:
            env["TORCH_NCCL_ENABLE_TIMING"] = "1"
        envs.append(env)
    return [argv, argv], envs, m


def nccl_hang_check(work: Path, gpus: int, dry_run: bool, timing: bool) -> bool:
    """GPU ONLY (step 4 above): a live rank's GPU held, NCCL's watchdog, the judgement."""
    from nvrx_appliance import manifest
    from nvrx_appliance.rank import flight, flight_record, stacks

    argvs, envs, m = nccl_hang_plan(work, timing)
    said = "with" if timing else "without"
    print(f"gpu-check: NCCL hang check (GPU only), {said} TORCH_NCCL_ENABLE_TIMING:\n  "
          + " ".join(argvs[0]), flush=True)  # fmt: skip
    if dry_run:
        return True
    if gpus < 2:
        print("gpu-check: NCCL hang check skipped: it needs two GPUs (one per rank)")
        return True
    layout = m.layout  # type: ignore[attr-defined]
    for directory in (layout.control("nccl"), layout.exit_records("nccl")):
        directory.mkdir(parents=True, exist_ok=True)
    manifest.save(m)  # type: ignore[arg-type]
    Path(m.spec.script).write_text(NCCL_HANG)  # type: ignore[attr-defined]
    guards = [
        subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for argv, env in zip(argvs, envs, strict=True)
    ]
    hold = Path(m.spec.work_dir) / "hold"  # type: ignore[attr-defined]
    record_path = layout.hangs("nccl") / "cycle0.json"
    try:
        time.sleep(20)  # a while of all-reduces: the state before the hang
        hold.touch()
        print(f"gpu-check: held rank 1's GPU; waiting for NCCL's watchdog ({NCCL_TIMEOUT_S} s)",
              flush=True)  # fmt: skip
        deadline = time.monotonic() + NCCL_HANG_RUN_S
        while not record_path.exists() and time.monotonic() < deadline:
            time.sleep(2)
    finally:
        for proc in guards:
            proc.kill()
            proc.wait(60)
    samples = stacks.read_samples(layout.stacks("nccl") / "cycle0")
    for sample in sorted(samples, key=lambda s: int(s.get("rank", 0))):
        print(f"gpu-check: rank {sample.get('rank')} on {sample.get('node')} state "
              f"{sample.get('state')} frames {[f['name'] for f in sample.get('frames', [])][:6]}")  # fmt: skip
    dumps = flight.read_dumps(layout.stacks("nccl") / "cycle0", f"{m.chain_id}/nccl/0", 0)  # type: ignore[attr-defined]
    found = flight_record.analyse(dumps, 2)
    states = {
        d["rank"]: [e.get("state") for e in d["trace"].get("entries", [])][-3:] for d in dumps
    }
    print(f"gpu-check: recorder: {len(dumps)} summary(ies), NCCL {found.nccl}, timing "
          f"{found.timing}, states {states}, held by {list(found.held_by())}")  # fmt: skip
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    expected = (
        "gpu1 named (never started on its device)"
        if timing
        else "no verdict: NCCL records no start without TORCH_NCCL_ENABLE_TIMING"
    )
    print(f"gpu-check: hang record ({said} timing): {record.get('words', 'none written')}\n"
          f"gpu-check: expected from torch 2.13's sources: {expected}")  # fmt: skip
    return bool(record)


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
        for timing in (False, True):
            nccl_hang_check(args.work, gpus, True, timing)
        return 0
    restarted = "cycle 1" in first or "_cycle1" in first
    left = int((args.work / "checkpoints" / "latest_checkpointed_iteration.txt").read_text())
    second = generation(args.work, megatron, "train", gpus, False)
    loaded = re.findall(r"loaded checkpoint .* at iteration (\d+)", second)
    print(f"gpu-check: in-job restart seen: {restarted}; tracker left at {left}; "
          f"generation 2 loaded iteration {loaded[:1]}")  # fmt: skip
    handed_off = bool(restarted and loaded and int(loaded[0]) == left > 0)
    hang = hang_check(args.work, megatron, gpus, False)
    nccl = [nccl_hang_check(args.work, gpus, False, timing) for timing in (False, True)]
    return 0 if handed_off and hang and all(nccl) else 1


if __name__ == "__main__":
    sys.exit(main())
