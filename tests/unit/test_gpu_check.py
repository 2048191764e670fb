"""`make gpu-check`'s plan, without a GPU: the dry run prints what the GPU machine runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def test_the_dry_run_prints_both_generations_and_the_hang_check_each_rank_under_its_guard(
    tmp_path,
):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--work", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    plans = [line for line in done.stdout.splitlines() if line.startswith("  ft_launcher ")]
    assert len(plans) == 3, done.stdout
    for line in plans:
        assert " -m nvrx_appliance.rank.guard " in line and "pretrain_gpt.py" in line
    assert "--fault-injector-ranks 0" in plans[0] and "--fault-injector" not in plans[1]
    # The hang check (GPU only): no fault injected, NVRx's short step timeout ends it.
    assert "gpu-check: hang check (GPU only):" in done.stdout
    assert "--fault-injector" not in plans[2] and "step:60," in plans[2]


def test_the_dry_run_prints_the_nccl_hang_check_without_and_with_timing(tmp_path):
    # Issue 53: an induced NCCL hang with and without TORCH_NCCL_ENABLE_TIMING, each rank
    # under its guard; NCCL's watchdog (the group's timeout) ends it, the guards judge.
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--work", str(tmp_path / "w")],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "gpu-check: NCCL hang check (GPU only), without TORCH_NCCL_ENABLE_TIMING:" in out
    assert "gpu-check: NCCL hang check (GPU only), with TORCH_NCCL_ENABLE_TIMING:" in out
    guarded = [line for line in out.splitlines() if "nccl_hang.py" in line]
    assert len(guarded) == 2 and all(" -m nvrx_appliance.rank.guard " in g for g in guarded)
    from scripts import gpu_check  # the plan itself: what differs per rank

    _, envs, _ = gpu_check.nccl_hang_plan(tmp_path / "p", timing=True)
    assert [e["SLURMD_NODENAME"] for e in envs] == ["gpu0", "gpu1"]
    assert all(e["TORCH_NCCL_ENABLE_TIMING"] == "1" for e in envs)
    _, plain, _ = gpu_check.nccl_hang_plan(tmp_path / "q", timing=False)
    assert all(e.get("TORCH_NCCL_ENABLE_TIMING") != "1" for e in plain)
