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
