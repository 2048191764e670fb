"""Comments and docstrings name the files they mean: after a move, a name left behind
(`interval.py`, `leasewatch.py`, the package's old `slurm` room) sends a reader nowhere."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Files of other projects the package's comments name on purpose (NVRx, Megatron, Python).
OUTSIDE = {
    "ft_rendezvous_barrier.py", "launcher.py", "segment_health_check.py", "pretrain_gpt.py",
    "rank_monitor_server.py", "genericpath.py", "os.py", "pathlib.py", "serialization.py",
    "shutil.py", "tempfile.py", "threading.py",
}  # fmt: skip


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return [ROOT / line for line in out.split()]


def test_every_file_name_in_the_package_is_a_file_of_ours_or_one_named_as_outside():
    ours = {p.name for p in tracked()}
    stale = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in tracked("nvrx_appliance/*.py")
        for name in re.findall(r"(?<![\w/.-])([a-z][a-z0-9_]*\.py)\b", path.read_text())
        if name not in ours and name not in OUTSIDE
    }
    assert not stale, sorted(stale)


def test_every_path_into_the_package_that_a_file_gives_exists():
    stale = {
        f"{path.relative_to(ROOT)}: {named}"
        for path in tracked("*.py", "*.md")
        for named in re.findall(r"nvrx_appliance/[A-Za-z0-9_/.-]*[A-Za-z0-9_]", path.read_text())
        if not (ROOT / named).exists() and not (ROOT / f"{named}.py").exists()
    }
    assert not stale, sorted(stale)
