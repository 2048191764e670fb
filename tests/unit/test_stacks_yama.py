"""The real guard where the kernel refuses py-spy (Yama's ptrace_scope 2 or 3, or a
container without CAP_SYS_PTRACE), simulated: a py-spy stand-in (named so) beside the
guard's interpreter fails as py-spy does there. One clear message, no retry loop, and
the hang record says why there are no stacks."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from nvrx_appliance import manifest as run_manifest
from nvrx_appliance.rank import guard

from .test_cpu_trainer import cpu_manifest

REPO = Path(__file__).resolve().parents[2]
REFUSAL = "Error: Operation not permitted (os error 1)"


def _interpreter_with_pyspy_standin(tmp_path: Path) -> Path:
    """This Python, linked into a directory whose py-spy is the stand-in (the guard
    runs the py-spy beside its interpreter first)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.symlink_to(os.path.realpath(sys.executable))
    standin = bin_dir / "py-spy"
    standin.write_text(
        f"#!/bin/sh\n# a stand-in for py-spy under Yama's ptrace_scope 3\n"
        f"echo run >> {tmp_path / 'runs'}\necho '{REFUSAL}' >&2\nexit 1\n"
    )
    standin.chmod(0o755)
    return python


def test_the_guard_says_once_why_it_has_no_stacks_and_the_hang_record_says_it_too(tmp_path):
    m = cpu_manifest(tmp_path / "w", iterations=10, stack_sampling=1)
    m.layout.work_dir.mkdir(parents=True)
    run_manifest.save(m)
    python = _interpreter_with_pyspy_standin(tmp_path)
    paths = [str(REPO), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths),
           "NVRX_RUN_MANIFEST": str(m.layout.run_json), "SLURMD_NODENAME": "node1",
           "RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_RESTART_COUNT": "0"}  # fmt: skip
    env.pop(guard.sampler.LOCAL_STACKS_ENV, None)
    argv = guard.argv(tmp_path / "control", tmp_path / "exits", "chain-1/77/t",
                      [str(python), "-c", "import time; time.sleep(600)"])  # fmt: skip
    argv[0] = str(python)
    run = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    sample_path = m.layout.stacks("77") / "cycle0" / "node1.rank0.json"
    deadline = time.monotonic() + 60
    try:
        epochs: set[float] = set()
        while len(epochs) < 4:  # four samples: py-spy would have run four times
            assert time.monotonic() < deadline and run.poll() is None
            with contextlib.suppress(OSError, ValueError):  # not written yet, or mid-rename
                epochs.add(json.loads(sample_path.read_text())["epoch"])
            time.sleep(0.05)
        sample = json.loads(sample_path.read_text())
        os.kill(sample["pid"], signal.SIGKILL)  # as NVRx's timeout ends a hung rank
        _, err = run.communicate(timeout=60)
    finally:
        run.kill()
    assert (tmp_path / "runs").read_text().count("run") == 1  # never retried
    told = [line for line in err.splitlines() if "no stacks" in line]
    assert len(told) == 1, err
    assert told[0].endswith(
        f"nvrx-guard: no stacks sampled from now on: py-spy cannot read the workload "
        f"(py-spy said: {REFUSAL}); " + sample["no_stacks"].split("; ", 1)[1]
    )
    assert sample["frames"] == [] and sample["unreadable"] == sample["no_stacks"]
    record = json.loads((m.layout.hangs("77") / "cycle0.json").read_text())
    assert record["no_stacks"] == [sample["no_stacks"]]
    assert record["verdict"] == "none" and record["words"].endswith(
        f"; no stacks: {sample['no_stacks']}"
    ), record["words"]
