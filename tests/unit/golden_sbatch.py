"""The golden sbatch scripts: a few representative chains, rendered whole.

tests/unit/test_sbatch_golden.py compares each rendered script with its recorded file
in fixtures/sbatch/. After a deliberate change to the template or the renderer,
regenerate them with `make golden-sbatch` (python -m tests.unit.golden_sbatch) and
review the diff: it is the change a user's batch script sees.
"""

from __future__ import annotations

import sys
from pathlib import Path

from nvrx_appliance import manifest
from nvrx_appliance.chain import render, submit
from nvrx_appliance.settings.chain import ChainSpec

RECORDED = Path(__file__).parent / "fixtures" / "sbatch"
# Fixed so the recording does not depend on the machine, the clock or the user.
WORK = "/shared/alice/run"
VENV_PYTHON = "/opt/nvrx/venv/bin/python"

# name -> (settings, extra sbatch arguments after `--`)
CASES: dict[str, tuple[dict, tuple[str, ...]]] = {
    # The production shape: Megatron in a pyxis image, hot and cold spares, defaults.
    "pyxis-megatron": (
        dict(image="/images/llm.sqsh", runtime="pyxis", train_tasks=4, hot_spares=1, cold_spares=4),
        (),
    ),
    # Apptainer, a partition, explicit mounts and an extra sbatch option.
    "apptainer-partition": (
        dict(
            image="/images/llm.sif",
            runtime="apptainer",
            partition="gpu",
            mounts="/data:/data,/shared/alice/run:/shared/alice/run",
            mem="",
        ),
        ("--qos=high",),
    ),
    # The local demo: the CPU trainer on bare metal, the no-restart mode.
    "bare-cpu-norestart": (
        dict(
            workload="cpu",
            runtime="bare",
            python=VENV_PYTHON,
            mode="no-restart",
            gpus_per_node=2,
            depth=2,
        ),
        (),
    ),
    # The pyxis stand-in used by the image tests, with multi-node tasks.
    "bwrap-standin-handoff": (
        dict(
            image="/images/llm.sqsh",
            runtime="bwrap-standin",
            python=VENV_PYTHON,
            workload="cpu",
            mode="handoff",
            nodes_per_task=2,
        ),
        (),
    ),
}


def rendered(name: str) -> str:
    settings, extra = CASES[name]
    spec = ChainSpec(**{"work_dir": WORK, "job_name": name, **settings})
    m = manifest.build(spec, created="2026-01-01T00:00:00Z", user="alice")
    return render.render(m, template=submit.template_text(), extra=extra)


def recorded_path(name: str) -> Path:
    return RECORDED / f"{name}.sbatch"


def main() -> int:
    RECORDED.mkdir(parents=True, exist_ok=True)
    for name in CASES:
        recorded_path(name).write_text(rendered(name))
        print(f"wrote {recorded_path(name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
