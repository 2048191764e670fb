"""The hand-off demo in container mode: the CPU image, run by the bwrap stand-in
(a test stand-in for pyxis+enroot) on the local cluster, qualified by `qualify`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from nvrx_appliance.image.qualification import record_path

from .chain_support import CLI, FAST, ledger, logs_on_failure, progress, wait_idle
from .conftest import Cluster
from .test_image_cpu_build import cpu_image  # noqa: F401  (the session's one CPU image)

pytestmark = pytest.mark.cluster

QUALIFY_DEADLINE_S = 900  # two generations on two cores, the first unpack of the image included
TRAINER = b"nvrx_appliance.workloads.cpu"
MANIFEST_INSIDE = "etc/nvrx-appliance/image.json"


def _trainers_in_image() -> list[dict]:
    """Manifests seen through the root of every running cpu-trainer process.

    /proc/PID/root is the process's own root: the host has no image manifest, so one
    found there proves the worker runs inside the image.
    """
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if TRAINER not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            found.append(json.loads(Path(f"/proc/{pid}/root/{MANIFEST_INSIDE}").read_text()))
        except (OSError, ValueError):
            continue
    return found


def test_qualify_runs_the_hand_off_in_container_mode_and_records_the_result(
    cluster: Cluster,
    cpu_image: Path,  # noqa: F811
):
    work = cluster.workdir("qualify")
    built = json.loads(
        subprocess.run(
            [CLI, "image", "inspect", "--json", str(cpu_image)], capture_output=True, check=True
        ).stdout
    )
    proc = subprocess.Popen(
        [CLI, "qualify", *FAST, "--runtime", "bwrap-standin", "--image", str(cpu_image),
         "--work-dir", str(work), "--train-tasks", "1", "--hot-spares", "1",
         "--fault-delay", "3", "--deadline", str(QUALIFY_DEADLINE_S)],
        env=cluster.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        seen = cluster.wait_until(
            lambda: _trainers_in_image() or (None if proc.poll() is None else [{}]),
            QUALIFY_DEADLINE_S,
            "a cpu trainer running inside the image",
            1.0,
        )
        output, _ = proc.communicate(timeout=QUALIFY_DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        run = json.loads((work / "run.json").read_text()) if (work / "run.json").exists() else {}
        name = run.get("spec", {}).get("job_name")
        if name:
            subprocess.run([CLI, "cancel", name], env=cluster.env(), capture_output=True)
            wait_idle(cluster, name, timeout=120)

    assert proc.returncode == 0, output + logs_on_failure(work)
    # What a person reads, run as the README shows it (no --json).
    assert "Traceback" not in output, output
    assert f"Qualifying {cpu_image} on this cluster: hand-off demo " in output
    assert "  ok    " in output and "FAIL" not in output, output
    assert f"{cpu_image}: qualified on this cluster (hand-off recovered)" in output
    # The workers ran inside this very image (its manifest, seen through their root).
    assert seen and seen[0].get("built") == built["built"], seen
    # submit recorded the image's manifest in run.json.
    assert run["image"]["built"] == built["built"] and run["spec"]["runtime"] == "bwrap-standin"

    record = json.loads((work / "qualification.json").read_text())
    assert record == json.loads(record_path(cpu_image).read_text())
    assert record["result"] == "passed"
    assert [c["passed"] for c in record["checks"]] == [True, True, True]
    assert record["image_manifest"]["built"] == built["built"]
    assert record["cluster"]["runtime"] == "bwrap-standin"

    # Independently of qualify's judge: the successor started where task 0's trap left the
    # tracker, and that was a checkpoint the first generation wrote.
    first, second = record["chain"]["generations"][:2]
    [handed] = [e for e in ledger(work) if e["array_job_id"] == first]
    assert handed["action"] == "released_spares" and handed["exit_code"] != 93
    start = next(
        e for e in progress(work) if e["event"] == "start" and e.get("slurm_array_job_id") == second
    )
    assert start["iteration"] == handed["checkpoint_iteration"] > 0
    assert start["host"] in cluster.nodes

    # The record now vouches for this image on this cluster: a later submit says so in one
    # line and raises no warning (issue 6: the image meets submit).
    later = subprocess.run(
        [CLI, "submit", "--dry-run", *FAST, "--runtime", "bwrap-standin", "--image",
         str(cpu_image), "--work-dir", str(cluster.workdir("qualified-later")),
         "--train-tasks", "1", "--hot-spares", "1"],
        env=cluster.env(), capture_output=True, text=True,
    )  # fmt: skip
    assert later.returncode == 0, later.stderr
    assert "qualified on" in later.stderr and "WARNING" not in later.stderr, later.stderr
